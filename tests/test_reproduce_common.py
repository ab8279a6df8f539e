"""hetfed/reproduce/common.py and plan.py: the runner every reproduction shares resumes exactly the
completed runs; a plan file loads or fails with one line naming its file, key and culprit."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hetfed.reproduce.common import completed_run, fmt, mean_std, run_many
from hetfed.reproduce.plan import PLANS, SEEDS, Plan, PlanError

BASE = {"strategy": "softmax-switching", "problem": "quadratic", "num-rounds": 3, "seed": 1}


def test_completed_runs_are_reused_changed_or_interrupted_ones_run_again(tmp_path: Path) -> None:
    lines: list[str] = []
    configs = [{**BASE, "run-name": "a"}, {**BASE, "run-name": "b", "seed": 2}]
    first = run_many(configs, nodes=3, results_dir=tmp_path, log=lines.append, describe=lambda s: " ok")
    assert [s["status"] for s in first] == ["completed", "completed"] and len(lines) == 2
    assert lines[0].endswith(" ok") and "1/2 a" in lines[0]

    lines.clear()
    again = run_many(configs, nodes=3, results_dir=tmp_path, log=lines.append)
    assert lines == [] and again == first  # nothing ran: the summaries on disk are returned

    (tmp_path / "b" / "summary.json").unlink()  # b was interrupted
    changed = [{**configs[0], "num-rounds": 4}, configs[1]]  # a's config changed
    third = run_many(changed, nodes=3, results_dir=tmp_path, log=lines.append)
    assert len(lines) == 2 and all(s["status"] == "completed" for s in third)
    saved = json.loads((tmp_path / "a" / "config.json").read_text())["config"]
    assert saved["num-rounds"] == 4
    assert completed_run(tmp_path / "a", changed[0]) is not None
    assert completed_run(tmp_path / "a", configs[0]) is None  # 3 rounds is another run
    assert completed_run(tmp_path / "missing", configs[0]) is None


def test_a_run_in_the_callers_process_leaves_flowers_logging_as_it_was(tmp_path: Path) -> None:
    """One job runs in this process; its quieter Flower logger must not outlive it (it once silenced
    every later test's INFO lines in the same pytest worker)."""
    import logging

    import hetfed.server.app  # noqa: F401  (importing Flower sets its logger's level once)

    flwr_log = logging.getLogger("flwr")
    before = flwr_log.level
    flwr_log.setLevel(logging.INFO)
    try:
        (summary,) = run_many([{**BASE, "run-name": "one"}], nodes=3, results_dir=tmp_path, log=print)
        assert summary["status"] == "completed" and flwr_log.level == logging.INFO
    finally:
        flwr_log.setLevel(before)


def test_a_run_named_twice_runs_once_and_two_configs_cannot_share_a_name(tmp_path: Path) -> None:
    lines: list[str] = []
    a = {**BASE, "run-name": "a"}
    out = run_many(
        [a, {**BASE, "run-name": "b", "seed": 2}, dict(a)], nodes=3, results_dir=tmp_path, log=lines.append
    )
    assert len(lines) == 2 and out[2] == out[0] and out[1] != out[0]  # "a" ran once, reported twice
    with pytest.raises(ValueError, match="share the run name 'a'"):
        run_many([a, {**a, "seed": 3}], nodes=3, results_dir=tmp_path, log=lines.append)


def test_mean_std_and_fmt() -> None:
    mean, std = mean_std([1.0, 2.0, 4.0, float("nan"), None])
    assert mean == pytest.approx(7 / 3) and std == pytest.approx(((16 + 1 + 25) / 9 / 2) ** 0.5)
    assert mean_std([3.0]) == (3.0, 0.0)
    assert fmt({"mean": 1.234, "std": 0.5}) == "1.23 ± 0.50"
    assert fmt({"mean": 1.25, "std": 0.5}, digits=1) == "1.2 ± 0.5"
    assert fmt(None) == "n/a" and fmt({"mean": float("nan"), "std": 0.0}) == "n/a"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("seeds = 'paper'\ncolour = 1", "colour: unknown key"),
        ("seeds = 'lucky'", "seeds: 'lucky' names no seed list"),
        ("seeds = [1, 'two']", "seeds: expected a seed list's name or a non-empty list of integers"),
        ("seeds = [1]\n[base]\nnum-round = 3", "base: unknown key 'num-round'"),
        ("seeds = [1]\n[quick]\nnum-rounds = -1", "quick: 'num-rounds': must be >= 1, got -1"),
        ("seeds = [1]\n[axes]\nrows = []", "axes.rows: expected a non-empty list"),
        ("seeds = [1]\nnodes = 0", "nodes: expected a positive integer, got 0"),
        ("seeds = [1]\n[[runs]]\ntable = 't'\nmethod = 'm'\nrows = 'rows'", "runs[0]: missing key 'config'"),
        (
            "seeds = [1]\n[[runs]]\ntable = 't'\nmethod = 'm'\nrows = 'r'\nconfig = {}",
            "runs[0].rows: 'r' is not an axis",
        ),
        (
            "seeds = [1]\n[axes]\nr = [1]\n[[runs]]\ntable = 't'\nmethod = 'm'\nrows = 'r'\n"
            "config = {}\nnodes = 0",
            "runs[0].nodes: expected a federation size >= 1, got 0",
        ),
        (  # a run may carry a label, not anything else
            "seeds = [1]\n[axes]\nr = [1]\n[[runs]]\ntable = 't'\nmethod = 'm'\nrows = 'r'\nconfig = {}\n"
            "label = 'a run'\nlabels = 'x'",
            "runs[0]: unknown key 'labels'",
        ),
        ("seeds = [1]\n[base", "Expected ']'"),
        ("seeds = [1]\nbudget = 3", "budget: expected a table"),
        ("seeds = [1]\n[budget]\nruns = 5\nquick = 1", "budget.quick: expected a table"),
        (
            "seeds = [1]\n[budget]\nruns = 5\n[budget.quick]\nrun = 1",
            "budget.quick.run: not a key of [budget]",
        ),
    ],
)
def test_a_malformed_plan_is_one_line_naming_file_key_and_culprit(
    tmp_path: Path, text: str, message: str
) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(PlanError) as err:
        Plan.load("bad", path)
    assert str(err.value).startswith(f"{path}: ") and message in str(err.value) and "\n" not in str(err.value)


def test_every_shipped_plan_loads_and_the_papers_seeds_are_defined_once() -> None:
    for path in sorted(PLANS.glob("*.toml")):
        plan = Plan.load(path.stem)
        assert plan.seeds and all(isinstance(s, int) for s in plan.seeds)
    assert Plan.load("knapsack").seeds == SEEDS["paper"] == (42, 69, 1993, 67, 2026)
    quick = Plan.load("knapsack").config(True, seed=7)
    assert quick["num-rounds"] == 3 and quick["seed"] == 7 and quick["strategy"] == "fedrspo"


def test_quick_replaces_a_budgets_values_and_keeps_its_order(tmp_path: Path) -> None:
    path = tmp_path / "b.toml"
    path.write_text("seeds = [1]\n[budget]\nruns = 5\nlevels = [0.5, 1.0]\n[budget.quick]\nruns = 1\n")
    plan = Plan.load("b", path)
    assert plan.budget_for(False) == {"runs": 5, "levels": [0.5, 1.0]}
    assert list(plan.budget_for(True).items()) == [("runs", 1), ("levels", [0.5, 1.0])]


def test_a_malformed_plan_fails_only_its_reproduction_with_its_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import sys

    import hetfed.reproduce.plan as plan_module
    from hetfed.cli import main

    for path in PLANS.glob("*.toml"):
        (tmp_path / path.name).write_text(path.read_text())
    (tmp_path / "lp-pilot.toml").write_text("seeds = 'pilot'\n[base]\nproblem = 'lp'\nnum-round = 3\n")
    monkeypatch.setattr(plan_module, "PLANS", tmp_path)
    monkeypatch.delitem(sys.modules, "hetfed.reproduce.lp_pilot", raising=False)
    assert main(["reproduce", "lp-pilot", "--quick", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"hetfed: error: {tmp_path / 'lp-pilot.toml'}: base: unknown key 'num-round'")
    assert err.count("\n") == 1
    assert not (tmp_path / "out").exists()
    assert main(["config"]) == 0  # every other command still works


@pytest.mark.parametrize(
    "experiment", ["knapsack", "energy", "energy-pilot", "shortest-path", "lp-pilot", "dp-knapsack"]
)
@pytest.mark.parametrize(
    ("option", "message"),
    [
        (["--seeds", "0"], "--seeds: must be in 1..5, got 0"),
        (["--seeds", "6"], "--seeds: must be in 1..5, got 6"),  # was cut to 5 without a word
        (["--quick", "--seeds", "-2"], "--seeds: must be in 1..5, got -2"),
        (["--quick", "--workers", "0"], "--workers: must be >= 1, got 0"),  # ran one at a time
    ],
)
def test_a_count_out_of_range_is_refused_in_one_line_before_any_run(
    experiment: str, option: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from hetfed.cli import main

    out, runs = tmp_path / "out", tmp_path / "runs"
    assert main(["reproduce", experiment, *option, "--out", str(out), "--results-dir", str(runs)]) == 2
    err = capsys.readouterr().err
    assert err == f"hetfed: error: {message}\n"
    assert not out.exists() and not runs.exists()
