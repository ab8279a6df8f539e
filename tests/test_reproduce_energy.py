"""`hetfed reproduce energy --quick` end to end: its tables are the runs' numbers, read back independently."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from hetfed.cli import main
from hetfed.client.decision import decision_metrics
from hetfed.config import validate
from hetfed.problems.ercot import fetch_ercot
from hetfed.problems.models import mlp_from_arrays
from hetfed.problems.registry import get_problem
from hetfed.reproduce.energy.plan import ABLATION, EXTRA, VARIANTS
from hetfed.server.store import read_models


@pytest.fixture(scope="module")
def reproduction(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, Path]:
    try:
        fetch_ercot()  # the reproduction reads the cache
    except RuntimeError as err:
        pytest.skip(f"the ERCOT data cannot be fetched: {err}")
    root = tmp_path_factory.mktemp("energy")
    argv = ["reproduce", "energy", "--quick", "--workers", "1", "--out", str(root / "out")]
    assert main([*argv, "--results-dir", str(root / "runs")]) == 0
    return json.loads((root / "out" / "energy.json").read_text()), root / "runs"


def summary(runs: Path, name: str) -> dict:
    return json.loads((runs / name / "summary.json").read_text())


def test_the_ablation_table_holds_each_runs_reported_regret(reproduction: tuple[dict, Path]) -> None:
    table, runs = reproduction
    for variant in VARIANTS:
        for label, (run, stage) in {**ABLATION, **EXTRA}.items():
            cell = table["ablation"][variant][label]
            reported = summary(runs, f"ablation-{variant}-{run}-s42")
            assert cell["absolute"]["values"] == [reported["aggregate"][f"{stage}-absolute-regret"]]
            assert cell["per-zone"] == {
                z: m[f"{stage}-absolute-regret"] for z, m in reported["clients"].items()
            }
    text = (runs.parent / "out" / "energy.md").read_text()
    assert f"{table['ablation']['as-is']['SPO+']['absolute']['mean']:.1f}" in text


def test_the_cold_start_judges_the_federations_own_model_on_a_zone_that_was_not_in_it(
    reproduction: tuple[dict, Path],
) -> None:
    """The federated model read from the run folder scores each member zone as that zone reported,
    and the table's number is that model on the left-out target's test days."""
    table, runs = reproduction
    name = "cold-fed-as-is-HB_HOUSTON-s42"
    members = summary(runs, name)["clients"]
    assert "HB_HOUSTON" not in members and len(members) == 3
    model = mlp_from_arrays(read_models(runs / name)["global"])
    energy = get_problem("energy")
    for zone, reported in members.items():
        data = energy.load_client(validate({"problem": "energy", "energy-zones": zone}), 0, 1, None)
        ours = decision_metrics(model, data.test, data.polytope)["absolute-regret"]
        assert ours == pytest.approx(reported["fed-absolute-regret"], rel=1e-12)
    target = energy.load_client(validate({"problem": "energy", "energy-zones": "HB_HOUSTON"}), 0, 1, None)
    expected = decision_metrics(model, target.test, target.polytope)["absolute-regret"]
    federated = table["cold-start"]["federated"]["as-is"]["absolute"]["mean"]["values"]
    assert federated == [pytest.approx(expected, rel=1e-12)]
    local = summary(runs, "cold-local-HB_HOUSTON-d7-s42")["aggregate"]["per-absolute-regret"]
    assert table["cold-start"]["local"]["7"]["absolute"]["mean"]["values"] == [local]


def test_the_papers_other_tables_hold_their_runs_numbers(reproduction: tuple[dict, Path]) -> None:
    """Table 4's OptNet-style cell is, per seed, the multiplier with the lowest validation regret;
    Table 13's runs buy the equal quota; Table 12 counts and the median reduction are recomputed
    from the cold-start table with NumPy; local-only is the local run's own number."""
    import numpy as np

    from hetfed.reproduce.energy.plan import MORE, OPTNET_MULTS

    table, runs = reproduction
    more = table["more"]
    for variant in VARIANTS:
        options = {m: summary(runs, f"more-{variant}-optnet-{m:g}-s42")["aggregate"] for m in OPTNET_MULTS}
        best = min(OPTNET_MULTS, key=lambda m: options[m]["per-val-relative-regret"])
        cell = more["t4"][variant]["OptNet-style"]
        assert cell["multipliers"] == [best] and cell["values"] == [options[best]["per-absolute-regret"]]
        interp = summary(runs, f"more-{variant}-interp-dffl-s42")["aggregate"]["interp-absolute-regret"]
        assert more["t4"][variant]["Interp-DFFL"]["values"] == [interp]
        equal = json.loads((runs / f"more-{variant}-equal-rspo+-s42" / "config.json").read_text())["config"]
        assert equal["energy-quota"] == MORE["equal-rspo+"]["energy-quota"]  # Table 13's equal demands
        reported = summary(runs, f"more-{variant}-equal-rspo+-s42")["aggregate"]["per-absolute-regret"]
        assert more["t13"][variant]["rspo+"]["per"]["values"] == [reported]
        local = summary(runs, f"more-{variant}-local-spo+-s42")["aggregate"]["per-absolute-regret"]
        assert more["t15"][variant]["spo+"]["local-only"]["values"] == [local]
        name = f"more-{variant}-centralized-spo+-s42"  # the yardstick: a run of its own, on every zone
        pooled = json.loads((runs / name / "config.json").read_text())["config"]
        assert (pooled["strategy"], pooled["engine"]) == ("centralized", "inline")
        central = summary(runs, name)
        assert len(central["clients"]) == len(table["zones"])
        reported = central["aggregate"]["fed-absolute-regret"]
        assert more["t15"][variant]["spo+"]["centralized"]["values"] == [reported]
        fed = table["cold-start"]["federated"][variant]["absolute"]["per-zone"]
        for days, t in more["t12"][variant].items():
            alone = table["cold-start"]["local"][days]["absolute"]["per-zone"]
            reduction = np.array([(alone[z]["mean"] - fed[z]["mean"]) / alone[z]["mean"] for z in fed])
            assert t["federated-better"] == int((reduction > 0).sum())
            assert t["median-reduction-%"] == pytest.approx(100 * np.median(reduction))


def test_equal_demands_give_every_zone_the_same_quota() -> None:
    energy = get_problem("energy")
    for zone in ("HB_HOUSTON", "LZ_WEST"):
        cfg = validate({"problem": "energy", "energy-zones": zone, "energy-quota": 8})
        data = energy.load_client(cfg, 0, 1, None)
        assert data.polytope.quota == 8
        assert data.polytope.solve_lp(data.test.c[:5]).sum(dim=1).tolist() == pytest.approx([8.0] * 5)
    own = energy.load_client(validate({"problem": "energy", "energy-zones": "HB_NORTH"}), 0, 1, None)
    assert own.polytope.quota == 9  # D_j = 4 + (5 k mod 9) for zone k = 1


def test_each_ladder_step_is_the_per_seed_difference_of_its_two_rows(reproduction: tuple[dict, Path]) -> None:
    table, runs = reproduction
    labels = list(ABLATION)
    for variant in VARIANTS:
        for before, after in zip(labels, labels[1:], strict=False):
            (run_a, stage_a), (run_b, stage_b) = ABLATION[after], ABLATION[before]
            a = summary(runs, f"ablation-{variant}-{run_a}-s42")["aggregate"][f"{stage_a}-absolute-regret"]
            b = summary(runs, f"ablation-{variant}-{run_b}-s42")["aggregate"][f"{stage_b}-absolute-regret"]
            step = table["ladder-steps"][variant][f"{before} -> {after}"]
            assert step["values"] == [pytest.approx(a - b)] and step["lower"] == int(a < b)


def test_the_cold_start_fed_plus_p_personalizes_the_received_federated_model(
    reproduction: tuple[dict, Path],
) -> None:
    """Table 11's Fed+P for the target: the target's ClientApp evaluates the model it received exactly
    as the cold-start table judged it (Fed), and its personal model's regret is the table's Fed+P."""
    from hetfed.reproduce.energy.analysis import personalized_on_target
    from hetfed.reproduce.energy.plan import Plan

    table, runs = reproduction
    plan = Plan.make(1, quick=True)
    name = "cold-fed-as-is-HB_HOUSTON-s42"
    config = {**json.loads((runs / name / "config.json").read_text())["config"], "personal-rounds": 2}
    config = {k: v for k, v in config.items() if k != "results-dir"}
    metrics = personalized_on_target(runs / name, config, "HB_HOUSTON", 7)
    federated = table["cold-start"]["federated"]["as-is"]["absolute"]["mean"]["values"][0]
    assert metrics["fed-absolute-regret"] == pytest.approx(federated, rel=1e-12)
    t11 = table["more"]["t11"]["as-is"]["7"]
    assert t11["Fed+P"]["values"] == [pytest.approx(metrics["per-absolute-regret"], rel=1e-12)]
    assert t11["Fed"]["values"] == [federated] and metrics["per-absolute-regret"] != federated
    assert plan.schedule["personal-rounds"] == 2  # the quick schedule the reproduction personalized with


def test_the_ladder_pairs_each_step_by_seed_and_refuses_rows_of_other_seeds() -> None:
    from hetfed.reproduce.energy.analysis import ladder_steps

    labels = list(ABLATION)
    values = {label: [10.0 - k, 5.0 + k] for k, label in enumerate(labels)}  # seed 1 falls, seed 2 rises
    rows = {label: {"absolute": {"values": v, "seeds": [1, 2]}} for label, v in values.items()}
    steps = ladder_steps({"as-is": rows})["as-is"]
    assert list(steps) == [f"{a} -> {b}" for a, b in zip(labels[:-1], labels[1:], strict=True)]
    for step in steps.values():
        assert step["values"] == [-1.0, 1.0] and step["seeds"] == [1, 2] and step["lower"] == 1
    rows[labels[1]]["absolute"]["seeds"] = [2, 1]
    message = f"as-is: '{labels[1]}' and '{labels[0]}' ran other seeds"
    with pytest.raises(ValueError, match=re.escape(message)):
        ladder_steps({"as-is": rows})
