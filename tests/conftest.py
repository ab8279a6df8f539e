"""Shared fixtures: a private FLWR_HOME for the whole session, Flower's task identity for
in-process messages, and a throw-away real deployment (SuperLink + SuperNodes on 127.0.0.1).

The tiers (README, Makefile): a test marked deployment, simulation, docker or slow, or using the
``deployment`` fixture, is of the full tier (``make test-all``); every other test, and the one test
marked ``smoke``, is of the fast tier (``make test``: ``pytest -m fast``). tests/tier_guard.py
fails a fast-tier test that starts a federation, Docker, a network namespace or a browser.
"""

from __future__ import annotations

import inspect
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, NoReturn

import pytest

from tests import tier_guard

REPO = Path(__file__).resolve().parents[1]
TESTS = Path(__file__).resolve().parent


def lscpu_model() -> str:
    """The CPU's model name as lscpu (util-linux) reports it: a reference independent of hetfed's."""
    lines = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout.splitlines()
    return next(ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("Model name"))


SHARED_DATA = REPO.parent / "shared" / "data"


# --- a run killed at a chosen point -------------------------------------------------------------
def start_inline_run(results: Path, sets: Mapping[str, object], nodes: int = 3) -> subprocess.Popen:
    """`hetfed run --engine inline` in its own process group (to be killed with its workers)."""
    return subprocess.Popen(
        [sys.executable, "-m", "hetfed.cli", "run", "--engine", "inline", "--nodes", str(nodes),
         "--results-dir", str(results), *(a for k, v in sets.items() for a in ("--set", f"{k}={v}"))],
        cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip


def wait_until(ready: Callable[[], Any], what: str, proc: subprocess.Popen, timeout: float = 240) -> Any:
    """Poll ``ready()`` until it returns something true (an OSError counts as not yet)."""
    end = time.time() + timeout
    while time.time() < end:
        assert proc.poll() is None, f"the run ended before {what}: {proc.communicate()}"
        try:
            if found := ready():
                return found
        except OSError:
            pass
        time.sleep(0.02)
    raise TimeoutError(what)


def wait_for_round(run_dir: Path, server_round: int, proc: subprocess.Popen, timeout: float = 240) -> None:
    """Until the run's progress.json says ``server_round`` is done (``proc`` must stay alive)."""
    end = time.time() + timeout
    while time.time() < end:
        try:
            if json.loads((run_dir / "progress.json").read_text())["round"] >= server_round:
                return
        except (OSError, ValueError, KeyError):
            pass
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    raise TimeoutError(f"round {server_round} not reached")


def kill_when_blocked(proc: subprocess.Popen, fifo: Path) -> None:
    """SIGKILL ``proc``'s process group once a thread of it waits to open ``fifo`` for writing (the
    kernel's ``wait_for_partner``), then remove the FIFO: the run stopped exactly before that write."""

    def blocked() -> bool:
        return any(
            (task / "wchan").read_text() == "wait_for_partner"
            for task in Path(f"/proc/{proc.pid}/task").iterdir()
        )

    try:
        wait_until(blocked, f"the run blocked on {fifo.name}", proc)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        fifo.unlink(missing_ok=True)


def kill_at_a_checkpoint(proc: subprocess.Popen, run_dir: Path) -> None:
    """Kill the run as it writes a checkpoint after round 1 (its file made a FIFO; torch.save writes
    ``.checkpoint.pt.tmp``, then renames it): rounds.csv then holds a round its checkpoint does not."""
    fifo = run_dir / ".checkpoint.pt.tmp"
    wait_for_round(run_dir, 1, proc)
    wait_until(lambda: os.mkfifo(fifo) or True, "a free checkpoint file", proc)  # not mid-write
    kill_when_blocked(proc, fifo)


@pytest.fixture(autouse=True, scope="session")
def private_flower_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Never touch ~/.flwr: every Flower process of the tests uses a private home."""
    home = tmp_path_factory.mktemp("flwr-home")
    saved = {
        k: os.environ.get(k)
        for k in ("FLWR_HOME", "FLWR_DISABLE_UPDATE_CHECK", "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION")
    }
    os.environ.update(
        FLWR_HOME=str(home), FLWR_DISABLE_UPDATE_CHECK="1", FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION="1"
    )
    yield home
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.fixture
def task_identity() -> Iterator[None]:
    """Instruction messages built outside a Flower runtime need a task identity."""
    from flwr.common.constant import SUPERLINK_NODE_ID
    from flwr.supercore.task_identity import TaskIdentity

    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, SUPERLINK_NODE_ID, 1
    yield


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """A real SuperLink and 3 SuperNodes (own processes, own node configs) for one test module."""
    from hetfed.engines.flower import LocalFlower
    from hetfed.federation import node_config

    root = tmp_path_factory.mktemp("deployment")
    flower = LocalFlower(root)
    try:
        flower.start_superlink(cwd=REPO)
        for i in range(3):
            flower.start_supernode(i, node_config(i, 3, root, None, None))
        flower.wait_for_nodes(3)
        yield flower
    finally:
        flower.stop()


def cannot_run(reason: str) -> NoReturn:
    """A live test this machine cannot run (no nginx, no network namespaces, no Docker engine...):
    skipped with ``reason``; under ``CI=true`` it fails instead, as CI must run every test."""
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"CI=true, and this test cannot run here: {reason}", pytrace=False)
    pytest.skip(reason)


def needs_nginx() -> str:
    """nginx for the SuperLink host's reverse proxy (hetfed.nginx_proxy), or :func:`cannot_run`."""
    from hetfed.nginx_proxy import find_nginx

    try:
        return find_nginx()
    except FileNotFoundError as exc:
        cannot_run(str(exc))


def pytest_configure(config: pytest.Config) -> None:
    """Tiny models run faster on one thread, and the suite shares 2 cores with Flower's processes.
    The fuzz tests' seed is drawn here once, so every xdist worker (started after this) draws the
    same examples, and printed in the header."""
    import random

    import torch

    torch.set_num_threads(1)
    os.environ.setdefault("HETFED_FUZZ_SEED", str(random.randrange(2**32)))
    tier_guard.install()


# --- tiers ------------------------------------------------------------------------------------------
FULL_TIER = ("deployment", "simulation", "docker", "slow")  # markers of the full tier's tests

# Tests of the full tier that start no federation but take too long for the fast tier (more than
# ~2 s on 2 idle cores: CLI processes, quick reproductions, many inline runs): file -> test functions
# (none: the whole file). conftest marks them slow.
SLOW: dict[str, tuple[str, ...]] = {
    "test_adam.py": ("test_training_does_not_import_dynamo",),
    "test_add_a_problem.py": (),
    "test_audit.py": ("test_a_folder_without_a_federation_is_one_line",),
    "test_bench_report.py": (),
    "test_centralized.py": (),
    "test_cli_faults.py": (
        "test_a_signal_stops_an_inline_run_cleanly_and_resume_reaches_the_uninterrupted_metrics",
        "test_resume_continues_with_the_recorded_settings_and_keeps_every_segment",
        "test_every_argument_is_checked_before_anything_starts",
        "test_a_refused_run_leaves_the_name_free",
        "test_damaged_checkpoints_and_missing_runs_are_one_line_naming_the_file",
        "test_run_help_documents_resume_and_signals",
        "test_federation_up_checks_every_argument_before_starting_anything",
        "test_two_federation_ups_on_one_folder_cannot_both_start",
        "test_a_state_dir_on_a_read_only_file_system_is_refused",
    ),
    "test_compose.py": (
        "test_the_identity_commands_make_what_the_compose_file_mounts_and_keep_it",
        "test_the_compose_command_prints_the_offline_build_the_readme_documents",
        "test_the_tls_superlink_service_runs_flower_on_its_loopback_behind_nginx",
    ),
    "test_dashboard.py": (
        "test_the_command_serves_the_page_and_metrics",
        "test_dashboard_refuses_bad_arguments_in_one_line",
    ),
    "test_decide.py": (),
    "test_deferred_imports.py": (),
    "test_energy.py": (
        "test_fetch_from_the_wheel_gives_the_shared_table",
        "test_pjm_generator_is_realistic_and_reproducible",
    ),
    "test_energy_federation.py": ("test_quick_energy_reproduction_writes_tables_json_and_plots",),
    "test_engines.py": (
        "test_cli_bad_input_is_one_line_naming_the_culprit",
        "test_cli_run_inline_prints_the_per_client_table",
    ),
    "test_fair_classification.py": ("test_alternative_splits",),
    "test_fault_matrix.py": (
        "test_a_corrupt_checkpoint_is_one_line_naming_it_on_every_engine",
        "test_a_bad_silo_file_on_the_inline_engine",
        "test_wait_run_notices_a_dead_superlink_within_30_s",
        "test_a_deployment_run_on_a_dead_superlink_is_refused_in_one_line",
        "test_federation_down_ends_processes_outside_its_process_groups",
    ),
    "test_inline.py": (
        "test_run_writes_complete_results",
        "test_rounds_csv_is_byte_equal_whatever_pythons_hash_seed",
        "test_every_engine_refuses_an_existing_results_folder_before_it_starts",
    ),
    "test_ledger.py": ("test_a_state_dir_without_a_ledger_is_one_line",),
    "test_light_imports.py": (
        "test_loading_the_client_app_imports_no_torch",
        "test_an_lsa_client_runs_its_rounds_without_torch",
        "test_decision_and_constrained_clients_still_import_torch_on_one_thread",
        "test_a_knapsack_client_maps_scipy_only_for_objective_heterogeneity",
        "test_an_inline_pflsa_run_loads_torch_only_for_the_server_store",
    ),
    "test_lsa_moments.py": ("test_the_expected_error_is_what_many_sampled_runs_average_to",),
    "test_packaging.py": (
        "test_the_app_bundle_has_no_symlinks_and_imports_the_app_from_its_own_folders",
        "test_the_wheel_has_one_top_level_package",
    ),
    "test_pflsa.py": ("test_noise_free_pflsa_reaches_every_personal_solution_and_fedlsa_theta_lim",),
    "test_pinning.py": ("test_approve_command_builds_the_hash_and_the_silo_command_takes_the_file",),
    "test_silo_policy.py": ("test_a_malformed_policy_file_is_one_line_and_leaves_the_silo_out",),
    "test_privacy.py": ("test_a_local_dp_round_redone_after_a_kill_is_accounted_twice",),
    "test_nginx_proxy.py": ("test_a_superlink_port_already_in_use_is_named_before_anything_starts",),
    "test_reproduce_dp_knapsack.py": ("test_the_quick_reproduction_tabulates_its_runs",),
    "test_reproduce_energy.py": (
        "test_the_ablation_table_holds_each_runs_reported_regret",
        "test_the_cold_start_judges_the_federations_own_model_on_a_zone_that_was_not_in_it",
        "test_the_papers_other_tables_hold_their_runs_numbers",
        "test_each_ladder_step_is_the_per_seed_difference_of_its_two_rows",
        "test_the_cold_start_fed_plus_p_personalizes_the_received_federated_model",
    ),
    "test_reproduce_energy_pilot.py": (
        "test_each_table_cell_and_step_is_its_runs_number",
        "test_no_silo_deploys_a_model_worse_on_its_validation_days_than_the_federated_one",
        "test_the_median_calibration_is_the_median_cost_norm_over_the_radius",
    ),
    "test_reproduce_knapsack.py": ("test_quick_reproduction_writes_tables_json_and_plots",),
    "test_reproduce_lp_pilot.py": ("test_the_quick_reproduction_tabulates_its_runs",),
    "test_reproduce_pflsa.py": (
        "test_quick_reproduction_writes_figures_and_tables_and_pflsa_speeds_up_with_n",
    ),
    "test_reproduce_pflsa_communication.py": (
        "test_fedlsa_with_local_steps_is_the_reference_trajectory_against_messages",
        "test_one_local_step_makes_scafflsa_fedlsa",
    ),
    "test_reproduce_pflsa_theory.py": ("test_quick_study_checks_floors_limits_and_convergence_against_runs",),
    "test_reproduce_switching.py": (
        "test_bad_methods_and_options_are_refused",
        "test_quick_np_classification_writes_tables_and_figures",
    ),
    "test_reproduce_switching_study.py": (
        "test_quick_study_times_come_from_the_runs_and_the_page_renders_from_its_json",
    ),
    "test_shortest_path.py": (
        "test_quick_reproduction_writes_every_part_and_a_part_run_alone_keeps_the_others",
    ),
    "test_signed_keys.py": (
        "test_a_new_silo_enrols_with_the_identity_command_and_a_silo_host_checks_its_files",
    ),
    "test_silo_budget.py": ("test_a_silo_refuses_the_release_that_would_exceed_its_lifetime_epsilon",),
    "test_store.py": ("test_a_second_live_writer_of_a_run_is_refused_and_a_dead_ones_lock_is_free",),
    "test_tabular.py": (
        "test_predict_equals_a_numpy_forward_pass_of_the_kept_model",
        "test_the_silo_keeps_the_runs_final_models_and_its_manifest",
        "test_predict_refuses_in_one_line",
        "test_predict_defaults_to_the_kept_models_and_refuses_other_problems",
    ),
    "test_tls_auth.py": ("test_start_scripts_map_their_env_files_to_the_commands",),
    "test_tracking.py": (
        "test_a_serverapp_killed_mid_send_or_before_its_checkpoint_logs_each_kept_row_once",
        "test_a_store_lost_for_some_rounds_costs_one_warning_and_gets_every_row_once",
    ),
    "test_trust_region.py": (
        "test_a_safe_rl_run_with_trust_region_steps_and_gae_completes_on_the_inline_engine",
    ),
}


@pytest.hookimpl(tryfirst=True)  # before -m selects
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every fast-tier test ``fast``; the ``deployment`` fixture makes a test ``deployment``."""
    smoke = [item.nodeid for item in items if item.get_closest_marker("smoke")]
    if len(smoke) > 1:
        raise pytest.UsageError(f"one smoke run in the fast tier, not {len(smoke)}: {', '.join(smoke)}")
    for item in items:
        if "deployment" in getattr(item, "fixturenames", ()):
            item.add_marker("deployment")
        if is_slow(item):
            item.add_marker("slow")
        if item.get_closest_marker("smoke") or not any(item.get_closest_marker(m) for m in FULL_TIER):
            item.add_marker("fast")
    for group, members in shared_fixture_groups(items).items():
        for item in members:
            item.add_marker(pytest.mark.xdist_group(group))
    if config.getoption("dist", "no") != "no":
        # xdist hands out the groups (largest first), then single tests in this order: the full
        # tier's and the smoke run first, so no long test starts last and runs alone at the end.
        items.sort(key=lambda item: item.get_closest_marker("fast") and not item.get_closest_marker("smoke"))


def is_slow(item: pytest.Item) -> bool:
    """Whether ``SLOW`` lists ``item`` (tests/test_tier_guard.py checks that every entry names a test)."""
    names = SLOW.get(item.path.name)
    return (
        names is not None and isinstance(item, pytest.Function) and (not names or item.originalname in names)
    )


def shared_fixture_groups(items: list[pytest.Item]) -> dict[str, list[pytest.Item]]:
    """The tests of each file that share module- or class-scoped fixtures of the tests folder (a
    federation, a run), directly or through another test: under ``--dist loadgroup`` each group
    runs on one worker, which sets its fixtures up once; every other test goes to any worker."""
    groups: dict[str, list[pytest.Item]] = {}
    for path in dict.fromkeys(item.path for item in items):
        components: list[tuple[set[str], list[pytest.Item]]] = []
        for item in (item for item in items if item.path == path):
            names, members = set(shared_fixtures(item)), [item]
            if not names:
                continue
            for other in [c for c in components if c[0] & names]:
                components.remove(other)
                names |= other[0]
                members = other[1] + members
            components.append((names, members))
        for names, members in components:
            groups[f"{path.name}::{','.join(sorted(names))}"] = members
    return groups


def shared_fixtures(item: pytest.Item) -> list[str]:
    """The module- or class-scoped fixtures of the tests folder that ``item`` uses."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return []
    return [
        name
        for name, defs in info.name2fixturedefs.items()
        if defs[-1].scope in ("module", "class") and Path(inspect.getfile(defs[-1].func)).parent == TESTS
    ]


GUARD = pytest.StashKey[dict]()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Arm the guard for a fast-tier test (the smoke run aside) from before its fixtures start."""
    if item.get_closest_marker("fast") and not item.get_closest_marker("smoke"):
        item.stash[GUARD] = tier_guard.arm(item.nodeid)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Iterator[None]:
    """After the fixtures' teardown: a test error naming what a fast-tier test started."""
    saved = item.stash.get(GUARD, None)
    try:
        result = yield
    finally:
        started = tier_guard.disarm(saved) if saved is not None else []
    if started:
        raise tier_guard.ForbiddenProcess(tier_guard.refusal(item.nodeid, started))
    return result


def pytest_report_header(config: pytest.Config) -> str:
    return f"fuzz seed (tests/test_fuzz_inputs.py): HETFED_FUZZ_SEED={os.environ['HETFED_FUZZ_SEED']}"


def hetfed_cli(
    *args: str, timeout: float = 300, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """``hetfed <args>`` as a user types it (a fresh process in the repository), output captured."""
    return subprocess.run(
        [sys.executable, "-m", "hetfed.cli", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=timeout,
        env=env,
    )


def reproduce_quick(
    experiment: str, tmp_path: Path, workers: int = 1, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """``hetfed reproduce <experiment> --quick``: runs in ``tmp_path/runs``, reports in ``tmp_path/out``."""
    return hetfed_cli(
        "reproduce",
        experiment,
        "--quick",
        "--workers",
        str(workers),
        "--results-dir",
        str(tmp_path / "runs"),
        "--out",
        str(tmp_path / "out"),
        timeout=900,
        env=env,
    )
