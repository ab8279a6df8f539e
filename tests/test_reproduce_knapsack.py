"""`hetfed reproduce knapsack --quick` end to end (every table's runs, short schedule)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hetfed.reproduce import knapsack
from tests.conftest import REPO, reproduce_quick

RESULTS = REPO / "docs" / "results"


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


def cell_stats(fed: float, per: float) -> dict:
    return {"fed": {"mean": fed, "std": 0.0}, "per": {"mean": per, "std": 0.0}}


def test_the_papers_orderings_are_checked_per_row_with_their_margin() -> None:
    """RSPO+ < SPO+ (Fed, +P) and SPO+ < MSE (+P): a row where SPO+ trails MSE after personalization
    and RSPO+ trails SPO+ in Fed is reported as failing, with a negative margin."""
    row1 = {"rspo+": cell_stats(2.0, 1.0), "spo+": cell_stats(9.0, 5.0), "mse": cell_stats(15.0, 10.0)}
    row2 = {"rspo+": cell_stats(9.5, 2.0), "spo+": cell_stats(9.0, 8.0), "mse": cell_stats(6.0, 7.5)}
    checked = knapsack.orderings({"t3": {"(0,0,0)": row1, "(0,1,0)": row2}})
    found = {(o["row"], o["order"], o["stage"]): (o["holds"], o["margin"]) for o in checked}
    assert found == {
        ("(0,0,0)", "rspo+ < spo+", "fed"): (True, 7.0),
        ("(0,0,0)", "rspo+ < spo+", "per"): (True, 4.0),
        ("(0,0,0)", "spo+ < mse", "per"): (True, 5.0),
        ("(0,1,0)", "rspo+ < spo+", "fed"): (False, -0.5),
        ("(0,1,0)", "rspo+ < spo+", "per"): (True, 6.0),
        ("(0,1,0)", "spo+ < mse", "per"): (False, -0.5),
    }


def test_committed_knapsack_json_holds_each_difference_from_the_paper_and_the_study_index() -> None:
    data = json.loads((RESULTS / "knapsack.json").read_text())
    tables, diff = data["tables"], data["differences"]
    for row, by_loss in knapsack.PLAN.paper["t3"].items():
        for loss, (fed, per) in by_loss.items():
            ours = tables["t3"][row][loss]
            expected = [ours["fed"]["mean"] - fed, ours["per"]["mean"] - per]
            assert diff["t3"][row][loss] == pytest.approx(expected)
    for row, (interp, optnet, full) in knapsack.PLAN.paper["t4"].items():
        expected = [
            tables["t4"][row]["interp-dffl"]["interp"]["mean"] - interp,
            tables["t4"][row]["optnet"]["per"]["mean"] - optnet,
            tables["t3"][row]["rspo+"]["per"]["mean"] - full,
        ]
        assert diff["t4"][row] == pytest.approx(expected)
    assert data["orderings"] == knapsack.orderings(tables)
    studies = sorted(p.stem.removeprefix("knapsack-") for p in RESULTS.glob("knapsack-*.json"))
    assert sorted(data["studies"]) == studies  # every committed study is indexed
    for name, entry in data["studies"].items():
        study = json.loads((RESULTS / f"knapsack-{name}.json").read_text())
        assert (entry["runs"], entry["orderings"]) == (study["runs"], study["orderings"])


def test_a_custom_grid_runs_only_its_rows_losses_and_clients(tmp_path: Path) -> None:
    from hetfed.cli import main

    out, runs = tmp_path / "out", tmp_path / "runs"
    argv = ["reproduce", "knapsack", "--quick", "--rows", "(0.5,0,0)", "--losses", "spo+", "rspo+"]
    argv += ["--clients", "3", "--workers", "1", "--out", str(out), "--results-dir", str(runs)]
    assert main(argv) == 0
    data = json.loads((out / "knapsack.json").read_text())
    assert data["clients"] == 3 and data["grid"] == " --rows '(0.5,0,0)' --losses spo+ rspo+ --clients 3"
    assert list(data["tables"]) == ["t3"] and list(data["tables"]["t3"]) == ["(0.5,0,0)"]
    for loss, cell in data["tables"]["t3"]["(0.5,0,0)"].items():  # each cell is its run's number
        summary = json.loads((runs / f"t3-0.5_0_0-{loss}-s42" / "summary.json").read_text())
        assert len(summary["clients"]) == 3
        assert cell["fed"]["values"] == [100 * summary["aggregate"]["fed-relative-regret"]]
    checked = [(o["order"], o["stage"]) for o in data["orderings"]]
    assert checked == [("rspo+ < spo+", "fed"), ("rspo+ < spo+", "per")]
    doc = (out / "knapsack.md").read_text()
    assert "knapsack --quick --rows '(0.5,0,0)' --losses spo+ rspo+ --clients 3`" in doc
    assert "| (eta_o, eta_c, eta_d) | spo+ | rspo+ |" in doc
    assert main([*argv[:3], "--rows", "(1,0)", "--out", str(out)]) != 0  # a malformed row is refused
