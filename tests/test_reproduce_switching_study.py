"""`hetfed reproduce switching-study`: the sweeps run what they say; feasibility times and fits."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import numpy as np
import pytest

from hetfed.cli import main
from hetfed.reproduce.common import fit_line
from hetfed.reproduce.switching_study import first_feasible, participation_fit, render


def test_first_reach_and_stay_of_a_constraint_curve() -> None:
    evals = [0.0, 10.0, 20.0, 30.0, 40.0]
    assert first_feasible(evals, [0.3, 0.04, 0.06, 0.01, 0.02], 0.05) == (10.0, 30.0)
    assert first_feasible(evals, [0.3, 0.2, 0.1, 0.09, 0.06], 0.05) == (None, None)
    assert first_feasible(evals, [0.01, 0.02, 0.03, 0.04, 0.09], 0.05) == (0.0, None)  # lost at the end
    assert first_feasible(evals, [None, None, 0.04, 0.04, 0.04], 0.05) == (20.0, 20.0)  # no output yet


def test_the_fits_recover_known_lines_and_tell_shapes_apart() -> None:
    x = np.array([0.1, 0.2, 0.5, 0.9])
    fit = fit_line(x, 0.02 + 0.3 * x)
    assert (
        fit["a"] == pytest.approx(0.02) and fit["c"] == pytest.approx(0.3) and fit["r2"] == pytest.approx(1.0)
    )
    # G following the paper's 1 / (|ln(1 - r)| n) exactly: that fit is perfect, the other is not
    table = {
        f"m{m}": {"switching": {"avg-G": {"mean": 0.01 + 0.5 / (abs(math.log(1 - m / 10)) * 10), "sd": 0.0}}}
        for m in (2, 3, 5, 7, 9)
    }
    fits = participation_fit(table)
    assert fits["paper"]["r2"] == pytest.approx(1.0) and fits["paper"]["c"] == pytest.approx(0.5)
    assert fits["finite-population"]["r2"] < 0.999


def test_quick_study_times_come_from_the_runs_and_the_page_renders_from_its_json(tmp_path: Path) -> None:
    out, runs = tmp_path / "out", tmp_path / "runs"
    assert (
        main(["reproduce", "switching-study", "--quick", "--out", str(out), "--results-dir", str(runs)]) == 0
    )
    result = json.loads((out / "switching-study-quick.json").read_text())
    alpha = result["studies"]["alpha"]
    label = "partial | switching alpha=100"
    # Independently of the study's readers: the run's own server rows, first averaged-model G <= eps.
    run_dir = runs / alpha["experiment"] / f"{alpha['experiment']}-partial-switching-alpha-100-s0"
    with open(run_dir / "rounds.csv", newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["client"] == "server" and r.get("avg-G")]
    first = next((float(r["grad-evals"]) for r in rows if float(r["avg-G"]) <= result["eps"]), None)
    assert alpha["feasibility"][label]["reach-median"] == first
    final = json.loads((run_dir / "summary.json").read_text())["aggregate"]["avg-G"]
    assert alpha["table"]["partial"]["switching alpha=100"]["avg-G"]["mean"] == pytest.approx(final)
    # the committed studies are read, not rerun: every method of np-classification.json is timed
    np_methods = {label.split(" | ")[1] for label in result["committed"]["np-classification"]["feasibility"]}
    assert "penalty rho=10" in np_methods and "switching alpha=100" in np_methods
    page = (out / "switching-study-quick.md").read_text()
    render(out, "-quick")
    assert (out / "switching-study-quick.md").read_text() == page
    assert "## What the paper claims, what we measured" in page


def test_the_committed_study_renders_from_its_json_and_repeats_the_committed_np_runs(tmp_path: Path) -> None:
    committed = Path(__file__).resolve().parents[1] / "docs" / "results"
    (tmp_path / "switching-study.json").write_bytes((committed / "switching-study.json").read_bytes())
    render(tmp_path)
    assert (tmp_path / "switching-study.md").read_text() == (committed / "switching-study.md").read_text()
    # The alpha sweep's alpha = 100 point is np-classification's partial setting, config for config:
    # the runs (deterministic per seed) give the committed reproduction's numbers.
    study = json.loads((committed / "switching-study.json").read_text())["studies"]["alpha"]
    ours = study["table"]["partial"]["switching alpha=100"]
    theirs = json.loads((committed / "np-classification.json").read_text())["table"]["partial"][
        "switching alpha=100"
    ]
    for key in ("avg-F", "avg-G", "F", "G"):
        assert ours[key]["mean"] == pytest.approx(theirs[key]["mean"], rel=1e-5)


def test_bad_options_are_refused_by_name_before_any_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for option in ("--seeds", "--workers"):
        args = ["reproduce", "switching-study", "--quick", option, "0", "--out", str(tmp_path / "o")]
        assert main([*args, "--results-dir", str(tmp_path / "r")]) == 2
        assert f"{option}: must be >= 1" in capsys.readouterr().err
    assert not (tmp_path / "r").exists() and not (tmp_path / "o").exists()
