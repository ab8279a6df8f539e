"""The cost of secure aggregation: FedAvg rounds with and without it at 4, 8 and 16 clients, and
with signed keys (every silo with an identity and the roster: hetfed/silo_identity.py) or without.

Same task everywhere (knapsack, 50 items, the MLP of 64 hidden units, every client trains every
round, 1 local epoch on 40 samples). Measured side by side in one run:

- **round time on a real federation**: a warm local federation of N SuperNodes (``federation up``),
  the plain run then the signed one on the same federation, the semi-honest secure run on one
  without identities; a round's time from the ServerApp's progress file (rounds 2..R-1: warm and
  train-only);
- **bytes on the wire**: on the inline engine (the same messages, no transport), every instruction
  and reply serialized as Flower sends it (the sum of its objects' deflated bytes), per round;
- **CPU**: on the inline engine, the CPU time spent in the ClientApp (all clients) and the rest of
  the process (the ServerApp: sampling, sums, unmasking), per round.

Run: ``python bench/secure_aggregation.py`` (about 15 minutes on 2 cores); ``--report`` rewrites
docs/benchmarks.md's section from the last measurements (docs/results/bench-secure-aggregation.json).
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
MODES = ("plain", "secure", "signed")  # no secure aggregation; semi-honest keys; signed keys
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


def inline_costs(results: Path, nodes: int, mode: str) -> dict[str, float]:
    """Bytes and CPU seconds per round on the inline engine (rounds 1..R, evaluate excluded)."""
    from flwr.app import Context, Message
    from flwr.common.constant import SUPERLINK_NODE_ID
    from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects
    from flwr.supercore.task_identity import TaskIdentity

    from hetfed.client.app import app as client_app
    from hetfed.engines.inline import InlineGrid, node_configs
    from hetfed.engines.runner import prepare
    from hetfed.federation import install_identities
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

    name = f"inline-{nodes}-{mode}-{time.monotonic_ns()}"
    cfg = prepare({**TASK, "run-name": name, "secure-aggregation": mode != "plain"}, "inline", results)
    configs = node_configs(nodes)
    if mode == "signed":
        install_identities(configs, results / name / "identities")
    grid = InlineGrid(timed_app, configs, cfg)
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
    """Round times of each mode on warm federations of ``nodes`` SuperNodes: the plain and the
    signed run on one with identities and a roster (`federation up`'s default), the semi-honest
    secure run on one without."""
    from hetfed.engines.runner import APP_DIR, run_experiment
    from hetfed.federation import federation_down, federation_up

    out = {}
    for signed, modes in ((True, ("plain", "signed")), (False, ("secure",))):
        with tempfile.TemporaryDirectory(prefix="hetfed-secagg-") as tmp:
            federation_up(Path(tmp), nodes, app_dir=APP_DIR, signed_keys=signed)
            try:
                for mode in modes:
                    name = f"deployment-{nodes}-{mode}"
                    overrides = {**TASK, "run-name": name, "secure-aggregation": mode != "plain"}
                    with RoundClock(results / name / "progress.json") as clock:
                        run_experiment(
                            "deployment",
                            overrides,
                            nodes=nodes,
                            results_dir=results,
                            echo=lambda _: None,
                            federation_dir=Path(tmp),
                        )
                    out[mode] = middle(clock)
            finally:
                federation_down(Path(tmp))
    return out


def main() -> None:
    os.environ.setdefault("FLWR_DISABLE_UPDATE_CHECK", "1")
    load_before = os.getloadavg()[0]
    measured: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="hetfed-secagg-results-") as tmp:
        results = Path(tmp)
        for nodes in SIZES:
            entry: dict[str, Any] = {"inline": {}}
            inline_costs(results, nodes, "signed")  # warm-up: data generated and cached, code paths loaded
            for mode in MODES:
                entry["inline"][mode] = inline_costs(results, nodes, mode)
            entry["deployment"] = deployment_rounds(results, nodes)
            measured[str(nodes)] = entry
            print(nodes, json.dumps(entry), flush=True)
    load = f"1-minute load average {load_before:.1f} before and {os.getloadavg()[0]:.1f} after the runs"
    RESULTS.write_text(
        json.dumps({"task": TASK, "load": load, "measured": measured, "environment": environment()}, indent=2)
        + "\n"
    )
    report(measured, load)


def report(measured: dict[str, Any], load: str) -> None:
    """docs/benchmarks.md's section from the measurements (``--report``: from RESULTS, not re-run)."""
    rows: list[list[Any]] = []
    for size, entry in measured.items():
        rounds = {m: statistics.mean(entry["deployment"][m]) for m in MODES}
        costs = entry["inline"]
        rows.append(
            [
                size,
                " / ".join(f"{rounds[m]:.2f}" for m in MODES),
                f"{rounds['secure'] / rounds['plain']:.1f}x / {rounds['signed'] / rounds['plain']:.1f}x",
                " / ".join(
                    f"{(costs[m]['bytes-sent'] + costs[m]['bytes-received']) / 1e3:.0f}" for m in MODES
                ),
                " / ".join(f"{costs[m]['client-cpu']:.3f}" for m in MODES),
                " / ".join(f"{costs[m]['server-cpu']:.3f}" for m in MODES),
            ]
        )
    header = [
        "clients",
        "round, plain / secure / signed (s)",
        "secure / plain, signed / plain",
        "wire per round, plain / secure / signed (kB)",
        "client CPU per round, plain / secure / signed (s)",
        "server CPU per round, plain / secure / signed (s)",
    ]
    body = f"""FedAvg on knapsack (50 items, MLP of 64 hidden units: {parameters():,} parameters per \
update), every client trains every round, {ROUNDS} rounds, measured by \
`bench/secure_aggregation.py` (all numbers in \
[`docs/results/bench-secure-aggregation.json`](results/bench-secure-aggregation.json)). **Round**: \
mean of rounds 2..{ROUNDS - 1} on a warm local federation of that many SuperNodes: the plain run and \
then the **signed** run (`secure-aggregation = true`, threshold a majority, every silo with an \
identity and the roster: keys signed and verified) on one federation, the **secure** run (the same \
without identities: keys not authenticated) on another. \
**Wire**: every instruction and reply of a round as Flower serializes it (inline engine, the same \
messages). **CPU**: the ClientApp's CPU time summed over the clients, and the rest of the process \
(the ServerApp), per round, on the inline engine. {os.cpu_count()} cores, {load} (above the core \
count, other jobs shared the machine).

{markdown_table(header, rows)}

A secure round runs five exchanges instead of one (keys, shares, train, consistency check, \
unmasking): on a deployment most of the extra time is the four more round trips, each paying the \
SuperNodes' polling. The wire grows with the pairwise shares (each client sends an encrypted share \
pair to each other client: O(n^2) in total) while the 64-bit masked words are as large as the \
update's float64 entries (two more words carry the weight and the clip bit). The client's extra CPU \
is the key agreements and the pair masks \
(one AES-CTR stream per other client over the update's length), the server's the unmasking \
(one Shamir reconstruction and one mask stream per survivor). Signed keys add an Ed25519 signature \
per client to the keys reply (64 bytes), all of them to the shares query (64 n bytes per client), \
and one signature and n verifications per client and round. The signed and the semi-honest secure \
runs ran on two federations one after the other: the difference of their round times is the load \
of the shared machine, not the signatures, whose CPU the inline columns show."""
    write_section("secure_aggregation", "Secure aggregation: cost of a round", body)
    print(body)


if __name__ == "__main__":
    import torch

    torch.set_num_threads(1)  # measured so; the report's machine line says it
    if sys.argv[1:] == ["--report"]:
        saved = json.loads(RESULTS.read_text())
        report(saved["measured"], saved["load"])
    else:
        main()
