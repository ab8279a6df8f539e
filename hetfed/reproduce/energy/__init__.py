"""FedRSPO+ on real ERCOT day-ahead prices: the Table 5 ablation and the cold start.

Thirteen ERCOT hubs / load zones are the silos; each buys its quota of hours every day at the
hours its model predicts cheapest (``hetfed.problems.energy``; the daily-quota set of docs/algorithms.md
1.2). Every federated number is a real hetfed run (ServerApp strategy and ClientApp clients,
inline engine by default); one run gives the federated model's result (Fed) and the personalized
one (+P). Two data variants run side by side: the training split as it is (it holds the February
2021 winter-storm days, prices up to ~$9,000/MWh) and the same split without those days
(``energy-exclude-storm``).

* **Ablation** (the paper's Table 5): federated MSE and SPO+, RSPO+ fed-only with a shared lam,
  + personalization, + per-client lam/eta, full (annealing and freezing); mean absolute regret in
  $/MWh-hours over 5 seeds.
* **Cold start** (leave one zone out): for each target zone, a FedRSPO+ warm start among the
  other 12 zones, evaluated on the target's test set, against the target's own local FedRSPO+
  model (strategy ``local-only``) trained on only its last {3, 7, 14, 30, 60} training days.

Writes ``energy.md``, ``energy.json`` and ``energy-*.png`` to ``--out``. The clients read the
ERCOT cache (``hetfed data ercot``; ``HETFED_DATA_DIR`` selects its root).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from hetfed.reproduce.common import add_run_arguments, publish
from hetfed.reproduce.energy.analysis import (
    ablation_table,
    cold_personalized,
    cold_start_table,
    ladder_steps,
    learning_check,
    more_tables,
    personalization_trace,
    predictions,
    storm_evidence,
    zone_similarity,
)
from hetfed.reproduce.energy.plan import (
    PAPER_PJM,
    Plan,
    ablation_jobs,
    cold_fed_jobs,
    cold_local_jobs,
    more_jobs,
)
from hetfed.reproduce.energy.plots import plot, plot_personalization
from hetfed.reproduce.energy.report import markdown
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
    ablation = ablation_jobs(plan)
    ablation_runs = run_jobs(ablation, args, nodes=zones)
    fed = cold_fed_jobs(plan)
    fed_runs = run_jobs(fed, args, nodes=zones - 1)  # every zone but the target
    local = cold_local_jobs(plan)
    local_runs = run_jobs(local, args, nodes=1)
    more = more_jobs(plan)
    more_runs = run_jobs(more, args, nodes=zones)

    table = ablation_table(ablation, ablation_runs)
    learning = learning_check(results_dir, ablation)
    cold = cold_start_table(plan, results_dir, fed, local, local_runs)
    cold_p = cold_personalized(plan, results_dir, fed)
    others = more_tables(plan, more, more_runs, table, cold, cold_p)
    steps = ladder_steps(table)
    evidence = {
        "storm": storm_evidence(plan),
        "similarity": zone_similarity(plan),
        "predictions": predictions(plan, results_dir, ablation),
        "personalization-trace": personalization_trace(plan, results_dir, ablation),
    }
    wall = sum(s["wall-time-s"] for s in ablation_runs + fed_runs + local_runs + more_runs)
    out = Path(args.out)
    publish(
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
            "ladder-steps": steps,
            "learning": learning,
            "cold-start": cold,
            "more": others,
            **evidence,
            "paper-pjm": {"market": "PJM (a different market)", "ablation": PAPER_PJM},
        },
        markdown,
    )
    plot(plan, results_dir, ablation, cold, out)
    plot_personalization(evidence["personalization-trace"], out)
    print((out / "energy.md").read_text())
    return 0
