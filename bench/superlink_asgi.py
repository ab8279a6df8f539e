"""The SuperLink's HTTP middleware: hetfed-superlink (gated by API path, Fleet and Runtime calls on
a buffered fast path) vs stock (flower-superlink).

Per request: one signed SuperNode (a P-384 key as Flower makes them, a P-256 key as hetfed's warm
SuperNodes and keygen make them) sends N empty pull-messages to a fresh SuperLink; the SuperLink
process's CPU per request. Per round: real local federations of N SuperNodes (warm ClientApp
runtime), FedAvg on the knapsack MLP (one local epoch, every client every round), one fresh
federation per row and SuperLink, stock and gated one after the other for each N. Per round: wall
time of rounds 2..R-1 (the ServerApp's progress file) and the CPU of the SuperLink's process group
(the SuperLink and the ServerApp it runs) over the whole run, divided by the rounds and by N.

Usage: ``python bench/superlink_asgi.py [--nodes 16 32] [--rounds 8] [--requests 2000]`` (about 10
minutes).
Numbers: docs/results/bench-superlink-asgi.json; table: docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import base64
import datetime as dt
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench._report import add_note_argument, environment, markdown_table, write_section  # noqa: E402
from bench.round_latency import RoundClock  # noqa: E402
from bench.superlink_capacity import cpu_seconds  # noqa: E402
from bench.warm_runtime import TASKS, group_cpu_seconds, run  # noqa: E402

RESULTS = ROOT / "docs" / "results" / "bench-superlink-asgi.json"
TASK: dict[str, Any] = TASKS["torch (FedAvg, knapsack MLP)"]
MODES = ("stock", "gated")
CURVES = ("secp384r1", "secp256r1")


def per_request(asgi: str, curve: str, requests: int) -> float:
    """SuperLink CPU (ms) per signed empty pull-messages of one registered SuperNode."""
    import httpx
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec
    from flwr.proto.fleet_pb2 import (
        ActivateNodeRequest,
        PullMessagesRequest,
        RegisterNodeFleetRequest,
        RegisterNodeFleetResponse,
    )
    from flwr.proto.node_pb2 import Node
    from flwr.supercore.primitives.asymmetric import public_key_to_bytes

    from hetfed.engines.flower import LocalFlower

    key = ec.generate_private_key(ec.SECP256R1() if curve == "secp256r1" else ec.SECP384R1())
    public = public_key_to_bytes(key.public_key())
    with tempfile.TemporaryDirectory(prefix="hetfed-asgi-requests-") as tmp:
        flower = LocalFlower(Path(tmp), superlink_asgi=asgi)
        flower.start_superlink()
        try:
            with httpx.Client(base_url=f"http://{flower.address}", timeout=30) as client:

                def post(path: str, message: Any) -> bytes:
                    # what Flower's NodeAuthHttpInterceptor sends: the timestamp, signed
                    stamp = dt.datetime.now(dt.UTC).isoformat()
                    signature = key.sign(stamp.encode(), ec.ECDSA(hashes.SHA256()))
                    reply = client.post(
                        path,
                        content=message.SerializeToString(),
                        headers={
                            "content-type": "application/protobuf",
                            "flwr-public-key": base64.b64encode(public).decode(),
                            "flwr-timestamp": stamp,
                            "flwr-signature": base64.b64encode(signature).decode(),
                        },
                    )
                    reply.raise_for_status()
                    return reply.content

                register = post("/v1/fleet/register-node", RegisterNodeFleetRequest(public_key=public))
                node = RegisterNodeFleetResponse.FromString(register).node_id
                post("/v1/fleet/activate-node", ActivateNodeRequest(public_key=public, heartbeat_interval=60))
                pull = PullMessagesRequest(node=Node(node_id=node))
                for _ in range(100):  # warm-up
                    post("/v1/fleet/pull-messages", pull)
                pid = flower.processes["superlink"].pid
                before, started = cpu_seconds(pid), time.monotonic()
                for _ in range(requests):
                    post("/v1/fleet/pull-messages", pull)
                if time.monotonic() - started < 1:
                    raise RuntimeError("too few requests to measure CPU in clock ticks")
                return 1000 * (cpu_seconds(pid) - before) / requests
        finally:
            flower.stop()


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
    parser.add_argument("--requests", type=int, default=2000, help="empty pulls per request row")
    add_note_argument(parser)
    args = parser.parse_args()
    load = {"before": os.getloadavg()[0]}
    per_request_ms = {
        f"{asgi}-{curve}": per_request(asgi, curve, args.requests) for curve in CURVES for asgi in MODES
    }
    print(json.dumps(per_request_ms), flush=True)
    measured: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="hetfed-asgi-results-") as results:
        for nodes in args.nodes:
            for asgi in MODES:
                measured[f"{asgi}-{nodes}"] = entry = measure(nodes, asgi, args.rounds, Path(results))
                print(nodes, asgi, json.dumps(entry), flush=True)
    load["after"] = os.getloadavg()[0]
    RESULTS.write_text(
        json.dumps(
            {
                "task": TASK,
                "rounds": args.rounds,
                "requests": args.requests,
                "load": load,
                "per-request-ms": per_request_ms,
                "measured": measured,
                "environment": environment(),
            },
            indent=2,
        )
        + "\n"
    )
    request_table = markdown_table(
        ["SuperNode key", "stock (ms)", "hetfed-superlink (ms)", "stock / hetfed"],
        [
            [
                curve,
                per_request_ms[f"stock-{curve}"],
                per_request_ms[f"gated-{curve}"],
                f"{per_request_ms[f'stock-{curve}'] / per_request_ms[f'gated-{curve}']:.2f}x",
            ]
            for curve in CURVES
        ],
    )
    key_gain = per_request_ms["gated-secp384r1"] / per_request_ms["gated-secp256r1"]
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
federation hetfed starts; hetfed/runtime/superlink.py) enters those six only on their own paths,
and runs a Fleet or Runtime API call through Flower's own error translation, protobuf translation
and node authentication with one buffered `call_next` instead of three `BaseHTTPMiddleware` task
groups, and answers a SuperNode's pull from that node's own messages once their objects are in
(hetfed/runtime/pull.py), holds a node's empty pull until one of its messages is complete
(hetfed/runtime/held_pull.py) and moves a message's objects in one request each way on the Fleet and
Runtime APIs (hetfed/runtime/object_batch.py); "gated" below is hetfed-superlink with all of it, and
the warm SuperNodes use what the SuperLink offers; stock is `flower-superlink`.

**Per request**: SuperLink CPU per signed empty pull-messages ({args.requests} in a row from one
registered SuperNode, after 100 to warm up; the ECDSA signature over the timestamp is verified on
every request). Flower's SuperNodes make P-384 keys; hetfed's warm SuperNodes and `federation
keygen` make P-256 keys (hetfed/runtime/node_key.py), which hetfed-superlink checks
{key_gain:.2f}x faster per request:

{request_table}

**Per round**: FedAvg on the knapsack MLP ({TASK["num-items"]} items, one local epoch, every client
every round), warm ClientApp runtime (P-256 keys on both sides), SuperLink state in memory, a fresh
federation per row and SuperLink (stock, then gated). **Round**: median wall time of rounds
2..{args.rounds - 1} of {args.rounds} (the ServerApp's progress file). **CPU**: the SuperLink's
process group (the SuperLink and the ServerApp it runs) over the whole run, per round. Numbers:
[`docs/results/bench-superlink-asgi.json`](results/bench-superlink-asgi.json). Machine:
{os.cpu_count()} cores; 1-minute load average {load["before"]:.1f} before and {load["after"]:.1f}
after; {args.note}.

{table}
"""
    write_section("superlink_asgi", "SuperLink middleware: gated by API path vs stock", body)


if __name__ == "__main__":
    main()
