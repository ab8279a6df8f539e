"""The worked pilot on the silos' own LPs (examples/pilot): FedRSPO+ with RSPO+ against MSE and SPO+.

Three silos state their own LP over the same 24 hourly variables (a Houston retailer buying 12 MWh a
day under ramp limits, a West producer maximising revenue under a fuel limit, a North buyer with a
3 MWh store; examples/pilot/README.md) and bring their own ERCOT days. Every loss runs the same
strategy (FedRSPO+: warm start, then personalization), so the only difference is the loss. Reported
per silo and as the mean over silos: the test relative regret of the federated, personal and
deployed model (``fed-``, ``per-``, ``dep-``), mean and std over seeds, and per seed whether RSPO+
beats each other loss on the deployed model's mean regret.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from hetfed.reproduce.common import add_run_arguments, publish, render, run_many, stat
from hetfed.reproduce.plan import Plan

PILOT = Path(__file__).resolve().parents[2] / "examples" / "pilot"
SILOS = {
    "client-00-silo-0": "Houston retailer (min, 12 MWh/day)",
    "client-01-silo-1": "West producer (max revenue)",
    "client-02-silo-2": "North buyer with storage (MPS)",
}
PLAN = Plan.load("lp-pilot")  # plans/lp-pilot.toml
LOSSES = tuple(PLAN.axes["losses"])
MODELS = ("fed", "per", "dep")


def configs(seeds: tuple[int, ...], quick: bool) -> list[dict[str, Any]]:
    """One run per loss and seed (plans/lp-pilot.toml)."""
    return [
        PLAN.config(quick, loss=loss, seed=seed, **{"run-name": f"lp-pilot-{loss}-s{seed}"})
        for loss in LOSSES
        for seed in seeds
    ]


def tables(planned: list[dict[str, Any]], summaries: list[dict[str, Any]]) -> dict[str, Any]:
    """Per loss and model: each silo's and the mean relative regret over seeds; RSPO+'s wins by seed."""
    out: dict[str, Any] = {}
    for loss in LOSSES:
        runs = [(c["seed"], s) for c, s in zip(planned, summaries, strict=True) if c["loss"] == loss]
        seeds = [seed for seed, _ in runs]
        out[loss] = {
            model: {
                **{
                    silo: stat([s["clients"][silo][f"{model}-relative-regret"] for _, s in runs], seeds)
                    for silo in SILOS
                },
                "mean": stat([s["aggregate"][f"{model}-relative-regret"] for _, s in runs], seeds),
            }
            for model in MODELS
        }
    for other in LOSSES[1:]:
        ours, theirs = out["rspo+"]["dep"]["mean"]["values"], out[other]["dep"]["mean"]["values"]
        out[f"rspo+-beats-{other}"] = {
            "seeds-won": sum(a < b for a, b in zip(ours, theirs, strict=True)),
            "seeds": len(ours),
            "mean-difference": stat(
                [a - b for a, b in zip(ours, theirs, strict=True)], out[other]["dep"]["mean"]["seeds"]
            ),
        }
    return out


def markdown(data: dict[str, Any]) -> str:
    """docs/results/lp-pilot.md, from lp-pilot.json alone (templates/lp-pilot.md)."""
    models = {"fed": "federated", "per": "personal", "dep": "deployed"}
    return render("lp-pilot.md", **data, silos=SILOS, losses=LOSSES, models=models)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_run_arguments(
        parser,
        "lp-pilot",
        quick="1 seed, 3 rounds (CI)",
        engines=("inline", "simulation"),
        seeds="how many seeds (max 5)",
    )


def run(args: argparse.Namespace) -> int:
    started = time.time()
    seeds = PLAN.chosen_seeds(args.seeds, args.quick)
    planned = configs(seeds, args.quick)
    summaries = run_many(
        planned,
        nodes=len(SILOS),
        results_dir=Path(args.results_dir),
        engine=args.engine,
        workers=args.workers,
        data_path=str(PILOT / "silo-{partition}"),
    )
    out = Path(args.out)
    publish(
        out,
        "lp-pilot",
        {
            "seeds": list(seeds),
            "quick": args.quick,
            "runs": len(planned),
            "config": {k: v for k, v in planned[0].items() if k not in ("loss", "seed", "run-name")},
            "wall-time-s": round(time.time() - started, 1),
            "metric": "relative regret on each silo's test days",
            "tables": tables(planned, summaries),
        },
        markdown,
    )
    print(f"wrote {out / 'lp-pilot.md'} and lp-pilot.json")
    return 0
