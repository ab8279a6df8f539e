"""The centralized yardstick as a registered method (strategy ``centralized``, inline engine): a
real inline run gives the committed Table 14 cells of docs/results/knapsack.json (computed before by
a separate pooled-training loop of the reproduction) to the last bits, and another engine is refused
before anything starts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hetfed.config import ConfigError
from hetfed.engines.runner import run_experiment
from hetfed.reproduce.plan import Plan

RESULTS = Path(__file__).resolve().parents[1] / "docs" / "results"


@pytest.mark.parametrize("loss", ["spo+", "rspo+"])
def test_a_centralized_run_gives_the_committed_table14_cell(tmp_path: Path, loss: str) -> None:
    t14 = json.loads((RESULTS / "knapsack.json").read_text())["tables"]["t14"]["(0,0,0)"]
    cell = t14[f"centralized-{loss}"]["per"]
    seed = cell["seeds"][0]
    config = Plan.load("knapsack").config(False, **{"eta-o": 0.0, "eta-c": 0.0, "eta-d": 0.0, "seed": seed})
    summary = run_experiment(
        "inline",
        {**config, "loss": loss, "strategy": "centralized", "run-name": "yardstick"},
        nodes=20,
        results_dir=tmp_path,
        echo=lambda _: None,
    )
    assert summary["status"] == "completed" and len(summary["clients"]) == 20
    # Bit for bit on a CPU like the one that computed the cell; torch picks its kernels by the CPU's
    # vector units (AVX-512 or AVX2), which can move the last bit (1 ulp on an AVX2-only machine),
    # while another loss, seed or training loop moves it by more than 1e-3.
    assert 100 * summary["aggregate"]["fed-relative-regret"] == pytest.approx(cell["values"][0], rel=1e-12)
    # one model, evaluated by every client: no personal model
    rounds = json.loads((tmp_path / "yardstick" / "summary.json").read_text())
    assert not any(k.startswith("per-") for k in rounds["aggregate"])


def test_the_centralized_yardstick_runs_on_the_inline_engine_only(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="'centralized' runs on the inline engine only, not 'simulation'"):
        run_experiment(
            "simulation", {"strategy": "centralized"}, nodes=2, results_dir=tmp_path, echo=lambda _: None
        )
    assert not any(tmp_path.iterdir())  # refused before anything was written
