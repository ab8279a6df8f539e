"""``hetfed reproduce dp-knapsack``: regret against epsilon under central DP (docs/results/dp-knapsack.*)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from hetfed.reproduce import dp_knapsack
from hetfed.server.privacy import epsilon_after
from tests.conftest import REPO, reproduce_quick


def test_the_quick_reproduction_tabulates_its_runs(tmp_path: Path) -> None:
    out = reproduce_quick("dp-knapsack", tmp_path, workers=2)
    assert out.returncode == 0, out.stderr
    data = json.loads((tmp_path / "out" / "dp-knapsack.json").read_text())
    levels = [dp_knapsack.OFF, *(f"{z:g}" for z in dp_knapsack.QUICK_NOISE)]
    assert data["seeds"] == [42] and data["quick"] and data["runs"] == len(dp_knapsack.LOSSES) * len(levels)
    rounds, (n,) = dp_knapsack.PLAN.quick["num-rounds"], dp_knapsack.QUICK_CLIENTS
    assert data["clients"] == [n] and list(data["tables"]) == [str(n)]
    tables = data["tables"][str(n)]
    for loss in dp_knapsack.LOSSES:
        table = tables[loss]
        assert list(table) == levels
        for key, row in table.items():
            run = tmp_path / "runs" / f"dp-knapsack-n{n}-{loss}-{key}-s42"
            summary = json.loads((run / "summary.json").read_text())
            config = json.loads((run / "config.json").read_text())["config"]
            assert summary["status"] == "completed" and config["loss"] == loss and config["eta-o"] == 0.5
            assert config["num-clients"] == n and len(summary["clients"]) == n
            for model in dp_knapsack.MODELS:  # the JSON's numbers are the run's own
                assert row[model]["values"] == [summary["aggregate"][f"{model}-relative-regret"]]
            with open(run / "rounds.csv", newline="") as f:
                within = [int(r["dp-within"]) for r in csv.DictReader(f) if r.get("dp-within")]
            if key == dp_knapsack.OFF:  # no DP: no epsilon, no clip
                assert config["dp"] == "off" and "epsilon" not in summary.get("privacy", {})
                assert row["epsilon"] is None and row["clip"] is None and row["within-clip"] is None
                assert within == []
                continue
            z = float(key)
            assert config["dp"] == "central" and config["dp-noise-multiplier"] == z
            assert config["dp-clipping-norm"] == row["clip"] == dp_knapsack.CLIPS[loss]
            assert row["epsilon"] == summary["privacy"]["epsilon"]
            assert row["epsilon"] == pytest.approx(epsilon_after(rounds, z, n, n, 1e-5), rel=1e-9)
            assert row["releases"] == rounds and row["clients-per-round"] == n
            # every warm-start round: one clipped update per client, the share of them within the clip
            assert len(within) == rounds * n
            assert row["within-clip"]["mean"] == pytest.approx(sum(within) / len(within))
        epsilons = [table[key]["epsilon"] for key in levels[1:]]
        assert epsilons == sorted(epsilons, reverse=True) and len(set(epsilons)) == len(epsilons)
    # epsilon depends on z and the rounds only, not on the loss
    assert [tables["rspo+"][k]["epsilon"] for k in levels] == [tables["mse"][k]["epsilon"] for k in levels]
    assert (tmp_path / "out" / "dp-knapsack.md").read_text() == dp_knapsack.markdown(data)
    assert (tmp_path / "out" / "dp-knapsack.png").stat().st_size > 0


def test_the_committed_report_is_what_its_json_renders() -> None:
    results = REPO / "docs" / "results"
    data = json.loads((results / "dp-knapsack.json").read_text(encoding="utf-8"))
    assert (results / "dp-knapsack.md").read_text(encoding="utf-8") == dp_knapsack.markdown(data)
    assert not data["quick"] and data["seeds"] == list(dp_knapsack.PLAN.seeds)
    assert data["noise-multipliers"] == list(dp_knapsack.NOISE)
    assert data["clients"] == list(dp_knapsack.CLIENTS) == [int(n) for n in data["tables"]]
    # epsilon depends on z and the rounds only: the same for every loss and number of clients
    for z in dp_knapsack.NOISE:
        rows = [by_level[f"{z:g}"] for by_loss in data["tables"].values() for by_level in by_loss.values()]
        assert {row["epsilon"] for row in rows} == {rows[0]["epsilon"]}
        assert rows[0]["epsilon"] == pytest.approx(epsilon_after(10, z, 10, 10, 1e-5), rel=1e-9)
