"""Softmax switching's theory on NP classification (docs/algorithms.md 2); how fast each method gets feasible.

Three sweeps of real inline runs (switching on the Wisconsin breast cancer task of
``hetfed reproduce np-classification``: 10 clients, eps = 0.05, the theorem's steps, 5 seeds):

* **participation**: m of n = 10 clients per round (r = m/n), E = 5, 2000 rounds, alpha = 100.
  The paper's partial-participation sampling error scales like sigma / (|ln(1 - r)| n); the
  measured worst-client constraint G of the output is fitted to a + c / (|ln(1 - r)| n), and to
  the finite-population shape a + c sqrt((1 - r) / m) for comparison;
* **local steps**: E in {1, 2, 5, 10} at m = 5 with equal gradient evaluations (20k: 4000/E rounds);
* **alpha**: m = 5, E = 5, 2000 rounds, alpha dense around the theory's 2 ln(m)/eps = 64.4
  (eps' read as the tolerance eps; the spec does not define it).

Then, from every run here and the committed np-classification.json and fair-classification.json
(no new runs): the gradient evaluations each method needs to first reach G <= eps and to stay
there, and fair classification's objective at a quarter, half and all of the budget with
alpha = 1 (the paper's default) beside the theory's 2 ln(m)/eps. Writes
``switching-study.{md,json,png}``; the runs stay under ``--results-dir`` (a rerun resumes).
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from hetfed.reproduce.common import fit_line
from hetfed.reproduce.switching import (
    NP_CLASSIFICATION,
    REPO,
    Experiment,
    Setting,
    run_all,
    summarize_runs,
    switching,
)

N = NP_CLASSIFICATION.nodes
EPS = NP_CLASSIFICATION.eps
ALPHA = 100.0  # above 2 ln(m)/eps for every m <= 10: the sweeps isolate m and E
PARTICIPATION = (2, 3, 5, 7, 9, 10)
LOCAL_STEPS = (1, 2, 5, 10)
ALPHAS = (1.0, 10.0, 20.0, 40.0, 64.4, 90.0, 100.0, 150.0, 300.0)


def sweeps(quick: bool) -> dict[str, Experiment]:
    """The three sweeps as experiments of the np-classification task (quick: a few rounds, 1 seed)."""
    base = replace(NP_CLASSIFICATION, quick=None, plotted=(), seeds=1 if quick else NP_CLASSIFICATION.seeds)
    rounds = 20 if quick else 2000
    ms = (2, 10) if quick else PARTICIPATION
    es = (1, 5) if quick else LOCAL_STEPS
    alphas = (10.0, 100.0) if quick else ALPHAS
    every = 5 if quick else 40
    tag = "-quick" if quick else ""
    participation = [Setting(f"m{m}", m if m < N else 0, 5, rounds) for m in ms]
    budget = 40 if quick else 4000  # rounds x E: 20k gradient evaluations at m = 5
    local = [Setting(f"E{e}", 5, e, budget // e) for e in es]
    return {
        "participation": replace(
            base,
            name=f"np-participation{tag}",
            settings=tuple(participation),
            methods=(switching(ALPHA),),
            eval_every={s.name: every for s in participation},
        ),
        "local-steps": replace(
            base,
            name=f"np-local-steps{tag}",
            settings=tuple(local),
            methods=(switching(ALPHA),),
            eval_every={s.name: max(1, s.rounds // 50) for s in local},
        ),
        "alpha": replace(
            base,
            name=f"np-alpha{tag}",
            settings=(Setting("partial", 5, 5, rounds),),
            methods=tuple(switching(a) for a in alphas),
            eval_every={"partial": every},
        ),
    }


def first_feasible(grad_evals: list[float], g: list[float], eps: float) -> tuple[float | None, float | None]:
    """Gradient evaluations at which ``g <= eps`` first holds, and from which it holds to the end."""
    ok = [v is not None and v <= eps for v in g]
    reach = next((grad_evals[i] for i, v in enumerate(ok) if v), None)
    stay = None
    for i in range(len(ok) - 1, -1, -1):
        if not ok[i]:
            break
        stay = grad_evals[i]
    return reach, stay


def feasibility_times(runs: list[dict[str, Any]], eps: float, key: str) -> dict[str, dict[str, Any]]:
    """Per (setting, method): the median over seeds of reach / stay (None where a seed never does)."""
    groups: dict[str, list[tuple[float | None, float | None]]] = {}
    for r in runs:
        curve = r["curve"]
        if key not in curve:
            continue
        groups.setdefault(f"{r['setting']} | {r['method']}", []).append(
            first_feasible(curve["grad-evals"], curve[key], eps)
        )
    out = {}
    for label, times in groups.items():
        reach = [t[0] for t in times if t[0] is not None]
        stay = [t[1] for t in times if t[1] is not None]
        out[label] = {
            "seeds": len(times),
            "reach-seeds": len(reach),
            "stay-seeds": len(stay),
            "reach-median": float(np.median(reach)) if reach else None,
            "stay-median": float(np.median(stay)) if stay else None,
        }
    return out


def participation_fit(table: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The averaged model's G against r = m/n, fitted to the paper's and the finite-population shape
    (over r < 1: at r = 1 the paper's shape is 0)."""
    points = []
    for name, rows in table.items():
        m = int(name[1:])
        (row,) = rows.values()
        points.append({"m": m, "r": m / N, "G": row["avg-G"]["mean"], "G-sd": row["avg-G"]["sd"]})
    partial = [p for p in points if p["m"] < N]
    out: dict[str, Any] = {"points": points}
    if len(partial) >= 3:
        y = np.array([p["G"] for p in partial])
        paper = np.array([1.0 / (abs(math.log(1.0 - p["r"])) * N) for p in partial])
        population = np.array([math.sqrt((1.0 - p["r"]) / p["m"]) for p in partial])
        out["paper"] = fit_line(paper, y)
        out["finite-population"] = fit_line(population, y)
    return out


def run(args: argparse.Namespace) -> int:
    for name, value in (("--seeds", args.seeds), ("--workers", args.workers)):
        if value is not None and value < 1:
            raise ValueError(f"{name}: must be >= 1, got {value}")
    exps = sweeps(args.quick)
    results = Path(args.results_dir) if args.results_dir else REPO / "results" / "reproduce"
    out = (
        Path(args.out)
        if args.out
        else (REPO / "results" / "reproduce" if args.quick else REPO / "docs" / "results")
    )
    studies: dict[str, Any] = {}
    for key, exp in exps.items():
        if args.seeds is not None:
            exp = replace(exp, seeds=args.seeds)
        print(
            f"{key}: {len(exp.settings)} setting(s) x {len(exp.methods)} method(s) x {exp.seeds} seed(s)",
            flush=True,
        )
        runs = run_all(exp, results / exp.name, args.workers)
        summary = summarize_runs(exp, runs)
        studies[key] = {
            "experiment": exp.name,
            "settings": [s.__dict__ for s in exp.settings],
            "methods": [m.label for m in exp.methods],
            "seeds": exp.seeds,
            "table": summary["table"],
            "feasibility": feasibility_times(runs, EPS, "avg-G"),
            "wall-s": round(sum(r["wall-s"] for r in runs), 1),
        }
    studies["participation"]["fit"] = participation_fit(studies["participation"]["table"])
    committed = {}
    for name in ("np-classification", "fair-classification"):
        path = REPO / "docs" / "results" / f"{name}.json"
        data = json.loads(path.read_text())
        committed[name] = {
            "eps": data["eps"],
            "settings": data["settings"],
            "feasibility": feasibility_times(data["runs"], data["eps"], "G"),
            "progress": progress(data),
        }
    tag = "-quick" if args.quick else ""
    result = {
        "command": "hetfed reproduce switching-study" + (" --quick" if args.quick else ""),
        "eps": EPS,
        "alpha": ALPHA,
        "studies": studies,
        "committed": committed,
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / f"switching-study{tag}.json").write_text(json.dumps(result, indent=1) + "\n")
    render(out, tag)
    print(f"wrote {out}/switching-study{tag}.md, .json, .png")
    return 0


def progress(data: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per (setting, method): mean over seeds of F and G at a quarter, half and all of the budget."""
    out = {}
    for setting, methods in data["curves"].items():
        for method, c in methods.items():
            evals = c["grad-evals"]
            at = {}
            for frac in (0.25, 0.5, 1.0):
                i = int(np.searchsorted(evals, frac * evals[-1]))
                at[f"{frac:g}"] = {"grad-evals": evals[i], "F": c["F"][i], "G": c["G"][i]}
            out[f"{setting} | {method}"] = at
    return out


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help="a few rounds, 1 seed, 2 values per sweep (CI)")
    parser.add_argument("--seeds", type=int, help="seeds per point (default 5; quick 1)")
    parser.add_argument("--workers", type=int, default=2, help="runs in parallel (processes; default 2)")
    parser.add_argument(
        "--out", help="where the .md/.json/.png go (default docs/results; quick: results/reproduce)"
    )
    parser.add_argument(
        "--results-dir", help="where the runs' folders go (default results/reproduce/<sweep>)"
    )


def render(out: Path, tag: str = "") -> None:
    """switching-study.md and .png from switching-study.json."""
    result = json.loads((out / f"switching-study{tag}.json").read_text())
    plot(result, out / f"switching-study{tag}.png")
    (out / f"switching-study{tag}.md").write_text(markdown(result, f"switching-study{tag}.png"))


def _rows(study: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [(s, m, row) for s, rows in study["table"].items() for m, row in rows.items()]


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    studies = result["studies"]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    fit = studies["participation"]["fit"]
    pts = fit["points"]
    r = np.array([p["r"] for p in pts])
    axes[0].errorbar(
        r, [p["G"] for p in pts], yerr=[p["G-sd"] for p in pts], fmt="o", color="C0", label="runs"
    )
    if "paper" in fit:
        grid = np.linspace(min(r), max(p["r"] for p in pts if p["m"] < N), 100)
        for name, shape, color in (
            ("paper", 1.0 / (np.abs(np.log(1.0 - grid)) * N), "C1"),
            ("finite-population", np.sqrt((1.0 - grid) / (grid * N)), "C2"),
        ):
            f = fit[name]
            axes[0].plot(grid, f["a"] + f["c"] * shape, color=color, label=f"{name} fit, R^2 {f['r2']:.2f}")
    axes[0].axhline(result["eps"], color="k", ls=":", lw=0.8)
    axes[0].set(
        xlabel="r = m / n", ylabel="G of the averaged model", title="participation (alpha = 100, E = 5)"
    )
    axes[0].legend(fontsize=7)
    for ax, key, xlabel, xscale in (
        (axes[1], "local-steps", "E", "linear"),
        (axes[2], "alpha", "alpha", "log"),
    ):
        rows = _rows(studies[key])
        x = (
            [s["local_steps"] for s in studies[key]["settings"]]
            if key == "local-steps"
            else [float(m.split("=")[1]) for _, m, _ in rows]
        )
        for stat, color in (("avg-F", "C0"), ("avg-G", "C3")):
            ax.errorbar(
                x,
                [row[stat]["mean"] for *_, row in rows],
                yerr=[row[stat]["sd"] for *_, row in rows],
                fmt="o-",
                color=color,
                label=f"{stat[4:]} of the averaged model",
            )
        ax.axhline(result["eps"], color="k", ls=":", lw=0.8)
        ax.set(xlabel=xlabel, xscale=xscale, title=f"{key} (m = 5)")
        ax.legend(fontsize=7)
    axes[2].axvline(2 * math.log(5) / result["eps"], color="grey", ls="--", lw=0.8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _f(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}g}"


def _evals(value: float | None) -> str:
    return "never" if value is None else f"{value:.0f}"


def _stat(row: dict[str, Any], key: str) -> str:
    return f"{row[key]['mean']:.4f} ± {row[key]['sd']:.4f}"


def _times(feas: dict[str, Any], label: str) -> str:
    t = feas.get(label)
    if t is None:
        return "-"
    return (
        f"{_evals(t['reach-median'])} ({t['reach-seeds']}/{t['seeds']}) / "
        f"{_evals(t['stay-median'])} ({t['stay-seeds']}/{t['seeds']})"
    )


def _sweep_row(cells: list[str], row: dict[str, Any], study: dict[str, Any], label: str) -> str:
    """``| cells | G | F | feasible seeds | reach / stay |`` of one sweep point."""
    return (
        "| " + " | ".join(cells) + f" | {_stat(row, 'avg-G')} | {_stat(row, 'avg-F')} | "
        f"{row['avg-feasible-seeds']}/{row['seeds']} | {_times(study['feasibility'], label)} |"
    )


def markdown(result: dict[str, Any], figure: str) -> str:
    studies, eps = result["studies"], result["eps"]
    part, local, alpha = studies["participation"], studies["local-steps"], studies["alpha"]
    seeds = part["seeds"]
    lines = [
        "# Softmax switching: participation, local steps, alpha, time to feasibility",
        "",
        f"Generated by `{result['command']}`: NP classification (the task of np-classification.md: "
        f"10 clients, eps = {eps:g}, the theorem's steps), switching on the inline engine, {seeds} "
        "seed(s) per point; run time "
        + ", ".join(f"{k} {v['wall-s'] / 60:.0f} min" for k, v in studies.items())
        + ". G and F: the worst-client constraint and objective of the averaged model (the method's "
        "output) over all 10 clients, mean ± std over seeds. Time to feasibility: the gradient "
        "evaluations until G <= eps first holds / holds to the end (median over the seeds that get "
        "there; their count in brackets).",
        "",
        f"![sweeps]({figure})",
        "",
        f"## Participation: r = m / n (alpha = {result['alpha']:g}, E = 5)",
        "",
        "| m | r | G | F | feasible seeds | to feasible: reach / stay |",
        "|---|---|---|---|---|---|",
    ]
    for setting, method, row in _rows(part):
        m = int(setting[1:])
        lines.append(_sweep_row([str(m), f"{m / N:.1f}"], row, part, f"{setting} | {method}"))
    fit = part["fit"]
    if "paper" in fit:
        p, q = fit["paper"], fit["finite-population"]
        lines += [
            "",
            "Fits over r < 1 of G = a + c x: the paper's sampling-error shape x = 1 / (|ln(1 - r)| n) "
            f"gives a = {p['a']:.4f}, c = {p['c']:.4f}, R^2 = {p['r2']:.3f}; the finite-population shape "
            f"x = sqrt((1 - r) / m) gives a = {q['a']:.4f}, c = {q['c']:.4f}, R^2 = {q['r2']:.3f}.",
        ]
    lines += [
        "",
        "## Local steps E (m = 5, 20k gradient evaluations: 4000 / E rounds)",
        "",
        "| E | rounds | G | F | feasible seeds | to feasible: reach / stay |",
        "|---|---|---|---|---|---|",
    ]
    rounds = {s["name"]: s["rounds"] for s in local["settings"]}
    for setting, method, row in _rows(local):
        lines.append(_sweep_row([setting[1:], str(rounds[setting])], row, local, f"{setting} | {method}"))
    bound = 2 * math.log(5) / eps
    lines += [
        "",
        f"## alpha around the theory's 2 ln(m) / eps = {bound:.1f} (m = 5, E = 5)",
        "",
        "With m sampled clients an objective round bounds the worst sampled constraint by the threshold "
        "plus ln(m) / alpha; that slack is listed beside eps.",
        "",
        "| alpha | ln(m) / alpha | G | F | feasible seeds | to feasible: reach / stay |",
        "|---|---|---|---|---|---|",
    ]
    for setting, method, row in _rows(alpha):
        a = float(method.split("=")[1])
        lines.append(_sweep_row([f"{a:g}", f"{math.log(5) / a:.3f}"], row, alpha, f"{setting} | {method}"))
    for name, data in result["committed"].items():
        lines += [
            "",
            f"## Time to feasibility per method: {name}.json (committed runs, no new runs)",
            "",
            f"eps = {data['eps']:g}. The last iterate's G (these runs recorded the averaged model's only "
            "at the end); resolution: the runs' evaluation spacing.",
            "",
            "| setting | method | last iterate: reach / stay |",
            "|---|---|---|",
        ]
        for label in sorted(data["feasibility"]):
            setting, method = label.split(" | ")
            lines.append(f"| {setting} | {method} | {_times(data['feasibility'], label)} |")
    fair = result["committed"]["fair-classification"]
    lines += [
        "",
        "## Fair classification at equal gradient evaluations (fair-classification.json)",
        "",
        "The last iterate's F and G (mean over seeds) at a quarter, half and all of the budget. "
        "alpha = 1 is the paper's default; the theory asks alpha >= 2 ln(m) / eps = "
        + " and ".join(
            f"{2 * math.log(s['m'] or 5) / fair['eps']:.0f} ({s['name']}, m = {s['m'] or 5})"
            for s in fair["settings"]
        )
        + ".",
        "",
        "| setting | method | F / G at 1/4 | at 1/2 | at the end |",
        "|---|---|---|---|---|",
    ]
    for label, at in fair["progress"].items():
        setting, method = label.split(" | ")
        cells = " | ".join(f"{v['F']:.4f} / {v['G']:.4f}" for v in at.values())
        lines.append(f"| {setting} | {method} | {cells} |")
    lines += ["", *findings(result), ""]
    return "\n".join(lines)


def findings(result: dict[str, Any]) -> list[str]:
    """What the sweeps say, from the JSON."""
    studies, eps = result["studies"], result["eps"]
    out = ["## What the paper claims, what we measured", ""]
    fit = studies["participation"]["fit"]
    pts = fit["points"]
    out.append(
        "- Participation: G of the output from "
        + ", ".join(f"{p['G']:.4f} (r = {p['r']:.1f})" for p in pts)
        + "."
        + (
            f" The paper's 1 / |ln(1 - r)| shape fits with R^2 {fit['paper']['r2']:.2f}, the finite-"
            f"population sqrt((1 - r) / m) with R^2 {fit['finite-population']['r2']:.2f}."
            if "paper" in fit
            else ""
        )
    )
    alpha_rows = _rows(studies["alpha"])
    feasible = [
        float(m.split("=")[1]) for _, m, row in alpha_rows if row["avg-feasible-seeds"] == row["seeds"]
    ]
    smallest = min(feasible) if feasible else None
    bound = 2 * math.log(5) / eps
    out.append(
        f"- alpha: the smallest alpha whose output is feasible in every seed is {_f(smallest)} "
        f"(theory's bound {bound:.1f} for m = 5)"
        + (
            ": the bound is sufficient here, not necessary."
            if smallest is not None and smallest < bound
            else "."
        )
    )
    part_settings = {s["name"]: s for s in studies["participation"]["settings"]}
    rounds_to = [
        (int(name[1:]), t["reach-median"] / ((int(name[1:])) * part_settings[name]["local_steps"]))
        for label, t in studies["participation"]["feasibility"].items()
        if t["reach-median"] is not None and (name := label.split(" | ")[0]) in part_settings
    ]
    if rounds_to:
        out.append(
            "- Time to feasibility with participation, in rounds (gradient evaluations / (m E)): "
            + ", ".join(f"{r:.0f} (m = {m})" for m, r in sorted(rounds_to))
            + " (resolution: the runs' evaluation spacing)."
        )
    local_rows = _rows(studies["local-steps"])
    out.append(
        "- Local steps at equal gradient evaluations: G "
        + ", ".join(f"{row['avg-G']['mean']:.4f} (E = {s[1:]})" for s, _, row in local_rows)
        + "; F "
        + ", ".join(f"{row['avg-F']['mean']:.4f}" for *_, row in local_rows)
        + "."
    )
    local = {s["local_steps"]: s for s in studies["local-steps"]["settings"]}
    same_rounds = [
        (e, row)
        for (name, _, row) in local_rows
        if (e := int(name[1:])) != 5 and local[e]["rounds"] == studies["alpha"]["settings"][0]["rounds"]
    ]
    reference = studies["alpha"]["table"]["partial"].get(f"switching alpha={result['alpha']:g}")
    if same_rounds and reference:
        e, row = same_rounds[0]
        out.append(
            f"  At the same {local[e]['rounds']} rounds, E = {e} and E = 5 (the alpha sweep's alpha = "
            f"{result['alpha']:g}) reach F {row['avg-F']['mean']:.4f} and {reference['avg-F']['mean']:.4f}: "
            "with the theorem's gamma = eta / E, E local steps move about as far as one step of eta, so "
            "the objective follows the number of rounds, and at equal gradient evaluations more local "
            "steps (fewer rounds) end at a worse F; G stays at the same level."
        )
    return out
