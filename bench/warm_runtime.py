"""Warm ClientApp runtime vs stock Flower on real local federations, side by side in one run.

* Exchange latency: one round = one exchange (every client every round) at 2, 4 and 8
  SuperNodes, for a no-op-sized task (PF-LSA on Garnet: NumPy only, microseconds of work)
  and a torch task (FedAvg, the knapsack MLP, one local epoch). Rounds 2..R-1 of an
  R-round run, timed by the ServerApp's own progress file; warm and stock interleaved.
* The 20-silo knapsack FedRSPO+ run of ``bench/knapsack_run.py`` (10 + 10 rounds, RSPO+).
* Idle CPU of one SuperNode (its process group: SuperNode + warm worker, or SuperNode +
  SuperExec), 20 s with no run, and 20 s right after a run's last message.
* Where a warm exchange's time goes: the worker's own per-task timing lines.

Usage: ``python bench/warm_runtime.py [--nodes 2 4 8] [--skip-knapsack]`` (about 35 minutes).
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench._report import add_note_argument, markdown_table, write_section  # noqa: E402
from bench.round_latency import FEDAVG_KNAPSACK, RoundClock  # noqa: E402

ROUNDS = 6
TASKS: dict[str, dict[str, Any]] = {
    "no-op-sized (PF-LSA, Garnet, NumPy)": {
        "strategy": "pflsa",
        "problem": "garnet",
        "lsa-report-every": 1,
        "seed": 1,
    },
    "torch (FedAvg, knapsack MLP)": FEDAVG_KNAPSACK,
}
KNAPSACK = {"strategy": "fedrspo", "loss": "rspo+", "seed": 42, "checkpoint-every": 0}
RUNTIMES = ("stock", "warm")
TASK_LINE = re.compile(r"task \d+ input ([\d.]+) s, ClientApp ([\d.]+) s, reply ([\d.]+) s")


def group_processes(pgids: set[int]) -> Iterator[tuple[Path, list[str]]]:
    """``(/proc/<pid>, stat fields after "(comm)")`` of every live process in these process groups
    (fields: state, ppid, pgrp, ..., utime (12), stime (13))."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) in pgids:
            yield stat.parent, fields


def group_cpu_seconds(pgid: int) -> float:
    """User + system CPU seconds of every live process in process group ``pgid``."""
    ticks = sum(int(fields[11]) + int(fields[12]) for _, fields in group_processes({pgid}))
    return ticks / os.sysconf("SC_CLK_TCK")


def idle_cpu(pgid: int, seconds: float = 20.0) -> float:
    """Percent of one core used by the group over ``seconds`` of wall time."""
    before, start = group_cpu_seconds(pgid), time.monotonic()
    time.sleep(seconds)
    return 100 * (group_cpu_seconds(pgid) - before) / (time.monotonic() - start)


def federation(root: Path, nodes: int, runtime: str, state: str = "memory"):  # noqa: ANN201
    from hetfed.federation import federation_up

    return federation_up(root, nodes, app_dir=ROOT, runtime=runtime, superlink_state=state)


def run(fed_dir: Path, results: Path, name: str, overrides: dict[str, Any], nodes: int) -> float:
    from hetfed.engines.runner import run_experiment

    start = time.perf_counter()
    run_experiment(
        "deployment",
        {**overrides, "run-name": name, "round-timeout": 900.0},
        nodes=nodes,
        results_dir=results,
        federation_dir=fed_dir,
        timeout=7200,
        echo=lambda _: None,
    )
    return time.perf_counter() - start


def exchanges(results: Path, runtime: str, task: str, nodes: int, state: str = "memory") -> dict[str, Any]:
    """Middle-round latencies of one task on a fresh federation, the SuperLink's CPU per round;
    idle CPU and task lines when asked."""
    from hetfed.federation import federation_down

    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="hetfed-warm-bench-") as tmp:
        info = federation(Path(tmp), nodes, runtime, state)
        try:
            supernode_group = info.pids[1]  # pids: SuperLink, then SuperNodes in order
            if nodes == 2 and task.startswith("torch"):
                time.sleep(5)  # let start-up settle
                out["idle"] = idle_cpu(supernode_group)
                out["superlink idle"] = idle_cpu(info.pids[0], 10)
            name = f"{runtime}-{state}-{nodes}-{task.split()[0]}"
            overrides = {**TASKS[task], "num-rounds": ROUNDS}
            link_cpu = group_cpu_seconds(info.pids[0])
            with RoundClock(results / name / "progress.json") as clock:
                run(Path(tmp), results, name, overrides, nodes)
            out["rounds"] = [clock.ends[r] - clock.ends[r - 1] for r in range(2, ROUNDS)]
            out["superlink cpu"] = (group_cpu_seconds(info.pids[0]) - link_cpu) / ROUNDS
            if "idle" in out:
                out["after run"] = idle_cpu(supernode_group)
            steps = [
                tuple(map(float, m.groups()))
                for log in Path(tmp).glob("supernode-*.log")
                for m in TASK_LINE.finditer(log.read_text())
            ]
            if steps:
                out["steps"] = [statistics.median(s[i] for s in steps) for i in range(3)]
        finally:
            federation_down(Path(tmp))
    return out


def knapsack(results: Path, runtime: str, clients: int = 20) -> float | str:
    """Wall time of the 20-silo run, or why it failed (a failed run is a result too)."""
    from hetfed.engines.runner import RunFailed
    from hetfed.federation import federation_down

    with tempfile.TemporaryDirectory(prefix="hetfed-warm-knapsack-") as tmp:
        federation(Path(tmp), clients, runtime)
        try:
            return run(Path(tmp), results, f"knapsack-{runtime}", KNAPSACK, clients)
        except RunFailed as exc:
            return f"failed ({str(exc).splitlines()[0]})"
        finally:
            federation_down(Path(tmp))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--skip-knapsack", action="store_true")
    add_note_argument(parser)
    args = parser.parse_args()
    os.environ.setdefault("FLWR_DISABLE_UPDATE_CHECK", "1")
    os.environ.setdefault("FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION", "1")
    load_before, started = os.getloadavg(), time.time()
    measured: dict[tuple[str, int, str], dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="hetfed-warm-bench-results-") as tmp:
        results = Path(tmp)
        for nodes in args.nodes:
            for task in TASKS:
                for runtime in RUNTIMES:  # side by side: the same machine state for both
                    measured[(task, nodes, runtime)] = m = exchanges(results, runtime, task, nodes)
                    print(task, nodes, runtime, {k: v for k, v in m.items()}, flush=True)
        # The SuperLink's state in a file (what `federation superlink` uses across machines) against
        # memory (Flower's default, used above), warm runtime, the torch task.
        torch_task = next(t for t in TASKS if t.startswith("torch"))
        state_nodes = 4 if 4 in args.nodes else args.nodes[0]
        file_state = exchanges(results, "warm", torch_task, state_nodes, state="file")
        print("file state", state_nodes, file_state, flush=True)
        whole = {} if args.skip_knapsack else {rt: knapsack(results, rt) for rt in RUNTIMES}
        print("knapsack", whole, flush=True)
    load_after = os.getloadavg()

    rows = []
    for task in TASKS:
        for nodes in args.nodes:
            stock, warm = (statistics.median(measured[(task, nodes, rt)]["rounds"]) for rt in RUNTIMES)
            spread = ", ".join(f"{r:.2f}" for r in measured[(task, nodes, "warm")]["rounds"])
            link = measured[(task, nodes, "warm")]["superlink cpu"]
            rows.append([task, nodes, stock, warm, spread, f"{stock / warm:.1f}x", link])
    table = markdown_table(
        [
            "task",
            "SuperNodes",
            "stock (s, median)",
            "warm (s, median)",
            "warm rounds (s)",
            "stock / warm",
            "SuperLink CPU per round, warm (s)",
        ],
        rows,
    )
    memory_state = measured[(torch_task, state_nodes, "warm")]
    state_table = markdown_table(
        ["SuperLink state", "round (s, median)", "rounds (s)", "SuperLink CPU per round (s)"],
        [
            [
                label,
                statistics.median(m["rounds"]),
                ", ".join(f"{r:.2f}" for r in m["rounds"]),
                m["superlink cpu"],
            ]
            for label, m in (
                ("memory (Flower's default)", memory_state),
                ("file (SQLite state.db)", file_state),
            )
        ],
    )
    idle_rows = [
        [
            rt,
            f"{measured[(torch_task, 2, rt)]['idle']:.2f}%",
            f"{measured[(torch_task, 2, rt)]['after run']:.2f}%",
            f"{measured[(torch_task, 2, rt)]['superlink idle']:.2f}%",
        ]
        for rt in RUNTIMES
        if (torch_task, 2, rt) in measured
    ]
    idle_table = markdown_table(
        ["runtime", "SuperNode group, idle 20 s", "... the 20 s after a run", "SuperLink, idle 10 s"],
        idle_rows,
    )
    step_rows = [
        [task, nodes, statistics.median(m["rounds"]), *m["steps"]]
        for (task, nodes, rt), m in measured.items()
        if rt == "warm" and "steps" in m
    ]
    step_table = markdown_table(
        ["task", "SuperNodes", "exchange (s)", "worker: input (s)", "ClientApp (s)", "reply + status (s)"],
        step_rows,
    )
    knapsack_keys = ", ".join(f"{k}={v}" for k, v in KNAPSACK.items())

    def took(value: float | str) -> str:
        return f"{value:.0f} s" if isinstance(value, float) else value

    stock, warm = whole.get("stock"), whole.get("warm")  # a float each, unless the run failed or was skipped
    ratio = f" ({stock / warm:.1f}x)" if isinstance(stock, float) and isinstance(warm, float) else ""
    knapsack_text = (
        ""
        if not whole
        else (
            f"\n\n**The 20-silo knapsack FedRSPO+ run** ({knapsack_keys}, "
            f"10 warm-start + 10 personalization rounds, 20 SuperNodes on this machine): stock "
            f"{took(whole['stock'])}, warm {took(whole['warm'])}{ratio}."
        )
    )
    body = f"""Real local federations (a SuperLink and N SuperNodes on 127.0.0.1, each its own process \
group), one per row and runtime, started fresh, stock and warm run one after the other for each row. \
One round is one exchange (every client every round). Rounds 2..{ROUNDS - 1} of a {ROUNDS}-round run, \
timed by the ServerApp's progress file. Machine: {os.cpu_count()} cores; 1-minute load average \
{load_before[0]:.1f} before and {load_after[0]:.1f} after; {args.note}; the whole benchmark took \
{(time.time() - started) / 60:.0f} min.

{table}{knapsack_text}

**Where the SuperLink keeps its state** (warm runtime, torch task, {state_nodes} SuperNodes; every \
row above uses memory, Flower's own default and `hetfed federation up`'s; `hetfed federation \
superlink` across machines defaults to file, so that a restarted SuperLink keeps the registered \
silo keys): with state.db the SuperLink spends its CPU in SQLAlchemy queries (py-spy: session \
execution, object push/pull, run-status checks, task-token cleanup) and is the bottleneck of the \
exchange.

{state_table}

**Idle CPU** (percent of one core; SuperNode group = the SuperNode and its warm worker, or the \
SuperNode and its SuperExec; 2-SuperNode federation, torch task):

{idle_table}

**Where a warm exchange's time goes**: each warm worker logs, per task, the time to pull its \
input (task input, message and its objects from the SuperNode), the ClientApp call, and pushing \
the reply and the task output (medians over all tasks of the run):

{step_table}

The rest of an exchange is Flower's HTTP request chain between the ServerApp, the SuperLink and \
the SuperNode (the ServerApp pushing messages and their objects, the SuperNode's pull of message \
and objects from the SuperLink, its push of the reply, the ServerApp's 0.1 s reply pull) and the \
SuperNode's idle pull interval: 0.1 s right after a message, growing x1.5 per empty pull back to \
Flower's 3 s (hetfed/runtime/waits.py). Every request costs the SuperLink CPU (FastAPI and its \
middlewares), and the SuperLink is the busiest process of an exchange (last column of the first \
table); each array of a message is two objects and so two requests per hop, which is why hetfed \
packs a message's arrays into one per dtype (hetfed/records.py: the knapsack MLP's 4 parameters \
travel as 1 array). With more SuperNodes than cores these steps queue for a core, which is why \
the latency grows with N on this 2-core machine."""
    print(body)
    write_section("warm_runtime", "Warm ClientApp runtime vs stock Flower", body)


if __name__ == "__main__":
    main()
