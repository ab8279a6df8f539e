"""A SuperNode's pull held at the SuperLink until one of its messages is complete (a long poll).

A Flower 1.42 SuperNode that finds no message sleeps and pulls again: between two rounds every
silo pulls empty every few seconds, and inside a round hetfed's fast waits make several empty
pulls per silo (7 of the 12 Fleet requests per silo per round at 100 simulated silos, each a
signed request the SuperLink verifies and answers, docs/benchmarks.md). hetfed-superlink adds one
Fleet route, :data:`PULL_MESSAGES`: its body is Flower's own ``PullMessagesRequest`` and its reply
Flower's own ``PullMessagesResponse``, produced by Flower's own handler after Flower's own node
authentication. When the node has nothing yet, the SuperLink holds the request up to :data:`WAIT`
seconds and answers as soon as one of the node's messages is complete, i.e. the ServerApp stored
the last object of the push session the message belongs to (:class:`Doorbell`), else empty, as
Flower would have. What a node receives, in which order and when it counts as delivered stay
Flower's (and :mod:`hetfed.runtime.pull`'s): only who waits changes.

hetfed-supernode's Fleet client (:class:`HeldPullFleetClient`, with the batched objects of
:mod:`hetfed.runtime.object_batch`) pulls there, and the stock way on a SuperLink without the route
(404: Flower's ``flower-superlink``), so every mix of stock and hetfed processes works.

What it relies on (Flower 1.42.0), pinned by SHA-256 in :data:`PINNED_SOURCE` and checked by
hetfed-superlink before installing it: the in-memory state's ``store_object`` (its push sessions and
their root messages), the Fleet pull handler, node authentication and the state dependency.
"""

# No `from __future__ import annotations`: FastAPI reads the route function's annotations as objects.
import asyncio
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from logging import WARNING
from typing import Any

from hetfed.runtime import object_batch
from hetfed.runtime.internals import extend_superlink_app, superlink_app_why_not, why_not_as_read
from hetfed.runtime.object_batch import FLEET_PULL, FLEET_PUSH, NOT_OFFERED, BatchedObjects

PULL_MESSAGES = "/v1/fleet/hetfed/pull-messages"
WAIT = 5.0  # s an empty pull is held (Flower's Fleet client reads 30 s; a stopping SuperLink waits it out)
RECHECK = 1.0  # s between looks while held even without a ring (a message completed some other way)

CLIENT_SEND = "flwr.supercore.protobuf.client:ProtobufClient._send"
CORESTATE = "flwr.supercore.corestate.in_memory_corestate:InMemoryCoreState"
PINNED_SOURCE: dict[str, str] = {
    f"{CORESTATE}.store_object": "2f952e079f4dadd4c15fbb18d61a8ae14d18ccc8b4aeb5d9500d4b2fa8e44673",
    "flwr.superlink.servicer.fleet.fleet_handlers:pull_messages": (
        "5f1d8861a9eb14651a1cea9ec21b4d7955470e5559ea76dc84745bf2d1964bd0"
    ),
    "flwr.superlink.routers.fleet.node_auth:authenticate_node": (
        "f8e66372d61b3653fc6ee3f9772cc89f805a01bed65e6ce55e4b5fb3a6ad3a17"
    ),
    "flwr.superlink.dependencies.linkstate:get_linkstate": (
        "a5afb79e372f4518c0a41c769dd64993899c3b43f091492f5d4f257b433ce45c"
    ),
}


# The SuperNode's Fleet connection (builds its client with FleetHttpClient.from_server_address and
# calls PullMessages / PullObject / PushMessages / PushObject through it), the pull step (objects
# pulled after the message) and the push step (objects pushed after PushMessages), and the client's
# request path.
FLEET_CLIENT_PINNED: dict[str, str] = {
    "flwr.supernode.fleet_http_connection:http_request_response": (
        "b80ca36779c2657f161509c5f94c8524c89d3b1a0d0245a4b9eec10876f09ea1"
    ),
    "flwr.supernode.start_client_internal:_pull_and_store_message": (
        "eaf5d0e36dc34e4cf46a490511d077ac55cc8edbbcdbe938c1f6dbcb758628be"
    ),
    "flwr.supernode.start_client_internal:_push_messages": (
        "00bb86faffdec114db87e7f716af2acd901d12284e44f51f5c2a84704db05f64"
    ),
    CLIENT_SEND: object_batch.PINNED_SOURCE[CLIENT_SEND],
}


class Doorbell:
    """The held pulls, by node; :meth:`ring` wakes a node's held pulls, from any thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: dict[int, set[tuple[asyncio.AbstractEventLoop, asyncio.Event]]] = {}

    @contextmanager
    def held(self, node_id: int) -> Iterator[asyncio.Event]:
        """An event set when ``node_id`` is rung while the block runs (call in the event loop)."""
        entry = (asyncio.get_running_loop(), asyncio.Event())
        with self._lock:
            self._held.setdefault(node_id, set()).add(entry)
        try:
            yield entry[1]
        finally:
            with self._lock:
                waiting = self._held.get(node_id, set())
                waiting.discard(entry)
                if not waiting:
                    self._held.pop(node_id, None)

    def ring(self, node_ids: Iterable[int]) -> None:
        with self._lock:
            entries = [entry for node in set(node_ids) for entry in self._held.get(node, ())]
        for loop, event in entries:
            loop.call_soon_threadsafe(event.set)


DOORBELL = Doorbell()


def ringing(store_object: Callable[..., bool]) -> Callable[..., bool]:
    """``InMemoryCoreState.store_object`` that rings the destination nodes of a push session's
    messages when it stored the session's last object (Flower then drops the session)."""

    def store(self: Any, run_id: int, session_id: str, object_id: str, object_content: bytes) -> bool:
        session = self._object_push_sessions.get(session_id) if session_id else None
        stored = store_object(self, run_id, session_id, object_id, object_content)
        if stored and session is not None and not session.pending_object_ids:
            messages = getattr(self, "message_ins_store", {})  # a LinkState's instructions to nodes
            DOORBELL.ring(messages[r].metadata.dst_node_id for r in session.root_object_ids if r in messages)
        return stored

    return store


def why_not_on_superlink(pinned: Mapping[str, str] = PINNED_SOURCE) -> str:
    """What :func:`install_on_superlink` relies on and this Flower lacks ("" = it can be installed)."""
    return superlink_app_why_not(pinned)


def install_on_superlink() -> str:
    """Ring the doorbell from every in-memory state of this process and make
    ``flwr.superlink.main.create_app`` add :data:`PULL_MESSAGES`. Returns "" when installed, else
    why not (nothing patched: SuperNodes then pull the stock way)."""
    from hetfed.runtime.internals import attr

    def with_the_route(app: Any) -> None:
        app.add_api_route(PULL_MESSAGES, _route(), methods=["POST"], include_in_schema=False)

    if why := extend_superlink_app(PINNED_SOURCE, with_the_route):
        return why
    state = attr(CORESTATE)
    state.store_object = ringing(state.store_object)
    return ""


def _route() -> Any:
    """The route function: Flower's node authentication once, then Flower's pull handler until a
    message is there, the node's doorbell rang, or :data:`WAIT` passed."""
    from fastapi import HTTPException, Request, Response
    from flwr.proto.fleet_pb2 import PullMessagesRequest
    from flwr.supercore.protobuf.constants import PROTOBUF_MEDIA_TYPE
    from flwr.superlink.dependencies.linkstate import get_linkstate
    from flwr.superlink.routers.fleet.node_auth import authenticate_node
    from flwr.superlink.servicer.fleet import fleet_handlers
    from google.protobuf.message import DecodeError
    from starlette.concurrency import run_in_threadpool

    async def fleet_held_pull_messages(request: Request) -> Response:
        try:
            pull = PullMessagesRequest.FromString(await request.body())
        except DecodeError as exc:
            raise HTTPException(status_code=400, detail=f"malformed PullMessagesRequest: {exc}") from exc

        def authenticated() -> Any:
            request.state.protobuf_request = pull
            authenticate_node(request)
            return get_linkstate(request)

        state = await run_in_threadpool(authenticated)
        deadline = time.monotonic() + WAIT
        with DOORBELL.held(pull.node.node_id) as rung:
            while True:
                rung.clear()
                reply = await run_in_threadpool(fleet_handlers.pull_messages, pull, state, state.object_store)
                left = deadline - time.monotonic()
                if reply.messages_list or left <= 0:
                    break
                try:
                    await asyncio.wait_for(rung.wait(), min(left, RECHECK))
                except TimeoutError:
                    pass
        return Response(reply.SerializeToString(), media_type=PROTOBUF_MEDIA_TYPE)

    return fleet_held_pull_messages


class HeldPullFleetClient(BatchedObjects):
    """A SuperNode's Fleet client: batched objects, and its pulls held at the SuperLink
    (:data:`PULL_MESSAGES`; Flower's own pull where the SuperLink has no such route)."""

    def __init__(self, client: Any) -> None:
        super().__init__(client, paths=(FLEET_PULL, FLEET_PUSH), hop="SuperLink", log_batches=True)
        self.held = True  # until the SuperLink answers that it has no such route

    def _pull_messages(self, request: Any) -> Any:
        """The held pull's answer; Flower's pull where the SuperLink has no such route, and for a
        refusal or a failed connection (Flower's pull meets it with its retries and its handling)."""
        import httpx
        from flwr.proto.fleet_pb2 import PullMessagesResponse
        from flwr.supercore import log
        from flwr.supercore.protobuf.constants import PROTOBUF_MEDIA_TYPE

        if self.held:
            try:
                response = self._send(
                    PULL_MESSAGES, request.SerializeToString(), request, PROTOBUF_MEDIA_TYPE, WAIT + 20
                )
            except httpx.TransportError:
                return self._client.PullMessages(request)
            if response.is_success:
                return PullMessagesResponse.FromString(response.content)
            if response.status_code in NOT_OFFERED:
                log(WARNING, "hetfed: the SuperLink holds no pulls: Flower's pull")
                self.held = False
        return self._client.PullMessages(request)


def why_not_fleet_client(pinned: Mapping[str, str] = FLEET_CLIENT_PINNED) -> str:
    """What :func:`install_fleet_client` relies on and this Flower lacks ("" = it can be installed)."""
    return why_not_as_read(pinned)


def install_fleet_client() -> str:
    """Make Flower's Fleet connection (``http_request_response``) send through a
    :class:`HeldPullFleetClient`. Returns "" when installed, else why not (nothing patched). Call
    before the SuperNode connects (and before :mod:`hetfed.runtime.dropped` wraps the pull step)."""
    if why := why_not_fleet_client():
        return why
    import flwr.supernode.fleet_http_connection as connection

    stock = connection.FleetHttpClient

    class FleetHttpClient:
        """What the connection builds its client with: Flower's, wrapped."""

        @staticmethod
        def from_server_address(*args: Any, **kwargs: Any) -> HeldPullFleetClient:
            return HeldPullFleetClient(stock.from_server_address(*args, **kwargs))

    vars(connection)["FleetHttpClient"] = FleetHttpClient
    return ""
