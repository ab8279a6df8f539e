"""The energy pilot on ERCOT (``hetfed reproduce energy-pilot``): SPO+ and FedRSPO+ with the mean and
the median calibration on both training splits; per zone the Fed, +P and deployed model (the personal
one only where it beats Fed on the zone's validation days), paired steps, and whether validation
gains predict test gains. Writes energy-pilot.md, .json and .png to ``--out``."""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path
from typing import Any

import numpy as np

from hetfed.reproduce.common import add_run_arguments, publish, pyplot, render, save_figure, stat
from hetfed.reproduce.energy.analysis import grouped, mean_by_round, paired, zone_data
from hetfed.reproduce.energy.plan import PLAN, VARIANT_LABELS, VARIANTS, Job, Plan, table_runs
from hetfed.reproduce.plan import run_jobs
from hetfed.reproduce.runs import curves, frozen_at

RUNS = table_runs("pilot")  # plans/energy.toml
STAGES = {"fed": "Fed", "per": "+P", "dep": "deployed"}
# Paired-by-seed differences (a - b): label -> ((run, stage), (run, stage)).
STEPS: dict[str, list[list[str]]] = PLAN.budget["pilot-steps"]


def tables(jobs: list[Job], summaries: list[dict[str, Any]]) -> dict[str, Any]:
    """``{split: {run: {stage: stat of the mean absolute regret over zones}}}`` and the paired steps
    ``{split: {step: stat of the per-seed differences, with "negative": seeds where a < b}}``."""
    by, seeds = grouped(jobs, summaries), sorted({job.seed for job in jobs})

    def values(split: str, run: str, stage: str) -> list[float]:  # nan: SPO+ deploys no model of its own
        return [
            float(by[(split, run)][s]["aggregate"].get(f"{stage}-absolute-regret", math.nan)) for s in seeds
        ]

    out: dict[str, Any] = {"regret": {}, "steps": {}}
    for split in VARIANTS:
        out["regret"][split] = {
            label: {stage: stat(values(split, label, stage), seeds) for stage in STAGES} for label in RUNS
        }
        out["steps"][split] = {
            step: paired(values(split, *a), values(split, *b), seeds, "negative")
            for step, (a, b) in STEPS.items()
        }
    return out


def zones(jobs: list[Job], summaries: list[dict[str, Any]], results_dir: Path) -> dict[str, Any]:
    """Per split, FedRSPO+ run and zone: each seed's row and their means; the personal model's gains
    over the federated one on validation (relative regret, points) and test ($), the share of seeds
    frozen (mean round where frozen), and whether the deployed model was ever worse on validation."""
    out: dict[str, Any] = {}
    for job, summary in zip(jobs, summaries, strict=True):
        split, label = job.key[1], job.key[2]
        if RUNS[label]["loss"] != "rspo+":
            continue
        frozen = frozen_at(results_dir / job.config["run-name"])
        for zone, m in summary["clients"].items():
            row = {
                "seed": job.seed,
                **{stage: m[f"{stage}-absolute-regret"] for stage in STAGES},
                "personal": m["dep-personal"],
                "val-gain": 100 * (m["fed-val-relative-regret"] - m["per-val-relative-regret"]),
                "test-gain": m["fed-absolute-regret"] - m["per-absolute-regret"],
                "dep-val-minus-fed-val": m["dep-val-relative-regret"] - m["fed-val-relative-regret"],
                "frozen-at": frozen.get(zone, 0),
            }
            entry = out.setdefault(split, {}).setdefault(label, {}).setdefault(zone, {"seeds": []})
            entry["seeds"].append(row)
    for entry in (e for by_run in out.values() for by_zone in by_run.values() for e in by_zone.values()):
        rows = entry["seeds"]
        for key in (*STAGES, "personal", "val-gain", "test-gain"):
            entry[key] = float(np.mean([r[key] for r in rows]))
        rounds = [r["frozen-at"] for r in rows if r["frozen-at"] > 0]
        entry["frozen"] = len(rounds) / len(rows)  # share of seeds in which it froze
        entry["freeze-round"] = float(np.mean(rounds)) if rounds else math.nan
        entry["never-worse-on-validation"] = all(r["dep-val-minus-fed-val"] <= 0 for r in rows)
    return out


def diagnosis(zone_table: dict[str, Any]) -> dict[str, Any]:
    """Over every (zone, seed) of a run: does the validation gain of the personal model predict its
    test gain? Pearson correlation, the share of cases where the personal model is better on
    validation, on test, and where the two agree (the per-silo choice picks the test winner)."""
    out: dict[str, Any] = {}
    for split, by_run in zone_table.items():
        for label, by_zone in by_run.items():
            rows = [r for entry in by_zone.values() for r in entry["seeds"]]
            val = np.array([r["val-gain"] for r in rows])
            test = np.array([r["test-gain"] for r in rows])
            defined = len(rows) > 2 and val.std() and test.std()
            corr = float(np.corrcoef(val, test)[0, 1]) if defined else math.nan
            out.setdefault(split, {})[label] = {
                "cases": len(rows),
                "val-test-gain-correlation": corr,
                "personal-better-on-validation": float(np.mean(val > 0)),
                "personal-better-on-test": float(np.mean(test > 0)),
                "choice-picks-test-winner": float(np.mean((val > 0) == (test > 0))),
            }
    return out


def personal_curves(jobs: list[Job], summaries: list[dict[str, Any]], results_dir: Path) -> dict[str, Any]:
    """Per split and run, mean over seeds: the federated model's validation regret (%) and the
    personal models' per personalization round (mean over the zones still training; RSPO+ stops a
    zone 3 rounds after it froze)."""
    by: dict[tuple[str, str], list[tuple[float, dict[int, float]]]] = {}
    for job, summary in zip(jobs, summaries, strict=True):
        fed = 100 * summary["aggregate"]["fed-val-relative-regret"]
        personal = curves(results_dir / job.config["run-name"])["personal"]
        by.setdefault((job.key[1], job.key[2]), []).append((fed, personal))
    out: dict[str, Any] = {}
    for (split, label), runs in by.items():
        out.setdefault(split, {})[label] = {
            "fed-val": float(np.mean([fed for fed, _ in runs])),
            "personal": mean_by_round([personal for _, personal in runs]),
        }
    return out


def style(split: str, label: str) -> dict[str, str]:
    """One colour and legend label per (split, run), the same in both panels."""
    color = f"C{list(VARIANTS).index(split) * len(RUNS) + list(RUNS).index(label)}"
    return {"color": color, "label": f"{label}, {VARIANT_LABELS[split]}"}


def plot(data: dict[str, Any], out: Path) -> None:
    """energy-pilot.png: validation gain against test gain of each (zone, seed)'s personal model, and
    the personal models' validation regret per personalization round against the federated model's."""
    plt = pyplot()

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    for split, by_run in data["per-zone"].items():
        for label, by_zone in by_run.items():
            rows = [r for entry in by_zone.values() for r in entry["seeds"]]
            gains = ([r["val-gain"] for r in rows], [r["test-gain"] for r in rows])
            marker = "o" if split == "as-is" else "^"
            left.scatter(*gains, s=12, marker=marker, alpha=0.7, **style(split, label))
    left.axhline(0, color="k", lw=0.8)
    left.axvline(0, color="k", lw=0.8)
    left.set(
        xlabel="validation gain of the personal model (points of relative regret)",
        ylabel="test gain ($/MWh-hours per day)",
        title="Does validation predict test? (zone x seed)",
    )
    left.legend(fontsize=7)
    for split, by_run in data["curves"].items():
        for label, c in by_run.items():
            rounds = [int(t) for t in c["personal"]]
            right.plot(rounds, list(c["personal"].values()), marker=".", **style(split, label))
            right.axhline(c["fed-val"], color=style(split, label)["color"], ls="--", lw=0.8)
    right.set(
        xlabel="personalization round",
        ylabel="validation relative regret (%)",
        title="Personal models on validation (dashed: the federated model)",
    )
    right.legend(fontsize=6)
    save_figure(fig, out / "energy-pilot.png")


def calibration(plan: Plan) -> dict[str, Any]:
    """Per zone and training split: lam0_j under the mean and the median norm (the zone's data)."""
    from hetfed.client.calibration import own_calibration
    from hetfed.methods.decision import CalibratedParams

    norms = {
        norm: CalibratedParams.from_config({**PLAN.base, "calibration-norm": norm})
        for norm in ("mean", "median")
    }
    out: dict[str, Any] = {}
    for zone in plan.zones:
        for split, extra in VARIANTS.items():
            data = zone_data(zone, **extra)
            out.setdefault(zone, {})[split] = {
                norm: own_calibration(data, p)["lam0"] for norm, p in norms.items()
            }
    return out


def markdown(data: dict[str, Any]) -> str:
    """energy-pilot.md from energy-pilot.json alone (templates/energy-pilot.md)."""
    return render(
        "energy-pilot.md", d=data, labels=VARIANT_LABELS, stages=STAGES, runs=RUNS, step_names=STEPS
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_run_arguments(
        parser, "energy-pilot", quick="4 zones, 1 seed, short schedule (CI)", engines=("inline", "simulation")
    )


def run(args: argparse.Namespace) -> int:
    from hetfed.problems.ercot import fetch_ercot

    started = time.time()
    plan = Plan.make(args.seeds, args.quick)  # checks --seeds
    fetch_ercot()  # once, before the clients read it (a no-op when cached)
    results_dir = Path(args.results_dir)
    planned = plan.split_jobs("pilot")
    summaries = run_jobs(planned, args, nodes=len(plan.zones))
    zone_table = zones(planned, summaries, results_dir)
    out = Path(args.out)
    data = publish(
        out,
        "energy-pilot",
        {
            "seeds": list(plan.seeds),
            "zones": list(plan.zones),
            "quick": args.quick,
            "engine": args.engine,
            "runs": len(planned),
            "runs-wall-time-s": round(sum(float(s["wall-time-s"]) for s in summaries), 1),
            "wall-time-s": round(time.time() - started, 1),
            "unit": "mean absolute regret, $/MWh-hours per day",
            "tables": tables(planned, summaries),
            "per-zone": zone_table,
            "diagnosis": diagnosis(zone_table),
            "curves": personal_curves(planned, summaries, results_dir),
            "calibration": calibration(plan),
        },
        markdown,
    )
    plot(data, out)
    print((out / "energy-pilot.md").read_text(encoding="utf-8"))
    return 0
