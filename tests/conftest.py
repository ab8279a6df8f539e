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
import tier_guard

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
    """nginx for the SuperLink host's reverse proxy (hetfed.proxy), or :func:`cannot_run`."""
    from hetfed.proxy import find_nginx

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


@pytest.hookimpl(tryfirst=True)  # before -m selects
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every fast-tier test ``fast``; the ``deployment`` fixture makes a test ``deployment``."""
    smoke = [item.nodeid for item in items if item.get_closest_marker("smoke")]
    if len(smoke) > 1:
        raise pytest.UsageError(f"one smoke run in the fast tier, not {len(smoke)}: {', '.join(smoke)}")
    for item in items:
        if "deployment" in getattr(item, "fixturenames", ()):
            item.add_marker("deployment")
        if item.get_closest_marker("smoke") or not any(item.get_closest_marker(m) for m in FULL_TIER):
            item.add_marker("fast")
        if shared := shared_fixtures(item):
            item.add_marker(pytest.mark.xdist_group(f"{item.path.name}::{','.join(shared)}"))
    if config.getoption("dist", "no") != "no":
        # xdist hands out the groups (largest first), then single tests in this order: the full
        # tier's and the smoke run first, so no long test starts last and runs alone at the end.
        items.sort(key=lambda item: item.get_closest_marker("fast") and not item.get_closest_marker("smoke"))


def shared_fixtures(item: pytest.Item) -> list[str]:
    """The module- or class-scoped fixtures of the tests folder that ``item`` uses (a federation, a
    run): under ``--dist loadgroup`` the tests sharing one run on one worker, set up once."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return []
    return sorted(
        name
        for name, defs in info.name2fixturedefs.items()
        if defs[-1].scope in ("module", "class") and Path(inspect.getfile(defs[-1].func)).parent == TESTS
    )


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
