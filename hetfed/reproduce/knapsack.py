"""FedRSPO+ on the synthetic knapsack (docs/algorithms.md 1.7): Tables 3, 4, 9 and 14 of the paper.

Every federated number is a real hetfed run; one run gives both the federated model's result (Fed)
and the personalized one (+P). The centralized reference (Table 14) is a run of strategy
``centralized``, which pools the clients' data in one process (inline engine): a yardstick only.
Writes ``knapsack.md`` (from templates/knapsack.md), ``knapsack.json`` and ``knapsack-*.png`` to
``--out``.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import textwrap
import time
from pathlib import Path
from typing import Any

from hetfed.reproduce.common import add_run_arguments, mean_std, publish, pyplot, render, save_figure, stat
from hetfed.reproduce.plan import Job, Plan, run_jobs
from hetfed.reproduce.runs import cell, curves, plot_rounds

PLAN = Plan.load("knapsack")  # plans/knapsack.toml: the grid and the paper's numbers
CLIENTS = 20
LOSSES, ABLATION_ROWS = tuple(PLAN.axes["losses"]), tuple(PLAN.axes["ablation-rows"])
# plans/knapsack.toml [budget]: the paper's orderings, and where each row of Tables 4, 9 and 14 takes
# our numbers from, (table, method, stage) of the results
PAPER_ORDERINGS, TABLE4 = PLAN.budget["orderings"], PLAN.budget["table-4"]
TABLE9, TABLE14 = PLAN.budget["table-9"], PLAN.budget["table-14"]
FULL = "full (annealing and freezing)"
LEVEL = 0.1  # points: two means closer than this are "level" ("about as good")
FAR = 2.0  # a regret at least FAR times another is "far" behind it
BIG = 0.5  # points: a Table 3 cell further than this from the paper is a "gap"


def row_etas(row: str) -> tuple[float, float, float]:
    """``"(eta_o,eta_c,eta_d)"`` -> three floats >= 0; ValueError naming the row otherwise."""
    match = re.fullmatch(r"\(\s*([^,()]+),\s*([^,()]+),\s*([^,()]+)\)", row.strip())
    try:
        etas = tuple(float(v) for v in match.groups()) if match else ()
    except ValueError:
        etas = ()
    if len(etas) != 3 or not all(math.isfinite(e) and e >= 0 for e in etas):
        raise ValueError(f"--rows: {row!r} is not (eta_o,eta_c,eta_d) with three numbers >= 0")
    return etas[0], etas[1], etas[2]


def base_config(row: str, seed: int, quick: bool) -> dict[str, Any]:
    eta_o, eta_c, eta_d = row_etas(row)
    return PLAN.config(quick, **{"eta-o": eta_o, "eta-c": eta_c, "eta-d": eta_d, "seed": seed})


def grid(seeds: tuple[int, ...], rows: tuple[str, ...], quick: bool, losses: tuple[str, ...]) -> list[Job]:
    """Per seed and row, Table 3's ``losses``, then the plan's ``[[runs]]`` on that row."""
    jobs = []
    for seed in seeds:
        for row in rows:
            cells = [("t3", loss, {"loss": loss}) for loss in losses] + [
                (r["table"], r["method"], r["config"]) for r in PLAN.runs if row in PLAN.axes[r["rows"]]
            ]
            for table, method, overrides in cells:
                name = "-".join((table, re.sub(r"[()]", "", row).replace(",", "_"), method, f"s{seed}"))
                config = {**base_config(row, seed, quick), **overrides, "run-name": name}
                jobs.append(Job((table, row, method), seed, config))
    return jobs


# --- analysis: pure functions of the run summaries and the tables ------------------------------------------
def collect(jobs: list[Job], summaries: list[dict[str, Any]]) -> dict[str, Any]:
    """``{table: {row: {method: {stage: {"values": [...], "seeds", "mean", "std"}}}}}``; Table 4's
    OptNet-style takes, per seed, the multiplier with the lowest validation regret."""
    out: dict[str, Any] = {}
    for job, summary in zip(jobs, summaries, strict=True):
        table, row, method = job.key
        stages = {
            "t3": ("fed", "per"),
            "t4": ("interp",) if method == "interp-dffl" else ("per",),
            "t9": ("per",) if method != "surrogate-only" else ("fed",),
            "t14": ("per",),
        }[table]
        # The centralized yardstick's one model is every client's (fed- metrics); Table 14 shows it as +P.
        pooled = job.config.get("strategy") == "centralized"
        for stage in stages:
            entry = out.setdefault(table, {}).setdefault(row, {}).setdefault(method, {})
            entry = entry.setdefault(stage, {"values": [], "seeds": []})
            entry["values"].append(cell(summary, "fed" if pooled else stage))
            entry["seeds"].append(job.seed)
            if table == "t4" and method.startswith("optnet"):
                entry.setdefault("val", []).append(100 * summary["aggregate"]["per-val-relative-regret"])
    for e in (e for t in out.values() for r in t.values() for m in r.values() for e in m.values()):
        e["mean"], e["std"] = mean_std(e["values"])
    for methods in out.get("t4", {}).values():
        options = [entry["per"] for method, entry in methods.items() if method.startswith("optnet-")]
        if options:
            seeds = range(len(options[0]["values"]))
            picked = [min(options, key=lambda o: o["val"][i])["values"][i] for i in seeds]
            methods["optnet"] = {"per": stat(picked, options[0]["seeds"])}
    return out


def orderings(tables: dict[str, Any]) -> list[dict[str, Any]]:
    """Each ordering the paper states, on every Table 3 row: the two means, whether it holds (better <
    worse) and its margin (worse minus better; negative when it fails)."""
    out = []
    for row, methods in tables.get("t3", {}).items():
        for better, worse, stages in PAPER_ORDERINGS:
            if better in methods and worse in methods:  # a custom grid may run only one of the two
                for stage in stages:
                    b, w = methods[better][stage]["mean"], methods[worse][stage]["mean"]
                    order = f"{better} < {worse}"
                    out.append(
                        {
                            "row": row,
                            "stage": stage,
                            "order": order,
                            "means": [b, w],
                            "holds": b < w,
                            "margin": w - b,
                        }
                    )
    return out


def entry(tables: dict[str, Any], table: str, row: str, method: str, stage: str) -> Any:
    """One statistics entry of the tables (None: not run)."""
    return tables.get(table, {}).get(row, {}).get(method, {}).get(stage)


def table4(tables: dict[str, Any], row: str) -> list[Any]:
    """Table 4's cells of ``row``: Interp-DFFL, OptNet-style and FedRSPO+ (+P) entries."""
    return [entry(tables, t, row, m, s) for t, m, s in TABLE4]


def table9(tables: dict[str, Any]) -> dict[str, list[Any]]:
    """Table 9's variants -> their entry on each of ABLATION_ROWS."""
    return {
        label: [entry(tables, t, row, m, s) for row in ABLATION_ROWS] for label, (t, m, s) in TABLE9.items()
    }


def table14(tables: dict[str, Any]) -> dict[str, Any]:
    """Table 14's settings -> their entry (all at (0,0,0))."""
    return {label: entry(tables, t, "(0,0,0)", m, s) for label, (t, m, s) in TABLE14.items()}


def differences(tables: dict[str, Any], paper: dict[str, Any]) -> dict[str, Any]:
    """Ours minus the paper's, for every cell the paper reports (points of relative regret)."""
    t3 = tables.get("t3", {})
    out: dict[str, Any] = {"t3": {}, "t4": {}, "t9": {}, "t14": {}}
    for row, by_loss in paper["t3"].items():
        for loss, ref in by_loss.items():
            if loss in t3.get(row, {}):
                ours = (t3[row][loss]["fed"]["mean"], t3[row][loss]["per"]["mean"])
                out["t3"].setdefault(row, {})[loss] = [o - r for o, r in zip(ours, ref, strict=True)]
    for row, ref in paper["t4"].items():
        if all(cells := table4(tables, row)):
            out["t4"][row] = [c["mean"] - r for c, r in zip(cells, ref, strict=True)]
    for label, entries in table9(tables).items():
        if all(entries):
            out["t9"][label] = [e["mean"] - r for e, r in zip(entries, paper["t9"][label], strict=True)]
    for label, e in table14(tables).items():
        if e:
            out["t14"][label] = e["mean"] - paper["t14"][label]
    return out


# --- the facts the report's prose states, from knapsack.json (templates/knapsack.md says the sentences) -----
def up(x: float, digits: int = 2) -> str:
    """A bound ("within x") rounded up, so that the stated bound is never below the truth."""
    return f"{math.ceil(x * 10**digits - 1e-9) / 10**digits:.{digits}f}"


def verdict(d: float) -> str:
    """Ours minus theirs ``d``: "level" (closer than LEVEL), else "behind" (worse) or "ahead"."""
    return "level" if abs(d) < LEVEL else "behind" if d > 0 else "ahead"


def facts_table3(tables: dict[str, Any], paper: dict[str, Any], diff: dict[str, Any]) -> dict[str, Any]:
    t, paper, diff = tables["t3"], paper["t3"], diff["t3"]
    cells = {  # loss -> [(ours - paper, row, stage, ours, paper)] over the cells the paper reports
        loss: [
            (diff[row][loss][i], row, s, t[row][loss][s]["mean"], paper[row][loss][i])
            for row in paper
            for i, s in enumerate(("fed", "per"))
        ]
        for loss in LOSSES
    }
    bound = {loss: max(abs(c[0]) for c in cells[loss]) for loss in LOSSES}
    big = [c[0] for loss in LOSSES for c in cells[loss] if abs(c[0]) > BIG]
    largest = [(max(cells[loss], key=lambda c: abs(c[0])), loss) for loss in LOSSES]
    largest.sort(key=lambda x: -abs(x[0][0]))  # the largest gap first
    return {
        "within": [(loss.upper(), up(bound[loss])) for loss in sorted(LOSSES, key=lambda loss: bound[loss])],
        "big": len(big),
        "lower": sum(d < 0 for d in big),
        "largest": [(loss.upper(), *c[1:]) for c, loss in largest],  # (loss, row, stage, ours, paper)
        "same-cell": len({(c[1], c[2]) for c, _ in largest}) == 1,
        "failed": list(dict.fromkeys(o["row"] for o in orderings({"t3": t}) if not o["holds"])),
        "unreported": len([row for row in t if row not in paper]),
    }


def facts_table4(tables: dict[str, Any], paper: dict[str, Any], diff: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"rows": []}
    for k, method in enumerate(("interp-dffl", "optnet")):  # how far below the paper: -(ours - paper)
        out[method] = -max(d[k] for d in diff["t4"].values()), -min(d[k] for d in diff["t4"].values())
    for row, (pi, _, pf) in paper["t4"].items():
        i, _, f = table4(tables, row)
        ours = {"level": None, "ahead": "Interp-DFFL", "behind": "FedRSPO+"}[verdict(i["mean"] - f["mean"])]
        theirs = None if pi == pf else ("Interp-DFFL" if pi < pf else "FedRSPO+")
        a, b = (f, i) if ours == "FedRSPO+" else (i, f)  # the one ahead first
        pa, pb = (pf, pi) if theirs == "FedRSPO+" else (pi, pf)
        noisy = ours is not None and abs(i["mean"] - f["mean"]) < max(i["std"], f["std"])
        out["rows"].append(
            {
                "row": row,
                "ours": ours,
                "theirs": theirs,
                "same": ours == theirs,
                "noisy": noisy,
                "a": a,
                "b": b,
                "pa": pa,
                "pb": pb,
                "i": i,
                "f": f,
            }
        )
    return out


def facts_table9(tables: dict[str, Any], paper: dict[str, Any], diff: dict[str, Any]) -> dict[str, Any]:
    paper, diff = paper["t9"], diff["t9"]
    local, full = (table9(tables)[label] for label in ("local-only RSPO+", FULL))
    here = {verdict(x["mean"] - y["mean"]) for x, y in zip(local, full, strict=True)}
    pairs = list(zip(paper["local-only RSPO+"], paper[FULL], strict=True))
    there = (
        "far"
        if all(x >= FAR * y for x, y in pairs)
        else "behind"
        if all(x >= y + LEVEL for x, y in pairs)
        else "level"
        if all(abs(x - y) < LEVEL for x, y in pairs)
        else "mixed"
    )
    rspo = [label for label in TABLE9 if label not in ("local-only RSPO+", "FedSPO+")]
    bound = {
        k: up(max(abs(d) for label in labels for d in diff[label]))
        for k, labels in (("rspo", rspo), ("spo", ["FedSPO+"]))
    }
    return {
        "here": here.pop() if len(here) == 1 else "mixed",
        "there": there,
        "local": local,
        "full": full,
        "rspo": len(rspo),
        "bound": bound,
    }


def facts_notes(t: dict[str, Any], paper: dict[str, Any], _: dict[str, Any]) -> dict[str, Any]:
    def spread(losses: tuple[str, ...]) -> tuple[float, float]:
        stds = [t["t3"][row][loss][s]["std"] for row in t["t3"] for loss in losses for s in ("fed", "per")]
        return min(stds), max(stds)

    local = zip(table9(t)["local-only RSPO+"], paper["t9"]["local-only RSPO+"], strict=True)
    rspo = [(ref, e["mean"]) for e, ref in local if e]  # (paper, ours)
    spo = table14(t)["SPO+ local-only"]
    spo_worse = spo is not None and spo["mean"] > paper["t14"]["SPO+ local-only"]
    return {
        "spread": spread(("mse", "spo+")),
        "rspo-spread": spread(("rspo+",)),
        "opposite": bool(rspo) and all(ref >= FAR * ours for ref, ours in rspo) and spo_worse,
        "rspo": "better"
        if rspo and all(o < r for r, o in rspo)
        else "worse"
        if rspo and all(o > r for r, o in rspo)
        else "mixed",
        "spo": "n/a" if spo is None else "worse" if spo_worse else "not worse",
    }


def bullet(text: str) -> str:
    """A list item of ``text`` (whitespace collapsed), wrapped at 96 columns under its first word."""
    return textwrap.fill(
        " ".join(text.split()),
        96,
        initial_indent="- ",
        subsequent_indent="  ",
        break_on_hyphens=False,
        break_long_words=False,
    )


def markdown(data: dict[str, Any]) -> str:
    """knapsack.md (templates/knapsack.md) from knapsack.json alone; the plots are only linked."""
    t, paper = data["tables"], data["paper"]
    default_grid = not data["quick"] and not data.get("grid")  # the paper's rows, losses and 20 clients
    parts = {"t3": facts_table3, "t4": facts_table4, "t9": facts_table9, "notes": facts_notes}
    facts = {k: part(t, paper, data["differences"]) for k, part in parts.items()} if default_grid else {}
    losses = [loss for loss in LOSSES if any(loss in m for m in t.get("t3", {}).values())]
    # knapsack.json files written before these were recorded: the default engine with 2 workers
    defaults = {"grid": "", "clients": CLIENTS, "engine": "inline", "workers": 2, "studies": {}}
    return render(
        "knapsack.md",
        **defaults | data,
        wall_time=data["wall-time-s"],
        default_grid=default_grid,
        facts=facts,
        losses=losses,
        table4=table4,
        table9=table9(t),
        table14=table14(t),
        ablation_rows=ABLATION_ROWS,
        bullet=bullet,
    )


# --- the studies' index (knapsack_study writes the studies) ------------------------------------------------
def study_index(out: Path) -> dict[str, Any]:
    """What each study in ``out`` (``knapsack-<study>.json``) ran and found."""
    index = {}
    for path in sorted(out.glob("knapsack-*.json")):
        study = json.loads(path.read_text(encoding="utf-8"))
        if name := study.get("study"):
            index[name] = {
                "file": f"knapsack-{name}.md",
                "command": f"hetfed reproduce knapsack-study {name}" + (" --quick" if study["quick"] else ""),
                **{k: study[k] for k in ("quick", "seeds", "runs", "runs-wall-time-s")},
                "rows": list(study["table"]),
                "variants": [v["label"] for v in study["variants"]],
                "orderings": study["orderings"],
            }
    return index


def plot(results_dir: Path, jobs: list[Job], out: Path) -> None:
    first = {job.key: job for job in reversed(jobs)}  # the first seed's run of each cell
    rows = [key[1] for key in first if key[0] == "t3"]
    row = "(0,0,0)" if "(0,0,0)" in rows else rows[0]  # a custom grid may not have (0,0,0)
    t3 = [first[("t3", row, loss)] for loss in LOSSES if ("t3", row, loss) in first]
    runs = [(results_dir / job.config["run-name"], job.key[2]) for job in t3]
    title = f"{row}, first seed"
    plot_rounds(out / "knapsack-regret-per-round.png", runs, "validation relative regret (%)", title)

    fig, axes = pyplot().subplots(1, 2, figsize=(10, 4))
    for ax, row in zip(axes, ("(0,0,0)", "(0,1,0)"), strict=True):
        if (job := first.get(("t3", row, "rspo+"))) is None:
            continue
        for _, series in sorted(curves(results_dir / job.config["run-name"])["freeze"].items()):
            ax.plot(list(series), list(series.values()), lw=1, alpha=0.7)
        ax.axhline(job.config.get("freeze-tau", 0.01), color="k", ls="--", lw=1, label="tau")
        ax.set(
            yscale="log",
            xlabel="personalization round t",
            ylabel="freeze statistic U_t (QP-LP gap)",
            title=f"RSPO+ {row}: one line per client",
        )
        ax.legend()
    save_figure(fig, out / "knapsack-freeze.png")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_run_arguments(parser, "knapsack", quick="1 seed, 2 rows, short schedule (CI)")
    rows = " ".join(PLAN.axes["rows"])
    parser.add_argument("--rows", nargs="+", help=f"Table 3 rows '(eta_o,eta_c,eta_d)' (default: {rows})")
    parser.add_argument("--losses", nargs="+", choices=LOSSES, help="Table 3 losses (default: all five)")
    parser.add_argument("--clients", type=int, default=CLIENTS, help=f"clients per federation ({CLIENTS})")


def custom_grid(args: argparse.Namespace) -> str:
    """The command-line options of a grid other than the paper's ('' for the paper's), checked."""
    for row in args.rows or ():
        row_etas(row)
    if args.clients < 1:
        raise ValueError(f"--clients: must be >= 1, got {args.clients}")
    parts = [f" --rows {' '.join(repr(r) for r in args.rows)}" if args.rows else ""]
    parts += [f" --losses {' '.join(args.losses)}" if args.losses else ""]
    return "".join(parts) + (f" --clients {args.clients}" if args.clients != CLIENTS else "")


def run(args: argparse.Namespace) -> int:
    started = time.time()
    seeds = PLAN.chosen_seeds(args.seeds, args.quick)
    custom = custom_grid(args)
    rows = tuple(args.rows or PLAN.axes["quick-rows" if args.quick else "rows"])
    jobs = grid(seeds, rows, args.quick, tuple(args.losses or LOSSES))
    res = collect(jobs, run_jobs(jobs, args, nodes=args.clients))
    out = Path(args.out)
    data = {
        "seeds": list(seeds),
        "wall-time-s": round(time.time() - started, 1),
        "quick": args.quick,
        "grid": custom,
        "clients": args.clients,
        "engine": args.engine,  # grid: '' for the paper's
        "workers": args.workers if args.engine == "inline" else 1,  # run_many: the others run one at a time
        "unit": "relative regret %",
        "tables": res,
        "paper": PLAN.paper,
        "differences": differences(res, PLAN.paper),
        "orderings": orderings(res),
        "studies": study_index(out),
    }
    publish(out, "knapsack", data, markdown)
    plot(Path(args.results_dir), jobs, out)
    print((out / "knapsack.md").read_text(encoding="utf-8"))
    return 0
