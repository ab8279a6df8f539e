"""PF-LSA on a real deployment: a SuperLink and 4 SuperNodes (own processes, own state dirs) on 127.0.0.1."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from hetfed.client.state import list_states
from hetfed.engines.flower import LocalFlower
from hetfed.engines.runner import prepare, run_experiment
from hetfed.federation import node_config
from tests.conftest import REPO

pytestmark = pytest.mark.deployment

NODES = 4
RUN = {
    "strategy": "pflsa",
    "problem": "garnet",
    "num-rounds": 20,
    "lsa-eta": 1.0,
    "garnet-zeta-ker": 0.5,
    "garnet-zeta-rew": 1.0,
    "checkpoint-every": 5,
    "round-timeout": 300.0,
}


@pytest.mark.timeout(1800)  # ~2 min on an idle 2-core machine; each message starts a ClientApp process
def test_20_pflsa_iterations_on_4_supernodes_equal_the_inline_run(tmp_path: Path) -> None:
    root, results = tmp_path / "federation", tmp_path / "results"
    flower = LocalFlower(root)
    try:
        flower.start_superlink(cwd=REPO)
        for i in range(NODES):
            flower.start_supernode(i, node_config(i, NODES, root, None, None))
        flower.wait_for_nodes(NODES)
        run_id = flower.submit(REPO, prepare({**RUN, "run-name": "deployed"}, "deployment", results))
        status = flower.wait_run(run_id, timeout=1500)
        log = flower.run_log(run_id)
    finally:
        flower.stop()
    assert status == "finished:completed", log[-3000:]
    deployed = json.loads((results / "deployed" / "summary.json").read_text())
    assert deployed["engine"] == "deployment" and deployed["aggregate"]["iteration"] == 20

    with open(results / "deployed" / "rounds.csv", newline="") as f:
        train = [r for r in csv.DictReader(f) if r["exchange"] == "train"]
    assert len(train) == 20 * NODES and all(r["status"] == "ok" for r in train)
    for i in range(NODES):  # every SuperNode kept its own theta_c on its own disk
        (state,) = [s.path for s in list_states(root / "state" / f"node-{i}") if s.run_name == "deployed"]
        assert (state / "lsa-log.json").exists() and (state / "final.npz").exists()

    # Samples are seeded per client and iteration: the inline engine computes the same numbers.
    inline = run_experiment("inline", {**RUN, "run-name": "inline"}, nodes=NODES, results_dir=results)
    assert deployed["clients"] == inline["clients"]
