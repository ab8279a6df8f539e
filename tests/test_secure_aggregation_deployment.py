"""Secure aggregation on a real local federation: a SuperNode killed after its masked input was sent."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from hetfed import secagg
from hetfed.engines.flower import LocalFlower
from hetfed.engines.inline import node_configs, run_inline
from hetfed.engines.runner import prepare
from hetfed.federation import node_config
from tests.conftest import REPO
from tests.test_faults import read_rows

pytestmark = pytest.mark.deployment

CFG = {
    "n-train": 40,
    "n-test": 30,
    "local-epochs": 1,
    "num-items": 10,
    "fraction": 1.0,
    "seed": 2,
    "num-rounds": 3,
    "secure-aggregation": True,
    "audit-traffic": True,
    "round-timeout": 15.0,
}


@pytest.fixture
def flower(tmp_path: Path) -> Iterator[LocalFlower]:
    """A SuperLink and 3 SuperNodes; SuperNode 1 stalls at the consistency check of round 2 (after its
    masked input reached the server), where the test kills it."""
    flower = LocalFlower(tmp_path / "fed")
    try:
        flower.start_superlink(cwd=REPO)
        for i in range(3):
            cfg = node_config(i, 3, flower.root, None, None)
            if i == 1:
                cfg |= {"stall-round": 2, "stall-seconds": 300, "drill-exchange": "query.secagg_check"}
            flower.start_supernode(i, cfg)
        flower.wait_for_nodes(3)
        yield flower
    finally:
        flower.stop()


def kill_after_masked_input(flower: LocalFlower, run_dir: Path, partition: int, server_round: int) -> None:
    """SIGKILL SuperNode ``partition`` once traffic.jsonl shows its masked input of ``server_round``."""
    end = time.time() + 600
    while time.time() < end:
        path = run_dir / "traffic.jsonl"
        lines = path.read_text().splitlines() if path.exists() else []
        if any(
            (e := json.loads(line))["round"] == server_round
            and e["exchange"] == "train"
            and e["partition-id"] == partition
            for line in lines
        ):
            os.killpg(flower.processes[f"supernode-{partition}"].pid, signal.SIGKILL)
            return
        time.sleep(0.1)
    raise TimeoutError(f"no masked input of partition {partition} in round {server_round}")


def models(path: Path) -> dict[str, np.ndarray]:
    with np.load(path / "models.npz") as z:
        return {k: z[k] for k in z.files}


def test_a_supernode_killed_after_its_masked_input_leaves_the_exact_sum(
    flower: LocalFlower, tmp_path: Path
) -> None:
    cfg = prepare({**CFG, "run-name": "killed"}, "deployment", tmp_path)
    run_id = flower.submit(REPO, cfg)
    kill_after_masked_input(flower, tmp_path / "killed", 1, 2)
    assert flower.wait_run(run_id, timeout=900) == "finished:completed"
    rows = read_rows(tmp_path / "killed")
    failed = {(r["round"], r["exchange"], r["client"]) for r in rows if r["status"] == "failed"}
    assert ("2", "query.secagg_check", "client-01") in failed  # killed after its masked input
    assert ("3", "query.secagg_keys", "client-01") in failed  # and gone in round 3
    assert not any(c != "client-01" for _, _, c in failed)
    # The same rounds in clear on the inline engine: client-01 in round 2's sum, absent from round 3.
    configs = node_configs(3)
    configs[1]["fail-round"] = 3
    plain = {**CFG, "secure-aggregation": False, "results-dir": str(tmp_path), "run-name": "plain"}
    run_inline(plain, configs)
    a, b = models(tmp_path / "plain"), models(tmp_path / "killed")
    assert max(float(np.abs(a[k] - b[k]).max()) for k in a) <= 1e-5
    for line in (tmp_path / "killed" / "traffic.jsonl").read_text().splitlines():
        entry = json.loads(line)
        assert (
            not any(name.startswith("arrays/") for name in entry["arrays"]) or entry["exchange"] == "evaluate"
        )


def test_below_the_threshold_a_round_fails_with_one_line_and_keeps_the_files(
    flower: LocalFlower, tmp_path: Path
) -> None:
    cfg = prepare({**CFG, "run-name": "below", "secagg-threshold": 3}, "deployment", tmp_path)
    run_id = flower.submit(REPO, cfg)
    kill_after_masked_input(flower, tmp_path / "below", 1, 2)
    assert flower.wait_run(run_id, timeout=900) == "finished:completed"
    rows = read_rows(tmp_path / "below")
    server = {r["round"]: r for r in rows if r["client"] == "server"}
    assert server["1"]["clients-used"] == "3" and server["2"]["clients-used"] == "0"
    assert server["3"]["clients-used"] == "0"  # 2 clients left, threshold 3: no sum either
    summary = json.loads((tmp_path / "below" / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["failed-rounds"]["client-01"] == [2, 3]
    assert summary["privacy"]["secagg-step"] == secagg.step_of(100.0, 32)
    assert (tmp_path / "below" / "models.npz").exists() and (tmp_path / "below" / "checkpoint.pt").exists()


@pytest.fixture
def plain_flower(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[LocalFlower]:
    """A SuperLink and 3 SuperNodes with the ClientApp runtime ``request.param`` (warm or stock:
    Flower's own, a ClientApp process per message, the client's secrets kept by the SuperNode)."""
    flower = LocalFlower(tmp_path / "fed", runtime=request.param)
    try:
        flower.start_superlink(cwd=REPO)
        for i in range(3):
            flower.start_supernode(i, node_config(i, 3, flower.root, None, None))
        flower.wait_for_nodes(3)
        yield flower
    finally:
        flower.stop()


@pytest.mark.parametrize(
    ("plain_flower", "method", "metric"),
    [
        (
            "warm",
            {"strategy": "fedrspo", "loss": "rspo+", "num-rounds": 2, "personal-rounds": 1},
            "fed-relative-regret",
        ),
        ("stock", {"problem": "garnet", "strategy": "pflsa", "num-rounds": 1}, "sq-error"),
    ],
    ids=["fedrspo-warm", "pflsa-stock"],
    indirect=["plain_flower"],
)
def test_secure_runs_equal_the_plain_inline_run(
    plain_flower: LocalFlower, tmp_path: Path, method: dict, metric: str
) -> None:
    cfg = {**CFG, "audit-traffic": False, "round-timeout": 300.0, **method}
    run_id = plain_flower.submit(REPO, prepare({**cfg, "run-name": "secure"}, "deployment", tmp_path))
    assert plain_flower.wait_run(run_id, timeout=900) == "finished:completed"
    assert [r for r in read_rows(tmp_path / "secure") if r["status"] != "ok"] == []
    secure = json.loads((tmp_path / "secure" / "summary.json").read_text())
    plain = run_inline(
        {**cfg, "secure-aggregation": False, "results-dir": str(tmp_path), "run-name": "plain"},
        node_configs(3),
    )
    for client, metrics in plain["clients"].items():
        assert secure["clients"][client][metric] == pytest.approx(metrics[metric], rel=1e-5, abs=1e-7)
    assert {r["exchange"] for r in read_rows(tmp_path / "secure")} >= {"query.secagg_unmask"}
