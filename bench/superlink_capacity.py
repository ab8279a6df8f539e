"""SuperLink capacity: many simulated silos in a few processes against a real SuperLink and ServerApp.

A simulated silo is one thread that speaks the Fleet API with Flower 1.42's own SuperNode
client code (``flwr.supernode.fleet_http_connection.http_request_response``: register,
activate, heartbeats every 30 s, pull messages, pull the message's objects, confirm, push
the reply and its objects, deactivate, unregister) and answers each message by calling a
ClientApp in-process: no SuperNode process, no ClientApp process. A few driver processes
hold all the silos; the SuperLink (in-memory state; ``flower-superlink`` for stock,
``hetfed-superlink`` for hetfed, as ``hetfed federation up`` starts it) and the ServerApp (started
by the SuperLink's own executor) are real.

Two paths, side by side on the same machine:

* **stock**: Flower's FedAvg (``flwr.serverapp.strategy.FedAvg``, every silo every round,
  no federated evaluation) in a plain ServerApp (bench/stock_app; replies pulled by
  ``Grid.send_and_receive``, every 3 s), silos waiting as Flower's SuperNode does (3 s
  after an empty pull, object pulls retried from 1 s), answering with bench/stock_app's
  ClientApp (the model plus seeded noise, a knapsack-MLP-sized reply).
* **hetfed**: hetfed's ServerApp and FedAvg strategy on the knapsack task
  (``hetfed run --engine deployment``: the ``query.info`` discovery, summed rounds, 0.1 s
  reply pulls, evaluation after the last round), silos waiting as hetfed's warm runtime
  does (hetfed/runtime/waits.py: 0.1 s after a message, growing x1.5 to Flower's 3 s;
  object pulls from 0.02 s) and answering with hetfed's real ClientApp (one local epoch
  of torch training on the silo's own generated partition), or, with ``--replies light``,
  answering train messages as the stock side's silos do (the model plus seeded noise, in
  hetfed's record layout; every other message by hetfed's ClientApp): at 1000 silos on 2
  cores the silos' own training, not the SuperLink, would bound a round. A row says which.

Measured per size, over the middle rounds 2..R-1 (the first carries start-up, the last
hetfed's evaluation): rounds per second, round durations, SuperLink CPU (utime + stime of
the SuperLink process, /proc) per silo per round, the ServerApp's CPU per round,
the latency of each reply (message created by the ServerApp -> the silo's reply and its
objects pushed), and the SuperLink's resident memory (VmRSS after the run, VmHWM peak).

Usage: ``python bench/superlink_capacity.py`` (10 and 100 silos, a few minutes);
``--silos 10 100 500 1000 --rounds 4`` for the full table (writes docs/benchmarks.md and
docs/results/bench-superlink-capacity.json). ``driver`` is the internal entry point of a
driver process.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import json
import math
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from contextlib import ExitStack
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench._report import add_note_argument, environment, markdown_table, write_section  # noqa: E402
from bench.round_latency import FEDAVG_KNAPSACK, RoundClock  # noqa: E402

STOCK_APP = ROOT / "bench" / "stock_app"
RESULTS = ROOT / "docs" / "results" / "bench-superlink-capacity.json"
PATHS = ("stock", "hetfed")
REPLIES = ("trained", "light")  # how hetfed's simulated silos answer a train message (the stock ones: light)
# The SuperLink each path runs: stock Flower's, or hetfed's (its middleware gated by API path,
# hetfed/runtime/superlink.py, and a node's pull from its own complete messages, hetfed/runtime/pull.py).
# Rows measured before hetfed-superlink existed name none: both paths ran flower-superlink then; rows
# named "hetfed-superlink" were measured before its own-message pull, rows without "batched objects,
# held pull" before a message's objects moved in one Fleet request each way and an empty pull waited
# at the SuperLink (hetfed/runtime/object_batch.py, hetfed/runtime/held_pull.py).
SUPERLINKS = {
    "stock": ("flower-superlink", "stock"),
    "hetfed": ("hetfed-superlink, own-message pull, batched objects and confirmations, held pull", "gated"),
}
SILOS_PER_DRIVER = 250
JOINING = 4  # silos of a driver registering at once
RUN_TIMEOUT = 7200.0
LARGE = 500  # from this many silos on, runs have --large-rounds rounds (a round takes minutes there)
# hetfed's side; the stock side gets the same model's layer sizes
TASK: dict[str, Any] = {**FEDAVG_KNAPSACK, "round-timeout": 1800.0, "node-wait-timeout": 600.0}
TICK = os.sysconf("SC_CLK_TCK")


# --- the simulated silo ------------------------------------------------------------------------
class Waits:
    """How a silo waits: after an empty pull, and between retries of an object not yet there."""

    def __init__(self, path: str) -> None:
        from flwr.supercore import constant

        from hetfed.runtime.internals import IDLE_SLEEP
        from hetfed.runtime.supernode import IDLE_FAST
        from hetfed.runtime.waits import PULL_BACKOFF_CAP, PULL_INITIAL_BACKOFF, Backoff

        if path == "hetfed":  # the warm runtime's (hetfed/runtime/waits.py)
            self.idle = Backoff(IDLE_FAST, IDLE_SLEEP)
            self.pull = (PULL_INITIAL_BACKOFF, PULL_BACKOFF_CAP)
        else:  # Flower's SuperNode: sleep(3) after an empty pull, its pull helpers' own backoff
            self.idle = Backoff(IDLE_SLEEP, IDLE_SLEEP)
            self.pull = (float(constant.PULL_INITIAL_BACKOFF), float(constant.PULL_BACKOFF_CAP))


def client_app(path: str, replies: str = "trained") -> Callable[..., Any]:
    """The ClientApp a silo of ``path`` calls: hetfed's own (``light`` replies: see
    :func:`light_train`), or bench/stock_app's."""
    if path == "hetfed":
        from hetfed.client.app import app

        return app if replies == "trained" else functools.partial(light_train, app)
    sys.path.insert(0, str(STOCK_APP))
    return importlib.import_module("capacity_stock.apps").client


def light_train(app: Callable[..., Any], message: Any, context: Any) -> Any:
    """``app``'s reply, but a train message is answered as bench/stock_app's silos answer it: the
    received model plus seeded noise (partition, round), ``num-examples = 40 + partition``, in
    hetfed's record layout: a reply of the real size and layout without the silo's training."""
    import numpy as np
    from flwr.app import Message, MetricRecord, RecordDict

    from hetfed.records import to_numpy, to_record

    if message.metadata.message_type != "train":
        return app(message, context)
    partition = int(context.node_config["partition-id"])
    rng = np.random.default_rng([partition, int(round_of(message))])
    model = to_numpy(message.content.array_records["arrays"])
    arrays = {k: v + rng.normal(0, 0.01, v.shape).astype(v.dtype) for k, v in model.items()}
    metrics = MetricRecord({"num-examples": 40 + partition, "train-loss": float(rng.random())})
    return Message(RecordDict({"arrays": to_record(arrays), "metrics": metrics}), reply_to=message)


class Silo(threading.Thread):
    """One simulated SuperNode: Flower's Fleet client code, the ClientApp called in this thread."""

    def __init__(
        self,
        address: str,
        node_config: dict[str, Any],
        path: str,
        stop: threading.Event,
        joining: threading.Semaphore,
        record: Path | None = None,
        replies: str = "trained",
    ) -> None:
        super().__init__(daemon=True)
        self.address, self.node_config, self.path = address, node_config, path
        self.stop, self.joining, self.record = stop, joining, record
        self.app = client_app(path, replies)
        self.waits = Waits(path)
        self.latencies: list[tuple[str, float]] = []  # (round, s from message creation to reply pushed)
        self.requests: list[tuple[float, str]] = []  # (when, kind) of every Fleet request but heartbeats
        self.errors: list[str] = []

    def run(self) -> None:
        from flwr.supernode.fleet_http_connection import http_request_response

        # The connection's registration, activation and heartbeat thread are Flower's own. A few silos
        # of a driver join at a time: a SuperLink swamped by hundreds of registrations answers late,
        # Flower retries, the retry finds the key registered, and Flower exits the whole process.
        with ExitStack() as stack:
            with self.joining:
                conn = stack.enter_context(http_request_response(self.address, insecure=True))
            node_id, receive, send, get_run, get_fab, pull_object, push_object, confirm = conn
            OBJECT_REQUESTS.by_node[node_id] = self.requests  # object requests: counted on the wire
            kinds = ("push-message", "run", "fab")
            calls: tuple[Callable[..., Any], ...] = (send, get_run, get_fab)
            send, get_run, get_fab = map(self.counted, kinds, calls)
            contexts: dict[int, Any] = {}
            while not self.stop.is_set():
                try:
                    got = receive()
                except Exception as exc:  # noqa: BLE001 - counted; the silo goes on
                    self.errors.append(f"pull: {type(exc).__name__}: {exc}")
                    got = None
                self.requests.append((time.time(), "pull-empty" if got is None else "pull-message"))
                if got is None:
                    self.stop.wait(self.waits.idle.next())
                    continue
                self.waits.idle.reset()
                try:
                    self.answer(
                        node_id, *got, contexts, get_run, get_fab, pull_object, push_object, confirm, send
                    )
                except Exception as exc:  # noqa: BLE001 - counted and reported; the silo goes on
                    self.errors.append(f"{type(exc).__name__}: {exc}")

    def counted(self, kind: str, request: Callable[..., Any]) -> Callable[..., Any]:
        """``request``, recorded in :attr:`requests` at each call."""

        def call(*args: Any) -> Any:
            self.requests.append((time.time(), kind))
            return request(*args)

        return call

    def answer(
        self,
        node_id: int,
        message: Any,
        tree: Any,
        contexts: dict[int, Any],
        get_run: Callable[..., Any],
        get_fab: Callable[..., Any],
        pull_object: Callable[..., Any],
        push_object: Callable[..., Any],
        confirm: Callable[..., Any],
        send: Callable[..., Any],
    ) -> None:
        """What a SuperNode and its ClientApp do with one message, in this thread."""
        from flwr.app import Context, Message, RecordDict
        from flwr.common.config import get_fused_config_from_fab
        from flwr.supercore.inflatable.inflatable_object import (
            get_all_nested_objects,
            get_object_tree,
            no_object_id_recompute,
        )
        from flwr.supercore.inflatable.inflatable_utils import pull_and_inflate_object_from_tree, push_objects

        run_id = message.metadata.run_id
        if run_id not in contexts:  # once per run, as a SuperNode does
            run = get_run(run_id)
            fab = get_fab(run.fab_hash, run_id)
            config = get_fused_config_from_fab(fab.content, run)
            contexts[run_id] = Context(
                run_id, node_id, dict(self.node_config), RecordDict(), config, series_id=run.series_id
            )
        message = pull_and_inflate_object_from_tree(
            tree,
            functools.partial(pull_object, run_id),
            functools.partial(confirm, run_id),
            return_type=Message,
            initial_backoff=self.waits.pull[0],
            backoff_cap=self.waits.pull[1],
        )
        message.metadata.__dict__["_message_id"] = tree.object_id  # as Flower's pull_task_input does
        started = time.perf_counter()
        reply = self.app(message, contexts[run_id])
        runtime = time.perf_counter() - started
        reply.metadata.__dict__["_message_id"] = reply.object_id  # as Flower's push_message does
        with no_object_id_recompute():
            ids, session = send(reply, get_object_tree(reply), runtime)
            push_objects(
                get_all_nested_objects(reply),
                functools.partial(push_object, run_id, session),
                object_ids_to_push=set(ids),
            )
        self.latencies.append((round_of(message), time.time() - message.metadata.created_at))
        if self.record is not None and "arrays" in reply.content.array_records:
            self.save(message, reply)

    def save(self, message: Any, reply: Any) -> None:
        """The reply's arrays and weight, for the test (``<round>-<partition>.npz``)."""
        import numpy as np

        from hetfed.records import to_numpy

        assert self.record is not None
        payload: dict[str, Any] = {f"a/{k}": v for k, v in to_numpy(reply.content["arrays"]).items()}
        payload["num_examples"] = reply.content["metrics"]["num-examples"]
        np.savez(self.record / f"{round_of(message)}-{self.node_config['partition-id']}.npz", **payload)


def round_of(message: Any) -> str:
    """The server round a message belongs to (its config's ``server-round``, which both FedAvgs set)."""
    config = message.content.config_records.get("config", {})
    return str(config.get("server-round", message.metadata.group_id))


class ObjectRequests:
    """Counts the object requests and message confirmations silos send over HTTP, by the node each
    names: Flower's single PullObject / PushObject (each try) and ConfirmMessageReceived, and
    hetfed's batches (one each, whatever they carry; a confirmation riding on a batch is none).
    Flower pulls a message's objects from a thread pool, so the count is taken where every Fleet
    request passes, Flower's node-signing interceptor, not around the connection's functions."""

    def __init__(self) -> None:
        from hetfed.runtime.object_batch import FLEET_PULL, FLEET_PUSH

        self.by_node: dict[int, list[tuple[float, str]]] = {}
        self.kinds = {
            "/flwr.proto.Fleet/PullObject": "object-pull",
            "/flwr.proto.Fleet/PushObject": "object-push",
            FLEET_PULL: "object-pull",
            FLEET_PUSH: "object-push",
            "/flwr.proto.Fleet/ConfirmMessageReceived": "confirm",
        }

    def install(self) -> None:
        from hetfed.runtime.internals import attr

        interceptor_class = attr("flwr.supernode.node_auth_http_interceptor:NodeAuthHttpInterceptor")
        stock = interceptor_class.intercept

        def intercept(interceptor: Any, context: Any, call_next: Any) -> Any:
            kind = self.kinds.get(context.rpc_method)
            counted = self.by_node.get(context.message.node.node_id) if kind else None
            if kind is not None and counted is not None:
                counted.append((time.time(), kind))
            return stock(interceptor, context, call_next)

        interceptor_class.intercept = intercept


OBJECT_REQUESTS = ObjectRequests()


def driver(args: argparse.Namespace) -> None:
    """One driver process: ``--count`` silos until SIGTERM; then its measurements to ``--out``."""
    from hetfed.federation import node_config

    stop, joining = threading.Event(), threading.Semaphore(JOINING)
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    OBJECT_REQUESTS.install()
    if args.path == "hetfed":  # sign with a P-256 key and batch objects, as the warm SuperNode does
        from hetfed.runtime import held_pull, node_key

        node_key.install()
        if why := held_pull.install_fleet_client():
            raise SystemExit(f"driver: the batched Fleet client cannot be installed: {why}")
    record = Path(args.record) if args.record else None
    silos = [
        Silo(
            args.address,
            node_config(i, args.num_partitions, Path(args.state), None, None),
            args.path,
            stop,
            joining,
            record,
            args.replies,
        )
        for i in range(args.first, args.first + args.count)
    ]
    for silo in silos:
        silo.start()
    stop.wait()
    end = time.monotonic() + 30  # then report anyway: a silo stuck retrying a gone SuperLink is a daemon
    for silo in silos:
        silo.join(timeout=max(0.0, end - time.monotonic()))
    out = {
        "latencies": [lat for s in silos for lat in s.latencies],
        "requests": [r for s in silos for r in s.requests],
        "errors": [e for s in silos for e in s.errors],
        "rss-kb": status_kb(os.getpid(), "VmRSS"),
    }
    Path(args.out).write_text(json.dumps(out))


# --- measuring a run ---------------------------------------------------------------------------
def cpu_seconds(pid: int) -> float:
    """utime + stime of one process (not its children)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def status_kb(pid: int, key: str) -> int:
    """A ``/proc/<pid>/status`` field in kB (VmRSS, VmHWM)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise KeyError(key)


def layer_sizes() -> str:
    """The knapsack MLP's layer sizes (``in,hidden,out``) of hetfed's task, for the stock side."""
    from hetfed.engines.runner import prepare
    from hetfed.strategies.fedavg import FedAvg

    with tempfile.TemporaryDirectory() as tmp:
        cfg = prepare({**TASK, "num-rounds": 1, "run-name": "sizes"}, "inline", Path(tmp))
        model = FedAvg.build(cfg)
    from hetfed.records import to_numpy

    assert model.arrays is not None
    weights = [v for v in to_numpy(model.arrays).values() if v.ndim == 2]
    return ",".join(str(n) for n in [weights[0].shape[1], *(w.shape[0] for w in weights)])


class Drivers:
    """The driver processes of one measurement (a process group each), stopped by :meth:`collect`."""

    def __init__(
        self, root: Path, address: str, path: str, silos: int, record: Path | None, replies: str
    ) -> None:
        self.root, self.procs, self.outs = root, [], []
        count = math.ceil(silos / SILOS_PER_DRIVER)
        for d in range(count):
            first, last = d * silos // count, (d + 1) * silos // count
            out = root / f"driver-{d}.json"
            cmd = [
                sys.executable,
                str(Path(__file__).resolve()),
                "driver",
                f"--address={address}",
                f"--path={path}",
                f"--first={first}",
                f"--count={last - first}",
                f"--num-partitions={silos}",
                f"--state={root / 'state'}",
                f"--out={out}",
                f"--replies={replies}",
                *([f"--record={record}"] if record else []),
            ]
            log = open(root / f"driver-{d}.log", "ab")  # noqa: SIM115 - closed with the process
            self.procs.append(
                subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            )
            self.outs.append(out)

    def wait_online(self, flower: Any, silos: int, timeout: float) -> None:
        """Until the SuperLink counts ``silos`` online; RuntimeError if a driver exits or time runs out."""
        from hetfed.engines.errors import FlowerProcessError

        end, online = time.time() + timeout, 0
        with flower.control(timeout=30) as control:
            while online < silos:
                if exited := [d for d, p in enumerate(self.procs) if p.poll() is not None]:
                    log = (self.root / f"driver-{exited[0]}.log").read_text().splitlines()
                    why = [line for line in log if "[code:" in line or "Exit Code" in line] or log[-3:]
                    raise RuntimeError(
                        f"driver {exited[0]} exited with {online} silos online: {' '.join(why[-2:])}"
                    )
                if time.time() > end:
                    raise RuntimeError(f"only {online} of {silos} silos online after {timeout:g} s")
                time.sleep(2)
                try:
                    online = control.online_nodes()
                except FlowerProcessError:
                    pass  # a busy SuperLink: asked again

    def collect(self, timeout: float = 120, strict: bool = True) -> dict[str, Any]:
        """SIGTERM every driver, wait for their reports; their latencies, errors and memory.
        ``strict``: a missing report is a RuntimeError (else what the others reported)."""
        for p in self.procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        end = time.time() + timeout
        for p in self.procs:
            try:
                p.wait(max(1.0, end - time.time()))
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        reports = [json.loads(o.read_text()) for o in self.outs if o.exists()]
        if strict and len(reports) < len(self.procs):
            logs = "\n".join(
                (self.root / f"driver-{d}.log").read_text()[-1500:] for d in range(len(self.procs))
            )
            raise RuntimeError(f"{len(self.procs) - len(reports)} driver(s) wrote no report:\n{logs}")
        return {
            "latencies": [tuple(lat) for r in reports for lat in r["latencies"]],
            "requests": [tuple(req) for r in reports for req in r["requests"]],
            "errors": [e for r in reports for e in r["errors"]],
            "drivers": len(reports),
            "drivers-rss-mb": sum(r["rss-kb"] for r in reports) / 1024,
        }


def measure(
    path: str, silos: int, rounds: int, record: Path | None = None, replies: str = "trained"
) -> dict[str, Any]:
    """One run of ``rounds`` rounds on ``silos`` simulated silos; the measurements (see the module docs)."""
    from hetfed.engines.flower import LocalFlower, end_processes_of, processes_of
    from hetfed.engines.runner import APP_DIR, prepare

    if rounds < 3:
        raise ValueError("--rounds must be >= 3: rounds 2..R-1 are measured")
    with tempfile.TemporaryDirectory(prefix="hetfed-capacity-") as tmp:
        root = Path(tmp)
        flower = LocalFlower(root / "federation", superlink_asgi=SUPERLINKS[path][1])
        drivers: Drivers | None = None
        completed = False
        samples: dict[int, tuple[float, float, float]] = {}
        try:
            app_dir = APP_DIR if path == "hetfed" else STOCK_APP
            flower.start_superlink(cwd=app_dir)
            link = flower.processes["superlink"].pid
            started = time.time()
            drivers = Drivers(root, flower.address, path, silos, record, replies)
            drivers.wait_online(flower, silos, timeout=120 + silos / 2)
            online_s = time.time() - started
            cpu_online = cpu_seconds(link)

            def on_round(r: int) -> None:
                apps = processes_of(flower.home, "flwr-serverapp")
                app_cpu = sum(cpu_seconds(p) for p in apps) if apps else math.nan
                samples[r] = (time.time(), cpu_seconds(link), app_cpu)

            if path == "hetfed":  # what `hetfed run --engine deployment` submits (hetfed/engines/runner.py)
                launch = {"nodes": silos, "data-path": "", "state-dir": "", "timeout": RUN_TIMEOUT}
                overrides = {
                    **TASK,
                    "num-rounds": rounds,
                    "run-name": "capacity",
                    "launch": json.dumps(launch),
                }
                config = prepare(overrides, "deployment", root / "results")
                progress = root / "results" / "capacity" / "progress.json"
                model = root / "results" / "capacity" / "models.npz"
            else:
                progress, model = root / "progress.json", root / "model.npz"
                config = {
                    "num-rounds": rounds,
                    "silos": silos,
                    "layer-sizes": layer_sizes(),
                    "progress": str(progress),
                    "out": str(model),
                }
            with RoundClock(progress, on_round):
                run_id = flower.submit(app_dir, config)
                # A SuperLink busy with hundreds of silos answers /health late: `hetfed run` gives up
                # after 20 s of silence (wait_run's default), the benchmark waits for the run itself.
                status = flower.wait_run(run_id, timeout=RUN_TIMEOUT, lost_after=RUN_TIMEOUT)
            if status != "finished:completed":
                raise RuntimeError(f"the {path} run ended {status}: {flower.run_log(run_id)[-3000:]}")
            rss, peak = status_kb(link, "VmRSS"), status_kb(link, "VmHWM")
            final = dict(_load_npz(model)) if record is not None else {}
            completed = True
        finally:
            # Not strict after a failure: a missing report must not hide why the run failed.
            silo_report = drivers.collect(strict=completed) if drivers else {}
            flower.stop()
            end_processes_of(flower.home)
    missing = [r for r in range(1, rounds) if r not in samples]
    if missing:
        raise RuntimeError(f"{path}, {silos} silos: the round clock missed rounds {missing}")
    (t1, c1, a1), (tn, cn, an) = samples[1], samples[rounds - 1]
    window = rounds - 2
    middle = {str(r) for r in range(2, rounds)}
    latencies = sorted(s for g, s in silo_report["latencies"] if g in middle)
    kinds = Counter(kind for t, kind in silo_report["requests"] if t1 < t <= tn)
    return {
        "path": path,
        "replies": replies if path == "hetfed" else "light",
        "superlink": SUPERLINKS[path][0],
        "silos": silos,
        "rounds": rounds,
        "online-s": online_s,
        "round-s": [samples[r][0] - samples[r - 1][0] for r in range(2, rounds)],
        "rounds-per-s": window / (tn - t1),
        "superlink-cpu-per-silo-round-ms": 1000 * (cn - c1) / window / silos,
        "superlink-cpu-per-round-s": (cn - c1) / window,
        "superlink-cpu-each-round-s": [samples[r][1] - samples[r - 1][1] for r in range(2, rounds)],
        "serverapp-cpu-per-round-s": (an - a1) / window,
        "superlink-cpu-until-online-s": cpu_online,
        "reply-latency-s": {f"p{q}": _percentile(latencies, q) for q in (50, 90, 99)}
        | {"max": latencies[-1]},
        "replies-measured": len(latencies),
        "fleet-requests-per-silo-round": {k: v / window / silos for k, v in sorted(kinds.items())},
        "fleet-requests-whole-run": dict(
            sorted(Counter(kind for _, kind in silo_report["requests"]).items())
        ),
        "superlink-cpu-per-fleet-request-ms": 1000 * (cn - c1) / max(1, sum(kinds.values())),
        "superlink-rss-mb": rss / 1024,
        "superlink-peak-rss-mb": peak / 1024,
        "drivers": silo_report["drivers"],
        "drivers-rss-mb": silo_report["drivers-rss-mb"],
        "silo-errors": silo_report["errors"][:20],
        "silo-error-count": len(silo_report["errors"]),
        "final-model": final,
    }


def _load_npz(path: Path) -> Mapping[str, Any]:
    import numpy as np

    with np.load(path) as data:
        return {k: data[k] for k in data.files}


def _percentile(values: list[float], q: float) -> float:
    """The q-th percentile (nearest rank) of sorted ``values``."""
    return values[min(len(values) - 1, max(0, math.ceil(q / 100 * len(values)) - 1))]


# --- the report --------------------------------------------------------------------------------
def one_line(text: str, limit: int = 500) -> str:
    """A failure's text on one line: Flower's log colours, blank lines and help links dropped; a long
    one keeps its start (what failed) and its end (Flower's last words)."""
    lines = [re.sub(r"\x1b\[[0-9;]*m", "", line).strip() for line in text.splitlines()]
    kept = [line for line in lines if line and not line.startswith("For more information")]
    text = " / ".join(dict.fromkeys(kept))
    return text if len(text) <= limit else f"{text[: limit // 4]} ... {text[-(limit - limit // 4) :]}"


def requests(m: Mapping[str, Any]) -> str:
    """Fleet requests per silo per round, the empty pulls among them, SuperLink CPU per request."""
    if "fleet-requests-per-silo-round" not in m:
        return "n/a"
    per = m["fleet-requests-per-silo-round"]
    return (
        f"{sum(per.values()):.1f} ({per.get('pull-empty', 0):.1f}); "
        f"{m['superlink-cpu-per-fleet-request-ms']:.1f} ms"
    )


def what_else_ran(measured: list[dict[str, Any]]) -> str:
    """Each row's ``--note`` (what else ran on the machine), rows of one note together."""
    rows: dict[str, list[str]] = {}
    for m in measured:
        note = m.get("note", "not recorded (rows measured before the note was kept per row)")
        superlink = m.get("superlink", "flower-superlink")
        rows.setdefault(note, []).append(f"{m['silos']} {m['path']} ({superlink})")
    return "; ".join(f"{', '.join(labels)}: {note}" for note, labels in rows.items())


def replies_of(m: Mapping[str, Any]) -> str:
    """How a row's silos answered train messages (rows from before --replies: hetfed's trained)."""
    return str(m.get("replies", "trained" if m["path"] == "hetfed" else "light"))


def report(measured: list[dict[str, Any]]) -> str:
    """The docs/benchmarks.md section."""
    # The side-by-side comparisons (ratios, target) take each path's own silos: stock's answer as the
    # stock app does, hetfed's train; hetfed rows with light replies are listed beside them.
    by = {
        (m["path"], m["silos"]): m
        for m in measured
        if replies_of(m) == ("trained" if m["path"] == "hetfed" else "light")
    }
    sizes = sorted({m["silos"] for m in measured})
    order = {
        (p, r): i for i, (p, r) in enumerate([("stock", "light"), ("hetfed", "trained"), ("hetfed", "light")])
    }
    rows = []
    for m in sorted(measured, key=lambda m: (m["silos"], order[(m["path"], replies_of(m))])):
        n, path = m["silos"], m["path"]
        ran = f"{path} ({m.get('superlink', 'flower-superlink')})"
        if path == "hetfed" and replies_of(m) == "light":
            ran += ", light replies"
        if "failed" in m:
            load = f"{m['load'][0]:.0f} / {m['load'][1]:.0f}"
            rows.append([n, ran, "did not complete", *["-"] * 8, load, f"{m['minutes']:.0f}"])
            continue
        lat = m["reply-latency-s"]
        rows.append(
            [
                n,
                ran,
                m["rounds-per-s"],
                ", ".join(f"{r:.2f}" for r in m["round-s"]),
                m["superlink-cpu-per-silo-round-ms"],
                m["superlink-cpu-per-round-s"],
                m["serverapp-cpu-per-round-s"],
                f"{lat['p50']:.2f} / {lat['p90']:.2f} / {lat['p99']:.2f}",
                f"{m['superlink-rss-mb']:.0f} ({m['superlink-peak-rss-mb']:.0f})",
                m["silo-error-count"],
                requests(m),
                f"{m['load'][0]:.0f} / {m['load'][1]:.0f}" if "load" in m else "n/a",
                f"{m['minutes']:.0f}" if "minutes" in m else "n/a",
            ]
        )
    table = markdown_table(
        [
            "silos",
            "path",
            "rounds / s",
            "rounds 2..R-1 (s)",
            "SuperLink CPU / silo / round (ms)",
            "SuperLink CPU / round (s)",
            "ServerApp CPU / round (s)",
            "reply latency p50 / p90 / p99 (s)",
            "SuperLink RSS MB (peak)",
            "silo errors",
            "Fleet requests / silo / round (empty pulls); SuperLink CPU / request",
            "load before / after",
            "row took (min)",
        ],
        rows,
    )
    ratio_rows = []
    for n in sizes:
        stock, het = by.get(("stock", n)), by.get(("hetfed", n))
        if stock and het and "failed" not in stock and "failed" not in het:
            ratio_rows.append(
                [
                    n,
                    f"{het['rounds-per-s'] / stock['rounds-per-s']:.1f}x",
                    f"{het['superlink-cpu-per-silo-round-ms'] / stock['superlink-cpu-per-silo-round-ms']:.2f}x",  # noqa: E501
                ]
            )
    ratios = markdown_table(
        ["silos", "rounds / s: hetfed / stock", "SuperLink CPU per silo: hetfed / stock"], ratio_rows
    )
    per_request = [
        m["superlink-cpu-per-fleet-request-ms"] for m in measured if "superlink-cpu-per-fleet-request-ms" in m
    ]
    capacity = ""
    if per_request:
        ms = statistics.median(per_request)
        # An idle silo on Flower's SuperNode: a pull every 3 s, a heartbeat every ~24 s (0.8 x 30 s).
        idle_rate = 1 / 3 + 1 / (0.8 * 30)
        capacity = (
            "**What the SuperLink can serve.** Its CPU per Fleet request (all its CPU over the measured "
            "rounds, the ServerApp's Runtime API requests and the uncounted heartbeats included, divided "
            f"by the silos' counted requests) was {min(per_request):.1f} to {max(per_request):.1f} ms, "
            f"median {ms:.1f} ms: one core of SuperLink serves about {1000 / ms:.0f} requests per second. "
            f"An idle silo on Flower's SuperNode makes {idle_rate:.2f} requests per second (a pull every "
            f"3 s, a heartbeat about every 24 s), so about {1000 / ms / idle_rate:.0f} idle silos saturate "
            "one core before any round runs; each round adds the requests counted above per silo, and a "
            "round that lasts longer adds empty pulls to every waiting silo, which is why the CPU per silo "
            "per round grows with the number of silos."
        )
    failures = "\n".join(
        f"- {m['silos']} silos, {m['path']}: {one_line(m['failed'])}" for m in measured if "failed" in m
    )
    at100 = by.get(("hetfed", 100))
    target = (
        "not measured (no 100-silo row)"
        if at100 is None
        else (
            f"**{'met' if at100['superlink-cpu-per-silo-round-ms'] <= 10 else 'not met'}** on hetfed's path "
            f"({at100['superlink-cpu-per-silo-round-ms']:.1f} ms"
            + (
                f"; stock path {by[('stock', 100)]['superlink-cpu-per-silo-round-ms']:.1f} ms)"
                if ("stock", 100) in by
                else ")"
            )
        )
    )
    biggest = max(sizes)
    # Completing rounds is the SuperLink's and the ServerApp's doing: a row with light replies counts.
    completed = {(m["path"], m["silos"]) for m in measured if "failed" not in m}
    done = [p for p in PATHS if (p, biggest) in completed]
    drivers = ", ".join(f"{n}: {math.ceil(n / SILOS_PER_DRIVER)}" for n in sizes)
    rounds = ", ".join(f"{n}: {r}" for n, r in sorted({(m["silos"], m["rounds"]) for m in measured}))
    return f"""Simulated silos, not SuperNode processes: each silo is a thread in one of a few driver \
processes ({SILOS_PER_DRIVER} silos each; drivers per size {drivers}) that speaks the Fleet API with \
Flower 1.42's own SuperNode client code (`http_request_response`: register, activate, 30 s heartbeats, \
pull, object pulls and confirmation, reply push, deactivate) and calls a ClientApp in-process, so the \
SuperLink sees what it sees from real SuperNodes while no process per silo is needed. The SuperLink \
(in-memory state) and the ServerApp are real and started fresh for every row. \
**stock**: Flower's own FedAvg ServerApp (`bench/stock_app`: `flwr.serverapp.strategy.FedAvg`, every silo \
every round, no federated evaluation, `Grid.send_and_receive`) and silos that wait as Flower's SuperNode \
does (3 s after an empty pull, object pulls retried from 1 s), replying with the received model plus \
noise (same layer sizes and dtype as hetfed's knapsack MLP). **hetfed**: `hetfed run --engine \
deployment`'s ServerApp with hetfed's FedAvg on the knapsack task (every silo every round, one local \
epoch, evaluation after the last round), silos that wait as hetfed's warm runtime does (0.1 s after a \
message, x1.5 per empty pull up to 3 s) and run hetfed's real ClientApp; rows marked "light replies" \
answer train messages as the stock silos do (`--replies light`: hetfed's layout, no training), so that \
the silos' own CPU does not bound a large size. Each row names its SuperLink: \
`flower-superlink` on the stock path, `hetfed-superlink` (Flower's, its middleware gated by API path) on \
hetfed's, with "own-message pull" where a node's pull checks only its own messages and gets one only once \
the ServerApp has pushed its objects (hetfed/runtime/pull.py; the rows named `hetfed-superlink` alone were \
measured before it), and "batched objects, held pull" where hetfed's silos send through the warm \
SuperNode's Fleet client, which moves a message's objects in one request each way and whose empty pull \
the SuperLink holds up to 5 s until one of the silo's messages is complete (hetfed/runtime/object_batch.py, \
hetfed/runtime/held_pull.py; object requests are counted on the wire, a batch as one), "and \
confirmations" where that batch also confirms the message (no ConfirmMessageReceived request of its own; \
confirmations are counted on the wire); rows measured \
before hetfed-superlink existed ran `flower-superlink` on both paths, so there the difference is the \
ServerApp (strategy, reply polling, message packing) and the silos' polling. \
R rounds per run (silos: R; {rounds}); rounds 2..R-1 \
measured (the first carries start-up and hetfed's discovery exchange, hetfed's last its evaluation). \
**SuperLink CPU** is utime + stime of the SuperLink process over those rounds, idle heartbeats \
and polls included; **reply latency**: message created by the ServerApp to the silo's reply and its \
objects pushed; RSS after the run (peak). Machine: {os.cpu_count()} cores shared with the silo drivers \
and the ServerApp (their CPU competes with the SuperLink's: rounds per second and latencies are those \
of this one machine, the CPU columns less so); the 1-minute load average before and after each row \
is in the table; what else ran: {what_else_ran(measured)}. Rows are kept in the JSON across \
invocations (a row is replaced when its size, path, replies and SuperLink are measured again), so large \
sizes can be run on their own.

{table}

{ratios}

{capacity}

{"Runs that did not complete, and why:" if failures else ""}
{failures}

Target: at 100 simulated silos at most 10 ms of SuperLink CPU per silo per round: {target}. \
{biggest} simulated silos completed rounds on {
        "every path"
        if len(done) == len(PATHS)
        else ("the " + ", ".join(done) + " path only" if done else "no path")
    }. Numbers: [`docs/results/bench-superlink-capacity.json`]\
(results/bench-superlink-capacity.json)."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command")
    run = sub.add_parser("driver", help="internal: one driver process of simulated silos")
    for flag in ("--address", "--path", "--state", "--out"):
        run.add_argument(flag, required=True)
    for flag in ("--first", "--count", "--num-partitions"):
        run.add_argument(flag, type=int, required=True)
    run.add_argument("--record")
    run.add_argument("--replies", choices=REPLIES, default="trained")
    parser.add_argument("--silos", type=int, nargs="+", default=[10, 100])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--large-rounds", type=int, default=3, help=f"rounds of a run with >= {LARGE} silos")
    parser.add_argument("--paths", nargs="+", choices=PATHS, default=list(PATHS))
    parser.add_argument(
        "--replies",
        choices=REPLIES,
        default="trained",
        help="hetfed's silos train (default) or answer train messages as the stock ones do (light)",
    )
    add_note_argument(parser)
    args = parser.parse_args()
    os.environ.setdefault("FLWR_DISABLE_UPDATE_CHECK", "1")
    os.environ.setdefault("FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION", "1")
    if args.command == "driver":
        driver(args)
        return

    def interrupt(*_: object) -> None:
        raise KeyboardInterrupt  # SIGTERM too stops the SuperLink and the drivers (measure's finally)

    signal.signal(signal.SIGTERM, interrupt)
    kept = json.loads(RESULTS.read_text())["measured"] if RESULTS.exists() else []
    replies = {"stock": "light", "hetfed": args.replies}  # what this invocation's rows replace
    measured = [
        m
        for m in kept
        if m["silos"] not in args.silos
        or m["path"] not in args.paths
        or replies_of(m) != replies[m["path"]]
        or m.get("superlink") != SUPERLINKS[m["path"]][0]  # an earlier SuperLink's row stays beside
    ]
    for silos in args.silos:
        for path in args.paths:  # side by side: the same machine state for both
            load, started = os.getloadavg()[0], time.time()
            rounds = args.rounds if silos < LARGE else args.large_rounds
            try:
                m = measure(path, silos, rounds, replies=args.replies)
                m.pop("final-model")
            except RuntimeError as exc:  # a size the SuperLink could not serve is a result too
                m = {"path": path, "superlink": SUPERLINKS[path][0], "silos": silos, "rounds": rounds}
                m["replies"] = args.replies if path == "hetfed" else "light"
                m["failed"] = one_line(str(exc))
            m |= {"load": [load, os.getloadavg()[0]], "minutes": (time.time() - started) / 60}
            m |= {"note": args.note, "environment": environment()}
            measured.append(m)
            print(json.dumps(m), flush=True)
            # Written after every row, so a run stopped at a large size keeps what it measured.
            RESULTS.write_text(json.dumps({"task": TASK, "measured": measured}, indent=2) + "\n")
            body = report(measured)
            write_section("superlink_capacity", "SuperLink capacity: simulated silos", body)
    print(body)


if __name__ == "__main__":
    main()
