"""The SuperLink's HTTP middleware, gated by API path (hetfed-superlink) vs stock (flower-superlink).

Real local federations of N SuperNodes (warm ClientApp runtime), FedAvg on the knapsack MLP (one
local epoch, every client every round), one fresh federation per row and SuperLink, stock and
gated one after the other for each N. Per round: wall time of rounds 2..R-1 (the ServerApp's
progress file) and the CPU of the SuperLink's process group (the SuperLink and the ServerApp it
runs) over the whole run, divided by the rounds and by N.

Usage: ``python bench/superlink_asgi.py [--nodes 16 32] [--rounds 8]`` (about 10 minutes).
Numbers: docs/results/bench-superlink-asgi.json; table: docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench._report import add_note_argument, markdown_table, write_section  # noqa: E402
from bench.round_latency import RoundClock  # noqa: E402
from bench.warm_runtime import TASKS, group_cpu_seconds, run  # noqa: E402

RESULTS = ROOT / "docs" / "results" / "bench-superlink-asgi.json"
TASK: dict[str, Any] = TASKS["torch (FedAvg, knapsack MLP)"]
MODES = ("stock", "gated")


def measure(nodes: int, asgi: str, rounds: int, results: Path) -> dict[str, Any]:
    """One run on a fresh federation: middle-round wall times, SuperLink CPU per round."""
    from hetfed.federation import federation_down, federation_up

    with tempfile.TemporaryDirectory(prefix="hetfed-asgi-bench-") as tmp:
        info = federation_up(Path(tmp), nodes, app_dir=ROOT, superlink_asgi=asgi)
        try:
            log = (Path(tmp) / "superlink.log").read_text()
            gated = "HTTP middleware gated by API path" in log
            if gated != (asgi == "gated"):
                raise RuntimeError(f"the SuperLink did not run {asgi}: {log[-500:]}")
            name = f"{asgi}-{nodes}"
            before = group_cpu_seconds(info.pids[0])
            with RoundClock(results / name / "progress.json") as clock:
                run(Path(tmp), results, name, {**TASK, "num-rounds": rounds}, nodes)
            cpu = (group_cpu_seconds(info.pids[0]) - before) / rounds
        finally:
            federation_down(Path(tmp))
    walls = [clock.ends[r] - clock.ends[r - 1] for r in range(2, rounds)]
    return {"rounds-s": walls, "round-s": statistics.median(walls), "superlink-cpu-per-round-s": cpu}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[16, 32])
    parser.add_argument("--rounds", type=int, default=8)
    add_note_argument(parser)
    args = parser.parse_args()
    load = {"before": os.getloadavg()[0]}
    measured: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="hetfed-asgi-results-") as results:
        for nodes in args.nodes:
            for asgi in MODES:
                measured[f"{asgi}-{nodes}"] = entry = measure(nodes, asgi, args.rounds, Path(results))
                print(nodes, asgi, json.dumps(entry), flush=True)
    load["after"] = os.getloadavg()[0]
    RESULTS.write_text(
        json.dumps({"task": TASK, "rounds": args.rounds, "load": load, "measured": measured}, indent=2) + "\n"
    )
    rows = []
    for nodes in args.nodes:
        stock, gated = measured[f"stock-{nodes}"], measured[f"gated-{nodes}"]
        cpu_s, cpu_g = stock["superlink-cpu-per-round-s"], gated["superlink-cpu-per-round-s"]
        rows.append([
            nodes,
            stock["round-s"],
            gated["round-s"],
            f"{stock['round-s'] / gated['round-s']:.2f}x",
            cpu_s,
            cpu_g,
            f"{cpu_s / cpu_g:.2f}x",
            f"{1000 * cpu_s / nodes:.0f} / {1000 * cpu_g / nodes:.0f}",
        ])  # fmt: skip
    table = markdown_table(
        [
            "SuperNodes",
            "round, stock (s)",
            "round, gated (s)",
            "stock / gated",
            "SuperLink CPU per round, stock (s)",
            "gated (s)",
            "stock / gated",
            "ms per SuperNode per round, stock / gated",
        ],
        rows,
    )
    body = f"""\
Flower 1.42's SuperLink passes every request through eight `BaseHTTPMiddleware` layers; six act
only on the Control API's or the Fleet API's paths. `hetfed-superlink` (the default of every
federation hetfed starts; hetfed/runtime/superlink.py) enters those six only on their own paths;
stock is `flower-superlink`. FedAvg on the knapsack MLP ({TASK["num-items"]} items, one local epoch,
every client every round), warm ClientApp runtime, SuperLink state in memory, a fresh federation
per row and SuperLink (stock, then gated). **Round**: median wall time of rounds 2..{args.rounds - 1}
of {args.rounds} (the ServerApp's progress file). **CPU**: the SuperLink's process group (the
SuperLink and the ServerApp it runs) over the whole run, per round. Numbers:
[`docs/results/bench-superlink-asgi.json`](results/bench-superlink-asgi.json). Machine:
{os.cpu_count()} cores; 1-minute load average {load["before"]:.1f} before and {load["after"]:.1f}
after.

{table}
"""
    write_section("superlink_asgi", "SuperLink middleware: gated by API path vs stock", body)


if __name__ == "__main__":
    main()
