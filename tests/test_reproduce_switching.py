"""`hetfed reproduce np-classification | fair-classification | safe-rl`: selection logic and a quick run."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from hetfed.reproduce import switching as rep
from tests.conftest import hetfed_cli


def fake_runs(exp: rep.Experiment, finals: dict[str, list[tuple[float, float]]]) -> list[dict]:
    """Runs of the first setting whose averaged model has the given (F, G) per seed; last = averaged."""
    return [
        {
            "setting": exp.settings[0].name,
            "method": label,
            "family": next(m.family for m in exp.methods if m.label == label),
            "seed": seed,
            "final": {"avg-F": F, "avg-G": G, "F": F, "G": G, "grad-evals": 100, "averaged-rounds": 10},
            "curve": {"grad-evals": [0.0, 100.0], "F": [1.0, F], "G": [1.0, G]},
        }
        for label, values in finals.items()
        for seed, (F, G) in enumerate(values)
    ]


def test_best_feasible_baseline_is_feasible_in_every_seed_then_lowest_F() -> None:
    exp = replace(rep.experiment("np-classification"), seeds=2)
    eps = exp.eps
    runs = fake_runs(
        exp,
        {
            "switching alpha=1": [(0.10, eps + 0.1), (0.11, eps - 0.01)],
            "switching alpha=100": [(0.20, eps), (0.22, eps - 0.01)],  # G = eps counts as feasible
            "penalty rho=1": [(0.05, eps + 1e-6), (0.05, 0.0)],  # lowest F, but one seed infeasible
            "penalty rho=10": [(0.30, 0.0), (0.32, 0.0)],
            "penalty rho=100": [(0.25, 0.0), (0.27, 0.0)],
            "primal-dual max lr=1": [(0.19, 0.0), (0.19, 0.0)],
            "primal-dual mean lr=1": [(0.01, 0.5), (0.01, 0.5)],
        },
    )
    summary = rep.summarize_runs(exp, runs)
    best = summary["best-feasible"]["averaged model"]["full"]
    assert best["penalty"] == "penalty rho=100"
    assert best["switching"] == "switching alpha=100"
    assert best["primal-dual (max)"] == "primal-dual max lr=1"
    assert best["primal-dual (mean)"] is None
    row = summary["table"]["full"]["switching alpha=1"]
    assert row["avg-feasible-seeds"] == 1 and row["avg-G"]["max"] == pytest.approx(eps + 0.1)
    assert row["avg-F"]["mean"] == pytest.approx(0.105)
    text = "\n".join(rep._verdict(summary["table"]["full"], best, "avg-"))
    assert "is not below the best feasible baseline's (primal-dual max lr=1): 0.2100 vs 0.1900" in text
    assert "no member feasible in every seed: primal-dual (mean)" in text
    # a member with a missing seed (a partial report, --available) is not "feasible in every seed"
    partial = [r for r in runs if not (r["method"] == "penalty rho=100" and r["seed"] == 1)]
    assert rep.summarize_runs(exp, partial)["best-feasible"]["averaged model"]["full"]["penalty"] == (
        "penalty rho=10"
    )
    curves = rep.curves(exp, runs)
    assert curves["full"]["penalty rho=1"]["F"] == pytest.approx([1.0, 0.05])
    assert curves["full"]["switching alpha=1"]["G-max"][1] == pytest.approx(eps + 0.1)


def test_extras_table_averages_each_aggregate_over_seeds_per_output() -> None:
    exp = replace(rep.experiment("safe-rl"), seeds=2)
    runs = fake_runs(exp, {"switching alpha=10": [(0.1, 0.0), (0.1, 0.0)], "parallel CRPO": [(0.1, 0.0)]})
    for run, (length, cost) in zip(runs, [(80.0, 12.0), (100.0, 14.0), (200.0, 3.0)], strict=True):
        run["aggregate"] = {"avg-episode_length": length, "avg-cost": cost}
        run["aggregate"].update({"episode_length": 1.0, "cost": 2.0})
    lines = rep._extras_table(exp, exp.settings[0], runs)
    assert lines[1] == (
        "| method | episode length (averaged) | cost per episode (averaged) "
        "| episode length (last) | cost per episode (last) |"
    )
    assert "| switching alpha=10 | 90.0 | 13.0 | 1.0 | 2.0 |" in lines
    assert "| parallel CRPO | 200.0 | 3.0 | 1.0 | 2.0 |" in lines
    assert not any("penalty" in line for line in lines)  # no runs, no row
    assert rep._extras_table(rep.experiment("np-classification"), exp.settings[0], runs) == []


def test_progress_line_of_a_run_without_an_averaged_model() -> None:
    line = rep.progress_line({"aggregate": {"F": 0.5, "G": 0.25}})
    assert line == ": avg F=nan G=nan | last F=0.5000 G=0.2500"


def test_every_method_of_an_experiment_takes_the_same_gradient_evaluations() -> None:
    for name in ("np-classification", "fair-classification", "safe-rl", "safe-rl-trpo"):
        exp = rep.experiment(name)
        for setting in exp.settings:
            configs = [rep.run_config(exp, setting, m, 0) for m in exp.methods]
            assert len({c["run-name"] for c in configs}) == len(configs)
            for c in configs:
                assert (c["num-rounds"], c["switching-m"], c["switching-local-steps"]) == (
                    setting.rounds,
                    setting.m,
                    setting.local_steps,
                )
    full, partial = rep.experiment("np-classification").settings
    assert full.rounds * 10 * full.local_steps == partial.rounds * partial.m * partial.local_steps == 50_000


def test_unknown_experiment_and_bad_options_are_refused() -> None:
    with pytest.raises(ValueError, match="experiment: unknown name 'np'"):
        rep.experiment("np")
    out = hetfed_cli("reproduce", "np-classification", "--seeds", "0", timeout=120)
    assert out.returncode == 2 and "--seeds: must be >= 1" in out.stderr


def test_quick_np_classification_writes_tables_and_figures(tmp_path: Path) -> None:
    """The CI smoke run: 2 seeds, a few rounds; even here alpha = 1 misses worst-case feasibility."""
    out = hetfed_cli(
        "reproduce",
        "np-classification",
        "--quick",
        "--out",
        str(tmp_path / "docs"),
        "--results-dir",
        str(tmp_path / "runs"),
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    docs = tmp_path / "docs"
    names = sorted(p.name for p in docs.iterdir())
    assert names == [
        "np-classification-quick-alpha.png",
        "np-classification-quick-full.png",
        "np-classification-quick-partial.png",
        "np-classification-quick.json",
        "np-classification-quick.md",
    ]
    data = json.loads((docs / "np-classification-quick.json").read_text())
    assert len(data["runs"]) == 2 * 3 * 2  # settings x methods x seeds
    table = data["table"]
    for setting in ("full", "partial"):
        assert table[setting]["switching alpha=1"]["avg-feasible-seeds"] == 0
        assert {r["grad-evals"] for r in table[setting].values()} == {300}
    assert table["full"]["switching alpha=100"]["avg-feasible-seeds"] == 2
    text = (docs / "np-classification-quick.md").read_text()
    assert "| switching alpha=100 |" in text and "![np-classification-quick-full]" in text


def test_the_trpo_safe_rl_experiment_runs_valid_configs_with_trust_region_steps_and_the_fall_cost() -> None:
    from hetfed.config import validate

    exp = rep.experiment("safe-rl-trpo")
    for setting in exp.settings:
        for method in exp.methods:
            cfg = validate(rep.run_config(exp, setting, method, 0))
            assert (cfg["rl-trust-region"], cfg["rl-advantage"], cfg["rl-fall-cost"]) == (0.01, "gae", True)
            assert cfg["rl-gae-lambda"] == 1.0
            assert cfg["switching-gamma"] * setting.local_steps == pytest.approx(cfg["switching-eta"])
