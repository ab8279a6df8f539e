"""Worst-client constrained FL (docs/algorithms.md section 2): softmax switching against its baselines.

``hetfed reproduce np-classification | fair-classification | safe-rl | safe-rl-trpo`` runs every
method of plans/<experiment>.toml in each setting (participation m, local steps E, rounds) and seed
on the inline engine, then writes ``<out>/<experiment>.md`` (templates/<experiment>.md) and
``.json`` (the final worst-client objective ``F = max_i f_i`` and constraint ``G = max_i g_i``) and
PNGs of ``F(w_k)``, ``G(w_k)`` against gradient evaluations. A method's output is its averaged
model (switching and CRPO: over the rounds that stepped on the objective; the others: over all
rounds); the last iterate is reported too. A baseline family's "best feasible" member is the one
whose averaged model meets ``G <= eps`` in every seed with the lowest mean ``F``. Completed runs
under ``--results-dir`` are reused (a rerun rewrites the report and figures without new runs).
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from hetfed.reproduce.common import completed_run, pyplot, render, save_figure
from hetfed.reproduce.plan import Job, Plan, PlanError, run_jobs

REPO = Path(__file__).resolve().parents[2]
EXPERIMENTS = ("np-classification", "fair-classification", "safe-rl", "safe-rl-trpo")
FAMILIES = ("switching", "crpo", "penalty", "primal-dual (mean)", "primal-dual (max)", "fedavg")
# a plan's method [strategy, parameters...] -> label, family, the parameters' run-config keys
KINDS = {
    "softmax-switching": ("switching alpha={0:g}", "switching", "switching-alpha"),
    "penalty": ("penalty rho={0:g}", "penalty", "penalty-rho"),
    "primal-dual": ("primal-dual {0} lr={1:g}", "primal-dual ({0})", "pd-dual-step pd-dual-lr"),
    "crpo": ("parallel CRPO", "crpo", ""),
    "fedavg-unconstrained": ("fedavg (unconstrained)", "fedavg", ""),
}
OUTPUTS = {"averaged model": "avg-", "last iterate": ""}  # output -> prefix of its F, G keys


@dataclass(frozen=True)
class Grid:
    """What one experiment (or sweep) runs: every method in every setting (a plan's ``settings``
    entry: name, m clients per round (0 = all), local_steps, rounds, ``every`` rounds an evaluation)
    and seed, on ``nodes`` clients with the run config ``base``; ``name`` prefixes the run names."""

    name: str
    nodes: int
    base: dict[str, Any]
    settings: list[dict[str, Any]]
    methods: list[dict[str, Any]]  # label, family, overrides, value (the family's hyperparameter)
    seeds: tuple[int, ...]

    @property
    def eps(self) -> float:
        return float(self.base["switching-eps"])

    def meta(self) -> dict[str, Any]:
        """The grid as its JSON describes it (what the tables and the report read)."""
        base = self.base
        theory = {k: base[f"switching-theory-{k.lower()}"] for k in "DL" if "switching-theory-d" in base}
        settings = [{k: v for k, v in s.items() if k != "every"} for s in self.settings]
        meta = {"base-config": base, "theory": theory, "eps": self.eps, "settings": settings}
        return {**meta, "methods": self.methods, "seeds": len(self.seeds)}


def method(spec: list[Any]) -> dict[str, Any]:
    """A plan's ``[strategy, parameters...]`` as a method."""
    strategy, *params = spec if isinstance(spec, list) and spec else [None]
    if strategy not in KINDS or len(params) != len(KINDS[strategy][2].split()):
        raise PlanError(f"method: expected [strategy, parameters...] of {', '.join(KINDS)}, got {spec!r}")
    label, family, keys = KINDS[strategy]
    return {
        "label": label.format(*params),
        "family": family.format(*params),
        "overrides": {"strategy": strategy, **dict(zip(keys.split(), params, strict=True))},
        "value": params[-1] if params else 0.0,
    }


def grid(
    plan: Plan, name: str, quick: bool, seeds: int | None = None, axes: str = "", base: Plan | None = None
) -> Grid:
    """``plan``'s ``[quick-]<axes>settings`` and ``methods`` on ``base``'s (default: ``plan``'s) run
    config and clients, with the first ``seeds`` of its seeds (default: all; quick: ``quick-seeds``)."""
    base, q = base or plan, "quick-" if quick else ""
    count = len(plan.axes["quick-seeds"] if quick else plan.seeds) if seeds is None else seeds
    if not 1 <= count <= len(plan.seeds):
        raise ValueError(f"--seeds: must be >= 1 and at most {len(plan.seeds)}, got {count}")
    if base.nodes is None:
        raise PlanError(f"plans/{base.name}.toml: nodes: missing (a switching experiment's clients)")
    settings, methods = plan.axes[f"{q}{axes}settings"], [method(s) for s in plan.axes[f"{q}{axes}methods"]]
    return Grid(name, base.nodes, base.config(quick), settings, methods, plan.seeds[:count])


def report_order(methods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Methods grouped by family (switching first), each family by increasing hyperparameter."""
    return sorted(methods, key=lambda m: (FAMILIES.index(m["family"]), m["value"]))


def run_config(g: Grid, setting: Mapping[str, Any], method: Mapping[str, Any], seed: int) -> dict[str, Any]:
    """One run's config; without the theory's steps, ``gamma = eta / E`` (the theorem's pairing)."""
    theory = "switching-theory-d" in g.base
    steps = {} if theory else {"switching-gamma": g.base["switching-eta"] / setting["local_steps"]}
    slug = "".join(ch if ch.isalnum() else "-" for ch in method["label"]).strip("-").replace("--", "-")
    return {
        **g.base,
        **steps,
        **method["overrides"],
        "seed": seed,
        "num-rounds": setting["rounds"],
        "switching-m": setting["m"],
        "switching-local-steps": setting["local_steps"],
        "switching-eval-every": setting["every"],
        "checkpoint-every": 0,
        "run-name": f"{g.name}-{setting['name']}-{slug}-s{seed}",
    }


def jobs(g: Grid) -> list[Job]:
    """Every (setting, method) and seed, method-major (an interrupted reproduction has whole methods)."""
    return [
        Job((s["name"], m["label"], m["family"]), seed, run_config(g, s, m, seed))
        for m in g.methods
        for s in g.settings
        for seed in g.seeds
    ]


def read_result(job: Job, folder: Path, summary: Mapping[str, Any]) -> dict[str, Any]:
    """A completed run's final aggregate and its evaluation curve (the server rows with F, G)."""
    from hetfed.server.store import RunResult

    rows = [r for r in RunResult.read(folder).rows_of(client="server") if "F" in r]
    curve: dict[str, list[float | None]] = {
        key: [float(r[key]) for r in rows]
        for key in ("grad-evals", "F", "G")
        if all(r.get(key) for r in rows)
    }
    # the averaged model exists from the first round that stepped on the objective: None before
    curve.update({key: [float(r[key]) if r.get(key) else None for r in rows] for key in ("avg-F", "avg-G")})
    keys = ("F", "G", "avg-F", "avg-G", "grad-evals", "averaged-rounds")
    return {
        **dict(zip(("setting", "method", "family"), job.key, strict=True)),
        "seed": job.seed,
        "final": {k: summary["aggregate"].get(k) for k in keys},
        "aggregate": {k: v for k, v in summary["aggregate"].items() if not k.startswith("setting-")},
        "curve": curve,
        "wall-s": summary["wall-time-s"],
    }


def progress_line(summary: Mapping[str, Any]) -> str:
    """A finished run's final F, G (``nan`` for the averaged model of a run without objective steps)."""
    agg = {k: summary["aggregate"].get(k, math.nan) for k in ("avg-F", "avg-G", "F", "G")}
    return f": avg F={agg['avg-F']:.4f} G={agg['avg-G']:.4f} | last F={agg['F']:.4f} G={agg['G']:.4f}"


def run_all(g: Grid, results_dir: Path, workers: int, available: bool = False) -> list[dict[str, Any]]:
    """Every run of ``g``, ``workers`` processes at a time (``available``: only those completed)."""
    todo = jobs(g)
    if available:
        done = [(j, completed_run(results_dir / j.config["run-name"], j.config)) for j in todo]
    else:
        args = argparse.Namespace(engine="inline", workers=workers, results_dir=results_dir)
        done = list(zip(todo, run_jobs(todo, args, nodes=g.nodes, describe=progress_line), strict=True))
    return [read_result(j, results_dir / j.config["run-name"], s) for j, s in done if s is not None]


# --- tables and figures (pure functions of the JSON) ------------------------------------------------


def groups(data: Mapping[str, Any], runs: list[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any], list]]:
    """(setting, method, its runs) per setting, methods in report order, where there are runs."""
    for s in data["settings"]:
        for m in report_order(data["methods"]):
            if mine := [r for r in runs if r["setting"] == s["name"] and r["method"] == m["label"]]:
                yield s["name"], m, mine


def summarize_runs(data: Mapping[str, Any], runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per setting and method: mean/sd/max over seeds of the final F, G; feasibility; best baselines."""
    table: dict[str, dict[str, dict[str, Any]]] = {}
    for setting, m, mine in groups(data, runs):
        finals = [r["final"] for r in mine]
        row: dict[str, Any] = {"family": m["family"], "seeds": len(finals)}
        for key in ("avg-F", "avg-G", "F", "G"):
            values = np.array([np.nan if f[key] is None else f[key] for f in finals], dtype=float)
            row[key] = {k: float(f(values)) for k, f in (("mean", np.mean), ("sd", np.std), ("max", np.max))}
        for prefix in OUTPUTS.values():
            row[f"{prefix}feasible-seeds"] = int(
                sum(f[f"{prefix}G"] is not None and f[f"{prefix}G"] <= data["eps"] for f in finals)
            )
        row["grad-evals"] = int(finals[0]["grad-evals"])
        table.setdefault(setting, {})[m["label"]] = row
    best: dict[str, dict[str, dict[str, str | None]]] = {}
    for output, prefix in OUTPUTS.items():
        for setting_name, rows in table.items():
            for family in dict.fromkeys(r["family"] for r in rows.values()):
                feasible = {  # feasible in every seed of the experiment (a row may lack runs: --available)
                    k: r
                    for k, r in rows.items()
                    if r["family"] == family and r[f"{prefix}feasible-seeds"] == r["seeds"] == data["seeds"]
                }
                best.setdefault(output, {}).setdefault(setting_name, {})[family] = (
                    min(feasible, key=lambda k: feasible[k][f"{prefix}F"]["mean"]) if feasible else None
                )
    return {"table": table, "best-feasible": best}


def curves(
    data: Mapping[str, Any], runs: list[dict[str, Any]]
) -> dict[str, dict[str, dict[str, list[float]]]]:
    """Per setting and method: grad-evals and the mean, min and max over seeds of F(w_k), G(w_k)."""
    out: dict[str, dict[str, dict[str, list[float]]]] = {}
    for setting, m, mine in groups(data, runs):
        chosen = [r["curve"] for r in mine]
        if not all("F" in c for c in chosen):
            continue
        length = min(len(c["F"]) for c in chosen)
        entry = {"grad-evals": chosen[0]["grad-evals"][:length]}
        for key in ("F", "G"):
            stack = np.array([c[key][:length] for c in chosen])
            for suffix, values in (("", stack.mean(0)), ("-min", stack.min(0)), ("-max", stack.max(0))):
                entry[key + suffix] = values.tolist()
        out.setdefault(setting, {})[m["label"]] = entry
    return out


def extras(data: Mapping[str, Any], setting: str, keys: list[str]) -> dict[str, list[float]]:
    """Per method: the mean over seeds of each aggregate in ``keys`` (a mean over clients), for the
    averaged model and then the last iterate."""
    return {
        m["label"]: [
            float(np.mean([r["aggregate"].get(p + k, np.nan) for r in mine]))
            for p in ("avg-", "")
            for k in keys
        ]
        for name, m, mine in groups(data, data["runs"])
        if name == setting
    }


def verdict(rows: Mapping[str, Any], best: Mapping[str, str | None], prefix: str) -> dict[str, Any]:
    """Switching against the best feasible baselines for one output: the facts the report states."""
    baselines = sorted(
        (lab for fam, lab in best.items() if fam != "switching" and lab is not None),
        key=lambda k: rows[k][f"{prefix}F"]["mean"],
    )
    return {
        "prefix": prefix,
        "sweep": [k for k, r in rows.items() if r["family"] == "switching"],
        "switching": best.get("switching"),
        "baselines": baselines,
        "infeasible": [fam for fam, lab in best.items() if fam != "switching" and lab is None],
    }


def pm(stats: Mapping[str, float]) -> str:
    return f"{stats['mean']:.4f} ± {stats['sd']:.4f}" if math.isfinite(stats["mean"]) else "n/a"


def markdown(data: dict[str, Any]) -> str:
    """docs/results/<experiment>.md from <experiment>.json alone (templates/<experiment>.md)."""
    plan = Plan.load(data["experiment"])
    return render(
        f"{data['experiment']}.md",
        data=data,
        summary=summarize_runs(data, data["runs"]),
        nodes=plan.nodes,
        extra=plan.axes.get("extras", []),  # [aggregate, title]: a further table per setting
        outputs=OUTPUTS,
        functions={f.__name__: f for f in (extras, verdict, pm, math.log)},
    )


def plot(data: Mapping[str, Any], plotted: list[str], out: Path, stem: str, title: str) -> list[Path]:
    """``<stem>-<setting>.png`` (F and G of the ``plotted`` methods, all if empty) and
    ``<stem>-alpha.png`` (the switching sweep)."""
    plt = pyplot()
    eps, settings, methods = data["eps"], [s["name"] for s in data["settings"]], report_order(data["methods"])
    figures = [
        (s, [s], [m["label"] for m in methods if not plotted or m["label"] in plotted]) for s in settings
    ]
    figures.append(("alpha", settings, [m["label"] for m in methods if m["family"] == "switching"]))
    paths = []
    for name, rows, labels in figures:
        fig, axes = plt.subplots(len(rows), 2, figsize=(11, 3.6 * len(rows)), squeeze=False)
        for row, setting in enumerate(rows):
            for col, key in enumerate(("F", "G")):
                ax = axes[row][col]
                for label in labels:
                    if (c := data["curves"].get(setting, {}).get(label)) is None:
                        continue
                    (line,) = ax.plot(c["grad-evals"], c[key], label=label, lw=1.4)
                    ax.fill_between(
                        c["grad-evals"], c[f"{key}-min"], c[f"{key}-max"], color=line.get_color(), alpha=0.15
                    )
                if key == "G":
                    ax.axhline(eps, color="k", ls="--", lw=1, label=f"tolerance eps = {eps:g}")
                    ax.axhline(0.0, color="grey", ls=":", lw=0.8)
                worst = "worst objective" if key == "F" else "worst constraint"
                ax.set(xlabel="gradient evaluations", ylabel=f"{key}(w_k) = max_i {key.lower()}_i")
                ax.set_title(f"{setting} participation: {worst}")
                ax.grid(alpha=0.3)
            axes[row][1].legend(fontsize=7, loc="upper right")
        fig.suptitle(f"{title}: mean over {data['seeds']} seeds (band: min-max)", fontsize=10)
        paths.append(out / f"{stem}-{name}.png")
        save_figure(fig, paths[-1])
    return paths


def add_grid_arguments(parser: argparse.ArgumentParser, quick: str, seeds: str, runs: str) -> None:
    """--quick, --seeds, --workers, --out and --results-dir (default results/reproduce/``runs``)."""
    parser.add_argument("--quick", action="store_true", help=quick)
    parser.add_argument("--seeds", type=int, help=seeds)
    parser.add_argument("--workers", type=int, default=2, help="runs in parallel (processes; default 2)")
    parser.add_argument("--out", help="where the reports go (default docs/results; quick: results/reproduce)")
    parser.add_argument("--results-dir", help=f"where the runs go (default results/reproduce/{runs})")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_grid_arguments(
        parser,
        "a few rounds, 2 seeds, 2-4 methods (< 1 min)",
        "override the number of seeds (default 5; quick 2)",
        "<experiment>[-quick]",
    )
    parser.add_argument("--available", action="store_true", help="report the runs completed so far only")


def run(args: argparse.Namespace) -> int:
    name, tag = args.experiment, "-quick" if args.quick else ""
    plan = Plan.load(name)
    g = grid(plan, name, args.quick, args.seeds)
    out = Path(args.out) if args.out else REPO / ("results/reproduce" if args.quick else "docs/results")
    results_dir = Path(args.results_dir) if args.results_dir else REPO / f"results/reproduce/{name}{tag}"
    runs = run_all(g, results_dir, args.workers, available=args.available)
    if not runs:  # only --available finds none: a report of no runs has no tables to show
        raise ValueError(f"--available: no completed run of {name} in {results_dir}")
    command = f"hetfed reproduce {name}" + (" --quick" if args.quick else "")
    command += " --available" if args.available else ""
    meta = {"experiment": name, "command": command, **g.meta()}
    exact = {**meta, **summarize_runs(meta, runs), "curves": curves(meta, runs), "runs": runs}
    # floats to 6 significant digits (the JSON keeps every run's curve); the figures use the exact ones
    data = json.loads(json.dumps(exact), parse_float=lambda x: float(f"{float(x):.6g}"))
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}{tag}.json").write_text(json.dumps(data) + "\n")
    report = markdown(data)
    (out / f"{name}{tag}.md").write_text(report)
    title = report.splitlines()[0].removeprefix("# ")
    figures = plot(exact, plan.axes.get("plotted", []), out, f"{name}{tag}", title)
    print(f"wrote {out / f'{name}{tag}.md'}, {name}{tag}.json and {len(figures)} figures")
    return 0
