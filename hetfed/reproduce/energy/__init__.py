"""FedRSPO+ on real ERCOT day-ahead prices (``hetfed reproduce energy``): the paper's Table 5
ablation, the cold start (leave one zone out) and its other energy tables, each on the training
split as is and without the February 2021 storm days. Thirteen ERCOT zones are the silos
(``hetfed.problems.energy``); every federated number is a real hetfed run. Writes energy.md,
energy.json and energy-*.png to ``--out``; the clients read the ERCOT cache (``hetfed data ercot``).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from hetfed.reproduce.common import add_run_arguments, publish
from hetfed.reproduce.energy import analysis as a
from hetfed.reproduce.energy.plan import PAPER_PJM, Plan, cold_fed_jobs, cold_local_jobs, split_jobs
from hetfed.reproduce.energy.report import markdown, plot, plot_personalization
from hetfed.reproduce.plan import run_jobs


def add_arguments(parser: argparse.ArgumentParser) -> None:
    # Not "deployment": the cold start runs federations of 12 and of 1 client, a deployment has one size.
    add_run_arguments(
        parser, "energy", quick="4 zones, 1 seed, short schedule (CI)", engines=("inline", "simulation")
    )


def run(args: argparse.Namespace) -> int:
    from hetfed.problems.ercot import fetch_ercot

    fetch_ercot()  # once, before the clients read it (a no-op when cached)
    plan = Plan.make(args.seeds, args.quick)
    results_dir, zones = Path(args.results_dir), len(plan.zones)
    ablation, more = split_jobs(plan, "ablation"), split_jobs(plan, "more")
    fed, local = cold_fed_jobs(plan), cold_local_jobs(plan)
    ablation_runs = run_jobs(ablation, args, nodes=zones)
    fed_runs = run_jobs(fed, args, nodes=zones - 1)  # every zone but the target
    local_runs = run_jobs(local, args, nodes=1)
    more_runs = run_jobs(more, args, nodes=zones)

    table = a.ablation_table(ablation, ablation_runs)
    cold = a.cold_start_table(plan, results_dir, fed, local, local_runs)
    cold_p = a.cold_personalized(plan, results_dir, fed)
    wall = sum(s["wall-time-s"] for s in ablation_runs + fed_runs + local_runs + more_runs)
    out = Path(args.out)
    data = publish(
        out,
        "energy",
        {
            "seeds": list(plan.seeds),
            "zones": list(plan.zones),
            "quick": args.quick,
            "engine": args.engine,
            "runs-wall-time-s": round(wall, 1),
            "unit": "mean absolute regret, $/MWh-hours per day (relative-%: relative regret %)",
            "ablation": table,
            "ladder-steps": a.ladder_steps(table),
            "learning": a.learning_check(results_dir, ablation),
            "cold-start": cold,
            "more": a.more_tables(plan, ablation + more, ablation_runs + more_runs, cold, cold_p),
            "storm": a.storm_evidence(plan),
            "similarity": a.zone_similarity(plan),
            "predictions": a.predictions(plan, results_dir, ablation),
            "personalization-trace": a.personalization_trace(results_dir, ablation),
            "paper-pjm": {"market": "PJM (a different market)", "ablation": PAPER_PJM},
        },
        markdown,
    )
    plot(plan, results_dir, ablation, data["cold-start"], out)
    plot_personalization(data["personalization-trace"], out)
    print((out / "energy.md").read_text())
    return 0
