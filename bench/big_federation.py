"""A big local federation: ``federation up --nodes N`` (default 64) and a NumPy run on it.

Starts the SuperLink and N warm SuperNodes on this machine as ``hetfed federation up --nodes N``
does (SuperNodes a few at a time, a timeout proportional to N), runs PF-LSA on Garnet (NumPy
only) for R rounds with every client every round, and records: seconds until all N were online,
the run's outcome, wall time of rounds 2..R-1, the machine's memory in use at its peak (sampled
every second from /proc/meminfo) and the federation's summed RSS after the run.

Usage: ``python bench/big_federation.py [--nodes 64] [--rounds 6] [--note TEXT]`` (5-10 minutes).
Numbers: docs/results/bench-big-federation.json; table: docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench._report import add_note_argument, environment, markdown_table, write_section  # noqa: E402
from bench.round_latency import RoundClock  # noqa: E402
from bench.warm_runtime import group_processes, run  # noqa: E402

RESULTS = ROOT / "docs" / "results" / "bench-big-federation.json"
TASK: dict[str, Any] = {"strategy": "pflsa", "problem": "garnet", "seed": 1}


def meminfo_mb(key: str) -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) / 1024
    raise KeyError(key)


def group_rss_mb(groups: set[int]) -> float:
    """Summed RSS of every live process in these process groups."""
    total = 0.0
    for proc, _ in group_processes(groups):
        try:
            status = (proc / "status").read_text().splitlines()
        except OSError:  # gone meanwhile
            continue
        total += sum(int(line.split()[1]) / 1024 for line in status if line.startswith("VmRSS:"))
    return total


def measure(nodes: int, rounds: int) -> dict[str, Any]:
    from hetfed.federation import federation_down, federation_up

    used_before = meminfo_mb("MemTotal") - meminfo_mb("MemAvailable")
    peak = [used_before]
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(1.0):
            peak.append(meminfo_mb("MemTotal") - meminfo_mb("MemAvailable"))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    out: dict[str, Any] = {"nodes": nodes, "rounds": rounds}
    with tempfile.TemporaryDirectory(prefix="hetfed-big-") as tmp, tempfile.TemporaryDirectory() as results:
        started = time.monotonic()
        try:
            info = federation_up(Path(tmp) / "fed", nodes, app_dir=ROOT)
        except Exception as exc:  # noqa: BLE001 - the outcome is the measurement
            out["outcome"] = f"federation up failed: {' '.join(str(exc).split())[:300]}"
            stop.set()
            return out
        out["up-s"] = time.monotonic() - started
        try:
            with RoundClock(Path(results) / "big" / "progress.json") as clock:
                run(Path(tmp) / "fed", Path(results), "big", {**TASK, "num-rounds": rounds}, nodes)
            summary = json.loads((Path(results) / "big" / "summary.json").read_text())
            out["outcome"] = (
                f"{summary.get('status', '?')}, {len(summary.get('clients', {}))} clients reported"
            )
            out["rounds-s"] = [clock.ends[r] - clock.ends[r - 1] for r in range(2, rounds) if r in clock.ends]
            out["federation-rss-mb"] = group_rss_mb(set(info.pids))
        except Exception as exc:  # noqa: BLE001
            out["outcome"] = f"run failed: {' '.join(str(exc).split())[:300]}"
        finally:
            federation_down(Path(tmp) / "fed")
            stop.set()
    out["memory-used-mb"] = {"before": used_before, "peak": max(peak)}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=6)
    add_note_argument(parser)
    args = parser.parse_args()
    load = {"before": os.getloadavg()[0]}
    entry = measure(args.nodes, args.rounds)
    load["after"] = os.getloadavg()[0]
    print(json.dumps(entry), flush=True)
    RESULTS.write_text(
        json.dumps(
            {"task": TASK, "load": load, "note": args.note, **entry, "environment": environment()}, indent=2
        )
        + "\n"
    )
    mem = entry.get("memory-used-mb", {})
    walls = entry.get("rounds-s") or []
    row = [
        entry["nodes"],
        f"{entry['up-s']:.0f}" if "up-s" in entry else "-",
        entry["outcome"],
        f"{statistics.median(walls):.2f}" if walls else "-",
        f"{entry['federation-rss-mb'] / entry['nodes']:.0f}" if "federation-rss-mb" in entry else "-",
        f"{mem['peak'] - mem['before']:.0f}" if mem else "-",
    ]
    table = markdown_table(
        [
            "SuperNodes",
            "online after (s)",
            "run",
            "round, median of 2..R-1 (s)",
            "RSS per SuperNode + worker (MB)",
            "machine memory added at peak (MB)",
        ],
        [row],
    )
    body = f"""\
`hetfed federation up --nodes {args.nodes}` (warm SuperNodes, hetfed-superlink, state in memory) and
a run of PF-LSA on Garnet (NumPy only, every client every round, {args.rounds} rounds) on it, as
`hetfed run --engine deployment` starts it. **Online after**: from the call to all SuperNodes
online. **RSS**: the federation's processes (SuperLink, its ServerApp, SuperNodes, workers) summed
after the run, per SuperNode. **Memory added**: the machine's memory in use (MemTotal -
MemAvailable, sampled every second) at its peak minus before. Machine: {os.cpu_count()} cores,
{meminfo_mb("MemTotal") / 1024:.0f} GiB; 1-minute load average {load["before"]:.1f} before and
{load["after"]:.1f} after; {args.note}. Numbers:
[`docs/results/bench-big-federation.json`](results/bench-big-federation.json).

{table}
"""
    write_section("big_federation", f"A big local federation: {args.nodes} SuperNodes", body)


if __name__ == "__main__":
    main()
