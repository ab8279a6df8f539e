"""FedRSPO+ on real ERCOT day-ahead prices (``hetfed reproduce energy``): the paper's Table 5
ablation, the cold start (leave one zone out) and its other energy tables, each on the training
split as is and without the February 2021 storm days. Thirteen ERCOT zones are the silos
(``hetfed.problems.energy``); every federated number is a real hetfed run. Writes energy.md,
energy.json and energy-*.png to ``--out``; the clients read the ERCOT cache (``hetfed data ercot``).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import numpy as np

from hetfed.reproduce.common import add_run_arguments, publish, pyplot, render, save_figure
from hetfed.reproduce.energy import analysis as a
from hetfed.reproduce.energy.plan import PLAN, VARIANT_LABELS, Job, Plan
from hetfed.reproduce.plan import run_jobs
from hetfed.reproduce.runs import plot_warm_then_personal

# The personalization figure's rows: a case's per-round key, its federated value, the rounds' mean, y label.
PERSONAL_ROWS = (
    ("test", "fed-test", "test-minus-fed", "test regret, personal - Fed ($)"),
    ("val-%", "fed-val-%", "val-minus-fed-points", "validation, personal - Fed (points)"),
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    # Not "deployment": the cold start runs federations of 12 and of 1 client, a deployment has one size.
    add_run_arguments(
        parser, "energy", quick="4 zones, 1 seed, short schedule (CI)", engines=("inline", "simulation")
    )


def run(args: argparse.Namespace) -> int:
    from hetfed.problems.ercot import fetch_ercot

    plan = Plan.make(args.seeds, args.quick)  # checks --seeds
    fetch_ercot()  # once, before the clients read it (a no-op when cached)
    results_dir, zones = Path(args.results_dir), len(plan.zones)
    ablation, more = plan.split_jobs("ablation"), plan.split_jobs("more")
    fed, local = plan.cold_fed_jobs(), plan.cold_local_jobs()
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
            "paper-pjm": {"market": "PJM (a different market)", "ablation": PLAN.paper["pjm"]},
        },
        markdown,
    )
    plot(plan, results_dir, ablation, data["cold-start"], out)
    plot_personalization(data["personalization-trace"], out)
    print((out / "energy.md").read_text())
    return 0


def storm_facts(storm: dict[str, Any], learning: dict[str, Any]) -> dict[str, Any]:
    """The storm paragraph's numbers: means over zones, and the RSPO+ runs' late swing per split."""
    zones = storm["zones"].values()

    def mean(f: Any) -> float:
        return float(np.mean([f(z) for z in zones]))

    def swing(runs: dict[str, Any]) -> str:
        late = [c["late-swing"] for run, c in runs.items() if run.startswith("rspo+")]
        return f"{np.mean(late):.1f}" if late else "n/a"

    return {
        "ratio": mean(lambda z: z["lam0"] / z["lam0-no-storm"]),
        "sq": mean(lambda z: z["share-sum-sq-norm-%"]),
        "share": mean(lambda z: z["share-sum-norm-%"]),
        "dec": mean(lambda z: z["decisiveness"]),
        "dec_clean": mean(lambda z: z["decisiveness-no-storm"]),
        "swing": {v: swing(learning.get(v, {})) for v in VARIANT_LABELS},
    }


def trace_facts(block: dict[str, Any]) -> dict[str, Any]:
    """When the personal model goes wrong, and whether validation saw it ({} without cases)."""
    cases = [c for by_seed in block["cases"].values() for c in by_seed.values()]
    if not cases:
        return {}
    val_better = [c["val-%"][-1] < c["fed-val-%"] for c in cases]
    test_worse = [c["test"][-1] > c["fed-test"] for c in cases]
    return {
        "last": str(max(map(int, block["rounds"]))),
        "n": len(cases),
        "val_better": sum(val_better),
        "test_worse": sum(test_worse),
        "both": sum(v and w for v, w in zip(val_better, test_worse, strict=True)),
        "frozen": [c["frozen-at"] for c in cases if c["frozen-at"]],
    }


def markdown(data: dict[str, Any]) -> str:
    """docs/results/energy.md from energy.json alone."""
    from hetfed.problems.energy import zone_quota

    cold = data["cold-start"]
    short = [b for days, b in cold["local"].items() if days != "0"]
    return render(
        "energy.md",
        d=data,
        labels=VARIANT_LABELS,
        quota=zone_quota,
        cold_wins={
            days: [
                sum(f["absolute"]["per-zone"][z]["mean"] < zones[z]["mean"] for z in zones)
                for f in cold["federated"].values()
            ]
            for days, block in cold["local"].items()
            for zones in [block["absolute"]["per-zone"]]
        },
        cold_short=short
        and {
            "val": np.mean([b["val-relative-%"]["mean"]["mean"] for b in short]),
            "test": np.mean([b["test-relative-%"]["mean"]["mean"] for b in short]),
        },
        storm=storm_facts(data["storm"], data["learning"]),
        trace={v: trace_facts(b) for v, b in data["personalization-trace"].items()},
    )


def plot(plan: Plan, results_dir: Path, jobs: list[Job], cold: dict[str, Any], out: Path) -> None:
    """energy-prices.png (the first zone's prices and splits), energy-regret-per-round.png (the
    first seed's Table 5 runs) and energy-cold-start.png (Table 11's local and federated models)."""
    from hetfed.problems.energy import split_sizes, zone_samples
    from hetfed.problems.ercot import load_ercot

    plt = pyplot()
    zone = plan.zones[0]
    samples = zone_samples(load_ercot(None, points=[zone]), zone)
    fig, ax = plt.subplots(figsize=(9, 3.5))
    ax.plot(samples.dates, samples.c.mean(1), lw=0.8)
    train, val, _ = split_sizes(len(samples.dates))  # the clients' chronological split
    cut = samples.dates[[train, train + val]]
    ax.axvspan(samples.dates[0], cut[0], color="C2", alpha=0.1, label="train")
    ax.axvspan(cut[0], cut[1], color="C1", alpha=0.15, label="validation")
    ax.axvspan(cut[1], samples.dates[-1], color="C3", alpha=0.08, label="test")
    ax.set(yscale="log", ylabel="daily mean price ($/MWh)", title=f"{zone}: day-ahead prices")
    ax.legend(loc="upper right")
    save_figure(fig, out / "energy-prices.png")

    fig, axes = plt.subplots(1, len(VARIANT_LABELS), figsize=(11, 4), sharey=True, squeeze=False)
    for ax, variant in zip(axes[0], VARIANT_LABELS, strict=True):
        for job in (j for j in jobs if j.key[1] == variant and j.seed == plan.seeds[0]):
            plot_warm_then_personal(ax, results_dir / job.config["run-name"], job.key[2])
        ax.set(
            xlabel="round (warm start, then personalization)",
            title=f"{VARIANT_LABELS[variant]} (seed {plan.seeds[0]})",
            yscale="log",
        )
    axes[0][0].set(ylabel="validation relative regret (%)")
    axes[0][0].legend(fontsize=8)
    save_figure(fig, out / "energy-regret-per-round.png")

    fig, ax = plt.subplots(figsize=(7, 4))
    local = cold["local"]
    days = [d for d in local if d != "0"]
    means = [local[d]["absolute"]["mean"]["mean"] for d in days]
    stds = [local[d]["absolute"]["mean"]["std"] for d in days]
    xs = [int(d) for d in days]
    ax.errorbar(xs, means, yerr=stds, marker="o", capsize=3, label="target's local model (last K days)")
    whole = local["0"]["absolute"]["mean"]["mean"]  # the cold-start days always include 0: all days
    ax.axhline(whole, color="C0", ls=":", label="local model, all training days")
    for i, (variant, block) in enumerate(cold["federated"].items(), 1):
        label = f"federated without target ({variant})"
        ax.axhline(block["absolute"]["mean"]["mean"], color=f"C{i}", ls="--", label=label)
    ax.set(
        xscale="log",
        xlabel="target's training days K",
        ylabel="mean absolute regret ($/MWh-h)",
        title="cold start (mean over target zones)",
    )
    ax.set_xticks(xs, [str(x) for x in xs])
    ax.minorticks_off()
    ax.legend(fontsize=8)
    save_figure(fig, out / "energy-cold-start.png")


def plot_personalization(trace: dict[str, Any], out: Path) -> None:
    """Personal minus federated model per personalization round: test regret ($) and validation
    relative regret (points); thin lines per zone (mean over its seeds), thick the mean of all."""
    plt = pyplot()

    fig, axes = plt.subplots(2, len(trace), figsize=(11, 6.5), sharex=True, squeeze=False)
    for col, (variant, block) in enumerate(trace.items()):
        for row, (key, fed, mean_key, label) in enumerate(PERSONAL_ROWS):
            ax = axes[row][col]
            for by_seed in block["cases"].values():
                n = max(len(c[key]) for c in by_seed.values())
                diffs = [[c[key][t] - c[fed] for c in by_seed.values() if len(c[key]) > t] for t in range(n)]
                ax.plot(range(1, n + 1), [np.mean(d) for d in diffs], color="grey", lw=0.6, alpha=0.7)
            ts = [int(t) for t in block["rounds"]]
            ax.plot(ts, [block["rounds"][str(t)][mean_key] for t in ts], color="C3", lw=2, label="mean")
            ax.axhline(0, color="black", lw=0.8)
            ax.set(ylabel=label)
        axes[0][col].set_title(VARIANT_LABELS[variant])
        axes[1][col].set_xlabel("personalization round")
    axes[0][0].legend()
    save_figure(fig, out / "energy-personalization.png")
