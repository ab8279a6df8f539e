"""Faults against real processes: a SuperNode killed mid-run, a raising ClientApp, a dead SuperLink."""

from __future__ import annotations

import csv
import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hetfed.engines.flower import LocalFlower, end_processes_of
from hetfed.engines.inline import node_configs, run_inline
from hetfed.engines.runner import prepare
from hetfed.federation import node_config
from tests.conftest import REPO

pytestmark = pytest.mark.deployment

CFG = {"n-train": 40, "n-test": 30, "local-epochs": 1, "num-items": 10, "fraction": 1.0, "seed": 2}


@pytest.fixture
def flower(tmp_path: Path) -> Iterator[LocalFlower]:
    """A SuperLink and 3 SuperNodes; SuperNode 1 rehearses a fault in round 2.

    The SuperLink keeps its state in a file: the restarted one must know the SuperNodes.
    """
    flower = LocalFlower(tmp_path / "fed", state="file")
    try:
        flower.start_superlink(cwd=REPO)
        for i in range(3):
            cfg = node_config(i, 3, flower.root, None, None)
            flower.start_supernode(i, {**cfg, "fail-round": 2} if i == 1 else cfg)
        flower.wait_for_nodes(3)
        yield flower
    finally:
        flower.stop()


def wait_for_round(run_dir: Path, server_round: int, timeout: float = 600) -> None:
    end = time.time() + timeout
    while time.time() < end:
        try:
            if json.loads((run_dir / "progress.json").read_text())["round"] >= server_round:
                return
        except (OSError, json.JSONDecodeError, KeyError):
            pass
        time.sleep(0.3)
    raise TimeoutError(f"round {server_round} not reached")


def read_rows(run_dir: Path) -> list[dict]:
    with open(run_dir / "rounds.csv", newline="") as f:
        return list(csv.DictReader(f))


def test_a_killed_supernode_and_a_raising_clientapp_do_not_stop_the_run(
    flower: LocalFlower, tmp_path: Path
) -> None:
    cfg = prepare({**CFG, "num-rounds": 3, "run-name": "faults"}, "deployment", tmp_path)
    run_id = flower.submit(REPO, cfg)
    run_dir = tmp_path / "faults"
    wait_for_round(run_dir, 1)
    before = read_rows(run_dir)
    os.killpg(flower.processes["supernode-2"].pid, signal.SIGKILL)  # a silo crashes
    assert flower.wait_run(run_id, timeout=900) == "finished:completed"

    rows = read_rows(run_dir)
    assert [{k: r[k] for k in before[0]} for r in rows[: len(before)]] == before  # nothing lost
    failed = {(r["round"], r["client"]): r["error"] for r in rows if r["status"] == "failed"}
    assert "fault drill" in failed[("2", "client-01")]
    for rnd in ("2", "3"):
        assert "Node Unavailable" in failed[(rnd, "client-02")]
    assert ("3", "client-01") not in failed and not any(c == "client-00" for _, c in failed)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed"
    assert sorted(summary["clients"]) == ["client-00", "client-01"]
    assert "Node Unavailable" in summary["failed"]["client-02"]


def test_a_run_whose_superlink_died_resumes_to_the_uninterrupted_result(
    flower: LocalFlower, tmp_path: Path
) -> None:
    overrides = {**CFG, "num-rounds": 3, "run-name": "phoenix"}
    cfg = prepare(overrides, "deployment", tmp_path)
    flower.submit(REPO, cfg)
    wait_for_round(tmp_path / "phoenix", 1)
    # The SuperLink host dies: the SuperLink, its SuperExec and the ServerApp it started (these
    # two run in sessions of their own, so they are ended by program name).
    os.killpg(flower.processes["superlink"].pid, signal.SIGKILL)
    for program in ("flwr-serverapp", "flower-superexec"):
        end_processes_of(flower.home, program=program)
    flower.start_superlink(cwd=REPO)  # same address; the SuperNodes reconnect by themselves
    flower.wait_for_nodes(3, timeout=180)
    run_id = flower.submit(REPO, {**cfg, "resume": True})
    status = flower.wait_run(run_id, timeout=900)
    assert status == "finished:completed", flower.run_log(run_id)[-3000:]
    resumed = json.loads((tmp_path / "phoenix" / "summary.json").read_text())
    # The resume continued after round 1 (its checkpoint) and did not start over; the files say
    # so (Flower's log stream of a finished run can come back cut short, so it is not evidence).
    assert [s["first-round"] for s in resumed["segments"]] == [1, 2], resumed["segments"]
    assert resumed["segments"][-1]["status"] == "completed"
    # A SuperLink whose state is in a file keeps Flower's own pull (hetfed/runtime/pull.py) and says so.
    line = "hetfed-superlink: stock message pull: the state is on disk (--database)"
    assert line in (flower.root / "superlink.log").read_text()

    # Node 1's fault drill hits round 2 in both runs, so they are comparable.
    configs = node_configs(3)
    configs[1]["fail-round"] = 2
    whole = run_inline({**overrides, "results-dir": str(tmp_path / "inline"), "run-name": "whole"}, configs)
    assert resumed["clients"].keys() == whole["clients"].keys()
    for name, metrics in whole["clients"].items():
        for key, value in metrics.items():
            assert resumed["clients"][name][key] == pytest.approx(value, rel=1e-9), (name, key)
