"""Regenerate the pilot example: three silos, each with its own LP over 24 hourly variables and ERCOT data.

Run from the repository root: ``.venv/bin/python examples/pilot/make_pilot.py [--ercot-dir DIR] [--out DIR]``.
Writes ``silo-{0,1,2}/`` (samples.csv, new-days.csv, problem.lp or problem.mps) and checks every
problem file with HiGHS: it reads, is feasible, all variables are bounded, its columns are h01..h24.
"""

from __future__ import annotations

import argparse
import csv
import math
import random
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import highspy
import numpy as np

from hetfed.problems import energy
from hetfed.problems.ercot import load_ercot

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
FEATURES: tuple[str, ...] = (
    "prev_mean",
    "prev_max",
    "prev_min",
    "week_mean",
    "dow_sin",
    "dow_cos",
    "off_peak_day",
    "gas_last",
)
VARS: tuple[str, ...] = tuple(f"h{h:02d}" for h in range(1, 25))
COSTS: tuple[str, ...] = tuple(f"cost:{v}" for v in VARS)
FIRST, LAST_SAMPLE, LAST = (np.datetime64(d) for d in ("2022-01-01", "2022-12-17", "2022-12-31"))


@dataclass(frozen=True)
class Day:
    date: str  # YYYY-MM-DD
    x: list[str]  # the FEATURES, formatted
    c: list[str]  # the 24 prices, formatted


def fmt(value: float, decimals: int) -> str:
    text = f"{value:.{decimals}f}"
    return text[1:] if float(text) == 0 and text.startswith("-") else text  # no "-0.00"


def zone_days(ercot_dir: Path | None, zone: str) -> tuple[list[Day], list[Day]]:
    """The zone's sample days (FIRST..LAST_SAMPLE) and new days (the rest up to LAST), every day present."""
    s = energy.zone_samples(load_ercot(ercot_dir, points=[zone]), zone)
    cols = [energy.FEATURE_NAMES.index(f) for f in FEATURES]
    keep = (s.dates >= FIRST) & (s.dates <= LAST)
    expected = int((LAST - FIRST).astype(int)) + 1
    if keep.sum() != expected:
        raise SystemExit(f"{zone}: {keep.sum()} of {expected} days {FIRST}..{LAST} in the ERCOT data")
    days = [
        Day(str(d), [fmt(v, 4) for v in x[cols]], [fmt(v, 2) for v in c])
        for d, x, c in zip(s.dates[keep], s.x[keep], s.c[keep], strict=True)
    ]
    n = int((LAST_SAMPLE - FIRST).astype(int)) + 1
    return days[:n], days[n:]


def write_csv(path: Path, header: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    with path.open("w", newline="") as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow(header)
        writer.writerows(rows)


# ----------------------------------------------------------------------------- problems (CPLEX LP text)
def lp_text(sense: str, objective: Sequence[str], rows: Sequence[str], bounds: Sequence[str]) -> str:
    obj = " + ".join(objective)
    return "\n".join(
        [
            sense,
            f" obj: {obj}",
            "Subject To",
            *(f" {r}" for r in rows),
            "Bounds",
            *(f" {b}" for b in bounds),
            "End",
            "",
        ]
    )


def ramp_rows(step: float, pairs: Sequence[int]) -> list[str]:
    """``up_i: h{i+1} - h{i} <= step`` and ``down_i: h{i} - h{i+1} <= step`` for i in pairs."""
    rows = []
    for i in pairs:
        a, b = VARS[i - 1], VARS[i]
        rows += [f"up_{i:02d}: {b} - {a} <= {step}", f"down_{i:02d}: {a} - {b} <= {step}"]
    return rows


def houston_retailer() -> str:
    """Buys exactly 12 MWh a day, at most 1.2 MWh an hour, changing by at most 0.4 MWh from hour to hour."""
    rows = [f"quota: {' + '.join(VARS)} = 12", *ramp_rows(0.4, range(1, 24))]
    return lp_text("Minimize", VARS, rows, [f"0 <= {v} <= 1.2" for v in VARS])


def west_producer() -> str:
    """Sells up to 2 MWh an hour, 30 MWh a day of fuel, ramp 0.6; variables first appear scrambled."""
    rng = random.Random(2022)
    shuffled = rng.sample(VARS, len(VARS))
    pairs = [17, *rng.sample([i for i in range(1, 24) if i != 17], 22)]
    fuel = [f"fuel: {' + '.join(rng.sample(VARS, len(VARS)))} <= 30"]
    rows = ramp_rows(0.6, pairs[:12]) + fuel + ramp_rows(0.6, pairs[12:])
    return lp_text("Maximize", shuffled, rows, [f"0 <= {v} <= 2" for v in reversed(shuffled)])


def north_load() -> list[float]:
    """Hourly consumption L_h = 0.4 + 0.3 sin(pi (h - 6) / 12), at least 0.1, in MWh (3 decimals)."""
    return [round(max(0.1, 0.4 + 0.3 * math.sin(math.pi * (h - 6) / 12)), 3) for h in range(1, 25)]


def north_buyer() -> str:
    """Buys w_h <= 2.5 into a 3 MWh store (empty at 00:00) that serves the load; the day ends empty.

    Store level after hour h: sum_{k<=h} (w_k - L_k) in [0, 3] for h = 1..23; at h = 24 it is 0 (row ``end``).
    """
    load = np.cumsum(north_load())
    rows = []
    for h in range(1, 24):
        bought = " + ".join(VARS[:h])
        rows += [
            f"soc_lo{h:02d}: {bought} >= {load[h - 1]:.3f}",
            f"soc_hi{h:02d}: {bought} <= {load[h - 1] + 3:.3f}",
        ]
    rows.append(f"end: {' + '.join(VARS)} = {load[-1]:.3f}")
    return lp_text("Minimize", VARS, rows, [f"0 <= {v} <= 2.5" for v in VARS])


# ----------------------------------------------------------------------------- checks (HiGHS)
def read(path: Path) -> highspy.Highs:
    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    if h.readModel(str(path)) != highspy.HighsStatus.kOk:
        raise SystemExit(f"HiGHS cannot read {path}")
    return h


def check(path: Path, prices: Sequence[str]) -> list[str]:
    """Read ``path``; check its columns are VARS, all bounded, and it solves with zero and one day's costs."""
    h = read(path)
    lp = h.getLp()
    names = list(lp.col_names_)
    if sorted(names) != list(VARS):
        raise SystemExit(f"{path}: columns {names} are not {VARS[0]}..{VARS[-1]}")
    if not (np.isfinite(lp.col_lower_).all() and np.isfinite(lp.col_upper_).all()):
        raise SystemExit(f"{path}: some variable is unbounded")
    price = dict(zip(VARS, map(float, prices), strict=True))
    for costs in ([0.0] * len(names), [price[n] for n in names]):
        h.changeColsCost(len(names), np.arange(len(names), dtype=np.int32), np.array(costs))
        h.run()
        if h.getModelStatus() != highspy.HighsModelStatus.kOptimal:
            raise SystemExit(f"{path}: {h.modelStatusToString(h.getModelStatus())} with costs {costs[:3]}...")
    return names


# ----------------------------------------------------------------------------- silos
@dataclass(frozen=True)
class Silo:
    folder: str
    name: str
    zone: str
    problem: Callable[[], str]
    layout: str  # "id+split", "plain+note" or "id"
    mps: bool = False


SILOS: tuple[Silo, ...] = (
    Silo("silo-0", "Houston retailer", "LZ_HOUSTON", houston_retailer, "id+split"),
    Silo("silo-1", "West producer", "LZ_WEST", west_producer, "plain+note"),
    Silo("silo-2", "North buyer with storage", "LZ_NORTH", north_buyer, "id", mps=True),
)


def split_of(date: str) -> str:
    month = int(date[5:7])
    return "train" if month <= 7 else "val" if month == 8 else "test"


def make_silo(silo: Silo, ercot_dir: Path | None, out: Path) -> None:
    samples, new = zone_days(ercot_dir, silo.zone)
    folder = out / silo.folder
    folder.mkdir(parents=True, exist_ok=True)
    if silo.layout == "id+split":
        write_csv(
            folder / "samples.csv",
            ["id", "split", *FEATURES, *COSTS],
            [[d.date, split_of(d.date), *d.x, *d.c] for d in samples],
        )
    elif silo.layout == "plain+note":
        write_csv(
            folder / "samples.csv", [*FEATURES, *COSTS, "note"], [[*d.x, *d.c, "west"] for d in samples]
        )
    else:
        write_csv(folder / "samples.csv", ["id", *FEATURES, *COSTS], [[d.date, *d.x, *d.c] for d in samples])
    write_csv(folder / "new-days.csv", ["id", *FEATURES], [[d.date, *d.x] for d in new])

    if silo.mps:
        with tempfile.TemporaryDirectory() as tmp:
            lp = Path(tmp) / "problem.lp"
            lp.write_text(silo.problem())
            check(lp, samples[0].c)
            h = read(lp)
            if h.writeModel(str(folder / "problem.mps")) != highspy.HighsStatus.kOk:
                raise SystemExit(f"HiGHS cannot write {folder / 'problem.mps'}")
        problem = folder / "problem.mps"
    else:
        problem = folder / "problem.lp"
        problem.write_text(silo.problem())
    names = check(problem, samples[0].c)
    rows = read(problem).getNumRow()
    order = "in order" if names == list(VARS) else f"HiGHS column order {' '.join(names[:6])} ..."
    print(
        f"{silo.folder} ({silo.name}, {silo.zone}): {len(samples)} sample rows "
        f"{samples[0].date}..{samples[-1].date}, {len(new)} new days {new[0].date}..{new[-1].date}; "
        f"{problem.name}: {rows} constraints, 24 variables {order}"
    )


def main() -> None:
    default_ercot = ROOT.parent / "shared" / "data" / "ercot"
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--ercot-dir",
        type=Path,
        default=default_ercot if default_ercot.is_dir() else None,
        help="directory with the ERCOT price and gas files (default: ../shared/data/ercot if "
        "present, else fetched into the user's cache)",
    )
    parser.add_argument(
        "--out", type=Path, default=HERE, help="output directory (default: this script's folder)"
    )
    args = parser.parse_args()
    for silo in SILOS:
        make_silo(silo, args.ercot_dir, args.out)


if __name__ == "__main__":
    main()
