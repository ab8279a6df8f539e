"""Knapsack studies beyond the paper's tables (docs/algorithms.md 1.7): any grid, as real federations.

``hetfed reproduce knapsack-study STUDY`` runs a study of plans/knapsack-study.toml: heterogeneity
rows ``(eta_o, eta_c, eta_d)`` x losses x variants x seeds, each cell a FedRSPO+ run, and writes
``<out>/knapsack-<study>.md`` (templates/knapsack-study.md) and ``.json``: per cell the relative
regret (%) of the federated (Fed) and personalized (+P) models, mean and std over seeds, and the
QP-LP gap diagnostics of RSPO+. ``--rows``, ``--losses``, ``--seeds``, ``--clients`` and ``--set``
change any of them, so any cell can be rerun.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import re
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from hetfed.config import SCHEMA, parse_assignments
from hetfed.reproduce import knapsack
from hetfed.reproduce.common import OUT, default_workers, publish, pyplot, render, save_figure, stat
from hetfed.reproduce.knapsack import CLIENTS, LOSSES, PAPER_ORDERINGS, base_config, row_etas
from hetfed.reproduce.plan import Job, Plan, run_jobs
from hetfed.reproduce.runs import cell, frozen_at

PLAN = Plan.load("knapsack-study")  # plans/knapsack-study.toml: every study's grid


@dataclass(frozen=True)
class Variant:
    """One column group of a study: run-config overrides and the federation's size (0: the study's)."""

    label: str
    overrides: dict[str, Any]
    clients: int = 0


@dataclass(frozen=True)
class Study:
    """What one study runs: rows x losses x variants x the first ``seeds`` seeds."""

    name: str
    rows: tuple[str, ...]
    losses: tuple[str, ...]
    variants: tuple[Variant, ...]
    seeds: int
    clients: int = CLIENTS
    centralized: bool = False  # also one model on the clients' pooled data (Table 14's yardstick)


STUDIES = {
    name: Study(
        name,
        tuple(PLAN.axes[name]),
        tuple(PLAN.axes[f"{name}-losses"]),
        tuple(Variant(r["method"], r["config"], r.get("nodes", 0)) for r in PLAN.runs if r["table"] == name),
        PLAN.axes.get(f"{name}-seeds", [len(PLAN.seeds)])[0],
        centralized=name in PLAN.axes["centralized"],
    )
    for name in dict.fromkeys(r["table"] for r in PLAN.runs)
}


def jobs(study: Study, quick: bool, fixed: dict[str, Any]) -> list[Job]:
    """Every run of ``study``: seeds x rows x losses x variants (``fixed``: --set overrides)."""
    out = []
    for seed, row, loss, variant in itertools.product(
        PLAN.seeds[: study.seeds], study.rows, study.losses, study.variants
    ):
        name = re.sub(r"[^A-Za-z0-9.+=-]+", "_", f"{study.name}-{row}-{loss}-{variant.label}-s{seed}")
        cfg = {
            **base_config(row, seed, quick=False),
            "loss": loss,
            **(PLAN.quick if quick else {}),
            **variant.overrides,
            **fixed,
            "run-name": name,
        }
        out.append(Job((row, loss, variant.label), seed, cfg, variant.clients or study.clients))
    return out


def table(all_jobs: list[Job], summaries: list[dict[str, Any]], results_dir: Path) -> dict[str, Any]:
    """``{row: {loss: {variant: {"fed", "per", "per/fed", "frozen-share", "frozen-round": stat}}}}``; the
    pooled model of a ``centralized`` run stands in the +P column (it has no Fed)."""
    cells: dict[tuple[str, ...], dict[str, list[float]]] = {}
    seeds: dict[tuple[str, ...], list[int]] = {}
    for job, summary in zip(all_jobs, summaries, strict=True):
        fed, per = cell(summary, "fed"), cell(summary, "per")
        if pooled := job.config.get("strategy") == "centralized":  # one model, every client's
            fed, per = math.nan, fed
        values = {"fed": fed, "per": per, "per/fed": per / fed if fed else math.nan}
        if job.key[1] == "rspo+" and job.config.get("personal-rounds", 1) and not pooled:  # QP-LP gap
            frozen = list(frozen_at(results_dir / job.config["run-name"]).values())  # 0: never froze
            at = [t for t in frozen if t > 0]
            values["frozen-share"] = len(at) / len(frozen) if frozen else math.nan
            values["frozen-round"] = sum(at) / len(at) if at else math.nan
        for metric, value in values.items():
            cells.setdefault(job.key, {}).setdefault(metric, []).append(value)
        seeds.setdefault(job.key, []).append(job.seed)
    out: dict[str, Any] = {}
    for (row, loss, variant), metrics in cells.items():
        by_metric = {m: stat(v, seeds[(row, loss, variant)]) for m, v in metrics.items()}
        out.setdefault(row, {}).setdefault(loss, {})[variant] = by_metric
    return out


def centralized_jobs(planned: list[Job], reference: str) -> list[Job]:
    """Per run of the ``reference`` variant, the same settings and clients as strategy ``centralized``:
    one model trained on the pooled data of its clients (Table 14's yardstick)."""
    return [
        Job(
            j.key[:2] + ("centralized",),
            j.seed,
            {**j.config, "strategy": "centralized", "run-name": f"{j.config['run-name']}-centralized"},
            j.nodes,
        )
        for j in planned
        if j.key[2] == reference
    ]


def orderings(cells: dict[str, Any], variants: list[str]) -> list[dict[str, Any]]:
    """Per variant, stage and pair of the paper's ordering: the rows where the means keep it, where
    not, and the smallest margin (the worse loss's mean minus the better one's)."""
    out = []
    for variant, stage, (better, worse, _) in itertools.product(variants, ("fed", "per"), PAPER_ORDERINGS):
        margins = {}
        for row, by_loss in cells.items():
            pair = [by_loss.get(x, {}).get(variant, {}).get(stage, {}).get("mean") for x in (better, worse)]
            if all(m is not None and math.isfinite(m) for m in pair):
                margins[row] = pair[1] - pair[0]
        if margins:
            fails, order = [row for row, m in margins.items() if m <= 0], f"{better} < {worse}"
            out.append(
                {
                    "variant": variant,
                    "stage": stage,
                    "order": order,
                    "rows": len(margins),
                    "holds": len(margins) - len(fails),
                    "fails": fails,
                    "margin": min(margins.values()),
                }
            )
    return out


def paper_settings(study: Study, variant: Variant, fixed: dict[str, Any], quick: bool) -> bool:
    """Does ``variant`` run the paper's Table 3 settings (every override at its default, 20 clients)?"""
    same = all(SCHEMA[k].default == v for k, v in {**variant.overrides, **fixed}.items())
    return same and not quick and (variant.clients or study.clients) == CLIENTS


def ranking(cells: dict[str, Any]) -> list[str]:
    """Per row and loss of a study: the best variant (mean +P, else Fed) and its margin over the next."""
    out = []
    for row, by_loss in cells.items():
        for loss, by_variant in by_loss.items():
            stage = "per" if any(math.isfinite(c["per"]["mean"]) for c in by_variant.values()) else "fed"
            entries = [(c[stage]["mean"], c[stage]["std"], v) for v, c in by_variant.items()]
            ranked = sorted(e for e in entries if math.isfinite(e[0]))
            if len(ranked) >= 2:
                (best, _, name), (second, sd, runner) = ranked[0], ranked[1]
                sds = f", {(second - best) / sd:.1f} sd" if sd > 0 else ""
                label = "+P" if stage == "per" else "Fed"
                gap = f"{second - best:.2f} points below {runner}{sds}"
                out.append(f"{row} {loss}: {name} ({best:.2f}, {label}), {gap}")
    return out


def markdown(data: dict[str, Any]) -> str:
    """knapsack-<study>.md from its JSON alone (templates/knapsack-study.md has the titles, questions)."""
    return render("knapsack-study.md", **data, data=data, best=ranking(data["table"]))


def plot(study: Study, data: dict[str, Any], title: str, out: Path) -> None:
    """For a sweep (one row): +P relative regret against the variant, per loss, with a ±std band."""
    if len(study.rows) != 1 or len(study.variants) < 3:
        return
    import numpy as np

    row = data["table"][study.rows[0]]
    labels = [v["label"] for v in data["variants"]]
    fig, ax = pyplot().subplots(figsize=(8, 4))
    for loss, by_variant in row.items():
        for stage, style in (("fed", "--"), ("per", "-")):
            xs = [i for i, v in enumerate(labels) if v in by_variant]
            means = np.array([by_variant[labels[i]][stage]["mean"] for i in xs])
            stds = np.array([by_variant[labels[i]][stage]["std"] for i in xs])
            ax.plot(xs, means, style, marker=".", label=f"{loss} {'Fed' if stage == 'fed' else '+P'}")
            ax.fill_between(xs, means - stds, means + stds, alpha=0.15)
    ax.set_xticks(range(len(labels)), labels, rotation=30, ha="right", fontsize=8)
    ax.set(ylabel="relative regret (%)", title=title, yscale="log")
    ax.legend(fontsize=7)
    save_figure(fig, out / f"knapsack-{study.name}.png")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("study", choices=sorted(STUDIES), help="which study (see the module docs)")
    parser.add_argument("--rows", nargs="+", help="rows '(eta_o,eta_c,eta_d)' (default: the study's)")
    parser.add_argument("--losses", nargs="+", choices=LOSSES, help="losses (default: the study's)")
    parser.add_argument("--seeds", type=int, help="how many of the paper's seeds, 1-5 (default: the study's)")
    parser.add_argument("--clients", type=int, help=f"clients per federation (default {CLIENTS})")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="run-config override")
    parser.add_argument("--quick", action="store_true", help="1 seed, a short schedule, small data (CI)")
    parser.add_argument("--workers", type=int, default=default_workers(), help="parallel inline runs")
    parser.add_argument("--results-dir", help="where the runs go (results/reproduce-knapsack-<study>)")
    parser.add_argument("--out", default=str(OUT), help="where the .md/.json/.png go (docs/results)")


def resolve(args: argparse.Namespace) -> Study:
    """The study with the command line's changes, checked."""
    study = STUDIES[args.study]
    for row in args.rows or ():
        row_etas(row)
    if args.seeds is not None:
        PLAN.chosen_seeds(args.seeds, quick=False)  # refuses a count the plan does not have
    if args.clients is not None and args.clients < 1:
        raise ValueError(f"--clients: must be >= 1, got {args.clients}")
    changes = {
        "rows": tuple(args.rows or ()),
        "losses": tuple(args.losses or ()),
        "seeds": args.seeds,
        "clients": args.clients,
    }
    study = replace(study, **{k: v for k, v in changes.items() if v})
    return replace(study, seeds=1) if args.quick else study


def run(args: argparse.Namespace) -> int:
    started = time.time()
    study = resolve(args)
    fixed = parse_assignments(args.set)
    results_dir = Path(args.results_dir or f"results/reproduce-knapsack-{study.name}")
    planned = jobs(study, args.quick, fixed)
    pooled = centralized_jobs(planned, study.variants[0].label) if study.centralized else []
    inline = argparse.Namespace(**(vars(args) | {"results_dir": results_dir, "engine": "inline"}))
    summaries = run_jobs(planned + pooled, inline)
    out = Path(args.out)
    data = {
        "study": study.name,
        "seeds": list(PLAN.seeds[: study.seeds]),
        "clients": study.clients,
        "quick": args.quick,
        "set": fixed,
        "workers": args.workers,
        "wall-time-s": round(time.time() - started, 1),
        "runs": len(planned),
        "runs-wall-time-s": round(
            sum(float(x.get("wall-time-s", 0.0)) for x in summaries[: len(planned)]), 1
        ),
        "unit": "relative regret %",
        "variants": [asdict(v) for v in study.variants + ((Variant("centralized", {}),) if pooled else ())],
        "table": (cells := table(planned + pooled, summaries, results_dir)),
        "centralized": study.centralized,
        "orderings": orderings(cells, [v.label for v in study.variants]),
        "paper-settings": [v.label for v in study.variants if paper_settings(study, v, fixed, args.quick)],
        "paper-t3": knapsack.PLAN.paper["t3"],
    }
    publish(out, f"knapsack-{study.name}", data, markdown)
    text = (out / f"knapsack-{study.name}.md").read_text(encoding="utf-8")
    plot(study, data, text.splitlines()[0].removeprefix("# Knapsack study: "), out)  # the report's title
    print(text)
    if not (index := out / "knapsack.json").exists():
        print(f"(no {index} yet: `hetfed reproduce knapsack` will index this study)")
    else:  # the main report indexes the studies beside it
        main = json.loads(index.read_text(encoding="utf-8"))
        publish(out, "knapsack", main | {"studies": knapsack.study_index(out)}, knapsack.markdown)
    return 0
