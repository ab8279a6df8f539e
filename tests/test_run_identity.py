"""Client state is bound to its run: a reused run name starts fresh, lost state is one recorded line
and the method's rule, a resume with intact state equals the uninterrupted run (issue 29)."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import pytest
from flwr.common.constant import SUPERLINK_NODE_ID
from flwr.supercore.task_identity import TaskIdentity

from hetfed.client.app import app as client_app
from hetfed.client.state import list_states
from hetfed.engines.inline import node_configs, run_inline
from hetfed.server.app import run_server
from hetfed.strategies.base import FederationError
from tests.test_resume import DyingGrid

# FedRSPO+ with Ditto: every client keeps a personal model across rounds (client state).
DITTO = {
    "strategy": "fedrspo",
    "loss": "spo+",
    "ditto-mu": 0.1,
    "personal-rounds": 0,
    "num-rounds": 5,
    "fraction": 1.0,
    "n-train": 40,
    "n-test": 30,
    "num-items": 10,
    "local-epochs": 1,
    "seed": 7,
}


def state_configs(root: Path, nodes: int = 3) -> list[dict]:
    return node_configs(nodes, {"state-dir": str(root / "{partition}")})


def with_state_dirs(configs: list[dict]) -> list[dict]:
    return [
        {**c, "state-dir": c["state-dir"].replace("{partition}", str(c["partition-id"]))} for c in configs
    ]


def rows(folder: Path) -> list[dict[str, str]]:
    with open(folder / "rounds.csv", newline="") as f:
        return list(csv.DictReader(f))


def test_a_reused_run_name_starts_fresh(tmp_path: Path) -> None:
    """The issue's drill: run X (seed 7), drop its results, run X again (seed 42) on the same silos'
    state dirs: it equals the same config under a fresh name on empty state dirs."""
    states = tmp_path / "state"
    first = {**DITTO, "results-dir": str(tmp_path / "a"), "run-name": "X"}
    run_inline(first, with_state_dirs(state_configs(states)))
    again = run_inline(
        {**first, "seed": 42, "results-dir": str(tmp_path / "b")}, with_state_dirs(state_configs(states))
    )
    fresh = run_inline(
        {**first, "seed": 42, "results-dir": str(tmp_path / "c"), "run-name": "Y"},
        with_state_dirs(state_configs(tmp_path / "empty")),
    )
    assert again["status"] == "completed" and again["clients"] == fresh["clients"]
    listed = list_states(states / "0")
    assert [s.run_name for s in listed] == ["X", "X"] and len({s.run_id for s in listed}) == 2
    ids = {json.loads((tmp_path / d / "X" / "config.json").read_text())["run-id"] for d in "ab"}
    assert ids == {s.run_id for s in listed}
    assert all(r["error"] == "" for r in rows(tmp_path / "b" / "X") if r["status"] == "ok")


@pytest.mark.parametrize("wipe", [False, True])
def test_a_resume_reads_its_own_state_and_a_wiped_state_is_one_recorded_line(
    tmp_path: Path, wipe: bool
) -> None:
    """A SuperLink crash in round 3, fresh node processes, the same state dirs (or partition 1's
    emptied): intact state resumes bit for bit; lost state is said in the log and in partition 1's
    row of every exchange that expected it, and Ditto's rule (docs/user-guide.md "Client state") restarts its
    personal model from the federated model: its fed-* metrics stay those of the whole run."""
    whole = run_inline(
        {**DITTO, "results-dir": str(tmp_path), "run-name": "whole"},
        with_state_dirs(state_configs(tmp_path / "whole-state")),
    )
    cfg = {**DITTO, "results-dir": str(tmp_path), "run-name": "crash"}
    configs = with_state_dirs(state_configs(tmp_path / "state"))
    grid = DyingGrid(client_app, configs, cfg, die_at=5)  # dies in round 3
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, SUPERLINK_NODE_ID, 1
    with pytest.raises(ConnectionError):
        run_server(grid, cfg)
    if wipe:
        shutil.rmtree(tmp_path / "state" / "1")
    resumed = run_inline({**cfg, "resume": True}, with_state_dirs(state_configs(tmp_path / "state")))
    assert resumed["status"] == "completed"
    lost = [r for r in rows(tmp_path / "crash") if r["error"].startswith("client state lost")]
    if not wipe:
        assert resumed["clients"] == whole["clients"] and lost == []
        return
    first = resumed["segments"][-1]["first-round"]  # the round after the last checkpoint
    assert {r["client"] for r in lost} == {"client-01"} and lost[0]["round"] == str(first)
    assert lost[0]["status"] == "ok" and "partition 1 holds no state of run crash" in lost[0]["error"]
    assert len(lost) == 1  # from then on the client holds state again
    assert resumed["state-lost"] == {"client-01": [first]}
    for name, metrics in resumed["clients"].items():
        if name != "client-01":
            assert metrics == whole["clients"][name]
        else:
            assert {k: v for k, v in metrics.items() if k.startswith("fed-")} == {
                k: v for k, v in whole["clients"][name].items() if k.startswith("fed-")
            }
            assert metrics["per-relative-regret"] != whole["clients"][name]["per-relative-regret"]


def test_a_run_in_which_every_client_failed_is_failed(tmp_path: Path) -> None:
    """Every client fails the final evaluation (a fault drill: personalization is round 4, so is the
    evaluation); the run once ended `completed` with clients-reporting = 0."""
    cfg = {**DITTO, "ditto-mu": 0.0, "personal-rounds": 2, "num-rounds": 3}
    cfg.update({"results-dir": str(tmp_path), "run-name": "all-failed"})
    drill = {"fail-round": 4, "drill-exchange": "evaluate"}
    with pytest.raises(FederationError, match=r"^no client reported in the final evaluation \(client-00: "):
        run_inline(cfg, node_configs(3, drill))
    summary = json.loads((tmp_path / "all-failed" / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["error"].startswith("NoUsableClient: no client reported")
    assert sorted(summary["failed"]) == ["client-00", "client-01", "client-02"]
    assert all("fault drill: partition" in why for why in summary["failed"].values())
    assert summary["failed-rounds"] == {"client-00": [4], "client-01": [4], "client-02": [4]}


def test_a_state_dir_that_is_a_file_leaves_its_silo_out_at_discovery(tmp_path: Path) -> None:
    """Every silo's state-dir is a file: its ledger (client/ledger.py) cannot be written, so not even
    its discovery reply leaves, and the run fails at once naming the ledger (it used to fail later,
    where the client kept state)."""
    (tmp_path / "file").write_text("not a folder")
    cfg = {**DITTO, "results-dir": str(tmp_path), "run-name": "no-state"}
    with pytest.raises(FederationError, match=r"^only 0 of \? required clients are usable, 3 left out"):
        run_inline(cfg, node_configs(3, {"state-dir": str(tmp_path / "file")}))
    summary = json.loads((tmp_path / "no-state" / "summary.json").read_text())
    assert (
        summary["status"] == "failed" and f"ledger {tmp_path / 'file' / 'ledger.jsonl'}" in summary["error"]
    )


def test_federation_state_lists_and_removes_one_runs_state(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two silos' state dirs holding two runs named X and one run Y: `ls` shows each folder with its
    size, `rm --run X.<id>` removes that run's folders on every silo and nothing else."""
    import numpy as np
    from flwr.app import Context, RecordDict

    from hetfed.cli import main
    from hetfed.client.state import ClientState, run_key

    dirs = [tmp_path / "silo-0", tmp_path / "silo-1"]
    for pid, folder in enumerate(dirs):
        for name, run_id, size in (("X", "aaaa", 10), ("X", "bbbb", 20), ("Y", "cccc", 30)):
            ctx = Context(run_id=1, node_id=pid, node_config={}, state=RecordDict(), run_config={})
            about = {"run-name": name, "run-id": run_id, "partition-id": pid}
            ClientState(ctx, run_key(name, run_id, pid), folder, about).set_arrays("m", {"w": np.zeros(size)})
    flags = [arg for d in dirs for arg in ("--state-dir", str(d))]
    assert main(["federation", "state", "ls", *flags]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 7 and lines[-1].startswith("6 state folders of 3 runs, ")
    sizes = {(s.key, s.partition_id): s.size for d in dirs for s in list_states(d)}
    assert lines[0].split()[:3] == ["X.aaaa", "partition", "0"] and str(dirs[0] / "X.aaaa-p0") in lines[0]
    assert sizes[("X.aaaa", 0)] < sizes[("X.bbbb", 0)] < sizes[("Y.cccc", 0)]  # 80, 160, 240 bytes of floats
    assert main(["federation", "state", "rm", "--run", "X.aaaa", *flags]) == 0
    assert (
        capsys.readouterr().out.strip().splitlines()[-1].startswith("removed 2 state folders of run X.aaaa")
    )
    assert sorted((s.key, s.partition_id) for d in dirs for s in list_states(d)) == [
        ("X.bbbb", 0), ("X.bbbb", 1), ("Y.cccc", 0), ("Y.cccc", 1)
    ]  # fmt: skip
    assert main(["federation", "state", "rm", "--run", "Z", *flags]) == 2
    assert "--run Z: no state of that run in " in capsys.readouterr().err
