"""Per-silo memory (RSS) of a SuperNode, idle and in a round, for each problem family.

For each family (LSA: PF-LSA on Garnet, NumPy only; constrained: softmax switching on the
quadratic task, torch; decision: FedAvg on the knapsack MLP, torch, with the same objective for
every client and with heterogeneous ones, whose data needs SciPy) and runtime (warm, stock),
on a fresh 2-SuperNode federation on 127.0.0.1, silo 0's processes are read from /proc:

* idle: 5 s after the federation is up, no run yet;
* in the rounds: sampled every 0.1 s while a 4-round run goes, the largest value of each;
* after: 2 s after the run finished.

A silo is its SuperNode process and, warm, its worker (which reports its own RSS in its task
lines; the table shows its last report next to /proc's), or, stock, Flower's SuperExec and the
``flwr-clientapp`` process it starts per message. Then what the worker's floor is made of:
the RSS of fresh interpreters importing what a worker imports, one layer at a time.

Usage: ``python bench/silo_memory.py`` (about 7 minutes).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench._report import add_note_argument, markdown_table, write_section  # noqa: E402
from bench.warm_runtime import TASKS  # noqa: E402
from hetfed.runtime.worker import proc_memory  # noqa: E402

ROUNDS = 4
FAMILIES: dict[str, dict[str, Any]] = {
    "lsa (PF-LSA, Garnet; NumPy)": {"strategy": "pflsa", "problem": "garnet", "seed": 1},
    "constrained (softmax switching, quadratic; torch)": {
        "strategy": "softmax-switching",
        "problem": "quadratic",
        "seed": 1,
    },
    "decision (FedAvg, knapsack MLP; torch)": TASKS["torch (FedAvg, knapsack MLP)"],
    # The same task with heterogeneous objectives: its data's rotations expm(eta_o G_j) need SciPy.
    "decision, eta_o = 0.5 (FedAvg, knapsack MLP; torch + SciPy)": {
        **TASKS["torch (FedAvg, knapsack MLP)"],
        "eta-o": 0.5,
    },
}
TARGETS = {"NumPy": 120, "torch": 300}  # MB, a warm worker's (issue 33, item 6)
RUNTIMES = ("warm", "stock")
ROLES = ("SuperNode", "worker", "SuperExec", "ClientApp")
REPORTED = re.compile(r"reply [\d.]+ s; RSS (\d+) MB \(peak (\d+) MB\)")
# What a warm worker imports, one layer at a time (each line on top of the ones before it).
LAYERS = [
    ("Python + NumPy", "import numpy"),
    ("+ Flower's ClientApp stack (the worker's imports)", "import hetfed.runtime.worker"),
    ("+ hetfed's ClientApp (client classes imported per message)", "import hetfed.client.app"),
    ("+ torch", "import torch"),
    ("+ SciPy's linear algebra (a knapsack with eta_o > 0: its data's rotations)", "import scipy.linalg"),
    ("+ torch._dynamo (what a torch.optim step imports; hetfed's clients do not)", "import torch._dynamo"),
]


def silo_processes(pgid: int) -> dict[int, str]:
    """pid -> role of every process in the SuperNode's process group."""
    roles = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            if int(stat.read_text().rsplit(")", 1)[1].split()[2]) != pgid:
                continue
            cmd = (stat.parent / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except (OSError, ValueError):
            continue
        pid = int(stat.parent.name)
        roles[pid] = (
            "SuperNode"
            if pid == pgid
            else "worker"
            if "hetfed.runtime.worker" in cmd
            else "SuperExec"
            if "flower-superexec" in cmd
            else "ClientApp"
        )
    return roles


def snapshot(pgid: int) -> dict[str, float]:
    """RSS (MB) per role and of the whole silo, now."""
    out = dict.fromkeys(ROLES, 0.0)
    for pid, role in silo_processes(pgid).items():
        out[role] += proc_memory(pid).get("VmRSS", 0.0)
    out["silo"] = sum(out[r] for r in ROLES)
    return out


class Sampler(threading.Thread):
    """The largest RSS per role (and of the silo) seen while it runs, every 0.1 s."""

    def __init__(self, pgid: int) -> None:
        super().__init__(daemon=True)
        self.pgid, self.peak, self.done = pgid, dict.fromkeys((*ROLES, "silo"), 0.0), threading.Event()

    def run(self) -> None:
        while not self.done.wait(0.1):
            for key, value in snapshot(self.pgid).items():
                self.peak[key] = max(self.peak[key], value)


def measure(family: str, runtime: str, results: Path) -> dict[str, Any]:
    from hetfed.engines.runner import run_experiment
    from hetfed.federation import federation_down, federation_up

    with tempfile.TemporaryDirectory(prefix="hetfed-silo-memory-") as tmp:
        info = federation_up(Path(tmp), 2, app_dir=ROOT, runtime=runtime)
        try:
            pgid = info.pids[1]  # SuperNode 0's process group (pids: SuperLink, then SuperNodes)
            time.sleep(5)
            out: dict[str, Any] = {"idle": snapshot(pgid)}
            sampler = Sampler(pgid)
            sampler.start()
            run_experiment(
                "deployment",
                {**FAMILIES[family], "num-rounds": ROUNDS, "run-name": f"{runtime}-{family.split()[0]}"},
                nodes=2,
                results_dir=results,
                federation_dir=Path(tmp),
                timeout=1800,
                echo=lambda _: None,
            )
            sampler.done.set()
            sampler.join()
            out["rounds"] = sampler.peak
            time.sleep(2)
            out["after"] = snapshot(pgid)
            workers = [pid for pid, role in silo_processes(pgid).items() if role == "worker"]
            if workers:
                out["torch"] = "libtorch" in Path(f"/proc/{workers[0]}/maps").read_text()
                out["proc"] = proc_memory(workers[0])
                out["reported"] = REPORTED.findall((Path(tmp) / "supernode-0.log").read_text())[-1]
        finally:
            federation_down(Path(tmp))
    return out


def layer_rss() -> list[tuple[str, float]]:
    """RSS (MB) of a fresh interpreter after each layer of imports."""
    rows, code = [], []
    for label, line in LAYERS:
        code.append(line)
        rss = "print(open('/proc/self/status').read().split('VmRSS:')[1].split()[0])"  # kB; imports nothing
        script = "\n".join([*code, rss])
        done = subprocess.run(
            [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, check=True
        )
        rows.append((label, int(done.stdout.split()[-1]) / 1024))
    return rows


def mb(value: float) -> str:
    return f"{value:.0f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_note_argument(parser)
    args = parser.parse_args()
    os.environ.setdefault("FLWR_DISABLE_UPDATE_CHECK", "1")
    os.environ.setdefault("FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION", "1")
    load_before, started = os.getloadavg(), time.time()
    measured: dict[tuple[str, str], dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="hetfed-silo-memory-results-") as tmp:
        for family in FAMILIES:
            for runtime in RUNTIMES:  # side by side: the same machine state for both
                measured[(family, runtime)] = m = measure(family, runtime, Path(tmp))
                print(family, runtime, m, flush=True)
    layers = layer_rss()
    load_after = os.getloadavg()

    warm_rows, misses = [], {}
    for family in FAMILIES:
        m = measured[(family, "warm")]
        target = TARGETS["NumPy" if "NumPy" in family else "torch"]
        worst = m["rounds"]["worker"]
        misses[family] = worst - target
        verdict = "met" if worst <= target else f"over by {worst - target:.0f} MB"
        rss, peak = m["reported"]
        warm_rows.append(
            [
                family,
                mb(m["idle"]["worker"]),
                mb(m["rounds"]["worker"]),
                mb(m["after"]["worker"]),
                f"{rss} / {peak}",
                f"{m['proc']['VmRSS']:.0f} / {m['proc']['VmHWM']:.0f}",
                "yes" if m["torch"] else "no",
                f"{target} MB: {verdict}",
            ]
        )
    warm_table = markdown_table(
        [
            "problem family",
            "worker idle",
            "worker in the rounds (max)",
            "worker after",
            "worker's own last report: RSS / peak",
            "/proc after: RSS / peak",
            "libtorch mapped",
            "target",
        ],
        warm_rows,
    )
    silo_rows = []
    for family in FAMILIES:
        for runtime in RUNTIMES:
            m = measured[(family, runtime)]
            silo_rows.append(
                [
                    family,
                    runtime,
                    mb(m["idle"]["SuperNode"]),
                    mb(m["rounds"]["SuperNode"]),
                    mb(m["idle"]["silo"]),
                    mb(m["rounds"]["silo"]),
                    mb(m["after"]["silo"]),
                ]
            )
    silo_table = markdown_table(
        [
            "problem family",
            "runtime",
            "SuperNode idle",
            "SuperNode in the rounds (max)",
            "silo idle",
            "silo in the rounds (max)",
            "silo after",
        ],
        silo_rows,
    )
    layer_table = markdown_table(
        ["a fresh interpreter after", "RSS (MB)", "added (MB)"],
        [
            [label, mb(rss), mb(rss - (layers[i - 1][1] if i else 0.0))]
            for i, (label, rss) in enumerate(layers)
        ],
    )
    over = [(f, m) for f, m in misses.items() if m > 0]
    misses_text = (
        "Over its target: " + "; ".join(f"{f.split(' (')[0]} by {m:.0f} MB" for f, m in over) + ". "
        if over
        else "Every family is within its target. "
    )
    from flwr.cli.build import build_fab_from_disk  # what every task carries to the worker

    fab_mb = len(build_fab_from_disk(ROOT)) / 2**20
    body = f"""Silo 0 of a fresh 2-SuperNode federation on 127.0.0.1 per row, {ROUNDS}-round runs; RSS in MB \
from /proc (VmRSS; "in the rounds" is the largest of samples every 0.1 s during the run). Machine: \
{os.cpu_count()} cores; 1-minute load average {load_before[0]:.1f} before and {load_after[0]:.1f} after; \
{args.note}; the whole benchmark took {(time.time() - started) / 60:.0f} min.

**The warm worker** (targets of issue 33 item 6: at most {TARGETS["NumPy"]} MB for a NumPy-only task, \
{TARGETS["torch"]} MB for a torch task, judged on the largest sample in the rounds). Its own report is \
the last task line of its log (``RSS n MB (peak m MB)``, read at the end of the task, before its input \
is freed):

{warm_table}

**The whole silo** (SuperNode process + warm worker; stock: SuperNode + Flower's SuperExec + the \
`flwr-clientapp` process of the message at hand, which lives only while it runs):

{silo_table}

**What a worker's floor is made of** (fresh interpreters, each row importing what the rows above \
import too):

{layer_table}

A warm worker imports only what its run's problem needs: hetfed's ClientApp imports a client class, \
its problem and torch or SciPy on a run's first message, so an LSA run's worker never maps libtorch. \
A worker that served a torch run restarts (same pid, fresh interpreter) on the first message of the \
next run, so a NumPy run after a torch run holds no torch either; until that message it keeps the \
torch run's memory. {misses_text}Before any task, a worker holds Flower's own ClientApp stack (the \
`flwr` package imports gRPC, httpx and cryptography; each `flwr-clientapp` process of the stock \
runtime imports them too, and FastAPI with pydantic and requests as well, which the worker loads only \
if something uses them: hetfed/runtime/deferred_imports.py), and a torch task adds torch itself \
and, only for a knapsack whose clients' objectives differ (eta_o > 0), SciPy's linear algebra for \
the rotations expm(eta_o G_j) (SciPy and the solvers are imported on first use: polytopes with \
exact oracles, such as the knapsack's, never load them); hetfed's clients never import `torch._dynamo`, \
which every `torch.optim` step imports (with SymPy) although nothing is compiled: the decision \
clients step with hetfed's own Adam (client/adam.py, bit for bit with torch's), the constrained tasks \
take their own steps. The rest is the run: its data and models, and each task's input, which \
carries the app's FAB ({fab_mb:.1f} MB; the worker drops it once that build is loaded)."""
    print(body)
    write_section("silo_memory", "Per-silo memory by problem family", body)


if __name__ == "__main__":
    main()
