"""Knapsack studies beyond the paper's tables (docs/algorithms.md 1.7): any grid, as real federations.

``hetfed reproduce knapsack-study STUDY`` runs a grid of heterogeneity rows ``(eta_o, eta_c,
eta_d)`` x losses x variants x seeds, each cell a FedRSPO+ run (calibration, warm start,
personalization) of ``--clients`` clients on the inline engine, and writes
``<out>/knapsack-<study>.md`` and ``.json``: per cell the relative regret (%) of the federated
(Fed) and personalized (+P) models, mean and std over seeds, and the QP-LP gap diagnostics of
RSPO+ (share of clients frozen, the mean round they froze, +P / Fed). A study is data
(:data:`STUDIES`): its rows, losses, seeds and variants (one swept run-config key, or named
run-config overrides such as FedProx and Ditto, or the client count); ``--rows``, ``--losses``,
``--seeds``, ``--clients`` and ``--set`` change any of them, so any cell can be rerun.
"""

from __future__ import annotations

import argparse
import itertools
import re
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from hetfed.config import SCHEMA, parse_assignments
from hetfed.reproduce.centralized import centralized
from hetfed.reproduce.common import OUT, default_workers, stat, write_json
from hetfed.reproduce.common import fmt as common_fmt
from hetfed.reproduce.knapsack import (
    CLIENTS,
    LOSSES,
    PAPER_T3,
    PLAN,
    base_config,
    ranking,
    refresh_study_index,
    row_etas,
)
from hetfed.reproduce.plan import Job, run_jobs
from hetfed.reproduce.runs import cell, frozen_at

QUICK = {"num-rounds": 2, "personal-rounds": 2, "local-epochs": 1, "n-train": 40, "n-test": 40}


@dataclass(frozen=True)
class Variant:
    """One column group of a study: run-config overrides and the federation's size (0: the study's)."""

    label: str
    overrides: dict[str, Any] = field(default_factory=dict)
    clients: int = 0


@dataclass(frozen=True)
class Study:
    """What one study runs: rows x losses x variants x seeds."""

    name: str
    title: str
    rows: tuple[str, ...]
    losses: tuple[str, ...]
    variants: tuple[Variant, ...] = (Variant("default"),)
    seeds: int = 5
    clients: int = CLIENTS
    question: str = ""  # what the study asks (the report's first paragraph)
    centralized: bool = False  # also one model on the clients' pooled data (Table 14's yardstick)


def sweep(key: str, values: tuple[Any, ...]) -> tuple[Variant, ...]:
    """One variant per value of run-config key ``key``."""
    return tuple(Variant(f"{key}={v:g}", {key: v}) for v in values)


AXIS = (0.0, 0.5, 1.0)
COMBINED = tuple(f"({o:g},{c:g},{d:g})" for o, c, d in itertools.product(AXIS, AXIS, AXIS))
STUDIES = {
    s.name: s
    for s in (
        Study(
            "combined",
            "Combined heterogeneity: every (eta_o, eta_c, eta_d) in {0, 0.5, 1}^3",
            COMBINED,
            ("mse", "spo+", "rspo+"),
            seeds=3,
            question="Does RSPO+'s lead over SPO+ and MSE, Fed and +P, hold when the three axes combine?",
        ),
        Study(
            "data-heterogeneity",
            "Data heterogeneity (Table 14's rows): federated against local-only",
            ("(0,0,0.5)", "(0,0,1)"),
            ("spo+", "rspo+"),
            (Variant("fedrspo"), Variant("local-only", {"strategy": "local-only"})),
            question="With shifted feature distributions, what do federation and personalization add? "
            "`centralized`: one model trained on all clients' pooled data with the same budget of epochs.",
            centralized=True,
        ),
        Study(
            "compositions",
            "FedProx and Ditto composed with SPO+ and RSPO+",
            ("(0,0,0)", "(1,0,0)", "(0,1,0)", "(0,0,1)"),
            ("spo+", "rspo+"),
            (
                Variant("plain"),
                Variant("FedProx mu=0.01", {"proximal-mu": 0.01}),
                Variant("FedProx mu=0.1", {"proximal-mu": 0.1}),
                Variant("Ditto mu=0.1", {"ditto-mu": 0.1, "personal-rounds": 0}),
            ),
            question="Do the FedProx term and Ditto's personal model help the decision-focused losses?",
        ),
        Study(
            "linear",
            "A linear predictor (no hidden layer, no bias) next to the MLP",
            ("(0,0,0)", "(1,0,0)", "(0,1,0)", "(0,0,1)"),
            LOSSES,
            (Variant("MLP (64 hidden)"), Variant("linear", {"hidden": 0})),
            question="How much of each loss's result is the model's capacity?",
        ),
        Study(
            "alpha",
            "Sensitivity: the RSPO+ learning-rate scale alpha (lr0 = alpha lam0 / 4)",
            ("(0,0,0)",),
            ("rspo+",),
            sweep("rspo-alpha", (0.001, 0.003, 0.01, 0.03, 0.1, 0.3, 1.0)),
            question="How sensitive is FedRSPO+ to alpha (SPO+ and MSE do not use it)?",
        ),
        Study(
            "clients",
            "Sensitivity: the number of clients",
            ("(0,0,0)",),
            ("mse", "spo+", "rspo+"),
            tuple(Variant(f"{n} clients", clients=n) for n in (5, 10, 20, 40, 80)),
            question="Does FedRSPO+'s advantage depend on the size of the federation?",
        ),
        Study(
            "rounds",
            "Sensitivity: the communication budget (warm-start rounds)",
            ("(0,0,0)",),
            ("mse", "spo+", "rspo+"),
            sweep("num-rounds", (1, 2, 5, 10, 20)),
            question="How many warm-start rounds does each loss need before personalization?",
        ),
        Study(
            "schedule",
            "Sensitivity: the personalization schedule (tau, kappa_lam, kappa_lr)",
            ("(0,0,0)",),
            ("rspo+",),
            sweep("freeze-tau", (0.001, 0.003, 0.03, 0.1))
            + sweep("kappa-lam", (0.0, 0.5, 2.0, 4.0))
            + sweep("kappa-lr", (0.0, 0.05, 0.2, 0.5)),
            question="How much do the freeze threshold and the two annealing rates matter (defaults "
            "tau 0.01, kappa_lam 1, kappa_lr 0.1)?",
        ),
    )
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
            **(QUICK if quick else {}),
            **variant.overrides,
            **fixed,
            "run-name": name,
        }
        out.append(Job((row, loss, variant.label), seed, cfg, variant.clients or study.clients))
    return out


def freezing(run_dir: Path) -> dict[str, float]:
    """QP-LP gap diagnostics of one run: the share of clients frozen and their mean freeze round."""
    frozen = list(frozen_at(run_dir).values())
    at = [t for t in frozen if t > 0]
    return {
        "frozen-share": len(at) / len(frozen) if frozen else float("nan"),
        "frozen-round": float(np.mean(at)) if at else float("nan"),
    }


def paper_settings(study: Study, variant: Variant, fixed: dict[str, Any], quick: bool) -> bool:
    """Does ``variant`` run the paper's Table 3 settings (every override at its default, 20 clients)?"""
    changes = {**variant.overrides, **fixed}
    same = all(SCHEMA[k].default == v for k, v in changes.items())
    return same and not quick and (variant.clients or study.clients) == CLIENTS


def table(all_jobs: list[Job], summaries: list[dict[str, Any]], results_dir: Path) -> dict[str, Any]:
    """``{row: {loss: {variant: {"fed", "per", "per/fed", "frozen-share", "frozen-round": stat}}}}``."""
    cells: dict[tuple[str, str, str], dict[str, list[float]]] = {}
    seeds: dict[tuple[str, str, str], list[int]] = {}
    for job, summary in zip(all_jobs, summaries, strict=True):
        row, loss, variant = key = job.key[0], job.key[1], job.key[2]
        fed, per = cell(summary, "fed"), cell(summary, "per")
        values = {"fed": fed, "per": per, "per/fed": per / fed if fed else float("nan")}
        if loss == "rspo+" and job.config.get("personal-rounds", 1):
            values.update(freezing(results_dir / job.config["run-name"]))
        for metric, value in values.items():
            cells.setdefault(key, {}).setdefault(metric, []).append(value)
        seeds.setdefault(key, []).append(job.seed)
    out: dict[str, Any] = {}
    for (row, loss, variant), metrics in cells.items():
        out.setdefault(row, {}).setdefault(loss, {})[variant] = {
            m: stat(v, seeds[(row, loss, variant)]) for m, v in metrics.items()
        }
    return out


def add_centralized(cells: dict[str, Any], planned: list[Job], reference: str) -> bool:
    """Add the ``centralized`` cell to every row and loss: one model trained on the pooled data of the
    ``reference`` variant's clients, per seed (its regret stands in the +P column)."""
    for row, by_loss in cells.items():
        for loss, by_variant in by_loss.items():
            runs = [j for j in planned if j.key == (row, loss, reference)]
            seeds = [j.seed for j in runs]
            none = [float("nan")] * len(runs)
            by_variant["centralized"] = {
                "fed": stat(none, seeds),
                "per": stat([centralized(j.config, j.nodes or CLIENTS) for j in runs], seeds),
                "per/fed": stat(none, seeds),
            }
    return True


def fmt(entry: dict[str, Any] | None, digits: int = 2) -> str:
    """common.fmt with ``-`` for a cell a variant has not (no +P without personalization)."""
    return common_fmt(entry, digits, missing="-")


def markdown(study: Study, data: dict[str, Any]) -> str:
    """The report: one table per row (losses x variants, Fed and +P), the paper's Table 3 cell beside
    ours where it has one, and the QP-LP gap diagnostics of RSPO+."""
    cells = data["table"]
    variants = [v["label"] for v in data["variants"]]
    lines = [
        f"# Knapsack study: {study.title}",
        "",
        f"Generated by `hetfed reproduce knapsack-study {study.name}{' --quick' if data['quick'] else ''}"
        f"{''.join(f' --set {k}={v}' for k, v in data['set'].items())}`: seeds {data['seeds']}, "
        f"{data['clients']} clients unless a variant says otherwise, inline engine; "
        f"{data['runs']} runs of {data['runs-wall-time-s'] / 60:.1f} min in all (each run's own wall time; "
        f"this invocation: {data['wall-time-s'] / 60:.1f} min on {data['workers']} worker(s), reusing "
        "completed runs). "
        "Relative regret (%) on each client's test set, mean over clients, mean ± std over seeds.",
        "",
        study.question,
        "",
    ]
    for row, by_loss in cells.items():
        lines += [f"## {row}", "", "| loss | variant | Fed | +P | +P / Fed | paper (Fed / +P) |"]
        lines += ["|---|---|---|---|---|---|"]
        for loss, by_variant in by_loss.items():
            for variant in variants:
                if variant not in by_variant:
                    continue
                c = by_variant[variant]
                paper = PAPER_T3.get(row, {}).get(loss) if variant in data["paper-settings"] else None
                lines.append(
                    f"| {loss} | {variant} | {fmt(c['fed'])} | {fmt(c['per'])} | {fmt(c['per/fed'])} | "
                    + (f"{paper[0]} / {paper[1]}" if paper else "")
                    + " |"
                )
        frozen = [(loss, v, c) for loss, bv in by_loss.items() for v, c in bv.items() if "frozen-share" in c]
        if frozen:
            lines += ["", "QP-LP gap diagnostics (RSPO+): share of clients frozen, mean round they froze", ""]
            lines += ["| variant | frozen share | freeze round |", "|---|---|---|"]
            lines += [f"| {v} | {fmt(c['frozen-share'])} | {fmt(c['frozen-round'], 1)} |"
                      for _, v, c in frozen]
        lines.append("")
    best = ranking(cells)
    if best:
        lines += ["## Best variant per row and loss (lowest mean +P, else Fed)", ""]
        lines += [f"- {line}" for line in best]
    if data["orderings"]:
        lines += ["", "## The paper's ordering RSPO+ < SPO+ < MSE, pair by pair (mean over seeds)", ""]
        for o in data["orderings"]:
            stage = "+P" if o["stage"] == "per" else "Fed"
            lines.append(
                f"- {o['order']}, {o['variant']}, {stage}: holds in {o['holds']} of {o['rows']} rows"
                + (f" (not in {', '.join(o['fails'])})" if o["fails"] else "")
                + f"; smallest margin {o['margin']:.2f} points"
            )
    return "\n".join(lines) + "\n"


def orderings(cells: dict[str, Any], variants: list[str]) -> list[dict[str, Any]]:
    """The paper's ordering, pair by pair (RSPO+ < SPO+, SPO+ < MSE), per variant and stage (Fed, +P):
    in how many rows the mean over seeds keeps it, the rows where it does not, and the smallest margin
    (the worse loss's mean minus the better one's)."""
    out = []
    for variant in variants:
        for stage in ("fed", "per"):
            for better, worse in (("rspo+", "spo+"), ("spo+", "mse")):
                margins = {}
                for row, by_loss in cells.items():
                    pair = [by_loss.get(loss, {}).get(variant, {}).get(stage, {}).get("mean")
                            for loss in (better, worse)]
                    if all(m is not None and np.isfinite(m) for m in pair):
                        margins[row] = pair[1] - pair[0]
                if margins:
                    fails = [row for row, m in margins.items() if m <= 0]
                    out.append(
                        {"variant": variant, "stage": stage, "order": f"{better} < {worse}",
                         "rows": len(margins), "holds": len(margins) - len(fails), "fails": fails,
                         "margin": min(margins.values())}
                    )
    return out


def plot(study: Study, data: dict[str, Any], out: Path) -> None:
    """For a sweep (one row): +P relative regret against the variant, per loss, with a ±std band."""
    if len(study.rows) != 1 or len(study.variants) < 3:
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    row = data["table"][study.rows[0]]
    labels = [v["label"] for v in data["variants"]]
    fig, ax = plt.subplots(figsize=(8, 4))
    for loss, by_variant in row.items():
        for stage, style in (("fed", "--"), ("per", "-")):
            xs = [i for i, v in enumerate(labels) if v in by_variant]
            means = np.array([by_variant[labels[i]][stage]["mean"] for i in xs])
            stds = np.array([by_variant[labels[i]][stage]["std"] for i in xs])
            ax.plot(xs, means, style, marker=".", label=f"{loss} {'Fed' if stage == 'fed' else '+P'}")
            ax.fill_between(xs, means - stds, means + stds, alpha=0.15)
    ax.set_xticks(range(len(labels)), labels, rotation=30, ha="right", fontsize=8)
    ax.set(ylabel="relative regret (%)", title=study.title, yscale="log")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / f"knapsack-{study.name}.png", dpi=110)
    plt.close(fig)


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
    if args.rows:
        for row in args.rows:
            row_etas(row)
        study = replace(study, rows=tuple(args.rows))
    if args.losses:
        study = replace(study, losses=tuple(args.losses))
    if args.seeds is not None:
        if not 1 <= args.seeds <= len(PLAN.seeds):
            raise ValueError(f"--seeds: must be in 1..{len(PLAN.seeds)}, got {args.seeds}")
        study = replace(study, seeds=args.seeds)
    if args.clients is not None:
        if args.clients < 1:
            raise ValueError(f"--clients: must be >= 1, got {args.clients}")
        study = replace(study, clients=args.clients)
    return replace(study, seeds=1) if args.quick else study


def run(args: argparse.Namespace) -> int:
    started = time.time()
    study = resolve(args)
    fixed = parse_assignments(args.set)
    results_dir = Path(args.results_dir or f"results/reproduce-knapsack-{study.name}")
    planned = jobs(study, args.quick, fixed)
    inline = argparse.Namespace(**(vars(args) | {"results_dir": results_dir, "engine": "inline"}))
    summaries = run_jobs(planned, inline)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    data = {
        "study": study.name,
        "seeds": list(PLAN.seeds[: study.seeds]),
        "clients": study.clients,
        "quick": args.quick,
        "set": fixed,
        "workers": args.workers,
        "wall-time-s": round(time.time() - started, 1),
        "runs": len(planned),
        "runs-wall-time-s": round(sum(float(x.get("wall-time-s", 0.0)) for x in summaries), 1),
        "unit": "relative regret %",
        "variants": [
            {"label": v.label, "overrides": v.overrides, "clients": v.clients} for v in study.variants
        ]
        + ([{"label": "centralized", "overrides": {}, "clients": 0}] if study.centralized else []),
        "table": (cells := table(planned, summaries, results_dir)),
        "centralized": study.centralized and add_centralized(cells, planned, study.variants[0].label),
        "orderings": orderings(cells, [v.label for v in study.variants]),
        "paper-settings": [v.label for v in study.variants if paper_settings(study, v, fixed, args.quick)],
        "paper-t3": PAPER_T3,
    }
    write_json(out / f"knapsack-{study.name}.json", data)
    (out / f"knapsack-{study.name}.md").write_text(markdown(study, data), encoding="utf-8")
    plot(study, data, out)
    print((out / f"knapsack-{study.name}.md").read_text(encoding="utf-8"))
    if not refresh_study_index(out):
        print(f"(no {out / 'knapsack.json'} yet: `hetfed reproduce knapsack` will index this study)")
    return 0
