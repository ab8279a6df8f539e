"""A batched object request or a held pull that fails goes to Flower's own single request.

The batched routes (hetfed.runtime.object_batch) and the held pull (hetfed.runtime.held_pull) are
sent beside Flower's client, outside its retries. Whatever they meet other than a success or "no such
route" (a connection refused or dropped, a refusal such as the 401 of a stopped run's revoked task
token) must be met by Flower's own request, so that Flower handles it its way (retries; a ServerApp
interrupted, not failed). Seen in CI: a stopped run's ServerApp recorded ``failed`` with the batch's
401, and a killed SuperLink's dropped connection ended a run ``failed`` instead of ``interrupted``.
"""

from __future__ import annotations

import socket
import threading
from typing import Any

import httpx
import pytest
from flwr.proto.message_pb2 import PushObjectRequest
from flwr.supercore.runtime import RuntimeHttpClient
from flwr.supernode.fleet_http_client import FleetHttpClient

from hetfed.engines.flower import free_port
from hetfed.runtime.held_pull import PULL_MESSAGES, HeldPullFleetClient
from hetfed.runtime.object_batch import PUSH, BatchedObjects


class Recorded:
    """A Flower HTTP interceptor that records each request's route and its outcome."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    def intercept(self, context: Any, call_next: Any) -> httpx.Response:
        path = context.request.url.path
        try:
            response = call_next(context)
        except httpx.TransportError as exc:
            self.calls.append((path, type(exc).__name__))
            raise
        self.calls.append((path, str(response.status_code)))
        return response


def pushed_through(base: str, interceptors: list[Any]) -> tuple[list[tuple[str, str]], BaseException]:
    """One object pushed by a :class:`BatchedObjects` over Flower's Runtime API client (no retries):
    the requests it made and what the push raised."""
    recorded = Recorded()
    client = RuntimeHttpClient.from_server_address(base, True, None, [*interceptors, recorded])
    batched = BatchedObjects(client, hop="SuperLink")
    with pytest.raises((httpx.HTTPError, ConnectionError)) as raised:
        batched.PushObject(PushObjectRequest(object_id="0" * 64, object_content=b"x", session_id="s"))
    assert batched.enabled  # a failure is not "no such route": the next message is batched again
    return recorded.calls, raised.value


def test_a_batch_that_meets_no_server_goes_to_flowers_single_request() -> None:
    port = free_port()
    calls, raised = pushed_through(f"127.0.0.1:{port}", [])
    assert calls == [(PUSH, "ConnectError"), ("/v1/runtime/push-object", "ConnectError")]
    assert isinstance(raised, httpx.ConnectError)


def read_request(conn: socket.socket) -> None:
    """Read one HTTP request whole (headers and Content-Length body). Closing with part of it still
    unread makes the kernel reset the connection (httpx ReadError) instead of closing it (httpx
    RemoteProtocolError): which one the client saw depended on how the request's bytes arrived."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        (
            int(line.split(b":", 1)[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        ),
        0,
    )
    while len(body) < length and (chunk := conn.recv(65536)):
        body += chunk


def test_a_batch_whose_connection_drops_goes_to_flowers_single_request() -> None:
    """A server that reads each request and closes without answering (a SuperLink killed mid-request)."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", free_port()))
        server.listen(8)

        def hang_up(requests: int) -> None:
            for _ in range(requests):
                conn, _ = server.accept()
                read_request(conn)
                conn.close()

        closer = threading.Thread(target=hang_up, args=(2,), daemon=True)
        closer.start()
        calls, raised = pushed_through(f"127.0.0.1:{server.getsockname()[1]}", [])
        closer.join(timeout=10)
    assert calls == [(PUSH, "RemoteProtocolError"), ("/v1/runtime/push-object", "RemoteProtocolError")]
    assert isinstance(raised, httpx.RemoteProtocolError)


def test_a_held_pull_that_meets_no_server_goes_to_flowers_pull() -> None:
    from flwr.proto.fleet_pb2 import PullMessagesRequest

    recorded = Recorded()
    client = FleetHttpClient.from_server_address(f"127.0.0.1:{free_port()}", True, None, [recorded])
    held = HeldPullFleetClient(client)
    with pytest.raises(httpx.ConnectError):
        held.PullMessages(PullMessagesRequest())
    assert recorded.calls == [(PULL_MESSAGES, "ConnectError"), ("/v1/fleet/pull-messages", "ConnectError")]
    assert held.held  # still held: the next pull tries the held route again
