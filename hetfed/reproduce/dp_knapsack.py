"""The utility cost of central DP on the knapsack (``hetfed reproduce dp-knapsack``): FedRSPO+ and MSE
under FedRSPO+'s protocol with n = 10, 20, 40 clients, without DP and per noise multiplier z with
``dp=central`` (each warm-start update clipped to a fixed S per loss, :data:`CLIPS`; N(0, (z S)^2)
added to the sum). Per n, loss and z: epsilon, the Fed, +P and deployed test relative regret over
seeds, and the share of updates within the clip. The grid is plans/dp-knapsack.toml."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from hetfed.reproduce.common import (
    add_run_arguments,
    default_workers,
    fmt,
    publish,
    pyplot,
    render,
    save_figure,
    stat,
)
from hetfed.reproduce.plan import Job, Plan, run_jobs

LOSSES = {"rspo+": "FedRSPO+", "mse": "MSE"}
MODELS = ("fed", "per", "dep")
PLAN = Plan.load("dp-knapsack")  # plans/dp-knapsack.toml
NOISE, QUICK_NOISE = tuple(PLAN.axes["noise"]), tuple(PLAN.axes["quick-noise"])
CLIENTS, QUICK_CLIENTS = tuple(PLAN.axes["clients"]), tuple(PLAN.axes["quick-clients"])
DELTA = 1e-5
CLIPS = {"rspo+": 1.2, "mse": 0.32}  # about the median no-DP update norm of each loss (module docs)
CLIP_CHOICE = (
    "about the median L2 norm of the clients' warm-start updates (x = reply - sent) in runs "
    "without DP (10 clients, seeds 42-44, every round and client; medians RSPO+ 1.198, 1.135, 1.192, "
    "MSE 0.324, 0.328, 0.320), rounded"
)
OFF = "off"  # the label of the runs without DP


def label(z: float | None) -> str:
    """A noise level's key in the tables: ``off`` without DP, else z (``1``, ``0.5``)."""
    return OFF if z is None else f"{z:g}"


def run_name(clients: int, loss: str, z: float | None, seed: int) -> str:
    return f"dp-knapsack-n{clients}-{loss}-{label(z)}-s{seed}"


def configs(
    seeds: tuple[int, ...], noise: tuple[float, ...], clients: tuple[int, ...], quick: bool
) -> list[dict[str, Any]]:
    """One run per number of clients, loss, noise level (None: no DP) and seed."""

    def dp(loss: str, z: float | None) -> dict[str, Any]:
        central = {
            "dp": "central",
            "dp-noise-multiplier": z,
            "dp-clipping-norm": CLIPS[loss],
            "dp-delta": DELTA,
        }
        return {} if z is None else central

    return [
        PLAN.config(
            quick,
            **dp(loss, z),
            **{"num-clients": n, "loss": loss, "seed": seed, "run-name": run_name(n, loss, z, seed)},
        )
        for n in clients
        for loss in LOSSES
        for z in (None, *noise)
        for seed in seeds
    ]


def within_clip(run_dir: Path) -> float | None:
    """Share of the run's warm-start updates within the clip (rounds.csv ``dp-within``; None without DP)."""
    from hetfed.server.store import RunResult

    values = [value for _, _, value in RunResult.read(run_dir).values("dp-within")]
    return sum(values) / len(values) if values else None


def cell(runs: list[tuple[int, dict[str, Any], Path]]) -> dict[str, Any]:
    """One (loss, noise level): epsilon (the same in every seed's run), regrets and clip share."""
    seeds = [seed for seed, _, _ in runs]
    privacy = [s.get("privacy", {}) for _, s, _ in runs]
    epsilons = [p.get("epsilon") for p in privacy]
    if len(set(epsilons)) != 1:
        raise ValueError(f"the seeds' runs spent different epsilon: {epsilons}")
    within = [within_clip(folder) for _, _, folder in runs]
    return {
        "epsilon": epsilons[0],
        "delta": privacy[0].get("delta"),
        "releases": privacy[0].get("releases"),
        "clients-per-round": privacy[0].get("clients-per-round"),
        **{
            model: stat([s["aggregate"][f"{model}-relative-regret"] for _, s, _ in runs], seeds)
            for model in MODELS
        },
        "within-clip": None if None in within else stat([float(w or 0) for w in within], seeds),
    }


def tables(
    planned: list[dict[str, Any]], summaries: list[dict[str, Any]], results_dir: Path
) -> dict[str, dict[str, dict[str, Any]]]:
    """Per number of clients, loss and noise level (``off``, then each z): :func:`cell` of its seeds."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for c, s in zip(planned, summaries, strict=True):
        by_level = out.setdefault(str(c["num-clients"]), {}).setdefault(c["loss"], {})
        by_level.setdefault(label(c.get("dp-noise-multiplier")), []).append(
            (c["seed"], s, results_dir / c["run-name"])
        )
    return {
        n: {
            loss: {
                key: {
                    "noise-multiplier": None if key == OFF else float(key),
                    "clip": None if key == OFF else CLIPS[loss],
                }
                | cell(runs)
                for key, runs in by_level.items()
            }
            for loss, by_level in by_loss.items()
        }
        for n, by_loss in out.items()
    }


def pct(entry: dict[str, Any]) -> str:
    """``mean ± std`` of a relative-regret entry, in percent."""
    return fmt({"mean": 100 * entry["mean"], "std": 100 * entry["std"]}, 2)


def facts(data: dict[str, Any]) -> dict[str, Any]:
    """What the sentences under the table say, computed from the JSON (templates/dp-knapsack.md)."""
    t, names = data["tables"], data["losses"]
    sizes = list(t)
    main = t[sizes[0]]
    levels = [k for k in main["rspo+"] if k != OFF]
    out: dict[str, Any] = {"sizes": sizes, "levels": levels, "mid": None}
    if not levels:
        return out
    out["rising"] = all(
        row[a]["dep"]["mean"] <= row[b]["dep"]["mean"]
        for row in main.values()
        for a, b in zip([OFF, *levels], levels, strict=False)
    )
    orders, lost_at_top, lost = [], True, False
    for n, by_loss in t.items():
        ahead = [z for z in levels if by_loss["rspo+"][z]["dep"]["mean"] < by_loss["mse"][z]["dep"]["mean"]]
        behind = [z for z in levels if z not in ahead]
        orders.append((n, ahead, behind))
        lost |= bool(behind)
        lost_at_top &= not behind or not ahead or max(map(float, ahead)) < min(map(float, behind))
    out["orders"] = orders
    if not lost:
        out["ending"] = "the decision-focused loss keeps its advantage at every epsilon tried."
    elif lost_at_top:
        out["ending"] = (
            "where the decision-focused loss loses its advantage, it is under the strongest privacy."
        )
    else:
        out["ending"] = "the ordering does not follow the noise level."
    if len(sizes) > 1:
        mid = out["mid"] = "1" if "1" in levels else levels[len(levels) // 2]

        def cost(n: str, loss: str) -> float:
            return 100 * float(t[n][loss][mid]["dep"]["mean"]) - 100 * float(t[n][loss][OFF]["dep"]["mean"])

        out["falling"] = all(
            cost(a, loss) >= cost(b, loss) for loss in names for a, b in zip(sizes, sizes[1:], strict=False)
        )
    cells = [(n, loss, z) for n in sizes for loss in names for z in levels]
    out["cells"] = len(cells)
    out["better"] = sum(t[n][loss][z]["dep"]["mean"] < t[n][loss][z]["fed"]["mean"] for n, loss, z in cells)
    lo, hi = levels[0], levels[-1]
    out["falls"] = any(
        row[hi]["within-clip"]["mean"] < row[lo]["within-clip"]["mean"] for row in main.values()
    )
    return out


def markdown(data: dict[str, Any]) -> str:
    """docs/results/dp-knapsack.md, from dp-knapsack.json alone (templates/dp-knapsack.md)."""
    return render("dp-knapsack.md", d=data, f=facts(data), off=OFF, models=MODELS, pct=pct)


def plot(data: dict[str, Any], out: Path) -> None:
    """dp-knapsack.png, one panel per number of clients: federated (dashed) and deployed (solid)
    regret against epsilon (log x), ±std; the deployed model without DP dotted."""
    plt = pyplot()
    from matplotlib.ticker import NullFormatter

    t = data["tables"]
    values = [
        100 * row[model]["mean"]
        for by_loss in t.values()
        for by_level in by_loss.values()
        for row in by_level.values()
        for model in ("fed", "dep")
    ]
    lowest, highest = min(values), max(values)
    fig, axes = plt.subplots(1, len(t), figsize=(4.6 * len(t), 4.2), sharey=True, squeeze=False)
    for ax, (n, by_loss) in zip(axes[0], t.items(), strict=True):
        for i, (loss, by_level) in enumerate(by_loss.items()):
            rows = sorted((r for k, r in by_level.items() if k != OFF), key=lambda r: r["epsilon"])
            name = data["losses"][loss]
            for model, style in (("fed", "--"), ("dep", "-")):
                ax.errorbar(
                    [r["epsilon"] for r in rows],
                    [100 * r[model]["mean"] for r in rows],
                    yerr=[100 * r[model]["std"] for r in rows],
                    ls=style,
                    marker="o",
                    capsize=3,
                    color=f"C{i}",
                    label=f"{name}, {'federated' if model == 'fed' else 'deployed'}",
                )
            ax.axhline(
                100 * by_level[OFF]["dep"]["mean"], color=f"C{i}", ls=":", label=f"{name}, deployed, no DP"
            )
        ax.set(
            xscale="log", yscale="log", xlabel=f"epsilon at delta = {data['delta']:g}", title=f"{n} clients"
        )
        ticks = [v for v in (1, 2, 5, 10, 20, 50, 100) if lowest / 2 < v < highest * 2]
        ax.set_yticks(ticks, [f"{v:g}" for v in ticks])
        ax.yaxis.set_minor_formatter(NullFormatter())
        ax.grid(alpha=0.3, which="both")
    axes[0][0].set_ylabel("test relative regret (%)")
    axes[0][0].legend(fontsize=7)
    fig.suptitle(
        f"Central DP on the knapsack (eta-o = {data['config']['eta-o']:g}), "
        f"mean ± std over {len(data['seeds'])} seed(s)"
    )
    save_figure(fig, out / "dp-knapsack.png")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_run_arguments(
        parser,
        "dp-knapsack",
        quick="1 seed, 10 clients, z in {1, 4}, 3 + 3 rounds of 1 epoch (CI)",
        engines=("inline",),
        seeds="how many seeds (max 5)",
    )


def run(args: argparse.Namespace) -> int:
    started = time.time()
    seeds = PLAN.chosen_seeds(args.seeds, args.quick)
    noise, clients = (QUICK_NOISE, QUICK_CLIENTS) if args.quick else (NOISE, CLIENTS)
    planned = configs(seeds, noise, clients, args.quick)
    results_dir = Path(args.results_dir)
    summaries = run_jobs([Job((), c["seed"], c, c["num-clients"]) for c in planned], args)
    out = Path(args.out)
    varied = ("num-clients", "loss", "seed", "run-name", "dp", "dp-noise-multiplier", "dp-clipping-norm")
    data = publish(
        out,
        "dp-knapsack",
        {
            "seeds": list(seeds),
            "quick": args.quick,
            "runs": len(planned),
            "clients": list(clients),
            "losses": LOSSES,
            "noise-multipliers": list(noise),
            "clips": CLIPS,
            "clip-choice": CLIP_CHOICE,
            "delta": DELTA,
            "config": {k: v for k, v in planned[0].items() if k not in (*varied, "dp-delta")},
            "cores": default_workers(),  # the usable cores (the default workers are one each)
            "wall-time-s": round(time.time() - started, 1),
            "run-time-s": round(sum(s["wall-time-s"] for s in summaries), 1),
            "metric": "relative regret on each client's test samples, mean over clients",
            "tables": tables(planned, summaries, results_dir),
        },
        markdown,
    )
    plot(data, out)
    print(f"wrote {out / 'dp-knapsack.md'}, dp-knapsack.json and dp-knapsack.png")
    return 0
