"""FedRSPO+ on grid shortest paths (PyEPO's synthetic law on k x k grids, ``hetfed.problems.shortest_path``):
five losses, Fed and +P, optimality gap (mean client relative regret, %). Three parts, each a key of
shortest-path.json (a part not run keeps what the file holds): ``table8`` (the paper's Table 8
settings on 12 x 12 and 5 x 5), ``sweep`` (what moves SPO+ against RSPO+, 3 seeds) and
``heterogeneity`` (clients with their own endpoints and terrain, the knapsack protocol); the grid is
plans/shortest-path.toml. Writes shortest-path.md, .json and -*.png to ``--out``."""

from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path
from typing import Any

import numpy as np

from hetfed.config import defaults
from hetfed.reproduce.common import add_run_arguments, mean_std, publish, pyplot, render, save_figure
from hetfed.reproduce.plan import Job, Plan, run_jobs
from hetfed.reproduce.runs import cell, plot_rounds

PLAN = Plan.load("shortest-path")  # plans/shortest-path.toml
LOSSES = tuple(PLAN.axes["losses"])
PARTS = ("table8", "sweep", "heterogeneity")
SWEEP_SEEDS = 3
TABLE8 = next(r["config"] for r in PLAN.runs if r["table"] == "table8")  # the paper's settings (plan)


def points(table: str) -> list[tuple[str, str, dict[str, Any]]]:
    """The plan's runs of ``table`` (a sweep axis, or ``rows``): (point id, label, overrides)."""
    return [(r["method"], r["label"], r["config"]) for r in PLAN.runs if r["table"] == table]


ROWS = {row: (label, over) for row, label, over in points("rows")}  # row id -> (label, overrides)
# axis -> (losses, [(point id, label, overrides)]); a point equal to Table 8 reuses its runs
SWEEP = {
    axis: (tuple(PLAN.axes[next(r["rows"] for r in PLAN.runs if r["table"] == axis)]), points(axis))
    for axis in ("degree-model", "clients", "spo-step", "rspo-schedule")
}
CLIENTS, QUICK_CLIENTS = 20, 8


def table8_run(grid_size: int, loss: str, seed: int, quick: bool, over: dict[str, Any]) -> dict[str, Any]:
    """The run config of Table 8's settings (corner-to-corner clients) with ``over`` changed (it may
    change the grid); its name carries only what differs from Table 8, so a sweep point equal to
    Table 8 reuses its run."""
    run = {**PLAN.base, **TABLE8, **(PLAN.quick if quick else {}), **ROWS["corners-t0"][1]}
    run["grid-size"] = grid_size
    reference = {**defaults(), **run}
    # RSPO+ steps with lr0 = alpha lam0 / 4 and never reads `lr`: a point that changes only the lr
    # is, for RSPO+, the Table 8 run.
    over = {k: v for k, v in over.items() if not (k == "lr" and loss == "rspo+")}
    changed = {k: v for k, v in over.items() if reference[k] != v}
    run |= changed
    tag = "".join(
        f"-{k}={v:g}" if isinstance(v, float | int) else f"-{k}={v}"
        for k, v in changed.items()
        if k != "grid-size"
    )
    name = f"t8-k{run['grid-size']}-{loss}{tag}-s{seed}"
    return {**run, "loss": loss, "seed": seed, "run-name": name}


def part_jobs(part: str, seeds: tuple[int, ...], quick: bool) -> list[Job]:
    """Every run of ``part`` with where its numbers go: table8 ``(grid, loss)``, sweep
    ``(axis, point, loss)``, heterogeneity ``(row, loss)``."""
    if part == "table8":
        grids = PLAN.axes["quick-grids" if quick else "grids"]
        return [
            Job((str(k), loss), s, table8_run(k, loss, s, quick, {}))
            for k, s, loss in itertools.product(grids, seeds, LOSSES)
        ]
    if part == "sweep":
        return [
            Job((axis, point, loss), s, table8_run(5, loss, s, quick, over))
            for axis, (losses, points) in SWEEP.items()
            for point, _, over in (points[:2] if quick else points)
            for s in seeds[:SWEEP_SEEDS]
            for loss in losses
        ]
    jobs = []
    for s, row, loss in itertools.product(seeds, ("corners-t0", "random-t0.5") if quick else ROWS, LOSSES):
        run = {"grid-size": 5, "loss": loss, "seed": s, "run-name": f"k5-{row}-{loss}-s{s}"}
        jobs.append(Job((row, loss), s, PLAN.config(quick, **ROWS[row][1], **run)))
    return jobs


def collect(jobs: list[Job], summaries: list[dict[str, Any]]) -> dict[str, Any]:
    """The part's table: at each job's path, ``{stage: {"values", "seeds", "pooled", "mean", "std"}}``
    for Fed and +P (gaps in %)."""
    out: dict[str, Any] = {}
    entries: list[dict[str, Any]] = []
    for job, summary in zip(jobs, summaries, strict=True):
        node = out
        for key in job.key:
            node = node.setdefault(key, {})
        for stage in ("fed", "per"):
            if stage not in node:
                entries.append(node.setdefault(stage, {"values": [], "seeds": [], "pooled": []}))
            entry = node[stage]
            entry["values"].append(cell(summary, stage))
            entry["pooled"].append(cell(summary, f"{stage}-pooled"))
            entry["seeds"].append(job.seed)
    for entry in entries:  # once every seed is in
        entry["mean"], entry["std"] = mean_std(entry["values"])
    return out


def paired(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """Paired-by-seed ``a - b`` (same seed: same data and the same sampled clients)."""
    assert a["seeds"] == b["seeds"], (a["seeds"], b["seeds"])
    diff = [x - y for x, y in zip(a["values"], b["values"], strict=True)]
    mean, std = mean_std(diff)
    return {"values": diff, "mean": mean, "std": std, "positive": sum(d > 0 for d in diff)}


def best(losses: dict[str, Any], stage: str) -> str:
    return min(losses, key=lambda loss: losses[loss][stage]["mean"])


def change(entry: dict[str, Any]) -> float:
    """What personalization does to a loss's gap, in %: ``100 (+P - Fed) / Fed`` (negative: a cut)."""
    return 100 * (entry["per"]["mean"] - entry["fed"]["mean"]) / entry["fed"]["mean"]


def leads(step: dict[str, Any]) -> dict[str, float]:
    """Per point of the spo-step axis: RSPO+'s lead before personalization (SPO+ − RSPO+, paired)."""
    return {p: float(paired(x["spo+"]["fed"], x["rspo+"]["fed"])["mean"]) for p, x in step.items()}


def moves(sched: dict[str, Any]) -> dict[str, float]:
    """Per schedule point: how it moves RSPO+'s +P gap against the Table 8 runs (kappa_lam 1);
    ``kappa``: the largest move of a kappa_lam."""
    base = sched["kappa1"]["rspo+"]["per"]
    out = {p: paired(x["rspo+"]["per"], base)["mean"] for p, x in sched.items() if p != "kappa1"}
    return {**out, "kappa": max(abs(v) for p, v in out.items() if p.startswith("kappa"))}


def markdown(data: dict[str, Any]) -> str:
    """shortest-path.md from the contents of shortest-path.json (the parts it holds)."""
    return render(
        "shortest-path.md",
        data=data,
        losses=LOSSES,
        degree=PLAN.base["degree"],
        quick_clients=QUICK_CLIENTS,
        mean=np.mean,
        **{f.__name__: f for f in (best, change, paired, leads, moves)},  # the template's functions
    )


def plot_bars(tables: dict[str, Any], titles: dict[str, str], path: Path) -> None:
    """Fed and +P gap per loss, one panel per table row (a grid or a heterogeneity row)."""
    panels = len(tables)
    fig, axes = pyplot().subplots(1, panels, figsize=(3.6 * panels, 3.8), sharey=True, squeeze=False)
    for ax, row in zip(axes[0], tables, strict=True):
        x = np.arange(len(LOSSES))
        for i, (stage, label) in enumerate((("fed", "Fed"), ("per", "+P"))):
            means = [tables[row][m][stage]["mean"] for m in LOSSES]
            stds = [tables[row][m][stage]["std"] for m in LOSSES]
            ax.bar(x + (i - 0.5) * 0.38, means, 0.38, yerr=stds, capsize=2, label=label)
        ax.set_xticks(x, LOSSES)
        ax.set_title(titles[row], fontsize=8)
    axes[0][0].set(ylabel="optimality gap (%)")
    axes[0][0].legend()
    save_figure(fig, path)


def plot_sweep(d: dict[str, Any], path: Path) -> None:
    """SPO+ and RSPO+ +P gap against the degree, linear and MLP models."""
    dm = d["tables"]["degree-model"]
    fig, axes = pyplot().subplots(1, 2, figsize=(8, 3.6), sharey=True)
    for ax, model in zip(axes, ("linear", "mlp"), strict=True):
        points = [p for p in dm if p.endswith(f"-{model}")]
        degrees = [int(p.split("-")[0][1:]) for p in points]
        for loss in ("spo+", "rspo+"):
            for stage, style, name in (("fed", "--", "Fed"), ("per", "-", "+P")):
                means = [dm[p][loss][stage]["mean"] for p in points]
                ax.plot(degrees, means, style, marker="o", label=f"{loss} {name}")
        ax.set(title=model, xlabel="degree of the feature-to-cost law")
    axes[0].set(ylabel="optimality gap (%)")
    axes[0].legend(fontsize=7)
    save_figure(fig, path)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_run_arguments(
        parser,
        "shortest-path",
        quick="1 seed, 8 clients, short schedule, 5 x 5 only, fewer sweep points and rows (CI)",
        seeds="how many seeds (max 5; the sweep takes at most 3)",
    )
    parser.add_argument(
        "--part",
        action="append",
        choices=PARTS,
        help="run only this part (repeatable; default: all); the others keep their entries in the JSON",
    )


def part_record(
    part: str, seeds: tuple[int, ...], quick: bool, jobs: list[Job], summaries: list[dict[str, Any]]
) -> dict[str, Any]:
    """A part's entry of shortest-path.json."""
    record: dict[str, Any] = {
        "seeds": list(seeds[:SWEEP_SEEDS] if part == "sweep" else seeds),
        "clients": QUICK_CLIENTS if quick else CLIENTS,
        "quick": quick,
        "runs-wall-time-s": round(sum(s["wall-time-s"] for s in summaries), 1),
        "unit": "optimality gap % (mean client relative regret); pooled: PyEPO normalized regret %",
        "tables": collect(jobs, summaries),
    }
    if part == "table8":
        record |= {"settings": TABLE8, "paper-table6": PLAN.paper["table6"]}
    elif part == "sweep":
        record["points"] = {axis: {p: label for p, label, _ in points} for axis, (_, points) in SWEEP.items()}
    else:
        record |= {"grid-size": 5, "rows": {row: ROWS[row][0] for row in record["tables"]}}
    return record


def run(args: argparse.Namespace) -> int:
    seeds = PLAN.chosen_seeds(args.seeds, args.quick)
    parts = tuple(p for p in PARTS if p in (args.part or PARTS))
    out, results_dir = Path(args.out), Path(args.results_dir)
    path = out / "shortest-path.json"
    data = json.loads(path.read_text()) if path.exists() else {}
    for part in parts:
        jobs = part_jobs(part, seeds, args.quick)
        summaries = run_jobs(jobs, args, nodes=QUICK_CLIENTS if args.quick else CLIENTS)
        data[part] = part_record(part, seeds, args.quick, jobs, summaries)
        publish(out, "shortest-path", data, markdown)  # each part lands as soon as it is done
        if part == "table8":
            t = data[part]["tables"]
            plot_bars(t, {k: f"{k} x {k}, Table 8's settings" for k in t}, out / "shortest-path-gap.png")
            grid, seed = jobs[0].key[0], jobs[0].seed  # part_jobs: the largest grid's first seed, every loss
            runs = [(results_dir / j.config["run-name"], j.config["loss"]) for j in jobs[: len(LOSSES)]]
            title = f"{grid} x {grid}, Table 8's settings, seed {seed}"
            plot_rounds(
                out / "shortest-path-regret-per-round.png", runs, "validation optimality gap (%)", title
            )
        elif part == "sweep":
            plot_sweep(data[part], out / "shortest-path-sweep.png")
        else:
            plot_bars(data[part]["tables"], data[part]["rows"], out / "shortest-path-heterogeneity.png")
    print((out / "shortest-path.md").read_text())
    return 0
