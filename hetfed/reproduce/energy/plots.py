"""The energy reproduction's figures (energy-*.png)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from hetfed.reproduce.common import pyplot, save_figure
from hetfed.reproduce.energy.plan import RUNS, VARIANT_LABELS, VARIANTS, Job, Plan
from hetfed.reproduce.runs import plot_warm_then_personal


def plot(plan: Plan, results_dir: Path, jobs: list[Job], cold: dict[str, Any], out: Path) -> None:
    plt = pyplot()

    from hetfed.problems.energy import zone_samples
    from hetfed.problems.ercot import load_ercot

    zone = plan.zones[0]
    samples = zone_samples(load_ercot(None, points=[zone]), zone)
    fig, ax = plt.subplots(figsize=(9, 3.5))
    ax.plot(samples.dates, samples.c.mean(1), lw=0.8)
    n = len(samples.dates)
    cut = samples.dates[[int(0.5 * n), int(0.5 * n) + int(0.1 * n)]]
    ax.axvspan(samples.dates[0], cut[0], color="C2", alpha=0.1, label="train")
    ax.axvspan(cut[0], cut[1], color="C1", alpha=0.15, label="validation")
    ax.axvspan(cut[1], samples.dates[-1], color="C3", alpha=0.08, label="test")
    ax.set(yscale="log", ylabel="daily mean price ($/MWh)", title=f"{zone}: day-ahead prices")
    ax.legend(loc="upper right")
    save_figure(fig, out / "energy-prices.png")

    fig, axes = plt.subplots(1, len(VARIANTS), figsize=(11, 4), sharey=True)
    for ax, variant in zip(np.atleast_1d(axes), VARIANTS, strict=True):
        for run in RUNS:
            job = next((j for j in jobs if j.key[1:] == (variant, run) and j.seed == plan.seeds[0]), None)
            if job is None:
                continue
            plot_warm_then_personal(ax, results_dir / job.config["run-name"], run)
        ax.set(
            xlabel="round (warm start, then personalization)",
            title=f"{VARIANT_LABELS[variant]} (seed {plan.seeds[0]})",
            yscale="log",
        )
    np.atleast_1d(axes)[0].set(ylabel="validation relative regret (%)")
    np.atleast_1d(axes)[0].legend(fontsize=8)
    save_figure(fig, out / "energy-regret-per-round.png")

    fig, ax = plt.subplots(figsize=(7, 4))
    days = [d for d in cold["local"] if d != "0"]
    means = [cold["local"][d]["absolute"]["mean"]["mean"] for d in days]
    stds = [cold["local"][d]["absolute"]["mean"]["std"] for d in days]
    xs = [int(d) for d in days]
    ax.errorbar(xs, means, yerr=stds, marker="o", capsize=3, label="target's local model (last K days)")
    if "0" in cold["local"]:
        ax.axhline(
            cold["local"]["0"]["absolute"]["mean"]["mean"],
            color="C0",
            ls=":",
            label="local model, all training days",
        )
    for i, (variant, block) in enumerate(cold["federated"].items()):
        ax.axhline(
            block["absolute"]["mean"]["mean"],
            color=f"C{i + 1}",
            ls="--",
            label=f"federated without target ({variant})",
        )
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
        for row, (key, fed, label) in enumerate(
            (
                ("test", "fed-test", "test regret, personal - Fed ($)"),
                ("val-%", "fed-val-%", "validation, personal - Fed (points)"),
            )
        ):
            ax = axes[row][col]
            for by_seed in block["cases"].values():
                n = max(len(c[key]) for c in by_seed.values())
                diffs = [[c[key][t] - c[fed] for c in by_seed.values() if len(c[key]) > t] for t in range(n)]
                ax.plot(range(1, n + 1), [np.mean(d) for d in diffs], color="grey", lw=0.6, alpha=0.7)
            mean_key = "test-minus-fed" if key == "test" else "val-minus-fed-points"
            ts = [int(t) for t in block["rounds"]]
            ax.plot(ts, [block["rounds"][str(t)][mean_key] for t in ts], color="C3", lw=2, label="mean")
            ax.axhline(0, color="black", lw=0.8)
            ax.set(ylabel=label)
            if row == 0:
                ax.set_title(VARIANT_LABELS[variant])
            else:
                ax.set_xlabel("personalization round")
    axes[0][0].legend()
    save_figure(fig, out / "energy-personalization.png")
