"""`hetfed reproduce knapsack --quick` end to end (every table's runs, short schedule)."""

from __future__ import annotations

import json
from pathlib import Path

from tests.conftest import reproduce_quick


def test_quick_reproduction_writes_tables_json_and_plots(tmp_path: Path) -> None:
    out = reproduce_quick("knapsack", tmp_path, workers=2)
    assert out.returncode == 0, out.stderr[-3000:]
    doc = (tmp_path / "out" / "knapsack.md").read_text()
    for heading in ("Table 3", "Table 4", "Table 9", "Table 14"):
        assert heading in doc
    data = json.loads((tmp_path / "out" / "knapsack.json").read_text())
    cell = data["tables"]["t3"]["(0,0,0)"]["rspo+"]["per"]
    assert cell["seeds"] == [42] and len(cell["values"]) == 1 and cell["mean"] == cell["values"][0]
    # The federated RSPO+ run beats the MSE run even on the short schedule.
    assert cell["mean"] < data["tables"]["t3"]["(0,0,0)"]["mse"]["per"]["mean"]
    assert (tmp_path / "out" / "knapsack-regret-per-round.png").stat().st_size > 10_000
    assert (tmp_path / "out" / "knapsack-freeze.png").stat().st_size > 10_000
    # Every run's summary records its full config and seed (reproducibility).
    summary = json.loads((tmp_path / "runs" / "t3-0_0_0-rspo+-s42" / "config.json").read_text())
    assert summary["config"]["loss"] == "rspo+" and summary["seed"] == 42
