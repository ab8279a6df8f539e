"""The warm ClientApp runtime (hetfed.runtime): its parts, and real SuperNodes running it.

Against real processes: a warm federation gives the inline engine's and a stock
federation's per-client metrics; a worker killed mid-task costs that round's reply
only (Flower's ClientApp-crashed error, at once) and the restarted worker serves the
next round; a raising ClientApp gives an error reply; a new app build is served by a
fresh interpreter, and so is a run after a run that imported torch (a NumPy run's worker
holds no torch); a SuperNode whose Flower internals differ runs stock and says so.
"""

from __future__ import annotations

import csv
import json
import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from flwr.supercore.interceptors.http.runtime_token import RuntimeTokenHttpInterceptor
from flwr.supercore.primitives.asymmetric import bytes_to_public_key

from bench.warm_runtime import group_processes
from hetfed.engines.control_api import ControlApi
from hetfed.engines.flower import BIN, CONNECTION, LocalFlower, free_port, supernode_args, supernode_command
from hetfed.engines.inline import node_configs, run_inline
from hetfed.engines.runner import prepare
from hetfed.federation import node_config
from hetfed.runtime import internals
from hetfed.runtime.object_batch import PUSH
from hetfed.runtime.supernode import runtime_api, split_runtime, with_isolation
from hetfed.runtime.waits import Backoff, SuperNodeClock, shorten_object_pull_backoff
from tests.conftest import REPO
from tests.test_object_batch_fallback import pushed_through

SMALL = {"n-train": 40, "n-test": 30, "local-epochs": 1, "num-items": 10, "fraction": 1.0, "seed": 5}


# --- parts ------------------------------------------------------------------------------
def test_backoff_is_fast_after_work_and_grows_geometrically_back_to_the_stock_wait() -> None:
    b = Backoff(fast=0.1, slow=3.0, factor=1.5)
    assert [b.next(), b.next()] == [3.0, 3.0]  # idle from the start: Flower's own interval
    b.reset()
    waits = [b.next() for _ in range(12)]
    assert waits == pytest.approx([min(3.0, 0.1 * 1.5**k) for k in range(12)])
    assert waits[-1] == 3.0
    b.reset()
    assert b.next() == 0.1
    with pytest.raises(ValueError, match="0 < fast <= slow"):
        Backoff(fast=2.0, slow=1.0)


def test_the_supernode_clock_replaces_only_flowers_two_literal_sleeps() -> None:
    idle, reply, ready = Backoff(0.001, 0.004, 2.0), Backoff(0.001, 0.004, 2.0), threading.Event()
    clock = SuperNodeClock(idle, reply, ready)
    idle.reset()
    clock.sleep(internals.IDLE_SLEEP)
    assert idle.next() == 0.002  # the idle backoff was used (and advanced) instead of 3 s
    ready.set()
    clock.sleep(internals.REPLY_SLEEP)
    assert not ready.is_set()  # the worker's "done" ended the reply wait and was consumed
    assert reply.next() == 0.004  # ... and the reply backoff advanced, from its idle start
    assert clock.monotonic() > 0 and clock.time() > 0  # everything else is module time


def test_shortened_object_pulls_retry_as_long_as_flower_would(monkeypatch: pytest.MonkeyPatch) -> None:
    """A short backoff must not mean giving up sooner: the tries are bounded by time, not count."""
    from flwr.supercore.inflatable import inflatable_utils
    from flwr.supercore.inflatable.inflatable_utils import ObjectPullError, ObjectUnavailableError

    for fn in (inflatable_utils.pull_objects, inflatable_utils.pull_and_inflate_object_from_tree):
        monkeypatch.setattr(fn, "__kwdefaults__", dict(fn.__kwdefaults__))  # restored after the test
    calls = {"n": 0}

    def arrives_after_600_tries(object_id: str) -> bytes:
        calls["n"] += 1
        if calls["n"] <= 600:
            raise ObjectUnavailableError(object_id)
        return b"content"

    assert shorten_object_pull_backoff(initial=1e-5, cap=1e-5)
    defaults = inflatable_utils.pull_objects.__kwdefaults__
    assert defaults["max_tries_per_object"] is None and defaults["max_time"] == 7200  # Flower's time limit
    assert inflatable_utils.pull_objects(["a"], arrives_after_600_tries) == {"a": b"content"}
    calls["n"] = 0
    with pytest.raises(ObjectPullError):  # Flower's own count of tries would have given up
        inflatable_utils.pull_objects(["a"], arrives_after_600_tries, max_tries_per_object=500)
    assert shorten_object_pull_backoff()  # the defaults the runtime uses
    assert (defaults["initial_backoff"], defaults["backoff_cap"]) == (0.02, 0.5)


def _receive_one_message(pull, monkeypatch: pytest.MonkeyPatch, pull_object):  # type: ignore[no-untyped-def]
    """Flower's SuperNode state after ``pull`` took in one message of a known run; (return, state)."""
    import numpy as np
    from flwr.app import ArrayRecord, Message, RecordDict
    from flwr.supercore.inflatable.inflatable_object import get_object_tree
    from flwr.supercore.object_store.in_memory_object_store import InMemoryObjectStore
    from flwr.supercore.run import Run
    from flwr.supercore.task_identity import TaskIdentity
    from flwr.supernode.nodestate.in_memory_nodestate import InMemoryNodeState

    for name, value in (("_run_id", 42), ("_node_id", 1), ("_task_id", 5)):  # as in a ServerApp process
        monkeypatch.setattr(TaskIdentity, name, value)
    store = InMemoryObjectStore()
    state = InMemoryNodeState(store)
    state.set_node_id(7)
    state.store_run(Run.create_empty(42))  # a known run: no FAB is fetched
    message = Message(RecordDict({"w": ArrayRecord([np.ones(3)])}), dst_node_id=7, message_type="train")
    message.metadata.__dict__["_message_id"] = message.object_id
    tree = get_object_tree(message)
    out = pull(
        state=state,
        object_store=store,
        node_config={},
        receive=lambda: (message, tree),
        get_run=None,
        get_fab=None,
        pull_object=pull_object,
        confirm_message_received=lambda *_: None,
        trusted_entities=None,
    )
    return out, state, store, message


def test_a_message_dropped_because_its_run_stopped_leaves_no_task_behind(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import flwr.supernode.start_client_internal as sci
    from flwr.supercore.run import RunNotRunningException

    from hetfed.runtime.dropped import finishing_dropped

    def stopped(run_id: int, object_id: str) -> bytes:
        raise RunNotRunningException()

    # Flower 1.42 as it is: the message is ignored but its task stays pending (a warm worker
    # claiming it would wait 2 h for objects that never come) and the empty message stays.
    out, state, _, _ = _receive_one_message(sci._pull_and_store_message, monkeypatch, stopped)
    assert out is None
    assert [t.status.status for t in state.get_tasks(run_ids=[42])] == ["pending"]
    assert len(state.get_messages_legacy(is_reply=False)) == 1

    out, state, store, message = _receive_one_message(
        finishing_dropped(sci._pull_and_store_message), monkeypatch, stopped
    )
    assert out is None
    assert [(t.status.status, t.status.sub_status) for t in state.get_tasks(run_ids=[42])] == [
        ("finished", "failed")
    ]
    assert state.get_messages_legacy(is_reply=False) == []
    assert store.get(message.metadata.message_id) is None
    assert "create_task" not in vars(state) and "store_message" not in vars(state)  # the shadows are gone

    # A message that arrives whole keeps its pending task for the worker.
    objects = {}

    def served(run_id: int, object_id: str) -> bytes:
        return objects[object_id]

    def pull(**kwargs):  # type: ignore[no-untyped-def]
        from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects

        message, _ = kwargs["receive"]()
        objects.update({k: v.deflate() for k, v in get_all_nested_objects(message).items()})
        return finishing_dropped(sci._pull_and_store_message)(**kwargs)

    out, state, _, _ = _receive_one_message(pull, monkeypatch, served)
    assert out == 42
    assert [t.status.status for t in state.get_tasks(run_ids=[42])] == ["pending"]


def test_runtime_flags_and_isolation() -> None:
    assert split_runtime(["--superlink", "h:1", "--runtime", "stock"]) == ("stock", ["--superlink", "h:1"])
    assert split_runtime(["--insecure"]) == ("warm", ["--insecure"])
    with pytest.raises(SystemExit, match="--runtime must be one of warm, stock, got 'hot'"):
        split_runtime(["--runtime", "hot"])
    assert with_isolation(["--insecure", "--isolation", "subprocess", "--port", "9"], "process") == [
        "--insecure",
        "--port",
        "9",
        "--isolation",
        "process",
    ]
    assert with_isolation(["--isolation=subprocess"], "process") == ["--isolation", "process"]
    assert runtime_api(["--insecure"]) == ("127.0.0.1:9094", None)  # Flower's defaults
    assert runtime_api(["--host", "0.0.0.0", "--port", "7", "--ssl-ca-certfile", "ca.crt"]) == (
        "127.0.0.1:7",
        "ca.crt",
    )


def test_the_self_test_passes_on_flower_1_42_and_names_what_changed(monkeypatch: pytest.MonkeyPatch) -> None:
    assert internals.missing_internals() == []
    import flwr.supernode.runtime.run_clientapp as run_clientapp
    import flwr.supernode.start_client_internal as sci

    monkeypatch.delattr(run_clientapp, "push_task_output")
    monkeypatch.setattr(sci, "time", object())
    assert internals.missing_internals() == [
        "start_client_internal uses module `time`",
        "run_clientapp helpers pull_task_input / push_message / push_task_output",
    ]


def test_a_task_sends_its_first_heartbeat_after_flowers_interval_not_at_once() -> None:
    from flwr.common import constant as c
    from flwr.supercore.heartbeat import HeartbeatSender

    from hetfed.runtime.worker import after_the_first_interval

    # A claimed task lives HEARTBEAT_DEFAULT_INTERVAL s (activated: PATIENCE times that; the
    # self-test checks Flower's corestate says so); the sender's next beat comes before that.
    latest = (c.HEARTBEAT_DEFAULT_INTERVAL - c.HEARTBEAT_CALL_TIMEOUT) * (
        c.HEARTBEAT_BASE_MULTIPLIER + c.HEARTBEAT_RANDOM_RANGE[1]
    )
    assert latest < c.HEARTBEAT_DEFAULT_INTERVAL
    beats: dict[str, list[float]] = {"flower": [], "hetfed": []}
    for name, wrap in (("flower", lambda beat: beat), ("hetfed", after_the_first_interval)):
        sender = HeartbeatSender(wrap(lambda name=name: beats[name].append(time.monotonic()) is None))
        sender.start()
        time.sleep(0.5)
        sender.stop()
    assert len(beats["flower"]) == 1 and beats["hetfed"] == []  # Flower's first beat is immediate


# --- real processes ---------------------------------------------------------------------
def read_rows(run_dir: Path) -> list[dict]:
    with open(run_dir / "rounds.csv", newline="") as f:
        return list(csv.DictReader(f))


def start_federation(
    root: Path, runtime: str, nodes: int, extra: dict[int, dict] | None = None, asgi: str = "gated"
) -> LocalFlower:
    flower = LocalFlower(root, runtime=runtime, superlink_asgi=asgi)
    flower.start_superlink(cwd=REPO)
    for i in range(nodes):
        flower.start_supernode(
            i, {**node_config(i, nodes, flower.root, None, None), **(extra or {}).get(i, {})}
        )
    flower.wait_for_nodes(nodes)
    return flower


def run_to_end(flower: LocalFlower, app_dir: Path, cfg: dict, timeout: float = 900) -> dict:
    run_id = flower.submit(app_dir, cfg)
    status = flower.wait_run(run_id, timeout=timeout)
    assert status == "finished:completed", flower.run_log(run_id)[-3000:]
    return json.loads((Path(cfg["results-dir"]) / cfg["run-name"] / "summary.json").read_text())


def worker_pids(supernode: subprocess.Popen) -> list[int]:
    """The warm worker processes started by this SuperNode."""
    out = subprocess.run(
        ["ps", "-o", "pid=,args=", "--ppid", str(supernode.pid)], capture_output=True, text=True
    )
    return [int(line.split()[0]) for line in out.stdout.splitlines() if "hetfed.runtime.worker" in line]


@pytest.mark.deployment
def test_warm_stock_inline_and_either_superlink_give_the_same_per_client_metrics(tmp_path: Path) -> None:
    overrides = {
        **SMALL,
        "strategy": "fedrspo",
        "loss": "rspo+",
        "eta-o": 1.0,
        "num-rounds": 2,
        "personal-rounds": 1,
    }
    inline = run_inline(
        {**overrides, "results-dir": str(tmp_path / "inline"), "run-name": "x"}, node_configs(2)
    )
    results, runtime_answers = {}, {}
    # SuperNode runtime x SuperLink middleware: hetfed's and stock Flower's on either side of the wire.
    for runtime, asgi in (("warm", "gated"), ("stock", "gated"), ("warm", "stock"), ("stock", "stock")):
        name = f"{runtime}-{asgi}"
        flower = start_federation(tmp_path / name, runtime, 2, asgi=asgi)
        try:
            cfg = prepare({**overrides, "run-name": name}, "deployment", tmp_path / "results")
            run_id = flower.submit(REPO, cfg)
            assert flower.wait_run(run_id, timeout=900) == "finished:completed", flower.run_log(run_id)[
                -3000:
            ]
            results[name] = json.loads((tmp_path / "results" / name / "summary.json").read_text())
            # The ServerApp's objects (hetfed.runtime.object_batch.batch_grid): batched where the
            # SuperLink has the routes, Flower's single requests (said once) where it has not.
            run_log = flower.run_log(run_id)
            moved = [tuple(map(int, m)) for m in SERVERAPP_MOVED.findall(run_log)]
            assert len(moved) == 1 and (min(moved[0]) > 0) == (asgi == "gated"), (moved, run_log[-2000:])
            said = run_log.count("the SuperLink has no batched object routes")
            assert said == (asgi == "stock"), run_log[-2000:]
            with ControlApi(flower.home, CONNECTION) as control:
                curves = {bytes_to_public_key(n.public_key).curve.name for n in control.nodes()}
            # hetfed.runtime.node_key: a warm SuperNode registers itself with a P-256 key
            assert curves == {"secp256r1" if runtime == "warm" else "secp384r1"}, (name, curves)
            # hetfed.runtime.telemetry_off: no Flower process it starts reports to Flower's server
            if asgi == "gated":  # the SuperNode's Runtime API: buffered (warm) or Flower's (stock)
                runtime_answers[runtime] = runtime_api_answers(flower)
            for has_routes, base in (
                (runtime == "warm", supernode_runtime_api),
                (asgi == "gated", lambda f: f"http://{f.address}"),
            ):
                if has_routes:  # a warm SuperNode's Runtime API, and hetfed-superlink's
                    batch, single = object_route_refusals(base(flower))
                    assert batch == single, (batch, single)  # Flower's own token check and error reply
                    assert {status for status, _ in batch} == {401}, batch
                    # A refused batch (a stopped run's revoked token) goes to Flower's single request,
                    # which meets the refusal Flower's way (tests/test_object_batch_fallback.py).
                    calls, _ = pushed_through(base(flower).removeprefix("http://"), [WRONG_TOKEN])
                    assert calls == [(PUSH, "401"), ("/v1/runtime/push-object", "401")], calls
            if asgi == "gated" and runtime == "warm":  # the SuperLink's: Flower's node authentication
                batch, single = fleet_route_refusals(flower)
                assert batch == single, (batch, single)
                assert [status for status, _ in batch[:4]] == [401] * 4, batch
                assert batch[4][0] >= 400 and batch[4][0] != 401, batch  # authenticated; run 1 not running
                assert [status for status, _ in batch[-3:]] == [401, 401, 200], batch
            environs = flower_environs(flower)
            assert len(environs) > len(flower.processes) or runtime == "stock"  # warm: the workers too
            for pid, environ in environs.items():
                assert b"\0FLWR_TELEMETRY_ENABLED=0\0" in b"\0" + environ, (name, pid)
        finally:
            flower.stop()
        log = (tmp_path / name / "supernode-0.log").read_text()
        assert ("hetfed warm worker" in log) == (runtime == "warm"), log[-2000:]
        assert ("buffered Runtime API" in log) == (runtime == "warm"), log[-2000:]
        # (pulled, pushed, confirmed) per task: the task's message confirmed with its objects' batch
        moved = [tuple(map(int, m)) for m in OBJECTS_MOVED.findall(log)]
        assert (len(moved) > 0 and all(p > 0 and q > 0 and c == 1 for p, q, c in moved)) == (
            runtime == "warm"
        ), moved
        # A warm SuperNode moves a message's objects in one Fleet request each way where the SuperLink
        # has the routes (hetfed's), one request each where it has not (Flower's: said once).
        fleet = FLEET_MOVED.findall(log)
        if runtime == "warm" and asgi == "gated":
            assert {kind for _, kind in fleet} == {"pulled from", "pushed to"}, log[-2000:]
            assert all(int(count) > 0 for count, _ in fleet), fleet
        else:
            assert not fleet, fleet
        for said in ("the SuperLink has no batched object routes", "the SuperLink holds no pulls"):
            assert log.count(said) == (runtime == "warm" and asgi == "stock"), (said, log[-2000:])
        log = (tmp_path / name / "superlink.log").read_text()
        assert ("HTTP middleware gated by API path" in log) == (asgi == "gated"), log[-2000:]
        assert ("objects in one Fleet request each way" in log) == (asgi == "gated"), log[-2000:]
        assert ("an empty pull is held up to" in log) == (asgi == "gated"), log[-2000:]
    assert runtime_answers["warm"] == runtime_answers["stock"]
    assert {status for status, _, _ in runtime_answers["warm"]} == {200, 400, 404, 415}
    for runtime, summary in results.items():
        assert sorted(summary["clients"]) == sorted(inline["clients"]) == ["client-00", "client-01"]
        for name, metrics in inline["clients"].items():
            assert "per-relative-regret" in metrics
            for key, value in metrics.items():
                assert summary["clients"][name][key] == pytest.approx(value, rel=1e-6), (runtime, name, key)


def runtime_api_answers(flower: LocalFlower) -> list[tuple[int, bytes, list[tuple[str, str]]]]:
    """Status, body and headers (but the date) of supernode-0's Runtime API for requests a ClientApp
    process would not send: malformed, token-less, wrongly typed, unknown."""
    argv = list(flower.processes["supernode-0"].args)
    base = f"http://127.0.0.1:{argv[argv.index('--port') + 1]}"
    protobuf = {"Content-Type": "application/protobuf"}
    calls = [
        ("GET", "/health", b"", protobuf),
        ("POST", "/v1/runtime/pull-task-input", b"\xff\x00garbage", protobuf),
        ("POST", "/v1/runtime/acquire-task", b"", protobuf),
        ("POST", "/v1/runtime/pull-messages", b"{}", {"Content-Type": "application/json"}),
        ("POST", "/v1/runtime/no-such-call", b"", protobuf),
    ]
    answers = []
    for method, path, body, headers in calls:
        reply = httpx.request(method, base + path, content=body, headers=headers)
        kept = [(k, v) for k, v in reply.headers.multi_items() if k != "date"]
        answers.append((reply.status_code, reply.content, kept))
    return answers


WRONG_TOKEN = RuntimeTokenHttpInterceptor(token="not-a-token")
OBJECTS_MOVED = re.compile(r"objects in one request each way: (\d+) pulled, (\d+) pushed; (\d+) confirmed")


def supernode_runtime_api(flower: LocalFlower) -> str:
    argv = list(flower.processes["supernode-0"].args)
    return f"http://127.0.0.1:{argv[argv.index('--port') + 1]}"


def object_route_refusals(base: str) -> tuple[list[tuple[int, bytes]], list[tuple[int, bytes]]]:
    """Status and body of the Runtime API's batched object routes at ``base`` (hetfed.runtime.object_batch:
    a SuperNode's, or the SuperLink's) and of Flower's single-object routes, for the same requests
    without a task token and with a wrong one."""
    from flwr.proto.message_pb2 import PullObjectRequest, PushObjectRequest
    from flwr.supercore.constant import TASK_TOKEN_HEADER

    from hetfed.runtime.object_batch import MEDIA_TYPE, PULL, PUSH, framed

    pull = PullObjectRequest(object_id="0" * 64).SerializeToString()
    push = PushObjectRequest(object_id="0" * 64, object_content=b"x", session_id="s").SerializeToString()
    batch, single = [], []
    for token in ({}, {TASK_TOKEN_HEADER: "not-a-token"}):
        for path, one, body in (
            (PULL, "/v1/runtime/pull-object", pull),
            (PUSH, "/v1/runtime/push-object", push),
        ):
            reply = httpx.post(
                base + path, content=framed([body]), headers={"content-type": MEDIA_TYPE, **token}
            )
            batch.append((reply.status_code, reply.content))
            reply = httpx.post(
                base + one, content=body, headers={"content-type": "application/protobuf", **token}
            )
            single.append((reply.status_code, reply.content))
    return batch, single


def fleet_route_refusals(flower: LocalFlower) -> tuple[list[tuple[int, bytes]], list[tuple[int, bytes]]]:
    """Status and body of the SuperLink's batched object routes (hetfed.runtime.object_batch) and of
    Flower's single-object routes for the same requests: unsigned, signed by an unregistered key,
    signed by a registered node (for a run that is not running); then a batch whose second request
    names another node, against the single request signed by the unregistered key; then the held
    pull against Flower's pull, unsigned, by the unregistered key and by the node (nothing to pull)."""
    from base64 import b64encode

    from flwr.common.constant import TIMESTAMP_HEADER
    from flwr.proto.fleet_pb2 import (
        ActivateNodeRequest,
        ActivateNodeResponse,
        PullMessagesRequest,
        RegisterNodeFleetRequest,
    )
    from flwr.proto.message_pb2 import PullObjectRequest, PushObjectRequest
    from flwr.proto.node_pb2 import Node
    from flwr.supercore.constant import FLEET_HTTP_PUBLIC_KEY_HEADER, FLEET_HTTP_SIGNATURE_HEADER
    from flwr.supercore.date import now
    from flwr.supercore.primitives.asymmetric import generate_key_pairs, public_key_to_bytes, sign_message

    from hetfed.runtime.held_pull import PULL_MESSAGES, WAIT
    from hetfed.runtime.object_batch import FLEET_PULL, FLEET_PUSH, MEDIA_TYPE, framed

    base, protobuf = f"http://{flower.address}", {"content-type": "application/protobuf"}

    def signed(keys: tuple) -> dict[str, str]:  # what Flower's NodeAuthHttpInterceptor sends
        stamp = now().isoformat()
        return {
            FLEET_HTTP_PUBLIC_KEY_HEADER: b64encode(public_key_to_bytes(keys[1])).decode(),
            TIMESTAMP_HEADER: stamp,
            FLEET_HTTP_SIGNATURE_HEADER: b64encode(sign_message(keys[0], stamp.encode())).decode(),
        }

    mine, stranger = generate_key_pairs(), generate_key_pairs()
    key = public_key_to_bytes(mine[1])
    for path, request in (
        ("register-node", RegisterNodeFleetRequest(public_key=key)),
        ("activate-node", ActivateNodeRequest(public_key=key, heartbeat_interval=30)),
    ):
        reply = httpx.post(
            f"{base}/v1/fleet/{path}",
            content=request.SerializeToString(),
            headers={**protobuf, **signed(mine)},
        )
        assert reply.status_code == 200, reply.text
    node = Node(node_id=ActivateNodeResponse.FromString(reply.content).node_id)
    pull = PullObjectRequest(node=node, run_id=1, object_id="0" * 64)
    push = PushObjectRequest(node=node, run_id=1, object_id="0" * 64, object_content=b"x", session_id="s")
    batch, single = [], []
    for headers in (lambda: {}, lambda: signed(stranger), lambda: signed(mine)):
        for path, one, body in (
            (FLEET_PULL, "/v1/fleet/pull-object", pull.SerializeToString()),
            (FLEET_PUSH, "/v1/fleet/push-object", push.SerializeToString()),
        ):
            reply = httpx.post(
                base + path, content=framed([body]), headers={"content-type": MEDIA_TYPE, **headers()}
            )
            batch.append((reply.status_code, reply.content))
            reply = httpx.post(base + one, content=body, headers={**protobuf, **headers()})
            single.append((reply.status_code, reply.content))
    other = PullObjectRequest(node=Node(node_id=node.node_id + 1), run_id=1, object_id="0" * 64)
    mixed = framed([pull.SerializeToString(), other.SerializeToString()])
    reply = httpx.post(base + FLEET_PULL, content=mixed, headers={"content-type": MEDIA_TYPE, **signed(mine)})
    batch.append((reply.status_code, reply.content))
    single.append(single[2])  # the unregistered key's answer: 401, Flower's body
    # The held pull (hetfed.runtime.held_pull): Flower's answers; with nothing for the node, held WAIT s.
    messages = PullMessagesRequest(node=node).SerializeToString()
    for headers in (lambda: {}, lambda: signed(stranger), lambda: signed(mine)):
        started = time.monotonic()
        reply = httpx.post(
            base + PULL_MESSAGES, content=messages, headers={**protobuf, **headers()}, timeout=30
        )
        held = time.monotonic() - started
        batch.append((reply.status_code, reply.content))
        reply = httpx.post(
            base + "/v1/fleet/pull-messages", content=messages, headers={**protobuf, **headers()}
        )
        single.append((reply.status_code, reply.content))
    assert WAIT - 0.5 < held < WAIT + 5, held  # the last: authenticated, nothing to pull
    return batch, single


SERVERAPP_MOVED = re.compile(
    r"hetfed ServerApp: objects in one request each way: (\d+) pulled, (\d+) pushed; (\d+) replies confirmed"
)
FLEET_MOVED = re.compile(r"hetfed: (\d+) objects (pulled from|pushed to) the SuperLink in one request")


def flower_environs(flower: LocalFlower) -> dict[int, bytes]:
    """The environment of every live process of the federation's process groups (SuperLink,
    ServerApp, SuperNodes, workers); a process gone while being read is left out."""
    environs = {}
    for proc, _ in group_processes({p.pid for p in flower.processes.values()}):
        try:
            environs[int(proc.name)] = (proc / "environ").read_bytes()
        except OSError:
            continue
    return environs


@pytest.fixture(scope="module")
def drills(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalFlower]:
    """3 warm SuperNodes: node 1 stalls 120 s in round 2 (its worker is killed), node 2 raises in round 3."""
    root = tmp_path_factory.mktemp("warm")
    flower = start_federation(
        root / "fed", "warm", 3, {1: {"stall-round": 2, "stall-seconds": 120}, 2: {"fail-round": 3}}
    )
    try:
        yield flower
    finally:
        flower.stop()


@pytest.mark.deployment
def test_a_killed_worker_fails_only_its_task_and_the_restarted_worker_serves_the_next_round(
    drills: LocalFlower, tmp_path: Path
) -> None:
    node = drills.processes["supernode-1"]
    log = drills.root / "supernode-1.log"
    (first,) = worker_pids(node)
    cfg = prepare(
        {**SMALL, "num-rounds": 4, "run-name": "kill", "round-timeout": 300.0}, "deployment", tmp_path
    )
    run_id = drills.submit(REPO, cfg)
    end = time.time() + 300
    while "ROUND 2]" not in log.read_text() and time.time() < end:  # node 1 has round 2's message
        time.sleep(0.2)
    time.sleep(1.0)  # ... and its worker is inside the 120 s stall
    os.kill(first, signal.SIGKILL)
    started = time.time()
    assert drills.wait_run(run_id, timeout=600) == "finished:completed", drills.run_log(run_id)[-3000:]
    assert time.time() - started < 100  # answered at once, not after the stall or a heartbeat timeout

    rows = {(r["round"], r["client"]): r for r in read_rows(tmp_path / "kill") if r["exchange"] == "train"}
    assert rows[("2", "client-01")]["status"] == "failed"
    assert "ClientApp stopped responding" in rows[("2", "client-01")]["error"], rows[("2", "client-01")]
    assert rows[("3", "client-01")]["status"] == rows[("4", "client-01")]["status"] == "ok"  # restarted
    assert rows[("3", "client-02")]["status"] == "failed"  # the raising ClientApp: an Error reply
    assert "fault drill" in rows[("3", "client-02")]["error"]
    assert all(rows[(str(r), "client-00")]["status"] == "ok" for r in range(1, 5))
    (second,) = worker_pids(node)
    assert second != first
    text = log.read_text()
    assert "hetfed warm worker exited with code -9 while running task" in text
    summary = json.loads((tmp_path / "kill" / "summary.json").read_text())
    assert sorted(summary["clients"]) == ["client-00", "client-01", "client-02"]


@pytest.mark.deployment
def test_a_new_app_build_is_served_by_a_fresh_interpreter(drills: LocalFlower, tmp_path: Path) -> None:
    """A one-line change (a canary written when client/app.py is imported) is a new FAB hash."""
    app = tmp_path / "app"
    files = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        text=True,
    ).stdout.split()
    for name in files:
        if (REPO / name).is_file() and not name.startswith(("docs/", "tests/")):
            (app / name).parent.mkdir(parents=True, exist_ok=True)
            (app / name).write_bytes((REPO / name).read_bytes())
    canary = tmp_path / "canary"
    with open(app / "client" / "app.py", "a") as f:
        f.write(f"\n__import__('pathlib').Path({str(canary)!r}).write_text(str(__import__('os').getpid()))\n")
    node = drills.processes["supernode-0"]
    overrides = {**SMALL, "num-rounds": 1}
    if "loaded app" not in (drills.root / "supernode-0.log").read_text():  # run alone: the old build first
        run_to_end(drills, REPO, prepare({**overrides, "run-name": "build-0"}, "deployment", tmp_path))
    (before,) = worker_pids(node)
    run_to_end(drills, app, prepare({**overrides, "run-name": "build-b"}, "deployment", tmp_path))
    assert canary.exists()  # the new build's code ran on the silos ...
    assert int(canary.read_text()) in {
        pid for n in range(3) for pid in worker_pids(drills.processes[f"supernode-{n}"])
    }
    (after,) = worker_pids(node)
    assert after == before  # ... in the same worker process, re-executed (same pid)
    assert "new app build" in (drills.root / "supernode-0.log").read_text()
    canary.unlink()
    run_to_end(drills, REPO, prepare({**overrides, "run-name": "build-a"}, "deployment", tmp_path))
    assert not canary.exists()  # back on the original build: no module of build B was left loaded


@pytest.mark.deployment
def test_stock_fallback_and_an_external_worker(tmp_path: Path) -> None:
    """Node 0: warm. Node 1: its Flower internals differ (a sitecustomize stands in for a Flower
    release that reorganised start_client_internal), so it runs stock and says so. Node 2: warm
    with ``--worker external``, served by a ``hetfed-worker`` started on its own (as in compose).
    Node 3: Flower's own ``flower-supernode`` (process isolation), served by a ``hetfed-worker``,
    which finds no batched object routes there and sends Flower's single requests."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        "import time, types\n"
        "import flwr.supernode.start_client_internal as sci\n"
        "sci.time = types.SimpleNamespace(sleep=time.sleep, time=time.time, monotonic=time.monotonic)\n"
    )
    flower = LocalFlower(tmp_path / "fed", runtime="warm")
    try:
        flower.start_superlink(cwd=REPO)
        flower.start_supernode(0, node_config(0, 4, flower.root, None, None))
        plain_env = flower.env
        flower.env = {**plain_env, "PYTHONPATH": str(site)}  # only SuperNode 1 sees the change
        flower.start_supernode(1, node_config(1, 4, flower.root, None, None))
        flower.env = plain_env
        port = free_port()
        args = supernode_args(
            superlink=flower.address,
            node_config=node_config(2, 4, flower.root, None, None),
            ca=None,
            port=port,
        )
        flower.spawn("supernode-2", supernode_command("warm", ["--worker", "external", *args]))
        flower.spawn("worker-2", [str(BIN / "hetfed-worker"), "--runtime-api-address", f"127.0.0.1:{port}"])
        port = free_port()
        config = node_config(3, 4, flower.root, None, None)
        args = supernode_args(
            superlink=flower.address, node_config=config, ca=None, port=port, isolation="process"
        )
        flower.spawn("supernode-3", supernode_command("stock", args))
        flower.spawn("worker-3", [str(BIN / "hetfed-worker"), "--runtime-api-address", f"127.0.0.1:{port}"])
        flower.wait_for_nodes(4)
        cfg = prepare({**SMALL, "num-rounds": 1, "run-name": "mixed"}, "deployment", tmp_path / "results")
        summary = run_to_end(flower, REPO, cfg)
    finally:
        flower.stop()
    assert sorted(summary["clients"]) == ["client-00", "client-01", "client-02", "client-03"]
    stock = (flower.root / "supernode-1.log").read_text()
    lines = [ln for ln in stock.splitlines() if "warm runtime off" in ln]
    assert len(lines) == 1 and "start_client_internal uses module `time`" in lines[0], stock[-2000:]
    assert "hetfed warm worker" not in stock
    assert "hetfed warm worker" in (flower.root / "supernode-0.log").read_text()
    assert "worker external" in (flower.root / "supernode-2.log").read_text()
    assert "task " in (flower.root / "worker-2.log").read_text()  # the external worker served node 2
    moved = {n: OBJECTS_MOVED.findall((flower.root / f"worker-{n}.log").read_text()) for n in (2, 3)}
    assert moved[2] and all(int(pulled) > 0 for pulled, _, _ in moved[2]), moved  # hetfed's routes
    assert moved[3] and all(m == ("0", "0", "0") for m in moved[3]), moved  # Flower's: one request each
    worker3 = (flower.root / "worker-3.log").read_text()
    assert worker3.count("no batched object routes") == 1, worker3[-2000:]


@pytest.mark.deployment
def test_a_restarted_supernode_restores_its_client_state_from_its_state_dir(tmp_path: Path) -> None:
    """Ditto keeps each client's personal model across rounds in its state dir.

    SuperNode 1 stalls in round 3 and is killed there (SuperNode and worker), then restarted
    with the same partition and state dir: round 3 fails for client-01, and rounds 4-5 must
    continue from the personal model it saved in round 2. The inline run with a fault drill
    in round 3 (raised before any state is touched) is the reference.
    """
    overrides = {**SMALL, "strategy": "fedrspo", "loss": "mse", "ditto-mu": 0.1, "personal-rounds": 0}
    overrides |= {"num-rounds": 5, "round-timeout": 300.0}
    flower = start_federation(tmp_path / "fed", "warm", 3, {1: {"stall-round": 3, "stall-seconds": 300}})
    try:
        cfg = prepare({**overrides, "run-name": "restart"}, "deployment", tmp_path / "results")
        run_id = flower.submit(REPO, cfg)
        log = flower.root / "supernode-1.log"
        end = time.time() + 300
        while "ROUND 3]" not in log.read_text() and time.time() < end:
            time.sleep(0.2)
        time.sleep(1.0)  # inside the stall of round 3
        os.killpg(flower.processes["supernode-1"].pid, signal.SIGKILL)
        state_dir = Path(node_config(1, 3, flower.root, None, None)["state-dir"])
        assert list(state_dir.rglob("personal.npz")), "round 2 left no personal model on disk"
        flower.start_supernode(1, node_config(1, 3, flower.root, None, None))  # same partition and state
        assert flower.wait_run(run_id, timeout=900) == "finished:completed", flower.run_log(run_id)[-3000:]
    finally:
        flower.stop()
    rows = {(r["round"], r["client"]): r for r in read_rows(tmp_path / "results" / "restart")}
    assert rows[("3", "client-01")]["status"] == "failed"
    assert rows[("4", "client-01")]["status"] == rows[("5", "client-01")]["status"] == "ok"
    deployed = json.loads((tmp_path / "results" / "restart" / "summary.json").read_text())

    configs = node_configs(3)
    configs[1]["fail-round"] = 3
    inline = run_inline({**overrides, "results-dir": str(tmp_path / "inline"), "run-name": "ref"}, configs)
    clean = run_inline(
        {**overrides, "results-dir": str(tmp_path / "inline"), "run-name": "clean"}, node_configs(3)
    )
    assert "per-relative-regret" in inline["clients"]["client-01"]
    # The reference is sensitive to client-01's missing round 3 ...
    assert (
        clean["clients"]["client-01"]["per-relative-regret"]
        != inline["clients"]["client-01"]["per-relative-regret"]
    )
    # ... and the restarted SuperNode reproduces it: it continued from its saved state.
    for name, metrics in inline["clients"].items():
        for key, value in metrics.items():
            assert deployed["clients"][name][key] == pytest.approx(value, rel=1e-6), (name, key)


def reported_memory(log: Path) -> tuple[float, float]:
    """(RSS, peak) in MB of the worker's last task line in this SuperNode's log."""
    rss, peak = re.findall(r"reply [\d.]+ s; RSS (\d+) MB \(peak (\d+) MB\)", log.read_text())[-1]
    return float(rss), float(peak)


def proc_memory(pid: int) -> tuple[float, float]:
    """(VmRSS, VmHWM) in MB of process ``pid``, from /proc."""
    status = Path(f"/proc/{pid}/status").read_text()
    rss, peak = (int(re.findall(rf"{key}:\s+(\d+) kB", status)[0]) / 1024 for key in ("VmRSS", "VmHWM"))
    return rss, peak


def maps(pid: int, library: str) -> bool:
    """Process ``pid`` has a shared library named ``library`` mapped (libtorch: torch is loaded;
    _pydantic_core: Flower's imports loaded FastAPI for real)."""
    return library in Path(f"/proc/{pid}/maps").read_text()


@pytest.mark.deployment
def test_a_numpy_run_holds_no_torch_even_after_a_torch_run(tmp_path: Path) -> None:
    """Lean silos: PF-LSA on Garnet (NumPy), then FedAvg on the knapsack (torch), then PF-LSA
    again, on the same 2 warm SuperNodes. The NumPy runs' worker never maps libtorch (the third
    run's first message restarts the worker, which keeps its pid); no run's worker maps FastAPI's
    pydantic (hetfed/runtime/deferred_imports.py); the RSS and peak it reports are /proc's, far
    below torch's ~180 MB alone; and the restarted worker's per-client metrics are the inline
    engine's."""
    numpy_run = {"strategy": "pflsa", "problem": "garnet", "num-rounds": 3, "seed": 2}
    torch_run = {**SMALL, "strategy": "fedavg", "problem": "knapsack", "num-rounds": 1}
    flower = start_federation(tmp_path / "fed", "warm", 2)
    try:
        log = flower.root / "supernode-0.log"
        (worker,) = worker_pids(flower.processes["supernode-0"])
        seen = []
        for name, overrides in (("numpy-1", numpy_run), ("torch", torch_run), ("numpy-2", numpy_run)):
            cfg = prepare({**overrides, "run-name": name}, "deployment", tmp_path / "results")
            summary = run_to_end(flower, REPO, cfg)
            seen.append((maps(worker, "libtorch"), reported_memory(log), proc_memory(worker)))
            assert not maps(worker, "_pydantic_core"), name
        assert worker_pids(flower.processes["supernode-0"]) == [worker]
    finally:
        flower.stop()
    assert [torch for torch, _, _ in seen] == [False, True, False], seen
    for _, (rss, peak), (proc_rss, proc_peak) in seen:
        assert peak == pytest.approx(proc_peak, abs=1)  # the idle worker's peak is still its last task's
        # After its line the task's message, reply and input are freed.
        assert rss - 20 < proc_rss <= rss + 1, seen
    # torch alone is ~180 MB; the peak of a re-executed worker counts only since the restart
    assert seen[0][1][1] < 150 and seen[2][1][1] < 150 < seen[1][1][0], seen
    restarts = [ln for ln in log.read_text().splitlines() if "not keeping what earlier runs imported" in ln]
    assert len(restarts) == 1 and "torch" in restarts[0], restarts  # only before the run after torch's
    inline = run_inline(
        {**numpy_run, "results-dir": str(tmp_path / "inline"), "run-name": "x"}, node_configs(2)
    )
    assert sorted(summary["clients"]) == sorted(inline["clients"]) == ["client-00", "client-01"]
    for name, metrics in inline["clients"].items():
        assert metrics  # the final evaluation's metrics
        for key, value in metrics.items():
            assert summary["clients"][name][key] == pytest.approx(value, rel=1e-6), (name, key)


def test_the_supernode_fast_path_installs_only_on_the_flower_it_was_read_in(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import flwr.supernode.main as supernode_main

    from hetfed.runtime import fast_path

    stock = supernode_main.create_app
    monkeypatch.setitem(fast_path.SUPERNODE_APP, "flwr.supernode.main:create_app", "0" * 64)
    assert fast_path.install_on_supernode() == (
        "the source of flwr.supernode.main:create_app as read in Flower 1.42.0"
    )
    assert supernode_main.create_app is stock  # nothing patched: the SuperNode runs stock
    monkeypatch.undo()
    monkeypatch.setattr(supernode_main, "create_app", stock)  # restored after the test
    assert fast_path.install_on_supernode() == ""
    app = supernode_main.create_app(state_factory=None)
    (layer,) = app.user_middleware
    assert layer.cls is fast_path.ProtobufFastPath
    assert [m.cls.__name__ for m in layer.kwargs["chain"]] == [
        "BaseHTTPMiddleware",
        "ProtobufTranslationMiddleware",
    ]
