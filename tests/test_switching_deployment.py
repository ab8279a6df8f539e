"""Softmax switching on a real deployment: SuperLink + 3 SuperNodes, NP classification, 2 rounds."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest

from hetfed.engines.inline import node_configs, run_inline
from hetfed.engines.runner import prepare
from tests.conftest import REPO

pytestmark = pytest.mark.deployment

CFG = {
    "strategy": "softmax-switching",
    "problem": "np-classification",
    "seed": 2,
    "num-rounds": 2,
    "switching-eval-every": 0,  # one evaluation, after the last round
    "switching-eta": 0.5,
    "switching-gamma": 0.5,
    "round-timeout": 300.0,
    "audit-traffic": True,
}


def test_np_classification_runs_across_processes_like_inline(deployment, tmp_path: Path) -> None:
    """Each message runs in a new ClientApp process: the w_k kept by query.fg must reach train."""
    cfg = prepare({**CFG, "run-name": "deploy"}, "deployment", tmp_path)
    run_id = deployment.submit(REPO, cfg)
    status = deployment.wait_run(run_id, timeout=600)
    assert status == "finished:completed", deployment.run_log(run_id)[-3000:]
    folder = tmp_path / "deploy"
    summary = json.loads((folder / "summary.json").read_text())
    assert sorted(summary["clients"]) == ["client-0", "client-1", "client-2"]
    with open(folder / "rounds.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert all(r["status"] == "ok" for r in rows), [r for r in rows if r["status"] != "ok"]
    assert sum(r["exchange"] == "train" for r in rows) == 2 * 3
    # What crossed the wire back: scalars from the query, model-shaped updates from train.
    for entry in map(json.loads, (folder / "traffic.jsonl").read_text().splitlines()):
        if entry["exchange"] == "train":
            assert sorted(entry["arrays"].items()) == [("arrays/bias", [1]), ("arrays/weight", [1, 30])]
        else:
            assert entry["arrays"] == {}, entry
        assert all(kind in ("int", "float") for kind in entry["metrics"].values()), entry
    # The same config inline gives the same models: the engine changes nothing.
    run_inline({**CFG, "results-dir": str(tmp_path), "run-name": "inline"}, node_configs(3))
    deployed, inline = np.load(folder / "models.npz"), np.load(tmp_path / "inline" / "models.npz")
    assert set(deployed.files) == set(inline.files)
    for key in inline.files:
        np.testing.assert_allclose(deployed[key], inline[key], rtol=0, atol=1e-6)
    assert summary["aggregate"]["G"] == pytest.approx(
        json.loads((tmp_path / "inline" / "summary.json").read_text())["aggregate"]["G"], abs=1e-6
    )
