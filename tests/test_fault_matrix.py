"""The fault matrix (issue 14): every engine x every fault ends in a clean continue or a clean stop.

Each cell asserts a completed run or a one-line error, the exit code, that every file written
before the fault is intact and, where the run is resumable, that ``hetfed run --resume`` reaches
the metrics of the same run never interrupted. :data:`CELLS` lists every cell with the test that
proves it: here, or an existing test (named, not repeated); a cell that does not apply says why
and names the test of the nearest fault. ``test_every_cell_is_listed_and_its_tests_exist`` keeps
the table honest.

The deployment cells share one federation (3 SuperNodes, ``hetfed federation up`` as a user types
it; SuperNode 2's silo file is bad) and run in file order: the killed-SuperLink cell starts a new
federation, the killed-client cell comes last.
"""

from __future__ import annotations

import ast
import csv
import http.server
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from hetfed.cli import main
from hetfed.engines.errors import SuperLinkUnreachable
from hetfed.engines.federation_info import FederationInfo
from hetfed.engines.flower import LocalFlower, free_port, processes_of
from hetfed.engines.inline import node_configs, run_inline
from tests.conftest import REPO, hetfed_cli
from tests.test_cli_faults import start_cli, wait_for_round
from tests.test_silo_data import RUN as ENERGY_RUN
from tests.test_silo_data import silo_files

ENGINES = ("inline", "simulation", "deployment")
FAULTS = ("SIGINT", "SIGTERM", "killed client", "killed SuperLink", "bad silo file", "corrupt checkpoint")

HERE = "tests/test_fault_matrix.py::"
CLI_FAULTS = "tests/test_cli_faults.py::"
SIGNAL_INLINE = (
    CLI_FAULTS + "test_a_signal_stops_an_inline_run_cleanly_and_resume_reaches_the_uninterrupted_metrics"
)
CORRUPT = HERE + "test_a_corrupt_checkpoint_is_one_line_naming_it_on_every_engine"


@dataclass(frozen=True)
class Cell:
    """The tests that prove one cell; ``note`` says why a cell does not apply as stated."""

    tests: tuple[str, ...]
    note: str = ""


CELLS: dict[tuple[str, str], Cell] = {
    ("inline", "SIGINT"): Cell((SIGNAL_INLINE,)),
    ("inline", "SIGTERM"): Cell((SIGNAL_INLINE,)),
    ("inline", "killed client"): Cell(
        (
            "tests/test_resume.py::test_a_fault_drill_node_fails_its_round_and_the_run_goes_on",
            "tests/test_pflsa.py::test_a_missing_agent_continues_with_its_last_update_and_equals_the_reference",
        ),
        "inline clients are no processes: a raising ClientApp (node config fail-round) is the fault",
    ),
    ("inline", "killed SuperLink"): Cell(
        ("tests/test_resume.py::test_a_resumed_run_ends_exactly_like_an_uninterrupted_one",),
        "no SuperLink: the fault is the server process dying mid-run, then resumed",
    ),
    ("inline", "bad silo file"): Cell(
        (
            HERE + "test_a_bad_silo_file_on_the_inline_engine",
            "tests/test_silo_data.py::test_a_bad_silo_is_left_out_and_the_run_goes_on",
        )
    ),
    ("inline", "corrupt checkpoint"): Cell(
        (CORRUPT, CLI_FAULTS + "test_damaged_checkpoints_and_missing_runs_are_one_line_naming_the_file")
    ),
    ("simulation", "SIGINT"): Cell(
        (
            CLI_FAULTS
            + "test_sigint_stops_a_simulation_run_cleanly_and_resume_reaches_the_uninterrupted_metrics",
        )
    ),
    ("simulation", "SIGTERM"): Cell(
        (HERE + "test_sigterm_stops_a_simulation_run_and_resume_reaches_the_metrics",)
    ),
    ("simulation", "killed client"): Cell(
        (HERE + "test_a_killed_client_on_the_deployment_engine",),
        "Flower's simulated nodes have no node config (no fault drill) and no process of their own",
    ),
    ("simulation", "killed SuperLink"): Cell(
        (HERE + "test_wait_run_notices_a_dead_superlink_within_30_s",),
        "the simulation SuperLink is the run's own process; `hetfed run` follows it with the same "
        "health check as a deployment run",
    ),
    ("simulation", "bad silo file"): Cell(
        (CLI_FAULTS + "test_every_argument_is_checked_before_anything_starts",),
        "Flower's simulated nodes hold no data path: --data-path is refused before anything starts",
    ),
    ("simulation", "corrupt checkpoint"): Cell((CORRUPT,)),
    ("deployment", "SIGINT"): Cell((HERE + "test_a_signal_stops_a_deployment_run_on_the_federation",)),
    ("deployment", "SIGTERM"): Cell((HERE + "test_a_signal_stops_a_deployment_run_on_the_federation",)),
    ("deployment", "killed client"): Cell(
        (
            HERE + "test_a_killed_client_on_the_deployment_engine",
            "tests/test_faults.py::test_a_killed_supernode_and_a_raising_clientapp_do_not_stop_the_run",
            "tests/test_warm_runtime.py::test_a_killed_worker_fails_only_its_task_and_the_restarted_worker"
            "_serves_the_next_round",
        )
    ),
    ("deployment", "killed SuperLink"): Cell(
        (
            HERE + "test_a_killed_superlink_is_noticed_the_federation_goes_down_whole_and_resume_completes",
            HERE + "test_a_deployment_run_on_a_dead_superlink_is_refused_in_one_line",
            HERE + "test_federation_down_ends_processes_outside_its_process_groups",
            "tests/test_faults.py::test_a_run_whose_superlink_died_resumes_to_the_uninterrupted_result",
        )
    ),
    ("deployment", "bad silo file"): Cell((HERE + "test_a_bad_silo_file_on_the_deployment_engine",)),
    ("deployment", "corrupt checkpoint"): Cell((CORRUPT,)),
}

# Small runs: 3 clients, 40 samples, 10 items; deployment runs long enough to be signalled mid-run
# (a warm 3-SuperNode round takes ~0.3 s on a quiet machine, a signal's `flwr stop` ~2 s: with 6
# rounds a run could complete before the stop landed).
KNAPSACK = {"n-train": 40, "n-test": 30, "num-items": 10, "local-epochs": 1, "fraction": 1.0, "seed": 3}
ROUNDS = 24


def sets(values: dict) -> list[str]:
    return [a for k, v in values.items() for a in ("--set", f"{k}={v}")]


def one_line(stderr: str, returncode: int, code: int) -> str:
    """The single ``hetfed:`` line of a stopped command (and no traceback)."""
    lines = [ln for ln in stderr.strip().splitlines() if ln.startswith("hetfed:") or "Traceback" in ln]
    assert returncode == code, stderr[-3000:]
    assert len(lines) == 1 and "Traceback" not in stderr, stderr[-3000:]
    return lines[0]


def read_json(path: Path) -> dict:
    return json.loads(path.read_text())


def rows(run_dir: Path) -> list[dict]:
    with open(run_dir / "rounds.csv", newline="") as f:
        return list(csv.DictReader(f))


def snapshot(run_dir: Path) -> dict[str, bytes]:
    """Every file of a run folder (to check that what was written before a fault is intact)."""
    return {p.name: p.read_bytes() for p in run_dir.iterdir() if p.is_file()}


def assert_prefix(before: list[dict], after: list[dict]) -> None:
    """The rows written before the fault are still the first rows (later rounds may add columns)."""
    assert before, "no rows before the fault"
    assert [{k: r[k] for k in before[0]} for r in after[: len(before)]] == before


def assert_same_metrics(
    got: dict, want: dict, rel: float = 1e-9, run_dir: Path | None = None, logs: Path | None = None
) -> None:
    # A client that failed a round changes the model legitimately: say so before comparing numbers,
    # with the failed rows, the segments (which one recorded them) and the Flower processes' error
    # lines (``logs``: a federation's folder) when given.
    failed = got.get("failed-rounds")
    if failed != want.get("failed-rounds"):
        why = [got.get("failed"), failed]
        if run_dir is not None:
            why += [r for r in rows(run_dir) if r["status"] != "ok"]
            why += (run_dir / "segments.jsonl").read_text().splitlines()
        for log in sorted(logs.glob("*.log")) if logs is not None else []:
            lines = log.read_text(errors="replace").splitlines()
            why += [f"{log.name}: {line}" for line in lines if "ERROR" in line or "Error:" in line][-20:]
        pytest.fail("\n".join(map(str, why)))
    assert got["clients"].keys() == want["clients"].keys()
    for client, metrics in want["clients"].items():
        for key, value in metrics.items():
            assert got["clients"][client][key] == pytest.approx(value, rel=rel), (client, key)


# --- the table ------------------------------------------------------------------------------------
def test_every_cell_is_listed_and_its_tests_exist() -> None:
    assert set(CELLS) == set(itertools.product(ENGINES, FAULTS))
    defined: dict[str, set[str]] = {}
    for cell in CELLS.values():
        assert cell.tests, cell
        for ref in cell.tests:
            path, name = ref.split("::")
            if path not in defined:
                tree = ast.parse((REPO / path).read_text())
                defined[path] = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
            assert name in defined[path], ref


def test_every_promise_of_the_faults_section_names_tests_that_exist() -> None:
    """docs/faults.md: every bullet names tests (``tests/x.py `test_a`, `test_b```)."""
    import re

    section = (REPO / "docs" / "faults.md").read_text().split("# Faults and recovery\n", 1)[1]
    paragraphs = re.split(r"\n(?=\* )", section.strip())
    assert len(paragraphs) > 8
    for text in paragraphs:
        path, named = None, []
        for match in re.finditer(r"(tests/test_\w+\.py)|`(test_\w+)`", text):
            if match[1]:
                path = match[1]
            else:
                assert path is not None, (match[2], text[:80])
                named.append(f"{path}::{match[2]}")
        assert named, f"a promise without a test: {text[:100]}"
        for ref in named:
            file, name = ref.split("::")
            tree = ast.parse((REPO / file).read_text())
            assert name in {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}, ref


# --- every engine -----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def stopped_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run that stopped after round 1 of 3 (every client failed round 2): resumable, checkpoint 1."""
    from hetfed.server.pool import FederationError

    root = tmp_path_factory.mktemp("stopped")
    cfg = {
        "strategy": "pflsa",
        "problem": "garnet",
        "num-rounds": 3,
        "results-dir": str(root),
        "run-name": "s",
    }
    with pytest.raises(FederationError):
        run_inline(cfg, node_configs(3, {"fail-round": 2}))
    return root / "s"


@pytest.mark.parametrize(
    ("engine", "damage"),
    [("inline", "empty"), ("simulation", "random"), ("deployment", "cut")],
)
def test_a_corrupt_checkpoint_is_one_line_naming_it_on_every_engine(
    stopped_run: Path, tmp_path: Path, engine: str, damage: str
) -> None:
    """``--resume`` reads the checkpoint before any engine starts: the same one line on each."""
    run_dir = tmp_path / f"{engine}-run"
    shutil.copytree(stopped_run, run_dir)
    config = read_json(run_dir / "config.json")
    launch = {"nodes": 3, "data-path": "", "timeout": 3600}
    if engine == "deployment":
        launch["federation-dir"] = str(tmp_path / "no-federation")
    config["config"].update(engine=engine, launch=json.dumps(launch))
    (run_dir / "config.json").write_text(json.dumps(config))
    checkpoint = run_dir / "checkpoint.pt"
    good = checkpoint.read_bytes()
    checkpoint.write_bytes({"empty": b"", "random": os.urandom(2048), "cut": good[: len(good) // 2]}[damage])
    before = snapshot(run_dir)
    out = hetfed_cli("run", "--resume", run_dir.name, "--results-dir", str(tmp_path), timeout=120)
    line = one_line(out.stderr, out.returncode, 2)
    assert f"checkpoint {checkpoint} is damaged" in line, line
    assert snapshot(run_dir) == before  # nothing written, nothing started


# --- inline -----------------------------------------------------------------------------------------
def test_a_bad_silo_file_on_the_inline_engine(tmp_path: Path) -> None:
    """``hetfed run --data-path``: a bad silo is left out while enough remain, else one line."""
    silo_files(tmp_path, {1: "nan"})
    args = ["run", "--nodes", "3", "--data-path", str(tmp_path / "silo-{partition}.csv")]
    args += ["--results-dir", str(tmp_path / "results")]
    out = hetfed_cli(*args, *sets({**ENERGY_RUN, "num-clients": 2, "run-name": "goes-on"}), timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    summary = read_json(tmp_path / "results" / "goes-on" / "summary.json")
    assert summary["status"] == "completed" and sorted(summary["clients"]) == ["zone_00", "zone_02"]
    assert "silo-1.csv row" in summary["failed"]["partition-1"]

    out = hetfed_cli(*args, *sets({**ENERGY_RUN, "run-name": "stops"}), timeout=300)  # needs all 3
    line = one_line(out.stderr, out.returncode, 2)
    assert "1 of 3 silos cannot load their data" in line and "the run needs 3: partition 1 of 3: " in line
    assert "silo-1.csv row" in line
    assert not (tmp_path / "results" / "stops").exists()  # refused before anything started


# --- deployment, without a federation ------------------------------------------------------------
class _Health(http.server.BaseHTTPRequestHandler):
    """A SuperLink whose /health answers and whose Control API hangs until ``released`` is set."""

    released = threading.Event()
    answered: list[float] = []  # when /health last answered

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        self.answered.append(time.time())  # before the answer: the watcher hears it later
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()

    def do_POST(self) -> None:  # noqa: N802
        self.released.wait(600)  # then closes without an answer

    def log_message(self, *args: object) -> None:
        pass


def test_wait_run_notices_a_dead_superlink_within_30_s(tmp_path: Path) -> None:
    """/health decides, also while a Control API call hangs (as on a dying SuperLink): one exception."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    flower = LocalFlower(tmp_path, link_port=server.server_address[1])
    ticks: list[float] = []
    died: list[float] = []

    def die() -> None:  # the SuperLink process is gone: its port refuses connections
        server.shutdown()
        server.server_close()
        died.append(time.time())
        _Health.released.set()

    threading.Timer(2.0, die).start()
    with pytest.raises(
        SuperLinkUnreachable, match=r"has not answered http://127\.0\.0\.1:\d+/health for 2\d s"
    ):
        flower.wait_run("7", timeout=3600, tick=lambda: ticks.append(time.time()))
    noticed = time.time()
    assert _Health.answered and 20 <= noticed - _Health.answered[-1] < 24  # 20 s of silence, no more
    assert noticed - died[0] < 30  # noticed within 30 s of its death, not an hour
    assert len(ticks) >= 8  # progress was still printed while it waited


def test_a_deployment_run_on_a_dead_superlink_is_refused_in_one_line(tmp_path: Path) -> None:
    fed = tmp_path / "fed"
    fed.mkdir()
    (fed / "federation.json").write_text(json.dumps({"link-port": free_port(), "nodes": 3, "pids": []}))
    started = time.time()
    out = hetfed_cli(
        "run", "--engine", "deployment", "--federation-dir", str(fed), "--results-dir", str(tmp_path / "r"),
        timeout=120,
    )  # fmt: skip
    assert "no SuperLink answers http://127.0.0.1:" in one_line(out.stderr, out.returncode, 2)
    assert time.time() - started < 30 and not (tmp_path / "r").exists()


FAKE_SERVERAPP = "import time\ntime.sleep(300)\n"


def test_federation_down_ends_processes_outside_its_process_groups(tmp_path: Path) -> None:
    """An orphaned ``flwr-serverapp`` (its own session, not in federation.json) does not survive ``down``."""
    from hetfed.engines.flower import flower_env

    fed = tmp_path / "fed"
    (fed / "flwr-home").mkdir(parents=True)
    env = flower_env(fed / "flwr-home")
    script = tmp_path / "flwr-serverapp"
    script.write_text(FAKE_SERVERAPP)
    group = subprocess.Popen(["sleep", "300"], env=env, start_new_session=True)  # a recorded group
    orphan = subprocess.Popen([sys.executable, str(script)], env=env, start_new_session=True)
    stranger = subprocess.Popen(["sleep", "300"], start_new_session=True)  # another FLWR_HOME: spared
    try:
        (fed / "federation.json").write_text(json.dumps({"link-port": 1, "nodes": 1, "pids": [group.pid]}))
        end = time.time() + 10
        while orphan.pid not in processes_of(fed / "flwr-home", program="flwr-serverapp"):
            assert time.time() < end
            time.sleep(0.1)
        out = hetfed_cli("federation", "down", "--dir", str(fed), timeout=120)
        assert out.returncode == 0, out.stderr
        assert "stopped 1 process groups and 1 other Flower processes" in out.stdout
        assert group.wait(timeout=10) is not None and orphan.wait(timeout=10) is not None
        assert processes_of(fed / "flwr-home") == [] and stranger.poll() is None
        assert not (fed / "federation.json").exists()
    finally:
        for proc in (group, orphan, stranger):
            proc.kill()
            proc.wait()


# --- simulation -------------------------------------------------------------------------------------
@pytest.mark.simulation
def test_sigterm_stops_a_simulation_run_and_resume_reaches_the_metrics(tmp_path: Path) -> None:
    cfg = {**KNAPSACK, "num-rounds": 12}  # simulation rounds are quick: still running at the signal
    whole = run_inline({**cfg, "results-dir": str(tmp_path / "inline"), "run-name": "whole"}, node_configs(3))
    proc = start_cli(
        "run", "--engine", "simulation", "--nodes", "3", "--results-dir", str(tmp_path),
        *sets({**cfg, "run-name": "sim"}),
    )  # fmt: skip
    run_dir = tmp_path / "sim"
    wait_for_round(run_dir, 1, proc, timeout=300)
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=120)
    assert "interrupted by SIGTERM" in one_line(stderr, proc.returncode, 143)
    summary = read_json(run_dir / "summary.json")
    assert summary["status"] == "interrupted" and summary["error"] == "stopped by SIGTERM"
    before, files = rows(run_dir), snapshot(run_dir)
    time.sleep(2)  # no Flower process is left writing into the run folder
    assert snapshot(run_dir) == files

    out = hetfed_cli("run", "--resume", "sim", "--results-dir", str(tmp_path), timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert_prefix(before, rows(run_dir))
    resumed = read_json(run_dir / "summary.json")
    assert [s["engine"] for s in resumed["segments"]] == ["simulation", "simulation"]
    assert_same_metrics(resumed, whole, rel=1e-6, run_dir=run_dir)


# --- deployment: one federation for the module ----------------------------------------------------
@dataclass
class Federation:
    """The module's federation: its folder, its data path, and the uninterrupted metrics."""

    root: Path
    data_path: str
    results: Path
    whole: dict

    def info(self) -> dict:
        return read_json(self.root / "federation.json")

    def home(self) -> Path:
        return self.root / "flwr-home"

    def up(self) -> None:
        out = hetfed_cli("federation", "up", "--nodes", "3", "--dir", str(self.root), "--data-path",
                         self.data_path, timeout=300)  # fmt: skip
        assert out.returncode == 0, out.stderr[-3000:]

    def run(self, name: str, **overrides: object) -> subprocess.Popen:
        """``hetfed run --engine deployment`` of the small knapsack run, in its own process."""
        return start_cli(
            "run", "--engine", "deployment", "--federation-dir", str(self.root), "--results-dir",
            str(self.results), *sets({**KNAPSACK, "num-rounds": ROUNDS, "run-name": name, **overrides}),
        )  # fmt: skip

    def resume(self, name: str) -> dict:
        out = hetfed_cli("run", "--resume", name, "--results-dir", str(self.results), timeout=600)
        assert out.returncode == 0, out.stderr[-3000:]
        return read_json(self.results / name / "summary.json")


@pytest.fixture(scope="module")
def federation(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Federation]:
    """``hetfed federation up --nodes 3``; SuperNode 2's silo file holds a NaN price (energy-pjm)."""
    root = tmp_path_factory.mktemp("matrix")
    silo_files(root, {2: "nan"})
    whole = run_inline(
        {**KNAPSACK, "num-rounds": ROUNDS, "results-dir": str(root / "inline"), "run-name": "whole"},
        node_configs(3),
    )
    fed = Federation(root / "fed", str(root / "silo-{partition}.csv"), root / "results", whole)
    fed.up()
    try:
        yield fed
    finally:
        if (fed.root / "federation.json").exists():
            hetfed_cli("federation", "down", "--dir", str(fed.root), timeout=120)


@pytest.mark.deployment
@pytest.mark.parametrize(("sig", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_stops_a_deployment_run_on_the_federation(
    federation: Federation, sig: int, code: int, capsys: pytest.CaptureFixture[str]
) -> None:
    """Ctrl-C / SIGTERM: ``flwr stop`` on the SuperLink, recorded interrupted, 130 / 143, resumable."""
    name = f"signal-{code}"
    proc = federation.run(name)
    run_dir = federation.results / name
    wait_for_round(run_dir, 1, proc, timeout=300)
    # While it runs, the silos' state of the run is in use: `federation state rm` refuses (in-process,
    # so the run is still going; a removed folder would be made again half filled, unnoticed).
    assert main(["federation", "state", "rm", "--dir", str(federation.root), "--run", name]) == 2
    (refused,) = capsys.readouterr().err.strip().splitlines()
    assert f"--run {name}: run {name} is running on the federation in {federation.root}" in refused
    started = time.time()
    proc.send_signal(sig)
    stdout, stderr = proc.communicate(timeout=120)
    line = one_line(stderr, proc.returncode, code)
    # Not a timeout: the designed worst case is `flwr stop` (15 s) plus the wait for the ServerApp to
    # close its segment (30 s); under CI's load (3 test workers on 2 cores) a stop took 37 s.
    assert time.time() - started < 60, line
    assert f"interrupted by {signal.Signals(sig).name} after round" in line and f"--resume {name}" in line
    run_id = stdout.split("submitted run ")[1].split()[0]
    flower = FederationInfo.load(federation.root).flower()
    assert flower.run_status(run_id) == "finished:stopped"  # stopped on the federation, not only here
    summary = read_json(run_dir / "summary.json")
    assert summary["status"] == "interrupted" and summary["engine"] == "deployment", summary
    before, files = rows(run_dir), snapshot(run_dir)
    end = time.time() + 30
    while processes_of(federation.home(), program="flwr-serverapp"):  # the ServerApp exits
        assert time.time() < end, "the stopped run's ServerApp is still running"
        time.sleep(0.5)
    assert snapshot(run_dir) == files  # nothing writes into the folder any more

    resumed = federation.resume(name)
    assert_prefix(before, rows(run_dir))
    assert [s["status"] for s in resumed["segments"]] == ["interrupted", "completed"]
    assert_same_metrics(resumed, federation.whole, run_dir=run_dir, logs=federation.root)


@pytest.mark.deployment
def test_a_bad_silo_file_on_the_deployment_engine(federation: Federation) -> None:
    """SuperNode 2's file: left out with its reason while 2 clients suffice, else one line at once."""
    energy = {k: v for k, v in ENERGY_RUN.items() if k != "problem"}
    base = ["run", "--engine", "deployment", "--federation-dir", str(federation.root)]
    base += ["--results-dir", str(federation.results), "--set", "problem=energy-pjm"]
    out = hetfed_cli(*base, *sets({**energy, "num-clients": 2, "run-name": "silo-ok"}), timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    summary = read_json(federation.results / "silo-ok" / "summary.json")
    assert summary["status"] == "completed" and sorted(summary["clients"]) == ["zone_00", "zone_01"]
    assert "silo-2.csv row" in summary["failed"]["partition-2"]

    started = time.time()
    out = hetfed_cli(*base, *sets({**energy, "run-name": "silo-stop"}), timeout=600)
    line = one_line(out.stderr, out.returncode, 2)
    assert "only 2 of 3 required clients are usable" in line and "partition-2: " in line, line
    assert time.time() - started < 120  # no node-wait-timeout wait
    assert read_json(federation.results / "silo-stop" / "summary.json")["status"] == "failed"


@pytest.mark.deployment
def test_a_killed_superlink_is_noticed_the_federation_goes_down_whole_and_resume_completes(
    federation: Federation,
) -> None:
    """Within 30 s one line and exit 1; ``down`` ends the orphaned ServerApp too; resume completes.

    It leaves a new federation (3 SuperNodes) behind.
    """
    proc = federation.run("link-killed")
    run_dir = federation.results / "link-killed"
    wait_for_round(run_dir, 1, proc, timeout=300)
    assert processes_of(federation.home(), program="flwr-serverapp")  # the run's ServerApp
    os.killpg(federation.info()["pids"][0], signal.SIGKILL)  # the SuperLink host dies
    killed = time.time()
    orphans = processes_of(federation.home(), program="flwr-serverapp")
    assert orphans, "the ServerApp died with the SuperLink: nothing to orphan"
    out = hetfed_cli("federation", "down", "--dir", str(federation.root), timeout=120)
    assert out.returncode == 0, out.stderr
    assert processes_of(federation.home()) == []  # every process it started, the ServerApp included

    stdout, stderr = proc.communicate(timeout=120)
    line = one_line(stderr, proc.returncode, 1)
    assert time.time() - killed < 30, line
    assert "has not answered" in line and "hetfed run --resume link-killed" in line, line
    summary = read_json(run_dir / "summary.json")
    assert summary["status"] == "interrupted" and summary["error"], summary
    before = rows(run_dir)

    federation.up()
    resumed = federation.resume("link-killed")
    assert_prefix(before, rows(run_dir))
    assert_same_metrics(resumed, federation.whole, run_dir=run_dir, logs=federation.root)


@pytest.mark.deployment
def test_a_wiped_state_dir_after_a_restart_is_one_recorded_line_on_the_deployment_engine(
    federation: Federation,
) -> None:
    """The issue-29 drill: Ditto (every silo keeps a personal model), SIGTERM after round 3,
    ``federation down``, node 1's state dir emptied, ``up``, ``--resume``: the run completes and
    says so once, in client-01's row and in summary.json; the other clients equal the uninterrupted
    run (inline), and client-01's federated metrics too (Ditto's rule restarts only its own model)."""
    ditto = {"strategy": "fedrspo", "loss": "spo+", "ditto-mu": 0.1, "personal-rounds": 0}
    ditto["num-rounds"] = ROUNDS
    whole = run_inline(
        {**KNAPSACK, **ditto, "results-dir": str(federation.results / "inline"), "run-name": "ditto"},
        node_configs(3),
    )
    proc = federation.run("ditto-wiped", **ditto)
    run_dir = federation.results / "ditto-wiped"
    wait_for_round(run_dir, 3, proc, timeout=300)
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=120)
    out = hetfed_cli("federation", "down", "--dir", str(federation.root), timeout=120)
    assert out.returncode == 0, out.stderr
    shutil.rmtree(federation.root / "state" / "node-1")
    federation.up()
    resumed = federation.resume("ditto-wiped")
    first = resumed["segments"][-1]["first-round"]
    lost = [r for r in rows(run_dir) if r["error"].startswith("client state lost")]
    assert [(r["round"], r["client"], r["status"]) for r in lost] == [(str(first), "client-01", "ok")]
    assert resumed["status"] == "completed" and resumed["state-lost"] == {"client-01": [first]}
    for name, metrics in whole["clients"].items():
        for key, value in metrics.items():
            if name != "client-01" or key.startswith("fed-"):
                assert resumed["clients"][name][key] == pytest.approx(value, rel=1e-6), (name, key)


@pytest.mark.deployment
def test_a_killed_client_on_the_deployment_engine(federation: Federation) -> None:
    """A SuperNode killed mid-run: the run goes on with the others and completes (exit 0).

    Runs last: the federation is left with 2 SuperNodes.
    """
    proc = federation.run("client-killed")
    run_dir = federation.results / "client-killed"
    wait_for_round(run_dir, 1, proc, timeout=300)
    before = rows(run_dir)
    os.killpg(federation.info()["pids"][3], signal.SIGKILL)  # SuperNode 2 (pids: SuperLink, nodes 0-2)
    stdout, stderr = proc.communicate(timeout=600)
    assert proc.returncode == 0, stderr[-3000:]
    assert_prefix(before, rows(run_dir))
    summary = read_json(run_dir / "summary.json")
    assert summary["status"] == "completed" and "client-02" in summary["failed"]
