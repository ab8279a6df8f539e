"""Real Flower processes on 127.0.0.1: a SuperLink and 3 SuperNodes, each with its own partition."""

from __future__ import annotations

import csv
import json
import os
import re
import subprocess
import threading
import time
from pathlib import Path

import pytest

from hetfed.engines.errors import FlowerProcessError
from hetfed.engines.flower import STARTUP_BATCH, _group_alive, nodes_timeout, processes_of
from hetfed.engines.inline import node_configs, run_inline
from hetfed.engines.runner import prepare
from tests.conftest import REPO, hetfed_cli
from tests.test_cli_faults import start_cli

pytestmark = pytest.mark.deployment

FAST = {
    "num-rounds": 2,
    "n-train": 40,
    "n-test": 30,
    "local-epochs": 1,
    "num-items": 10,
    "round-timeout": 300.0,
}


def submit(deployment, tmp_path: Path, **overrides) -> tuple[str, dict, str]:
    """Submit with `flwr run`, wait for the end; return (status, summary.json, ServerApp log)."""
    cfg = prepare({**FAST, **overrides}, "deployment", tmp_path)
    run_id = deployment.submit(REPO, cfg)
    status = deployment.wait_run(run_id, timeout=900)
    summary = json.loads((tmp_path / cfg["run-name"] / "summary.json").read_text())
    return status, summary, deployment.run_log(run_id)


@pytest.mark.smoke  # the fast tier's one real federation (make test)
def test_two_rounds_complete_and_only_weights_and_scalars_cross_the_wire(deployment, tmp_path: Path) -> None:
    status, summary, log = submit(deployment, tmp_path, **{"audit-traffic": True, "run-name": "deploy"})
    # `flwr run` exits 0 even for failed runs: the status comes from `flwr ls`.
    assert status == "finished:completed", log[-3000:]
    assert summary["status"] == "completed"
    assert sorted(summary["clients"]) == ["client-00", "client-01", "client-02"]
    assert 0 < summary["aggregate"]["fed-relative-regret"] < 1
    assert (tmp_path / "deploy" / "rounds.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"  # test_plots.py
    shapes = ([64, 8], [64], [10, 64], [10])
    lines = (tmp_path / "deploy" / "traffic.jsonl").read_text().splitlines()
    assert len(lines) == 2 * 2 + 3  # 2 rounds x ceil(0.4 * 3) train replies + 3 evaluations
    for entry in map(json.loads, lines):
        assert all(shape in shapes for shape in entry["arrays"].values()), entry
        assert all(kind in ("int", "float") for kind in entry["metrics"].values()), entry


def test_fewer_nodes_than_required_fails_with_a_clear_error(deployment, tmp_path: Path) -> None:
    status, summary, log = submit(
        deployment, tmp_path, **{"num-clients": 4, "node-wait-timeout": 3.0, "run-name": "few"}
    )
    assert status == "finished:failed"
    assert summary["status"] == "failed"
    assert "only 3 of 4 required clients connected" in summary["error"]
    assert "only 3 of 4 required clients connected" in log
    assert (tmp_path / "few" / "config.json").exists()


def test_federation_up_and_down_leave_no_process_behind(tmp_path: Path) -> None:
    root = tmp_path / "fed"
    up = hetfed_cli("federation", "up", "--nodes", "2", "--dir", str(root), timeout=300)
    assert up.returncode == 0, up.stderr
    assert "2 SuperNodes online" in up.stdout
    pids = json.loads((root / "federation.json").read_text())["pids"]
    assert len(pids) == 3 and all(_group_alive(p) for p in pids)
    # A local federation's SuperLink keeps its state in memory (the fast default): no state.db.
    argv = Path(f"/proc/{pids[0]}/cmdline").read_bytes().decode().split("\0")
    assert argv[argv.index("--database") + 1] == ":flwr-in-memory:" and not (root / "state.db").exists()
    assert "SuperLink state in memory" in up.stdout
    status = hetfed_cli("federation", "status", "--dir", str(root), timeout=120)
    assert "2 of 2 SuperNodes online" in status.stdout
    # The same SuperLink through a named flwr connection (as a compose deployment is asked).
    home = ["--connection", "hetfed", "--flwr-home", str(root / "flwr-home")]
    status = hetfed_cli("federation", "status", *home, "--wait", "2", timeout=120)
    assert status.returncode == 0 and "; 2 SuperNodes online" in status.stdout, status.stderr
    status = hetfed_cli("federation", "status", *home, "--wait", "3", "--timeout", "3", timeout=120)
    assert status.returncode == 1 and status.stderr.strip().splitlines() == [
        "hetfed: only 2 of 3 SuperNodes came online within 3 s"
    ]
    down = hetfed_cli("federation", "down", "--dir", str(root), timeout=120)
    assert down.returncode == 0, down.stderr
    assert not any(_group_alive(p) for p in pids)
    again = hetfed_cli("federation", "down", "--dir", str(root), timeout=60)
    assert again.returncode == 2 and "no local federation is running" in again.stderr


class FlwrChildren:
    """The ``flwr`` CLI processes a process starts, seen by polling /proc every 20 ms (one lives
    ~1 s: its imports alone take ~0.8 s of CPU). ``commands``: each one's subcommand, in order."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.proc, self.seen, self.commands = proc, set[int](), list[str]()
        self.thread = threading.Thread(target=self._watch, daemon=True)
        self.thread.start()

    def _watch(self) -> None:
        while self.proc.poll() is None:
            for stat in Path("/proc").glob("[0-9]*/stat"):
                try:
                    ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
                    argv = (stat.parent / "cmdline").read_bytes().decode(errors="replace").split("\0")
                except (OSError, IndexError, ValueError):
                    continue
                pid = int(stat.parent.name)
                if ppid != self.proc.pid or pid in self.seen:
                    continue
                self.seen.add(pid)
                flwr = [i for i, a in enumerate(argv[:2]) if Path(a).name == "flwr"]
                if flwr:
                    self.commands.append(argv[flwr[0] + 1] if len(argv) > flwr[0] + 1 else "")
            time.sleep(0.02)


def _started(pid: int) -> float:
    """When process ``pid`` started, in seconds since boot."""
    ticks = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    return ticks / os.sysconf("SC_CLK_TCK")


def test_a_watched_run_starts_no_flwr_process(tmp_path: Path) -> None:
    """``hetfed run`` follows a deployment run (and ``federation status`` counts SuperNodes) through
    the Control API in its own process: the only ``flwr`` process is the submission (``flwr run``).
    ``up`` started at most STARTUP_BATCH SuperNodes at once, the next one once one before was online."""
    root, nodes = tmp_path / "fed", STARTUP_BATCH + 1
    up = hetfed_cli(
        "federation", "up", "--nodes", str(nodes), "--dir", str(root), "--timeout", "300", timeout=400
    )
    assert up.returncode == 0, up.stderr
    try:
        pids = json.loads((root / "federation.json").read_text())["pids"]  # SuperLink, SuperNode 0, 1, ...
        first, second = [_started(p) for p in pids[1 : STARTUP_BATCH + 1]], _started(pids[-1])
        assert max(first) - min(first) < 1 and second - max(first) > 1  # coming online takes seconds
        status = start_cli("federation", "status", "--dir", str(root), "--wait", str(nodes))
        status_children = FlwrChildren(status)
        assert f"{nodes} of {nodes} SuperNodes online" in status.communicate(timeout=120)[0]
        status_children.thread.join()
        assert status_children.commands == []

        sets = {**FAST, "num-rounds": 6, "num-clients": 2, "run-name": "watched"}
        run = start_cli(
            "run", "--engine", "deployment", "--federation-dir", str(root), "--results-dir",
            str(tmp_path / "results"), *(a for k, v in sets.items() for a in ("--set", f"{k}={v}")),
        )  # fmt: skip
        children = FlwrChildren(run)
        stdout, stderr = run.communicate(timeout=600)
        children.thread.join()
        assert run.returncode == 0, stderr[-3000:]
        # The watch lasted long enough for the old poll (a `flwr ls` every 1-2 s) to start several.
        summary = json.loads((tmp_path / "results" / "watched" / "summary.json").read_text())
        assert summary["status"] == "completed" and summary["wall-time-s"] > 5, summary
        assert children.commands == ["run"], children.commands  # seen: the submission; nothing while watched
    finally:
        hetfed_cli("federation", "down", "--dir", str(root), timeout=120)


def test_an_up_whose_supernodes_do_not_come_online_in_time_says_how_many_did(tmp_path: Path) -> None:
    """One line with the count and the logs, exit 2, nothing left running; the default wait grows with
    --nodes."""
    root = tmp_path / "fed"
    out = hetfed_cli("federation", "up", "--nodes", "3", "--dir", str(root), "--timeout", "0.5", timeout=300)
    line = [ln for ln in out.stderr.splitlines() if ln.startswith("hetfed:")]
    assert out.returncode == 2 and len(line) == 1 and "Traceback" not in out.stderr, out.stderr
    found = re.search(r"only (\d) of 3 SuperNodes came online: within 0\.5 s; their logs: (\S+)", line[0])
    assert found and int(found[1]) < 3 and Path(found[2].replace("<i>", "0")).is_file(), line
    assert not (root / "federation.json").exists() and not processes_of(root / "flwr-home")
    assert nodes_timeout(16) == 110 and nodes_timeout(64) == 350  # as `up --help` says
    help_text = " ".join(hetfed_cli("federation", "up", "--help").stdout.split())
    assert "30 + 5 per SuperNode (110 for 16)" in help_text


def test_waiting_for_more_nodes_than_are_online_counts_them(deployment) -> None:
    """The count in the give-up line is the SuperLink's: the module's federation has 3 online."""
    with pytest.raises(FlowerProcessError, match=r"^only 3 of 4 SuperNodes came online: within 2 s; "):
        deployment.wait_for_nodes(4, timeout=2)


def test_a_node_with_a_missing_data_path_is_refused_before_start(tmp_path: Path) -> None:
    out = hetfed_cli(
        "federation",
        "up",
        "--nodes",
        "2",
        "--dir",
        str(tmp_path / "f"),
        "--data-path",
        str(tmp_path / "silo-{partition}"),
        timeout=300,
    )
    assert out.returncode == 2
    assert "silo-0 does not exist (partition 0, 1 of 2)" in out.stderr
    assert not (tmp_path / "f" / "federation.json").exists()


def test_fedrspo_protocol_on_real_supernodes(deployment, tmp_path: Path) -> None:
    """Calibration, 2 warm-start rounds and personalization; per-client results for both models."""
    status, summary, log = submit(
        deployment, tmp_path, strategy="fedrspo", loss="rspo+", **{"personal-rounds": 3, "run-name": "rspo"}
    )
    assert status == "finished:completed", log[-3000:]
    assert sorted(summary["clients"]) == ["client-00", "client-01", "client-02"]
    for metrics in summary["clients"].values():
        assert 0 <= metrics["fed-relative-regret"] < 1 and 0 <= metrics["per-relative-regret"] < 1
    with open(tmp_path / "rspo" / "rounds.csv", newline="") as f:
        exchanges = [(r["round"], r["exchange"]) for r in csv.DictReader(f) if r["client"] != "server"]
    assert exchanges.count(("0", "query.calibrate")) == 3
    assert exchanges.count(("3", "train.personalize")) == 3 and exchanges.count(("3", "evaluate")) == 3
    assert "personalization on 3 clients" in log


def test_shared_calibration_is_masked_across_real_supernodes_and_matches_inline(
    deployment, tmp_path: Path
) -> None:
    """The masked mean needs each node's key pair to survive from one message to the next (its
    ClientApp state); the run then equals the inline one, whose mean is checked in test_fedrspo."""
    shared = {"strategy": "fedrspo", "loss": "rspo+", "personal-rounds": 0, "per-client-calibration": False}
    status, summary, log = submit(deployment, tmp_path, **shared, **{"run-name": "shared"})
    assert status == "finished:completed", log[-3000:]
    with open(tmp_path / "shared" / "rounds.csv", newline="") as f:
        exchanges = [(r["exchange"], r["status"]) for r in csv.DictReader(f) if r["client"] != "server"]
    assert exchanges.count(("query.masked_calibration", "ok")) == 3
    cfg = {**FAST, **shared, "results-dir": str(tmp_path / "inline"), "run-name": "i"}
    inline = run_inline(cfg, node_configs(3))
    assert summary["clients"].keys() == inline["clients"].keys()
    for name, metrics in inline["clients"].items():
        for key, value in metrics.items():
            assert summary["clients"][name][key] == pytest.approx(value, rel=1e-9), (name, key)


def test_free_ports_lie_below_the_ephemeral_range_and_are_not_handed_out_twice(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An outgoing connection takes its port from the kernel's ephemeral range; a SuperNode whose
    Runtime API port was taken that way between free_port() and its bind failed to start in CI."""
    import socket

    from hetfed.engines import flower

    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    ports = [flower.free_port() for _ in range(200)]
    assert len(set(ports)) == len(ports)
    assert all(flower.LISTEN_PORTS_FROM <= p < low for p in ports), (low, ports[:5])
    held = flower.LISTEN_PORTS_FROM + 10
    with socket.socket() as listener:  # a port a server holds is skipped
        listener.bind(("127.0.0.1", held))
        listener.listen()
        monkeypatch.setattr(flower, "_next_port", held)
        assert flower.free_port() == held + 1
