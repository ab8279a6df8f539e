"""The cost of secure aggregation: FedAvg rounds with and without it at 4, 8 and 16 clients.

Same task everywhere (knapsack, 50 items, the MLP of 64 hidden units, every client trains every
round, 1 local epoch on 40 samples). Measured side by side in one run:

- **round time on a real federation**: a warm local federation of N SuperNodes (``federation up``),
  the plain run then the secure one on the same federation; a round's time from the ServerApp's
  progress file (rounds 2..R-1: warm and train-only);
- **bytes on the wire**: on the inline engine (the same messages, no transport), every instruction
  and reply serialized as Flower sends it (the sum of its objects' deflated bytes), per round;
- **CPU**: on the inline engine, the CPU time spent in the ClientApp (all clients) and the rest of
  the process (the ServerApp: sampling, sums, unmasking), per round.

Run: ``python bench/secure_aggregation.py`` (about 10 minutes on 2 cores).
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._report import environment, markdown_table, write_section  # noqa: E402
from bench.round_latency import TASK as LATENCY_TASK  # noqa: E402
from bench.round_latency import RoundClock  # noqa: E402

SIZES = (4, 8, 16)
ROUNDS = 5
# round_latency's task at the knapsack's default size (50 items: updates of a few thousand entries)
TASK: dict[str, Any] = {**LATENCY_TASK, "num-items": 50, "num-rounds": ROUNDS}
RESULTS = Path(__file__).resolve().parents[1] / "docs" / "results" / "bench-secure-aggregation.json"


def parameters() -> int:
    """Entries of one update: the task's MLP."""
    from hetfed.config import validate
    from hetfed.problems.models import make_mlp
    from hetfed.problems.registry import get_problem

    cfg = validate(TASK)
    dims = get_problem("knapsack").model_dims
    assert dims is not None
    features, costs = dims(cfg)
    return int(sum(p.numel() for p in make_mlp(features, int(cfg["hidden"]), costs, seed=0).parameters()))


def middle(clock: RoundClock) -> list[float]:
    return [clock.ends[r] - clock.ends[r - 1] for r in range(2, ROUNDS)]


def inline_costs(results: Path, nodes: int, secure: bool) -> dict[str, float]:
    """Bytes and CPU seconds per round on the inline engine (rounds 1..R, evaluate excluded)."""
    from flwr.app import Context, Message
    from flwr.common.constant import SUPERLINK_NODE_ID
    from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects
    from flwr.supercore.task_identity import TaskIdentity

    from hetfed.client.app import app as client_app
    from hetfed.engines.inline import InlineGrid, node_configs
    from hetfed.engines.runner import prepare
    from hetfed.server.app import run_server

    sent = received = 0
    client_cpu = 0.0

    def wire(message: Message) -> int:
        return sum(len(o.deflate()) for o in get_all_nested_objects(message).values())

    def observe(msg: Message, reply: Message) -> None:
        nonlocal sent, received
        if msg.metadata.message_type not in ("query.info", "evaluate"):
            sent += wire(msg)
            received += wire(reply)

    def timed_app(message: Message, context: Context) -> Message:
        nonlocal client_cpu
        start = time.thread_time()
        try:
            return client_app(message, context)
        finally:
            if message.metadata.message_type not in ("query.info", "evaluate"):
                client_cpu += time.thread_time() - start

    name = f"inline-{nodes}-{'secure' if secure else 'plain'}-{time.monotonic_ns()}"
    cfg = prepare({**TASK, "run-name": name, "secure-aggregation": secure}, "inline", results)
    grid = InlineGrid(timed_app, node_configs(nodes), cfg)
    grid.observers.append(observe)
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, SUPERLINK_NODE_ID, 1
    start = time.process_time()
    run_server(grid, dict(cfg))
    total = time.process_time() - start
    return {
        "bytes-sent": sent / ROUNDS,
        "bytes-received": received / ROUNDS,
        "client-cpu": client_cpu / ROUNDS,
        "server-cpu": (total - client_cpu) / ROUNDS,  # includes the final evaluate's clients (small)
    }


def deployment_rounds(results: Path, nodes: int) -> dict[str, list[float]]:
    """Round times of the plain and the secure run on one warm federation of ``nodes`` SuperNodes."""
    from hetfed.engines.runner import APP_DIR, run_experiment
    from hetfed.federation import federation_down, federation_up

    out = {}
    with tempfile.TemporaryDirectory(prefix="hetfed-secagg-") as tmp:
        federation_up(Path(tmp), nodes, app_dir=APP_DIR)
        try:
            for secure in (False, True):
                name = f"deployment-{nodes}-{'secure' if secure else 'plain'}"
                overrides = {**TASK, "run-name": name, "secure-aggregation": secure}
                with RoundClock(results / name / "progress.json") as clock:
                    run_experiment(
                        "deployment",
                        overrides,
                        nodes=nodes,
                        results_dir=results,
                        echo=lambda _: None,
                        federation_dir=Path(tmp),
                    )
                out["secure" if secure else "plain"] = middle(clock)
        finally:
            federation_down(Path(tmp))
    return out


def main() -> None:
    import torch

    torch.set_num_threads(1)
    os.environ.setdefault("FLWR_DISABLE_UPDATE_CHECK", "1")
    load_before = os.getloadavg()[0]
    measured: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="hetfed-secagg-results-") as tmp:
        results = Path(tmp)
        for nodes in SIZES:
            entry: dict[str, Any] = {"inline": {}}
            inline_costs(results, nodes, True)  # warm-up: data generated and cached, code paths loaded
            for secure in (False, True):
                entry["inline"]["secure" if secure else "plain"] = inline_costs(results, nodes, secure)
            entry["deployment"] = deployment_rounds(results, nodes)
            measured[str(nodes)] = entry
            print(nodes, json.dumps(entry), flush=True)
    load = f"1-minute load average {load_before:.1f} before and {os.getloadavg()[0]:.1f} after the runs"
    RESULTS.write_text(
        json.dumps({"task": TASK, "load": load, "measured": measured, "environment": environment()}, indent=2)
        + "\n"
    )

    rows: list[list[Any]] = []
    for size, entry in measured.items():
        plain, secure = entry["deployment"]["plain"], entry["deployment"]["secure"]
        p, s = entry["inline"]["plain"], entry["inline"]["secure"]
        rows.append(
            [
                size,
                f"{statistics.mean(plain):.2f}",
                f"{statistics.mean(secure):.2f}",
                f"{statistics.mean(secure) / statistics.mean(plain):.1f}x",
                f"{(p['bytes-sent'] + p['bytes-received']) / 1e3:.0f}",
                f"{(s['bytes-sent'] + s['bytes-received']) / 1e3:.0f}",
                f"{p['client-cpu']:.3f} / {s['client-cpu']:.3f}",
                f"{p['server-cpu']:.3f} / {s['server-cpu']:.3f}",
            ]
        )
    header = [
        "clients",
        "round, plain (s)",
        "round, secure (s)",
        "secure / plain",
        "wire per round, plain (kB)",
        "wire per round, secure (kB)",
        "client CPU per round, plain / secure (s)",
        "server CPU per round, plain / secure (s)",
    ]
    body = f"""FedAvg on knapsack (50 items, MLP of 64 hidden units: {parameters():,} parameters per \
update), every client trains every round, {ROUNDS} rounds, measured by \
`bench/secure_aggregation.py` (all numbers in \
[`docs/results/bench-secure-aggregation.json`](results/bench-secure-aggregation.json)). **Round**: \
mean of rounds 2..{ROUNDS - 1} on a warm local federation of that many SuperNodes, the plain run and \
then the secure run (`secure-aggregation = true`, threshold a majority) on the same federation. \
**Wire**: every instruction and reply of a round as Flower serializes it (inline engine, the same \
messages). **CPU**: the ClientApp's CPU time summed over the clients, and the rest of the process \
(the ServerApp), per round, on the inline engine. {os.cpu_count()} cores, {load}; nothing else of \
ours was running.

{markdown_table(header, rows)}

A secure round runs five exchanges instead of one (keys, shares, train, consistency check, \
unmasking): on a deployment most of the extra time is the four more round trips, each paying the \
SuperNodes' polling. The wire grows with the pairwise shares (each client sends an encrypted share \
pair to each other client: O(n^2) in total) while the 64-bit masked words are as large as the \
update's float64 entries (two more words carry the weight and the clip bit). The client's extra CPU \
is the key agreements and the pair masks \
(one AES-CTR stream per other client over the update's length), the server's the unmasking \
(one Shamir reconstruction and one mask stream per survivor)."""
    write_section("secure_aggregation", "Secure aggregation: cost of a round", body)
    print(body)


if __name__ == "__main__":
    main()
