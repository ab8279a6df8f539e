"""Softmax switching's theory on NP classification (docs/algorithms.md 2); how fast each method gets feasible.

Three sweeps of plans/switching-study.toml, inline runs of switching on plans/np-classification.toml's
task: participation m of n clients, local steps E at equal gradient evaluations, and alpha around the
theory's 2 ln(m)/eps; then, from those runs and the committed np- and fair-classification.json, the
gradient evaluations to reach and to keep G <= eps. Writes ``switching-study.{md,json,png}``
(templates/switching-study.md); a rerun resumes.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from hetfed.reproduce.common import fit_line, pyplot, save_figure, write_json
from hetfed.reproduce.common import render as render_template
from hetfed.reproduce.plan import Plan
from hetfed.reproduce.switching import REPO, Grid, add_grid_arguments, grid, run_all, summarize_runs

SWEEPS = ("participation", "local-steps", "alpha")
TASK = Plan.load("np-classification")
N = int(TASK.nodes or 0)  # the clients of every run


def sweeps(quick: bool, seeds: int | None = None) -> dict[str, Grid]:
    """The three sweeps on the np-classification task (quick: a few rounds, 1 seed)."""
    plan, tag = Plan.load("switching-study"), "-quick" if quick else ""
    return {key: grid(plan, f"np-{key}{tag}", quick, seeds, f"{key}-", TASK) for key in SWEEPS}


def first_feasible(grad_evals: list[float], g: list[float], eps: float) -> tuple[float | None, float | None]:
    """Gradient evaluations at which ``g <= eps`` first holds, and from which it holds to the end."""
    ok = [v is not None and v <= eps for v in g]
    reach = next((grad_evals[i] for i, v in enumerate(ok) if v), None)
    tail = next((i for i in range(len(ok) - 1, -1, -1) if not ok[i]), -1) + 1  # feasible from tail on
    return reach, grad_evals[tail] if tail < len(ok) else None


def feasibility_times(runs: list[dict[str, Any]], eps: float, key: str) -> dict[str, dict[str, Any]]:
    """Per (setting, method): the median over seeds of reach / stay (None where a seed never does)."""
    groups: dict[str, list[tuple[float | None, float | None]]] = {}
    for r in runs:
        if key in r["curve"]:
            pair = first_feasible(r["curve"]["grad-evals"], r["curve"][key], eps)
            groups.setdefault(f"{r['setting']} | {r['method']}", []).append(pair)
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


def shapes(r: np.ndarray, m: np.ndarray) -> dict[str, np.ndarray]:
    """G's shapes in r = m/n fitted as a + c x: the paper's sampling error x = 1 / (|ln(1 - r)| n) and
    the finite-population x = sqrt((1 - r) / m)."""
    return {"paper": 1.0 / (np.abs(np.log(1.0 - r)) * N), "finite-population": np.sqrt((1.0 - r) / m)}


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
        r, sampled, y = (np.array([p[key] for p in partial]) for key in ("r", "m", "G"))
        out.update({name: fit_line(x, y) for name, x in shapes(r, sampled).items()})
    return out


def progress(data: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per (setting, method): mean over seeds of F and G at a quarter, half and all of the budget."""
    out = {}
    for setting, methods in data["curves"].items():
        for method, c in methods.items():
            evals, at = c["grad-evals"], {}
            for frac in (0.25, 0.5, 1.0):
                i = int(np.searchsorted(evals, frac * evals[-1]))
                at[f"{frac:g}"] = {"grad-evals": evals[i], "F": c["F"][i], "G": c["G"][i]}
            out[f"{setting} | {method}"] = at
    return out


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_grid_arguments(
        parser,
        "a few rounds, 1 seed, 2 values per sweep (CI)",
        "seeds per point (default 5; quick 1)",
        "<sweep>",
    )


def run(args: argparse.Namespace) -> int:
    grids = sweeps(args.quick, args.seeds)
    results = Path(args.results_dir) if args.results_dir else REPO / "results" / "reproduce"
    out = Path(args.out) if args.out else REPO / ("results/reproduce" if args.quick else "docs/results")
    studies: dict[str, Any] = {}
    for key, g in grids.items():
        print(
            f"{key}: {len(g.settings)} setting(s) x {len(g.methods)} method(s) x {len(g.seeds)} seed(s)",
            flush=True,
        )
        runs, meta = run_all(g, results / g.name, args.workers), g.meta()
        studies[key] = {
            "experiment": g.name,
            "settings": meta["settings"],
            "methods": [m["label"] for m in g.methods],
            "seeds": meta["seeds"],
            "table": summarize_runs(meta, runs)["table"],
            "feasibility": feasibility_times(runs, g.eps, "avg-G"),
            "wall-s": round(sum(r["wall-s"] for r in runs), 1),
        }
    studies["participation"]["fit"] = participation_fit(studies["participation"]["table"])
    committed = {}
    for name in ("np-classification", "fair-classification"):
        data = json.loads((REPO / "docs" / "results" / f"{name}.json").read_text())
        committed[name] = {
            "eps": data["eps"],
            "settings": data["settings"],
            "feasibility": feasibility_times(data["runs"], data["eps"], "G"),
            "progress": progress(data),
        }
    tag = "-quick" if args.quick else ""
    result = {
        "command": "hetfed reproduce switching-study" + (" --quick" if args.quick else ""),
        "eps": grids["alpha"].eps,
        "alpha": grids["participation"].methods[0]["value"],
        "studies": studies,
        "committed": committed,
    }
    write_json(out / f"switching-study{tag}.json", result)
    render(out, tag)
    print(f"wrote {out}/switching-study{tag}.md, .json, .png")
    return 0


def render(out: Path, tag: str = "") -> None:
    """switching-study.md and .png from switching-study.json."""
    result = json.loads((out / f"switching-study{tag}.json").read_text())
    plot(result, out / f"switching-study{tag}.png")
    (out / f"switching-study{tag}.md").write_text(markdown(result))


def plot(result: dict[str, Any], path: Path) -> None:
    studies = result["studies"]
    fig, axes = pyplot().subplots(1, 3, figsize=(15, 4.2))
    fit = studies["participation"]["fit"]
    pts = fit["points"]
    r = np.array([p["r"] for p in pts])
    axes[0].errorbar(r, [p["G"] for p in pts], [p["G-sd"] for p in pts], fmt="o", color="C0", label="runs")
    if "paper" in fit:
        grid = np.linspace(min(r), max(p["r"] for p in pts if p["m"] < N), 100)
        for (name, shape), color in zip(shapes(grid, grid * N).items(), ("C1", "C2"), strict=True):
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
        study = studies[key]
        rows = [row for rows in study["table"].values() for row in rows.values()]
        x = (
            [s["local_steps"] for s in study["settings"]]
            if key == "local-steps"
            else [float(m.split("=")[1]) for rows in study["table"].values() for m in rows]
        )
        for stat, color in (("avg-F", "C0"), ("avg-G", "C3")):
            mean, sd = ([row[stat][k] for row in rows] for k in ("mean", "sd"))
            ax.errorbar(x, mean, sd, fmt="o-", color=color, label=f"{stat[4:]} of the averaged model")
        ax.axhline(result["eps"], color="k", ls=":", lw=0.8)
        ax.set(xlabel=xlabel, xscale=xscale, title=f"{key} (m = 5)")
        ax.legend(fontsize=7)
    axes[2].axvline(2 * math.log(5) / result["eps"], color="grey", ls="--", lw=0.8)
    save_figure(fig, path)


def facts(result: dict[str, Any]) -> dict[str, Any]:
    """The numbers the findings state: the smallest alpha feasible in every seed, the rounds to
    feasibility per m, and E against E = 5 at the same rounds (the alpha sweep's point)."""
    studies, alphas = result["studies"], result["studies"]["alpha"]["table"]["partial"]
    feasible = [
        float(m.split("=")[1]) for m, row in alphas.items() if row["avg-feasible-seeds"] == row["seeds"]
    ]
    part = {s["name"]: s for s in studies["participation"]["settings"]}
    rounds_to = sorted(
        (int(name[1:]), t["reach-median"] / (int(name[1:]) * part[name]["local_steps"]))
        for label, t in studies["participation"]["feasibility"].items()
        if t["reach-median"] is not None and (name := label.split(" | ")[0]) in part
    )
    alpha_rounds = studies["alpha"]["settings"][0]["rounds"]
    same_rounds = [
        (s["local_steps"], s["rounds"], next(iter(studies["local-steps"]["table"][s["name"]].values())))
        for s in studies["local-steps"]["settings"]
        if s["local_steps"] != 5 and s["rounds"] == alpha_rounds
    ]
    reference = alphas.get(f"switching alpha={result['alpha']:g}")
    return {
        "smallest": min(feasible, default=None),
        "rounds_to": rounds_to,
        "same_rounds": same_rounds[0] if same_rounds and reference else None,
        "reference": reference,
    }


def markdown(data: dict[str, Any]) -> str:
    """docs/results/switching-study.md from switching-study.json alone (templates/switching-study.md)."""
    return render_template("switching-study.md", **data, n=N, log=math.log, **facts(data))
