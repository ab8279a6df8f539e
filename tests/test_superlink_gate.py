"""hetfed-superlink (hetfed/runtime/superlink.py): Flower's SuperLink with its path-specific HTTP
middleware entered only on its own API's paths must answer every request as stock Flower does.

A gated and a stock SuperLink run side by side; the same requests (health, Control API calls incl.
a sensitive route whose response headers only the gated Control layer sets, malformed, unsigned,
wrongly typed and signed Fleet API calls, Runtime API calls, an unknown path) get the same status,
body and headers from both; Fleet and Runtime calls take hetfed's buffered fast path. A SuperLink
whose Flower differs from what the gate was read in runs stock, saying so in one line. Rounds over
every mix of gated/stock SuperLink and warm/stock SuperNodes: tests/test_warm_runtime.py.
"""

from __future__ import annotations

import base64
import datetime as dt
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from hetfed.engines.control_api import ControlApi
from hetfed.engines.flower import LocalFlower, free_port, superlink_args
from hetfed.runtime import object_batch, pull
from hetfed.runtime.superlink import (
    GATED,
    PINNED_SOURCE,
    ProtobufFastPath,
    gated_middleware,
    hetfed_middleware,
    missing_gate_internals,
)

PROTOBUF = {"Content-Type": "application/protobuf"}
# (method, path, body): every API of the SuperLink, well-formed where no state is needed.
REQUESTS = [
    ("GET", "/health", b""),
    ("POST", "/v1/control/get-login-details", b""),  # sensitive: no-store headers, set by a gated layer
    ("POST", "/v1/control/list-runs", b"\xff\x00garbage"),
    ("POST", "/v1/fleet/pull-messages", b"\xff\x00garbage"),
    ("POST", "/v1/fleet/pull-messages", b""),  # well-formed, unsigned: refused by node authentication
    ("POST", "/v1/fleet/send-node-heartbeat", b""),
    ("POST", "/v1/runtime/get-nodes", b""),  # without the ServerApp's token
    ("POST", "/v1/runtime/pull-messages", b"\xff"),
    ("GET", "/v1/no-such-api", b""),
]
UNCOMPARED_HEADERS = ("date",)


def test_the_gate_self_test_passes_on_this_flower_and_gates_six_layers() -> None:
    from flwr.superlink.main import _get_middleware

    assert missing_gate_internals() == []
    stock = _get_middleware()
    gated = gated_middleware(_get_middleware)
    assert len(gated) == len(stock) == 8
    wrapped = [g.kwargs["middleware"] for g in gated if g.kwargs.get("middleware")]
    assert len(wrapped) == len(GATED) == 6 and set(wrapped) < {s.cls for s in stock}
    kept = [s.cls for s, g in zip(stock, gated, strict=True) if g.cls is s.cls]  # errors, protobuf
    assert len(kept) == 2
    (outer,) = hetfed_middleware(_get_middleware)
    assert outer.cls is ProtobufFastPath and len(outer.kwargs["chain"]) == 8
    fast = ProtobufFastPath(lambda *_: None, **outer.kwargs)
    assert {("POST", "/v1/fleet/pull-messages"), ("POST", "/v1/runtime/pull-messages")} <= fast.routes
    assert not any(path.startswith("/v1/control/") for _, path in fast.routes)


@pytest.fixture(scope="module")
def superlinks(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, LocalFlower]]:
    root = tmp_path_factory.mktemp("gate")
    started = {asgi: LocalFlower(root / asgi, superlink_asgi=asgi) for asgi in ("gated", "stock")}
    try:
        for flower in started.values():
            flower.start_superlink()
        yield started
    finally:
        for flower in started.values():
            flower.stop()


def answer(
    flower: LocalFlower, method: str, path: str, body: bytes, headers: dict[str, str] = PROTOBUF
) -> tuple[int, bytes, list[tuple[str, str]]]:
    response = httpx.request(method, f"http://{flower.address}{path}", content=body, headers=headers)
    kept = [(k, v) for k, v in response.headers.multi_items() if k not in UNCOMPARED_HEADERS]
    return response.status_code, response.content, kept


def signed(key: Any) -> dict[str, str]:
    """Headers of a SuperNode's signed Fleet call, as Flower's NodeAuthHttpInterceptor makes them."""
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec
    from flwr.supercore.primitives.asymmetric import public_key_to_bytes

    stamp = dt.datetime.now(dt.UTC).isoformat()
    return {
        **PROTOBUF,
        "flwr-public-key": base64.b64encode(public_key_to_bytes(key.public_key())).decode(),
        "flwr-timestamp": stamp,
        "flwr-signature": base64.b64encode(key.sign(stamp.encode(), ec.ECDSA(hashes.SHA256()))).decode(),
    }


@pytest.mark.deployment
def test_a_gated_superlink_answers_every_api_as_stock_flower(superlinks: dict[str, LocalFlower]) -> None:
    gated, stock = superlinks["gated"], superlinks["stock"]
    assert "HTTP middleware gated by API path" in (gated.root / "superlink.log").read_text()
    assert "a node's pull sees its own complete messages" in (gated.root / "superlink.log").read_text()
    assert "gated" not in (stock.root / "superlink.log").read_text()
    statuses = set()
    for method, path, body in REQUESTS:
        assert answer(gated, method, path, body) == answer(stock, method, path, body), (method, path, body)
        statuses.add(answer(gated, method, path, body)[0])
    assert len(statuses) >= 4  # the requests reach handlers, refusals and a missing route
    _, _, headers = answer(gated, "POST", "/v1/control/get-login-details", b"")
    assert dict(headers)["cache-control"] == "no-store"  # the gated Control layer ran on its path
    status, body, _ = answer(gated, "POST", "/v1/fleet/pull-messages", b"")
    assert status == 401 and b"Invalid SuperNode authentication" in body  # node authentication ran
    wrong_type = {"Content-Type": "application/json"}
    assert answer(gated, "POST", "/v1/fleet/pull-messages", b"{}", wrong_type) == answer(
        stock, "POST", "/v1/fleet/pull-messages", b"{}", wrong_type
    )
    assert answer(gated, "POST", "/v1/fleet/pull-messages", b"", wrong_type)[0] == 415
    assert_signed_calls_agree(gated, stock)
    for flower in (gated, stock):  # well-formed Control calls (their replies carry the time)
        with ControlApi(flower.home, "hetfed") as control:
            assert control.runs() == {} and control.online_nodes() == 2  # the signed SuperNodes


def assert_signed_calls_agree(gated: LocalFlower, stock: LocalFlower) -> None:
    """Signed Fleet calls of a P-256 and a P-384 SuperNode: registration (a fresh node id each),
    activation, a pull that finds nothing, a pull under another node's id (refused)."""
    from cryptography.hazmat.primitives.asymmetric import ec
    from flwr.proto.fleet_pb2 import (
        ActivateNodeRequest,
        PullMessagesRequest,
        PullMessagesResponse,
        RegisterNodeFleetRequest,
        RegisterNodeFleetResponse,
    )
    from flwr.proto.node_pb2 import Node
    from flwr.supercore.primitives.asymmetric import public_key_to_bytes

    for curve in (ec.SECP256R1(), ec.SECP384R1()):
        ids = {}
        for name, flower in (("gated", gated), ("stock", stock)):
            key = ec.generate_private_key(curve)
            public = public_key_to_bytes(key.public_key())
            register = RegisterNodeFleetRequest(public_key=public).SerializeToString()
            status, body, headers = answer(flower, "POST", "/v1/fleet/register-node", register, signed(key))
            ids[name] = (status, [k for k, _ in headers])
            node = RegisterNodeFleetResponse.FromString(body).node_id
            assert status == 200 and node != 0
            activate = ActivateNodeRequest(public_key=public, heartbeat_interval=30).SerializeToString()
            assert answer(flower, "POST", "/v1/fleet/activate-node", activate, signed(key))[0] == 200
            pull = PullMessagesRequest(node=Node(node_id=node)).SerializeToString()
            status, body, headers = answer(flower, "POST", "/v1/fleet/pull-messages", pull, signed(key))
            assert (status, PullMessagesResponse.FromString(body).messages_list) == (200, [])
            ids[name + "-pull"] = (status, headers)
            other = PullMessagesRequest(node=Node(node_id=node + 1)).SerializeToString()
            ids[name + "-other"] = answer(flower, "POST", "/v1/fleet/pull-messages", other, signed(key))
        assert ids["gated"] == ids["stock"] and ids["gated-pull"] == ids["stock-pull"]
        assert ids["gated-other"] == ids["stock-other"] and ids["gated-other"][0] == 401


@pytest.mark.deployment
def test_a_flower_the_gate_was_not_read_in_runs_stock_and_says_so(tmp_path: Path) -> None:
    port = free_port()
    changed, changed_pull = next(iter(PINNED_SOURCE)), next(iter(pull.PINNED_SOURCE))
    changed_objects = next(iter(object_batch.SUPERLINK_PINNED))
    script = (
        "import sys, hetfed.runtime.superlink as s, hetfed.runtime.pull as p, "
        "hetfed.runtime.object_batch as o; "
        f"s.PINNED_SOURCE[{changed!r}] = '0' * 64; p.PINNED_SOURCE[{changed_pull!r}] = '0' * 64; "
        f"o.SUPERLINK_PINNED[{changed_objects!r}] = '0' * 64; "
        "s.main(sys.argv[1:])"
    )
    # Process isolation: the SuperLink starts no ServerApp executor of its own.
    args = superlink_args(
        host="127.0.0.1", port=port, database=":flwr-in-memory:", tls=None, isolation="process"
    )
    log = tmp_path / "superlink.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-c", script, *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        end = time.time() + 60
        while time.time() < end:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.3)
        else:
            pytest.fail(f"the SuperLink did not answer: {log.read_text()[-2000:]}")
        lines = [ln for ln in log.read_text().splitlines() if ln.startswith("hetfed-superlink:")]
        assert lines == [
            f"hetfed-superlink: no batched object routes: this Flower lacks the source of {changed_objects} "
            "as read in Flower 1.42.0",
            f"hetfed-superlink: stock message pull: this Flower lacks the source of {changed_pull} "
            "as read in Flower 1.42.0",
            f"hetfed-superlink: running stock Flower: this Flower lacks the source of {changed} "
            "as read in Flower 1.42.0",
        ]
    finally:
        proc.terminate()
        proc.wait(timeout=30)
