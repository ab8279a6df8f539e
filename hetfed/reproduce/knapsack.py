"""FedRSPO+ on the synthetic knapsack (docs/algorithms.md 1.7): Tables 3, 4, 9 and 14 of the paper.

Every federated number is a real hetfed run (the ServerApp strategy and ClientApp clients, on
the inline engine by default, any engine with ``--engine``); one run gives both the federated
model's result (Fed) and the personalized one (+P). The centralized reference (Table 14) pools
the clients' data in one process, which a federation never does; it is a yardstick only.
Writes ``knapsack.md``, ``knapsack.json`` and ``knapsack-*.png`` to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import textwrap
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from hetfed.reproduce.centralized import centralized
from hetfed.reproduce.common import add_run_arguments, fmt, mean_std, publish, write_json
from hetfed.reproduce.plan import Job, Plan, run_jobs
from hetfed.reproduce.runs import cell, curves, plot_warm_then_personal

PLAN = Plan.load("knapsack")  # plans/knapsack.toml: the grid and the paper's numbers
CLIENTS = 20
ROWS, LOSSES = tuple(PLAN.axes["rows"]), tuple(PLAN.axes["losses"])
ABLATION_ROWS = tuple(PLAN.axes["ablation-rows"])
PAPER_T3, PAPER_T4, PAPER_T9, PAPER_T14 = (PLAN.paper[t] for t in ("t3", "t4", "t9", "t14"))
TOLERANCE = {"rspo+": 1.0, "mse": 3.0, "spo+": 3.0}  # points; the acceptance bands


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


def grid(
    seeds: tuple[int, ...], rows: tuple[str, ...], quick: bool, losses: tuple[str, ...] = LOSSES
) -> list[Job]:
    """Every run of Tables 3 (``losses``), 4, 9 and 14 on ``rows`` (plans/knapsack.toml: Table 3's
    losses, then each of its ``[[runs]]`` on the rows it names); Table 14's federated cells reuse
    Table 3 and 9 runs."""
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


# --- the report ------------------------------------------------------------------------------------------
def _val_at(i: int) -> Callable[[dict[str, Any]], float]:
    """The key of an OptNet-style option: its validation regret at seed index ``i``."""
    return lambda entry: entry["val"][i]


def collect(jobs: list[Job], summaries: list[dict[str, Any]]) -> dict[str, Any]:
    """``{table: {row: {method: {stage: {"values": [...], "mean", "std", "seeds"}}}}}``."""
    out: dict[str, Any] = {}
    for job, summary in zip(jobs, summaries, strict=True):
        table, row, method = job.key
        stages = {
            "t3": ("fed", "per"),
            "t4": ("interp",) if method == "interp-dffl" else ("per",),
            "t9": ("per",) if method != "surrogate-only" else ("fed",),
            "t14": ("per",),
        }[table]
        for stage in stages:
            entry = (
                out.setdefault(table, {})
                .setdefault(row, {})
                .setdefault(method, {})
                .setdefault(stage, {"values": [], "seeds": []})
            )
            entry["values"].append(cell(summary, stage))
            entry["seeds"].append(job.seed)
            if table == "t4" and method.startswith("optnet"):
                entry.setdefault("val", []).append(100 * summary["aggregate"]["per-val-relative-regret"])
    for table in out.values():
        for row in table.values():
            for method in row.values():
                for entry in method.values():
                    entry["mean"], entry["std"] = mean_std(entry["values"])
    # OptNet-style: per seed, the multiplier with the lowest validation regret.
    for methods in out.get("t4", {}).values():
        options = [entry["per"] for method, entry in methods.items() if method.startswith("optnet-")]
        if options:
            picked = [
                min(options, key=_val_at(i))["values"][i]
                for i in range(len(options[0]["values"]))
            ]
            methods["optnet"] = {"per": {"values": picked, "seeds": options[0]["seeds"]}}
            methods["optnet"]["per"]["mean"], methods["optnet"]["per"]["std"] = mean_std(picked)
    return out


# The orderings the paper draws from Table 3: (better, worse, stages in which it states them).
PAPER_ORDERINGS = (("rspo+", "spo+", ("fed", "per")), ("spo+", "mse", ("per",)))


def orderings(tables: dict[str, Any]) -> list[dict[str, Any]]:
    """Each ordering the paper states, checked on every Table 3 row: the two means, whether it
    holds (better < worse) and its margin (worse minus better; negative when it fails)."""
    out = []
    for row, methods in tables.get("t3", {}).items():
        for better, worse, stages in PAPER_ORDERINGS:
            if better not in methods or worse not in methods:  # a grid run without one of the two
                continue
            for stage in stages:
                b, w = methods[better][stage]["mean"], methods[worse][stage]["mean"]
                out.append(
                    {"row": row, "stage": stage, "order": f"{better} < {worse}", "means": [b, w],
                     "holds": b < w, "margin": w - b}
                )
    return out


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
        cells = table4(tables, row)
        if all(cells):
            out["t4"][row] = [c["mean"] - r for c, r in zip(cells, ref, strict=True)]
    for label, entries in table9(tables).items():
        if all(entries):
            out["t9"][label] = [e["mean"] - r for e, r in zip(entries, paper["t9"][label], strict=True)]
    for label, entry in table14(tables).items():
        if entry:
            out["t14"][label] = entry["mean"] - paper["t14"][label]
    return out


def findings(data: Mapping[str, Any]) -> list[str]:
    """The acceptance checks (knapsack.json ``orderings``, and the paper's bands), each stated as met
    or missed (a miss is a finding, not hidden)."""
    if data["quick"]:
        return ["- `--quick` shortens the schedule (3 + 3 rounds, 1 epoch): not comparable with the paper."]
    tables, paper = data["tables"], data["paper"]
    lines = []
    for row, methods in tables.get("t3", {}).items():
        for o in (o for o in data["orderings"] if o["row"] == row):
            better, worse = (NAMES[loss] for loss in o["order"].split(" < "))
            (b, w), ok = o["means"], o["holds"]
            lines.append(
                f"- {row} {'Fed' if o['stage'] == 'fed' else '+P'}: {better} {b:.2f} {'<' if ok else '>='} "
                f"{worse} {w:.2f} ({'ok' if ok else 'MISSED'})"
            )
        if row in paper["t3"]:
            for loss, tol in ((k, v) for k, v in TOLERANCE.items() if k in methods):
                for i, stage in enumerate(("fed", "per")):
                    ours, ref = methods[loss][stage]["mean"], paper["t3"][row][loss][i]
                    if abs(ours - ref) > tol:
                        lines.append(
                            f"- {row} {loss} {stage}: {ours:.2f} vs paper {ref} differs by "
                            f"{abs(ours - ref):.2f} > {tol} points (MISSED; see the notes)"
                        )
    return lines


# Table 9's variants -> (table, method, stage) of the results: where each row's numbers come from.
TABLE9 = {
    "local-only RSPO+": ("t9", "local-only", "per"),
    "FedSPO+": ("t3", "spo+", "fed"),
    "RSPO+ surrogate only": ("t9", "surrogate-only", "fed"),
    "+ per-client lam/eta": ("t3", "rspo+", "fed"),
    "+ per-client lam/eta + P": ("t9", "no-anneal", "per"),
    "full (annealing and freezing)": ("t3", "rspo+", "per"),
}
FULL = "full (annealing and freezing)"
NAMES = {"mse": "MSE", "pfyl": "PFYL", "dpo": "DPO", "spo+": "SPO+", "rspo+": "RSPO+"}
LEVEL = 0.1  # points: two means closer than this are "level" ("about as good")
FAR = 2.0  # a regret at least FAR times another is "far" behind it
BIG = 0.5  # points: a Table 3 cell further than this from the paper is a "gap"
WRAP = 96  # the generated prose is wrapped to this width


def table4(tables: dict[str, Any], row: str) -> tuple[Any, Any, Any]:
    """Table 4's cells of ``row``: Interp-DFFL, OptNet-style and FedRSPO+ (+P) entries (None: not run)."""
    t4 = tables.get("t4", {}).get(row, {})
    full = tables.get("t3", {}).get(row, {}).get("rspo+", {}).get("per")
    return t4.get("interp-dffl", {}).get("interp"), t4.get("optnet", {}).get("per"), full


def table9(tables: dict[str, Any]) -> dict[str, list[Any]]:
    """Table 9's variants -> their entry on each of ABLATION_ROWS (None where not run)."""
    return {
        label: [tables.get(table, {}).get(row, {}).get(method, {}).get(stage) for row in ABLATION_ROWS]
        for label, (table, method, stage) in TABLE9.items()
    }


def table14(tables: dict[str, Any]) -> dict[str, Any]:
    """Table 14's settings -> their statistics entry (None when not run)."""
    row = tables.get("t14", {}).get("(0,0,0)", {})
    t3row = tables.get("t3", {}).get("(0,0,0)", {})
    return {
        "SPO+ centralized": row.get("centralized-spo+", {}).get("per"),
        "SPO+ local-only": row.get("spo+-local-only", {}).get("per"),
        "SPO+ Fed": t3row.get("spo+", {}).get("fed"),
        "SPO+ Fed+P": t3row.get("spo+", {}).get("per"),
        "RSPO+ centralized": row.get("centralized-rspo+", {}).get("per"),
    }


def up(x: float, digits: int = 2) -> str:
    """A bound ("within x") rounded up, so that the stated bound is never below the truth."""
    return f"{math.ceil(x * 10**digits - 1e-9) / 10**digits:.{digits}f}"


def count(n: int) -> str:
    words = ("no", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten")
    return words[n] if n < len(words) else str(n)


def and_join(items: list[str]) -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def bullet(text: str) -> list[str]:
    """A list item, wrapped, continuation lines indented under its text."""
    return textwrap.wrap(
        text,
        WRAP,
        initial_indent="- ",
        subsequent_indent="  ",
        break_on_hyphens=False,
        break_long_words=False,
    )


def mean(tables: dict[str, Any], table: str, row: str, method: str, stage: str) -> float:
    return tables[table][row][method][stage]["mean"]


def against_table3(t: dict[str, Any], paper: dict[str, Any]) -> str:
    stages = {"fed": "Fed", "per": "+P"}
    cells = {  # loss -> [(ours - paper, row, stage, ours, paper)] over the cells the paper reports
        loss: [
            (mean(t, "t3", row, loss, s) - ref[loss][i], row, s, mean(t, "t3", row, loss, s), ref[loss][i])
            for row, ref in paper["t3"].items()
            for i, s in enumerate(stages)
        ]
        for loss in LOSSES
    }
    bound = {loss: max(abs(c[0]) for c in cells[loss]) for loss in LOSSES}
    first, *rest = sorted(LOSSES, key=lambda loss: bound[loss])
    text = (
        f"{NAMES[first]} is within {up(bound[first])} points of the paper in every cell (Fed and +P), "
        + and_join([f"{NAMES[loss]} within {up(bound[loss])}" for loss in rest])
        + ". "
    )
    big = [c[0] for loss in LOSSES for c in cells[loss] if abs(c[0]) > BIG]
    if not big:
        text += f"No cell differs by more than {BIG} points"
    elif all(d < 0 for d in big):
        text += f"Every cell that differs by more than {BIG} points is lower (better) here than in the paper"
    elif all(d > 0 for d in big):
        text += f"Every cell that differs by more than {BIG} points is higher (worse) here than in the paper"
    else:
        lower = sum(d < 0 for d in big)
        text += (
            f"Of the {count(len(big))} cells that differ by more than {BIG} points, {count(lower)} are lower "
            f"(better) here than in the paper and {count(len(big) - lower)} higher (worse)"
        )
    largest = [(max(cells[loss], key=lambda c: abs(c[0])), loss) for loss in LOSSES]
    largest.sort(key=lambda x: -abs(x[0][0]))  # the largest gap first
    if len({(c[1], c[2]) for c, _ in largest}) == 1:
        row, stage = largest[0][0][1], largest[0][0][2]
        text += f"; the largest gaps are in the {stages[stage]} column of {row}: " + ", ".join(
            f"{NAMES[loss]} {c[3]:.2f} vs {c[4]}" for c, loss in largest
        )
    else:
        text += "; the largest gap of each loss: " + ", ".join(
            f"{NAMES[loss]} {c[3]:.2f} vs {c[4]} at {c[1]} {stages[c[2]]}" for c, loss in largest
        )
    failed = [
        row
        for row in t["t3"]
        if not (
            all(mean(t, "t3", row, "rspo+", s) < mean(t, "t3", row, "spo+", s) for s in stages)
            and mean(t, "t3", row, "spo+", "per") < mean(t, "t3", row, "mse", "per")
        )
    ]
    orderings = "RSPO+ < SPO+ in both stages and SPO+ < MSE after personalization"
    unreported = len([row for row in t["t3"] if row not in paper["t3"]])
    if failed:
        text += (
            f". The orderings the paper draws ({orderings}) do not hold at {and_join(failed)} "
            "(acceptance checks below)."
        )
    elif unreported:
        rows = "row it does not report" if unreported == 1 else "rows it does not report"
        text += (
            f". The orderings the paper draws hold on every row, the {count(unreported)} {rows} included: "
            f"{orderings} (acceptance checks below)."
        )
    else:
        text += f". The orderings the paper draws hold on every row: {orderings} (acceptance checks below)."
    return "**Table 3.** " + text


def offset(diffs: list[float], unit: str) -> str:
    """How far ours is from the paper, given paper - ours per row."""
    lo, hi = min(diffs), max(diffs)
    if lo > 0:
        return f"{lo:.2f} to {hi:.2f}{unit} below"
    if hi < 0:
        return f"{-hi:.2f} to {-lo:.2f}{unit} above"
    return f"from {hi:.2f}{unit} below to {-lo:.2f} above"


def against_table4(t: dict[str, Any], paper: dict[str, Any]) -> str:
    rows = list(paper["t4"])
    interp = {row: t["t4"][row]["interp-dffl"]["interp"] for row in rows}
    full = {row: t["t3"][row]["rspo+"]["per"] for row in rows}
    below_i = [paper["t4"][row][0] - interp[row]["mean"] for row in rows]
    below_o = [paper["t4"][row][1] - t["t4"][row]["optnet"]["per"]["mean"] for row in rows]
    text = (
        f"Interp-DFFL is {offset(below_i, ' points')} the paper's values and "
        f"OptNet-style {offset(below_o, '')}. "
    )
    same, differ = [], []
    for row in rows:
        i, f = interp[row], full[row]
        pi, pf = paper["t4"][row][0], paper["t4"][row][2]
        ours = (
            None
            if abs(i["mean"] - f["mean"]) < LEVEL
            else ("Interp-DFFL" if i["mean"] < f["mean"] else "FedRSPO+")
        )
        theirs = None if pi == pf else ("Interp-DFFL" if pi < pf else "FedRSPO+")
        a, b = (f, i) if ours == "FedRSPO+" else (i, f)  # the one ahead first
        pa, pb = (pf, pi) if theirs == "FedRSPO+" else (pi, pf)
        noisy = ours is not None and abs(i["mean"] - f["mean"]) < max(i["std"], f["std"])
        std = f"; std {a['std']:.2f} and {b['std']:.2f}" if noisy else ""
        if ours == theirs:
            who = f"{ours} ahead" if ours else "the two level"
            same.append(f"at {row}, {who} ({a['mean']:.2f} vs {b['mean']:.2f}{std}; paper {pa} vs {pb})")
            continue
        here = (
            f"{ours} is ahead here ({a['mean']:.2f} vs {b['mean']:.2f}{std})"
            if ours
            else f"the two are level here (Interp-DFFL {i['mean']:.2f}, FedRSPO+ {f['mean']:.2f})"
        )
        there = (
            f"the paper has {theirs} ahead ({pa} vs {pb})" if theirs else f"the paper has them level ({pa})"
        )
        differ.append(f"at {row}, where {here} and {there}")
    text += "Interp-DFFL against FedRSPO+ (+P) ranks as in the paper "
    if not same:
        text += "at no row: not " + ", nor ".join(differ) + "."
    else:
        text += (same[0] if len(same) == 1 else ", ".join(same[:-1]) + ", and " + same[-1]) + "."
        if differ:
            text += " It does not " + ", nor ".join(differ) + "."
    return "**Table 4.** " + text


def against_table9(t: dict[str, Any], paper: dict[str, Any]) -> str:
    rows = ABLATION_ROWS
    local = [mean(t, "t9", row, "local-only", "per") for row in rows]
    full = [mean(t, "t3", row, "rspo+", "per") for row in rows]
    p_local, p_full = paper["t9"]["local-only RSPO+"], paper["t9"][FULL]
    d = [x - y for x, y in zip(local, full, strict=True)]
    if all(abs(x) < LEVEL for x in d):
        text = "Local-only RSPO+ is about as good as FedRSPO+ here: "
    elif all(x >= LEVEL for x in d):
        text = "Local-only RSPO+ is behind FedRSPO+ here: "
    elif all(x <= -LEVEL for x in d):
        text = "Local-only RSPO+ is ahead of FedRSPO+ here: "
    else:
        text = "Local-only RSPO+ against FedRSPO+ here: "
    text += ", ".join(f"{x:.2f} vs {y:.2f} at {row}" for x, y, row in zip(local, full, rows, strict=True))
    pairs = list(zip(p_local, p_full, strict=True))
    quoted = ", ".join(map(str, p_local))
    if all(x >= FAR * y for x, y in pairs):
        text += f", where the paper has local-only far behind ({quoted})."
    elif all(x >= y + LEVEL for x, y in pairs):
        text += f", where the paper has local-only behind ({quoted})."
    elif all(abs(x - y) < LEVEL for x, y in pairs):
        text += f", as in the paper ({quoted})."
    else:
        text += (
            f", where the paper has local-only at ({quoted}) and FedRSPO+ at ({', '.join(map(str, p_full))})."
        )
    if all(abs(x) < LEVEL for x in d):
        text += (
            " On this task and training budget, federation adds almost nothing to RSPO+ with personalization."
        )

    def bound(variants: list[str]) -> str:
        diffs = []
        for label in variants:
            table, method, stage = TABLE9[label]
            diffs += [
                mean(t, table, row, method, stage) - paper["t9"][label][i] for i, row in enumerate(rows)
            ]
        return up(max(map(abs, diffs)))

    rspo = [label for label in TABLE9 if label not in ("local-only RSPO+", "FedSPO+")]
    text += (
        f" The {count(len(rspo))} RSPO+ ablation rows are within {bound(rspo)} points of the paper, "
        f"FedSPO+ within {bound(['FedSPO+'])}."
    )
    return "**Table 9.** " + text


def against_table14(t: dict[str, Any], paper: dict[str, Any]) -> str:
    entries = table14(t)

    def side(label: str) -> str:
        ours, ref = entries[label]["mean"], paper["t14"][label]
        return "worse" if ours > ref else "better" if ours < ref else "level"

    def pair(label: str) -> str:
        return f"{entries[label]['mean']:.2f} vs {paper['t14'][label]}"

    local, c_spo, c_rspo = side("SPO+ local-only"), side("SPO+ centralized"), side("RSPO+ centralized")
    text = "SPO+ local-only is " + (
        f"{local} here than in the paper" if local != "level" else "level with the paper"
    )
    text += f" ({pair('SPO+ local-only')})"
    yardsticks = f"(SPO+ {pair('SPO+ centralized')}, RSPO+ {pair('RSPO+ centralized')})"
    if c_spo == c_rspo == local:
        text += f", and so are the centralized yardsticks {yardsticks}."
    elif c_spo == c_rspo:
        text += f", while the centralized yardsticks are {c_spo} {yardsticks}."
    else:
        text += (
            f"; the centralized SPO+ yardstick is {c_spo} ({pair('SPO+ centralized')}) and the RSPO+ one "
            f"{c_rspo} ({pair('RSPO+ centralized')})."
        )
    return "**Table 14.** " + text


def against_the_paper(tables: dict[str, Any], paper: dict[str, Any]) -> list[str]:
    """The "Against the paper" section: every number and every comparison from ``tables`` (ours)
    and ``paper``, the wording chosen by the numbers."""
    lines = [
        "## Against the paper",
        "",
        "Every number below is read from `knapsack.json` (`tables` for ours, `paper` for the paper's);",
        "`tests/test_docs.py` recomputes each one.",
        "",
    ]
    for part in (against_table3, against_table4, against_table9, against_table14):
        lines += bullet(part(tables, paper))
    return lines + [""]


def notes(tables: dict[str, Any], paper: dict[str, Any]) -> str:
    """The notes; the numbers and comparisons in them come from ``tables`` and ``paper``."""
    t3 = tables.get("t3", {})

    def spread(losses: tuple[str, ...]) -> str:
        stds = [t3[row][loss][s]["std"] for row in t3 for loss in losses for s in ("fed", "per")]
        return f"{min(stds):.2f} to {max(stds):.2f}"

    noise = bullet(
        "The MSE and SPO+ baselines train for only ~60 Adam steps in the warm start; their seed-to-seed "
        f"std in Table 3 is {spread(('mse', 'spo+'))} points (RSPO+: {spread(('rspo+',))})."
    )
    rows = [row for row in ABLATION_ROWS if row in tables.get("t9", {})]
    rspo = [
        (
            paper["t9"]["local-only RSPO+"][ABLATION_ROWS.index(row)],
            mean(tables, "t9", row, "local-only", "per"),
        )
        for row in rows
    ]
    spo = table14(tables)["SPO+ local-only"]
    spo_worse = spo is not None and spo["mean"] > paper["t14"]["SPO+ local-only"]
    if rspo and all(ref >= FAR * ours for ref, ours in rspo) and spo_worse:
        local = LOCAL_NOTE
    else:
        rspo_side = (
            "better"
            if rspo and all(o < r for r, o in rspo)
            else "worse"
            if rspo and all(o > r for r, o in rspo)
            else "mixed"
        )
        spo_side = "n/a" if spo is None else "worse" if spo_worse else "not worse"
        local = "\n".join(
            bullet(
                f"Local-only (Tables 9 and 14) against the paper: RSPO+ {rspo_side} here, SPO+ {spo_side} "
                '(numbers under "Against the paper"). Our local-only run gives each client exactly the '
                "federated protocol's budget (10 warm rounds x 3 epochs, then the 10 personalization rounds) "
                "on its own 100 samples; the paper does not state its local-only schedule."
            )
        )
    return "\n".join([NOTES_HEAD, *noise, local, NOTES_TAIL])


NOTES_HEAD = """\
- Centralized and local-only runs use the same epochs as the federated protocol
  (warm start + personalization). The centralized model is trained in one process on pooled
  data (a yardstick the federation never builds); local-only is a hetfed run in which every
  client trains only its own model and nothing is averaged.
- OptNet-style differentiates through the exact (sort-based) projection of the knapsack set by
  default (`optnet-backend = exact`), which gives the same QP layer as qpth to solver precision
  (tests/test_losses.py) in a fraction of the time; the multiplier is picked per seed on the
  mean validation regret of the personalized models."""
# Used when local-only RSPO+ is far better here than in the paper and local-only SPO+ worse.
LOCAL_NOTE = """\
- Local-only (Tables 9 and 14) misses the paper in opposite directions: RSPO+ far better here,
  SPO+ worse. Our local-only run gives each client exactly the federated protocol's budget (10
  warm rounds x 3 epochs, then the 10 personalization rounds) on its own 100 samples. The paper
  does not state its local-only schedule; a longer SPO+ budget and a much shorter RSPO+ one
  would explain both gaps, but that is a hypothesis: the committed results hold no sweep over
  the local-only budget."""
NOTES_TAIL = """\
- Interp-DFFL blends a local SPO+ model with the federated SPO+ model. With a local model trained
  only the warm start's ~60 steps, the blend always picked the federated model (a = 1, so
  Interp-DFFL equalled FedSPO+); its local model is therefore trained to convergence
  (`interp-local-epochs`, default 100 epochs, against FedRSPO+'s 10 personalization epochs).
  How it then compares with the paper and with FedRSPO+ is under "Against the paper"."""


def delta(d: float) -> str:
    """Ours minus the paper's, signed: ``Δ +0.12``."""
    return f"Δ {d:+.2f}"


def table_sections(data: Mapping[str, Any]) -> list[str]:
    """Tables 3, 4, 9 and 14: ours, and in brackets the paper's value with our difference from it
    (knapsack.json ``differences``), as markdown lines."""
    tables, paper, diff = data["tables"], data["paper"], data["differences"]
    t3 = tables.get("t3", {})
    losses = [loss for loss in LOSSES if any(loss in methods for methods in t3.values())]
    lines = [
        "## Table 3: losses x heterogeneity (Fed / +P)",
        "",
        "| (eta_o, eta_c, eta_d) | " + " | ".join(losses) + " |",
        "|---|" + "---|" * len(losses),
    ]
    for row, methods in t3.items():
        cells = []
        for loss in losses:
            ref, d = paper["t3"].get(row, {}).get(loss), diff["t3"].get(row, {}).get(loss)
            quoted = f" [{ref[0]} / {ref[1]}; {delta(d[0])} / {d[1]:+.2f}]" if ref and d else ""
            cell = methods.get(loss, {})
            cells.append(f"{fmt(cell.get('fed'))} / {fmt(cell.get('per'))}{quoted}")
        lines.append(f"| {row} | " + " | ".join(cells) + " |")
    if "t4" in tables:
        lines += [
            "",
            "## Table 4: FedRSPO+ against Interp-DFFL and OptNet-style (+P)",
            "",
            "| row | Interp-DFFL | OptNet-style | FedRSPO+ |",
            "|---|---|---|---|",
        ]
        for row in tables["t4"]:
            ref, d = paper["t4"].get(row, ("", "", "")), diff["t4"].get(row)
            refs = [f" [{r}; {delta(x)}]" for r, x in zip(ref, d, strict=True)] if d else [""] * 3
            cells = [f"{fmt(entry)}{quoted}" for entry, quoted in zip(table4(tables, row), refs, strict=True)]
            lines.append(f"| {row} | " + " | ".join(cells) + " |")
    if "t9" in tables:
        lines += [
            "",
            "## Table 9: component ablation",
            "",
            "| variant | " + " | ".join(ABLATION_ROWS) + " |",
            "|---|" + "---|" * len(ABLATION_ROWS),
        ]
        for label, entries in table9(tables).items():
            cells = []
            for i, entry in enumerate(entries):
                d = diff["t9"].get(label)
                quoted = f" [{paper['t9'][label][i]}; {delta(d[i])}]" if d else f" [{paper['t9'][label][i]}]"
                cells.append(f"{fmt(entry)}{quoted}" if entry else "n/a")
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
    if "t14" in tables:
        lines += [
            "",
            "## Table 14: SPO+ and RSPO+ at (0,0,0), from centralized to federated",
            "",
            "| setting | ours | paper | ours - paper |",
            "|---|---|---|---|",
        ]
        for label, entry in table14(tables).items():
            d = diff["t14"].get(label)
            gap = "" if d is None else f"{d:+.2f}"
            lines.append(f"| {label} | {fmt(entry)} | {paper['t14'][label]} | {gap} |")
    return lines


def study_index(out: Path) -> dict[str, Any]:
    """What each committed study (``knapsack-<study>.json`` in ``out``) ran and found: its runs,
    seeds, variants, the paper's orderings pair by pair (per variant and stage) and the best
    variant per row and loss; the study's own file has the tables."""
    index = {}
    for path in sorted(out.glob("knapsack-*.json")):
        study = json.loads(path.read_text(encoding="utf-8"))
        if "study" not in study:
            continue
        name = study["study"]
        index[name] = {
            "file": f"knapsack-{name}.md",
            "command": f"hetfed reproduce knapsack-study {name}" + (" --quick" if study["quick"] else ""),
            "quick": study["quick"],
            "seeds": study["seeds"],
            "runs": study["runs"],
            "runs-wall-time-s": study["runs-wall-time-s"],
            "rows": list(study["table"]),
            "variants": [v["label"] for v in study["variants"]],
            "orderings": study["orderings"],
            "best": ranking(study["table"]),
        }
    return index


def refresh_study_index(out: Path) -> bool:
    """Re-index the studies in ``out``'s knapsack.json and re-render knapsack.md (after a study ran);
    False when there is no knapsack.json yet (``hetfed reproduce knapsack`` indexes them then)."""
    path = out / "knapsack.json"
    if not path.exists():
        return False
    data = json.loads(path.read_text(encoding="utf-8"))
    data["studies"] = study_index(out)
    write_json(path, data)
    (out / "knapsack.md").write_text(markdown(json.loads(path.read_text(encoding="utf-8"))), encoding="utf-8")
    return True


def ranking(cells: dict[str, Any]) -> list[str]:
    """Per row and loss of a study: the variant with the lowest mean +P regret (Fed where no +P),
    and its margin over the runner-up in points and in the runner-up's standard deviations."""
    out = []
    for row, by_loss in cells.items():
        for loss, by_variant in by_loss.items():
            stage = "per" if any(math.isfinite(c["per"]["mean"]) for c in by_variant.values()) else "fed"
            entries = [(c[stage]["mean"], c[stage]["std"], v) for v, c in by_variant.items()]
            ranked = sorted(e for e in entries if math.isfinite(e[0]))
            if len(ranked) < 2:
                continue
            (best, _, name), (second, sd, runner) = ranked[0], ranked[1]
            sds = f", {(second - best) / sd:.1f} sd" if sd > 0 else ""
            label = "+P" if stage == "per" else "Fed"
            gap = f"{second - best:.2f} points below {runner}{sds}"
            out.append(f"{row} {loss}: {name} ({best:.2f}, {label}), {gap}")
    return out


def study_sections(studies: Mapping[str, Any]) -> list[str]:
    """knapsack.md's section on the studies: one line per study with the paper's orderings summed
    over its rows and variants (knapsack.json ``studies``)."""
    if not studies:
        return []
    lines = [
        "## Studies",
        "",
        "Each study regenerates with its command; its own page has the tables, the QP-LP gap",
        "diagnostics and the best variant per row and loss. The paper's orderings, summed over the",
        "study's rows and variants (rows where it holds / rows; the smallest margin in points):",
        "",
        "| study | command | runs | seeds | rspo+ < spo+ (Fed, +P) | spo+ < mse (Fed, +P) |",
        "|---|---|---|---|---|---|",
    ]
    for name, s in studies.items():
        cells = []
        for order in ("rspo+ < spo+", "spo+ < mse"):
            parts = []
            for stage in ("fed", "per"):
                found = [o for o in s["orderings"] if o["order"] == order and o["stage"] == stage]
                holds, rows = sum(o["holds"] for o in found), sum(o["rows"] for o in found)
                margin = min((o["margin"] for o in found), default=float("nan"))
                parts.append(f"{holds}/{rows} ({margin:.2f})" if found else "-")
            cells.append(", ".join(parts))
        lines.append(
            f"| [{name}]({s['file']}) | `{s['command']}` | {s['runs']} | {len(s['seeds'])} | "
            + " | ".join(cells) + " |"
        )
    return lines + [""]


def markdown(data: dict[str, Any]) -> str:
    """knapsack.md from the contents of knapsack.json: nothing else goes into it (the plots are
    only linked; ``plot`` draws them from the run folders)."""
    tables, paper, quick = data["tables"], data["paper"], data["quick"]
    # knapsack.json files written before the engine and the worker count were recorded came from
    # the default engine with 2 workers (what knapsack.md has said of them).
    engine, workers = data.get("engine", "inline"), data.get("workers", 2)
    lines = [
        "# FedRSPO+ on the synthetic knapsack (reproduction)",
        "",
        f"Generated by `hetfed reproduce knapsack{' --quick' if quick else ''}{data.get('grid', '')}`: "
        f"seeds {data['seeds']}, {data.get('clients', CLIENTS)} clients, {engine} engine, {workers} "
        f"parallel worker{'s' if workers != 1 else ''}; "
        f"the invocation that wrote this file took {data['wall-time-s'] / 60:.1f} min (`wall-time-s`: "
        "runs already on disk are reused, and knapsack.json does not record the runs' own wall times). "
        "Relative regret in % (mean over clients of mean regret / mean |z*|), mean ± std over seeds; the "
        "paper's value in brackets with our difference from it (Δ = ours - paper). Fed = the federated "
        "model after the warm start; +P = after personalization.",
        "",
        *table_sections(data),
        "",
    ]
    default_grid = not quick and not data.get("grid")  # the paper's rows, losses and 20 clients
    if default_grid:
        lines += against_the_paper(tables, paper)
    lines += [
        "## Acceptance checks",
        "",
        *findings(data),
        "",
        *study_sections(data.get("studies", {})),
        "## Plots",
        "",
        "![validation regret per round](knapsack-regret-per-round.png)",
        "",
        "![freeze statistic per client](knapsack-freeze.png)",
        "",
        "## Notes",
        "",
        notes(tables, paper) if default_grid else "A custom grid: see the default run's notes.",
    ]
    return "\n".join(lines) + "\n"


def plot(results_dir: Path, jobs: list[Job], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    first = {job.key: job for job in reversed(jobs)}  # the first seed's run of each cell
    rows = [key[1] for key in first if key[0] == "t3"]
    row = "(0,0,0)" if "(0,0,0)" in rows else rows[0]  # a custom grid may not have (0,0,0)
    fig, ax = plt.subplots(figsize=(7, 4))
    for loss in LOSSES:
        job = first.get(("t3", row, loss))
        if job is None:
            continue
        plot_warm_then_personal(ax, results_dir / job.config["run-name"], loss)
    ax.set(
        xlabel="round (warm start, then personalization)",
        ylabel="validation relative regret (%)",
        title=f"{row}, first seed",
        yscale="log",
    )
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "knapsack-regret-per-round.png", dpi=110)
    plt.close(fig)

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, row in zip(axes, ("(0,0,0)", "(0,1,0)"), strict=True):
        job = first.get(("t3", row, "rspo+"))
        if job is None:
            continue
        freeze = curves(results_dir / job.config["run-name"])["freeze"]
        for _, series in sorted(freeze.items()):
            ax.plot(list(series), list(series.values()), lw=1, alpha=0.7)
        ax.axhline(job.config.get("freeze-tau", 0.01), color="k", ls="--", lw=1, label="tau")
        ax.set(
            yscale="log",
            xlabel="personalization round t",
            ylabel="freeze statistic U_t (QP-LP gap)",
            title=f"RSPO+ {row}: one line per client",
        )
        ax.legend()
    fig.tight_layout()
    fig.savefig(out / "knapsack-freeze.png", dpi=110)
    plt.close(fig)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_run_arguments(parser, "knapsack", quick="1 seed, 2 rows, short schedule (CI)")
    parser.add_argument(
        "--rows", nargs="+", help=f"Table 3 rows '(eta_o,eta_c,eta_d)' (default: {' '.join(ROWS)})"
    )
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
    parts += [f" --clients {args.clients}" if args.clients != CLIENTS else ""]
    return "".join(parts)


def run(args: argparse.Namespace) -> int:
    started = time.time()
    seeds = PLAN.chosen_seeds(args.seeds, args.quick)
    custom = custom_grid(args)
    rows = tuple(args.rows or PLAN.axes["quick-rows" if args.quick else "rows"])
    jobs = grid(seeds, rows, args.quick, tuple(args.losses or LOSSES))
    res = collect(jobs, run_jobs(jobs, args, nodes=args.clients))
    for seed in seeds if "(0,0,0)" in rows else ():  # Table 14's centralized yardstick
        for loss in ("spo+", "rspo+"):
            value = centralized({**base_config("(0,0,0)", seed, args.quick), "loss": loss}, args.clients)
            entry = (
                res.setdefault("t14", {})
                .setdefault("(0,0,0)", {})
                .setdefault(f"centralized-{loss}", {"per": {"values": [], "seeds": []}})["per"]
            )
            entry["values"].append(value)
            entry["seeds"].append(seed)
            entry["mean"], entry["std"] = mean_std(entry["values"])
    wall = time.time() - started
    paper = PLAN.paper
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    publish(
        out,
        "knapsack",
        {
            "seeds": list(seeds),
            "wall-time-s": round(wall, 1),
            "quick": args.quick,
            "grid": custom,  # '' for the paper's rows, losses and clients
            "clients": args.clients,
            "engine": args.engine,
            "workers": args.workers
            if args.engine == "inline"
            else 1,  # run_many: the others run one at a time
            "unit": "relative regret %",
            "tables": res,
            "paper": paper,
            "differences": differences(res, paper),
            "orderings": orderings(res),
            "studies": study_index(out),
        },
        markdown,
    )
    plot(Path(args.results_dir), jobs, out)
    print((out / "knapsack.md").read_text(encoding="utf-8"))
    return 0
