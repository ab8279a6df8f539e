"""`hetfed reproduce knapsack-study`: any grid of rows, losses, variants and seeds, as real runs."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import pytest

from hetfed.cli import main
from hetfed.reproduce.knapsack_study import STUDIES, jobs, orderings, row_etas
from tests.conftest import REPO


def test_a_study_reports_each_runs_numbers_and_its_freeze_diagnostics(tmp_path: Path) -> None:
    out, runs = tmp_path / "out", tmp_path / "runs"
    argv = ["reproduce", "knapsack-study", "compositions", "--quick", "--rows", "(0,0.5,1)"]
    argv += ["--losses", "rspo+", "--clients", "3", "--workers", "1", "--out", str(out)]
    argv += ["--results-dir", str(runs)]
    out.mkdir()
    shutil.copy(REPO / "docs" / "results" / "knapsack.json", out / "knapsack.json")  # the main report
    assert main(argv) == 0
    data = json.loads((out / "knapsack-compositions.json").read_text())
    # The main report now indexes this study (and only it: the others are not in `out`).
    index = json.loads((out / "knapsack.json").read_text())["studies"]
    assert list(index) == ["compositions"]
    assert (index["compositions"]["runs"], index["compositions"]["orderings"]) == (4, data["orderings"])
    assert "| [compositions](knapsack-compositions.md) |" in (out / "knapsack.md").read_text()
    cells = data["table"]["(0,0.5,1)"]["rspo+"]
    assert list(cells) == [v.label for v in STUDIES["compositions"].variants]
    for variant in STUDIES["compositions"].variants:
        (folder,) = [p for p in runs.iterdir() if p.name.endswith(f"{variant.label}-s42".replace(" ", "_"))]
        config = json.loads((folder / "config.json").read_text())["config"]
        assert (config["eta-o"], config["eta-c"], config["eta-d"]) == (0.0, 0.5, 1.0)
        assert all(config[k] == v for k, v in variant.overrides.items())  # the variant reached the run
        summary = json.loads((folder / "summary.json").read_text())
        assert len(summary["clients"]) == 3
        assert cells[variant.label]["fed"]["values"] == [100 * summary["aggregate"]["fed-relative-regret"]]
        if config["personal-rounds"]:
            per = 100 * summary["aggregate"]["per-relative-regret"]
            assert cells[variant.label]["per"]["values"] == [per]
            with open(folder / "rounds.csv", newline="") as f:
                rows = [r for r in csv.DictReader(f) if r["exchange"] == "train.personalize"]
            frozen = sum(1 for r in rows if float(r["frozen-at"]) > 0)
            assert cells[variant.label]["frozen-share"]["values"] == [frozen / 3]
        else:  # Ditto keeps its own personal model: no personalization rounds, no freezing
            assert "frozen-share" not in cells[variant.label]
    text = (out / "knapsack-compositions.md").read_text()
    assert "FedProx mu=0.1" in text and "(0,0.5,1)" in text
    with_per = {v: c["per"]["mean"] for v, c in cells.items() if c["per"]["mean"] is not None}
    (line,) = [ln for ln in text.splitlines() if ln.startswith("- (0,0.5,1) rspo+: ")]
    named = line.removeprefix("- (0,0.5,1) rspo+: ").split(" (")[0]
    assert with_per[named] == min(with_per.values()) and f"({with_per[named]:.2f}, +P)" in line


def test_rows_are_checked_and_every_variant_gets_its_federation_size() -> None:
    assert row_etas("(0.5, 0,1)") == (0.5, 0.0, 1.0)
    for bad in ("(1,2)", "(a,0,0)", "(0,-1,0)", "0,0,0"):
        with pytest.raises(ValueError, match="--rows"):
            row_etas(bad)
    planned = jobs(STUDIES["clients"], quick=True, fixed={})
    assert sorted({j.nodes for j in planned}) == [5, 10, 20, 40, 80]
    assert len({j.config["run-name"] for j in planned}) == len(planned)  # no run overwrites another
    assert len(jobs(STUDIES["combined"], quick=False, fixed={})) == 27 * 3 * 3


def test_the_papers_ordering_is_counted_per_pair_and_row_with_its_smallest_margin() -> None:
    def c(fed: float, per: float) -> dict:
        return {"v": {"fed": {"mean": fed}, "per": {"mean": per}}}

    cells = {
        "A": {"rspo+": c(1.0, 1.0), "spo+": c(2.0, 1.5), "mse": c(3.0, 4.0)},
        "B": {"rspo+": c(2.0, 0.5), "spo+": c(1.5, 0.7), "mse": c(3.0, 0.6)},
    }
    got = {(o["stage"], o["order"]): o for o in orderings(cells, ["v"])}
    fed = got[("fed", "rspo+ < spo+")]
    assert (fed["holds"], fed["rows"], fed["fails"], fed["margin"]) == (1, 2, ["B"], -0.5)
    assert (got[("fed", "spo+ < mse")]["holds"], got[("fed", "spo+ < mse")]["margin"]) == (2, 1.0)
    per = got[("per", "spo+ < mse")]
    assert (per["holds"], per["fails"], per["margin"]) == (1, ["B"], pytest.approx(-0.1))


def test_the_centralized_yardstick_pools_the_same_clients_and_settings_as_the_runs(tmp_path: Path) -> None:
    out, runs = tmp_path / "out", tmp_path / "runs"
    argv = ["reproduce", "knapsack-study", "data-heterogeneity", "--quick", "--rows", "(0,0,1)", "--losses"]
    argv += ["rspo+", "--clients", "3", "--workers", "1", "--out", str(out), "--results-dir", str(runs)]
    assert main(argv) == 0
    data = json.loads((out / "knapsack-data-heterogeneity.json").read_text())
    cell = data["table"]["(0,0,1)"]["rspo+"]["centralized"]
    (folder,) = [p for p in runs.iterdir() if p.name.endswith("fedrspo-s42")]
    (pooled,) = [p for p in runs.iterdir() if p.name == folder.name + "-centralized"]
    config = json.loads((folder / "config.json").read_text())["config"]
    yardstick = json.loads((pooled / "config.json").read_text())["config"]
    assert config["n-train"] == 40
    assert (yardstick["strategy"], yardstick["engine"]) == ("centralized", "inline")
    own = ("strategy", "run-name", "results-dir")

    def shared(cfg: dict) -> dict:
        return {k: v for k, v in cfg.items() if k not in own}

    assert shared(yardstick) == shared(config)
    summary = json.loads((pooled / "summary.json").read_text())
    assert len(summary["clients"]) == 3
    assert cell["per"]["values"] == [100 * summary["aggregate"]["fed-relative-regret"]]
    assert "| rspo+ | centralized | - |" in (out / "knapsack-data-heterogeneity.md").read_text()
