"""A message's objects in one request each way, on every hop: worker, SuperNode, SuperLink, ServerApp.

A Flower 1.42 ClientApp pulls its message's objects from the SuperNode one request each
(``PullObject``) and pushes its reply's the same way (``PushObject``); the SuperNode does the same
with the SuperLink's Fleet API, and the ServerApp with the SuperLink's Runtime API: for hetfed's
FedAvg message, 12 of the ~19 local HTTP requests of a task and 12 of the ~22 Fleet requests of a
silo's round, each parsed, authenticated and answered by a FastAPI app (docs/benchmarks.md). The
servers get routes whose body is a list of Flower's own ``PullObjectRequest`` or
``PushObjectRequest`` messages and whose reply is the list of Flower's responses, each produced by
Flower's own handler, so a batch is exactly what its requests sent one by one would have been:

* the Runtime APIs of hetfed-supernode and hetfed-superlink, :data:`PULL` and :data:`PUSH`:
  Flower's ``runtime_handlers`` for the task that Flower's own task-token dependency authenticated;
* hetfed-superlink's Fleet API, :data:`FLEET_PULL` and :data:`FLEET_PUSH`: Flower's
  ``fleet_handlers`` after Flower's own ``authenticate_node`` accepted the batch's signed headers
  for the node that every request of the batch names (a batch naming two nodes is refused with
  Flower's 401), with Flower's error translation (a run that stopped: Flower's error reply).

Clients send through :class:`BatchedObjects`: when a ``PullMessages`` reply carries object trees,
every object is pulled in one request and Flower's ``PullObject`` calls are answered from that (an
object not yet there: Flower's own request and retries). That request also names the messages
(:data:`CONFIRM`): when every object was there the server confirms them with Flower's
``confirm_message_received`` handler and says so (:data:`CONFIRMED`), and the client answers
Flower's ``ConfirmMessageReceived`` call for them itself (one request less per message; a server
that does not say so gets Flower's request). ``PushObject`` calls are buffered until
every object the ``PushMessages`` reply asked for is in, then sent in one request. Against a server
without the routes (:data:`NOT_OFFERED`: Flower's own SuperNode or SuperLink, a proxy that does not
forward them) it sends Flower's single requests, so every mix of stock and hetfed processes works.
The warm worker wraps its Runtime API client, hetfed's ServerApp its grid's (:func:`batch_grid`),
hetfed-supernode the Fleet client Flower's connection builds (:mod:`hetfed.runtime.held_pull`).

Body and reply: frames of ``4-byte big-endian length + serialized protobuf``, in request order.

What it relies on (Flower 1.42.0), pinned by SHA-256 and checked before anything is installed:
the handlers, the task-token dependency and node authentication (:data:`PINNED_SOURCE`,
:data:`SUPERLINK_PINNED`), the grid's push and pull (:data:`GRID_PINNED`) and the client's request
path; the app factories are pinned with :mod:`hetfed.runtime.fast_path` and
:func:`hetfed.runtime.internals.extend_superlink_app`.
"""

# No `from __future__ import annotations`: FastAPI reads the route functions' annotations (Flower's
# dependencies, imported inside _runtime_routes) as objects.
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from logging import INFO, WARNING
from typing import TYPE_CHECKING, Any

from hetfed.runtime.internals import (
    extend_superlink_app,
    extend_supernode_app,
    superlink_app_why_not,
    supernode_app_why_not,
    why_not_as_read,
)

if TYPE_CHECKING:
    import httpx
    from flwr.proto.message_pb2 import PullObjectResponse, PushObjectRequest
    from flwr.supercore.protobuf.client import ProtobufClient

PULL, PUSH = "/v1/runtime/hetfed/pull-objects", "/v1/runtime/hetfed/push-objects"
FLEET_PULL, FLEET_PUSH = "/v1/fleet/hetfed/pull-objects", "/v1/fleet/hetfed/push-objects"
MEDIA_TYPE = "application/x-hetfed-protobuf-frames"
# A server without the route answers 404 (Flower's app) or 405; a proxy that does not forward it,
# 403 (hetfed's nginx before these routes). Flower's own refusals are 401 and 400.
NOT_OFFERED = frozenset({403, 404, 405})
FRAME_HEADER = 4  # bytes of a frame's length, big-endian (as Flower's protobuf streams)
# A batched pull may ask the server to confirm the messages whose trees it pulls (Flower's
# ConfirmMessageReceived, one request per message otherwise): their object ids in CONFIRM, the
# ones confirmed in the reply's CONFIRMED (a server that does not know the header sends none, and
# the client confirms Flower's way). At most CONFIRM_AT_MOST ids ride along (a header's size).
CONFIRM, CONFIRMED = "x-hetfed-confirm", "x-hetfed-confirmed"
CONFIRM_AT_MOST = 64

PINNED_SOURCE: dict[str, str] = {
    "flwr.supernode.servicer.runtime.runtime_handlers:pull_object": (
        "cf11db1e6a098b4a57a04d02f2eb2230ba1f6b8a65dbe4e51e840886a0595340"
    ),
    "flwr.supernode.servicer.runtime.runtime_handlers:push_object": (
        "c6dad970cb51b02bbf509eac14d8f59a17d0fa492dec2758f466b2288067566f"
    ),
    "flwr.supernode.servicer.runtime.runtime_handlers:confirm_message_received": (
        "d922673fae155c8e5a0a1b9526a81246060206ea35ce51a2e7a91c5c472acbfc"
    ),
    "flwr.supercore.dependencies.runtime:get_task": (
        "2ef297c4e5381e6a9744aff3d9d12d138dc257b207fe45591a9218cf169e075e"
    ),
    "flwr.supercore.dependencies.task:authenticate_task": (
        "7b4c0c58ea91353a9075df3af90acc2e5139cfa8f0ae9772651fbafecf25cc38"
    ),
    "flwr.supercore.protobuf.client:ProtobufClient._send": (
        "8841dcbf6e34dda22eebb41e1fdaa9665245bce04d3bd5d509441b714f57ca5b"
    ),
}
# The SuperLink's side: the Fleet handlers, Flower's node authentication and the state dependency
# the routes call, and the Runtime API handlers the ServerApp's batches go to (with the task-token
# dependency of PINNED_SOURCE; create_app is pinned with internals.extend_superlink_app).
SUPERLINK_PINNED: dict[str, str] = {
    "flwr.superlink.servicer.runtime.runtime_handlers:pull_object": (
        "9fad81e6c59e35d8ef040b1abb6ac2542e199964f27a27854e518a1facb14237"
    ),
    "flwr.superlink.servicer.runtime.runtime_handlers:push_object": (
        "b2f9c8ea398e9778bc71601870bf94f973375aa1b60c4613d0a00ae9cfe7eb39"
    ),
    "flwr.superlink.servicer.fleet.fleet_handlers:pull_object": (
        "78f6d45fda46df4763be3e7e8e99211e0d16f4cf3d927d63146eb45c57cdf6ba"
    ),
    "flwr.superlink.servicer.fleet.fleet_handlers:push_object": (
        "df7e96f1188e0a40eb23b2accc1708b7d50753e6819193fd04211210c001ef66"
    ),
    "flwr.superlink.servicer.runtime.runtime_handlers:confirm_message_received": (
        "ff473664219103714b442e8531976af80427ef0d245d00768dcf9bfa5ff4295f"
    ),
    "flwr.superlink.servicer.fleet.fleet_handlers:confirm_message_received": (
        "52bf47754a452d94eafeed580af5071fa4a7834b7467e391cfcd2f3945b2796a"
    ),
    "flwr.superlink.routers.fleet.node_auth:authenticate_node": (
        "f8e66372d61b3653fc6ee3f9772cc89f805a01bed65e6ce55e4b5fb3a6ad3a17"
    ),
    "flwr.superlink.dependencies.linkstate:get_linkstate": (
        "a5afb79e372f4518c0a41c769dd64993899c3b43f091492f5d4f257b433ce45c"
    ),
    "flwr.supercore.dependencies.runtime:get_task": PINNED_SOURCE[
        "flwr.supercore.dependencies.runtime:get_task"
    ],
    "flwr.supercore.dependencies.task:authenticate_task": PINNED_SOURCE[
        "flwr.supercore.dependencies.task:authenticate_task"
    ],
}
# The ServerApp's grid (HttpGrid): its Runtime API client (set by _connect), the push (PushMessages,
# then PushObject for the objects it asks for) and the pull (PullMessages, then PullObject for each
# object of each reply's tree), and the client's request path.
GRID_PINNED: dict[str, str] = {
    "flwr.superlink.grid.http_grid:HttpGrid._connect": (
        "a15a944f65181da90c1afea72d403524d411ebea7760752cdca706787618c699"
    ),
    "flwr.superlink.grid.http_grid:HttpGrid._try_push_messages": (
        "6e420bc3237c65bbc51d0e0ded1331c577e1a797a21cda6fed560712995b5352"
    ),
    "flwr.superlink.grid.http_grid:HttpGrid.pull_messages": (
        "67a5266a5a2ed51557437a15ef4c8844f46576bc5bb6b0753d2a2f6230a3aa83"
    ),
    "flwr.supercore.protobuf.client:ProtobufClient._send": PINNED_SOURCE[
        "flwr.supercore.protobuf.client:ProtobufClient._send"
    ],
}


def frames(body: bytes) -> list[bytes]:
    """The frames of ``body``; ValueError when it is not a whole number of frames."""
    out, at = [], 0
    while at < len(body):
        size = int.from_bytes(body[at : at + FRAME_HEADER], "big")
        end = at + FRAME_HEADER + size
        if at + FRAME_HEADER > len(body) or end > len(body):
            raise ValueError(f"truncated frame at byte {at} of {len(body)}")
        out.append(body[at + FRAME_HEADER : end])
        at = end
    return out


def framed(parts: Iterable[bytes]) -> bytes:
    """``parts`` as one body of frames."""
    return b"".join(len(p).to_bytes(FRAME_HEADER, "big") + p for p in parts)


async def _answer(
    request: Any,
    request_type: Any,
    handle: Callable[[list[Any]], list[Any]],
    confirm: Callable[[list[Any]], Any] | None = None,
) -> Any:
    """The reply to a batch: ``handle(requests)`` (Flower's handler per request, in the thread pool
    as Flower runs its own routes) serialized as frames; 400 when the body is not frames of
    ``request_type``. A pull batch whose objects were all there confirms, with ``confirm`` (Flower's
    handler per ConfirmMessageReceivedRequest, in the same thread pool), each message named in
    :data:`CONFIRM` whose object it pulled, and names them in :data:`CONFIRMED`: what Flower's client
    sends next."""
    from fastapi import HTTPException, Response
    from flwr.proto.message_pb2 import ConfirmMessageReceivedRequest
    from google.protobuf.message import DecodeError
    from starlette.concurrency import run_in_threadpool

    try:
        requests = [request_type.FromString(frame) for frame in frames(await request.body())]
    except (ValueError, DecodeError) as exc:
        raise HTTPException(status_code=400, detail=f"malformed batch: {exc}") from exc
    replies = await run_in_threadpool(handle, requests) if requests else []
    headers = {}
    if confirm is not None and replies and all(r.object_available for r in replies):
        pulled = {r.object_id for r in requests}
        ids = [i for i in request.headers.get(CONFIRM, "").split(",") if i in pulled]
        if ids:
            first = requests[0]
            await run_in_threadpool(
                confirm,
                [
                    ConfirmMessageReceivedRequest(node=first.node, run_id=first.run_id, message_object_id=i)
                    for i in ids
                ],
            )
            headers[CONFIRMED] = ",".join(ids)
    return Response(framed(r.SerializeToString() for r in replies), media_type=MEDIA_TYPE, headers=headers)


# --- the SuperNode's Runtime API --------------------------------------------------------------
def why_not_on_supernode(pinned: Mapping[str, str] = PINNED_SOURCE) -> str:
    """What :func:`install_on_supernode` relies on and this Flower lacks ("" = it can be installed)."""
    return supernode_app_why_not(pinned)


def why_not_batch_grid(pinned: Mapping[str, str] = GRID_PINNED) -> str:
    """What :func:`batch_grid` relies on and this Flower lacks ("" = a ServerApp's grid can be batched)."""
    return why_not_as_read(pinned)


def install_on_supernode() -> str:
    """Make ``flwr.supernode.main.create_app`` add the :data:`PULL` and :data:`PUSH` routes.
    Returns "" when installed, else why not (the worker then sends single requests)."""

    def with_the_routes(app: Any) -> None:
        pull, push = _runtime_routes()
        app.add_api_route(PULL, pull, methods=["POST"], include_in_schema=False)
        app.add_api_route(PUSH, push, methods=["POST"], include_in_schema=False)

    return extend_supernode_app(PINNED_SOURCE, with_the_routes)


def _runtime_routes() -> tuple[Any, Any]:
    """The two route functions, with Flower's dependencies (state, handlers, authenticated task)."""
    from fastapi import Request, Response
    from flwr.proto.message_pb2 import PullObjectRequest, PushObjectRequest
    from flwr.supercore.dependencies.runtime import (
        RuntimeHandlersDependency,
        RuntimeStateDependency,
        TaskDependency,
    )

    async def pull_objects(
        request: Request,
        state: RuntimeStateDependency,
        handlers: RuntimeHandlersDependency,
        task: TaskDependency,
    ) -> Response:
        return await _answer(
            request,
            PullObjectRequest,
            lambda rs: [handlers.pull_object(r, state, task) for r in rs],
            lambda confirmings: [handlers.confirm_message_received(c, state, task) for c in confirmings],
        )

    async def push_objects(
        request: Request,
        state: RuntimeStateDependency,
        handlers: RuntimeHandlersDependency,
        task: TaskDependency,
    ) -> Response:
        return await _answer(
            request, PushObjectRequest, lambda rs: [handlers.push_object(r, state, task) for r in rs]
        )

    return pull_objects, push_objects


# --- the SuperLink: its Fleet API, and its Runtime API (the ServerApp's) ------------------------
def why_not_on_superlink(pinned: Mapping[str, str] = SUPERLINK_PINNED) -> str:
    """What :func:`install_on_superlink` relies on and this Flower lacks ("" = it can be installed)."""
    return superlink_app_why_not(pinned)


def install_on_superlink() -> str:
    """Make ``flwr.superlink.main.create_app`` add the :data:`FLEET_PULL` and :data:`FLEET_PUSH`
    routes, and :data:`PULL` and :data:`PUSH` to its Runtime API (the ServerApp's). Returns "" when
    installed, else why not (nothing patched: SuperNodes and ServerApps then send single requests)."""

    def with_the_routes(app: Any) -> None:
        pull, push = _fleet_routes()
        app.add_api_route(FLEET_PULL, pull, methods=["POST"], include_in_schema=False)
        app.add_api_route(FLEET_PUSH, push, methods=["POST"], include_in_schema=False)
        pull, push = _runtime_routes()
        app.add_api_route(PULL, pull, methods=["POST"], include_in_schema=False)
        app.add_api_route(PUSH, push, methods=["POST"], include_in_schema=False)

    return extend_superlink_app(SUPERLINK_PINNED, with_the_routes)


def _fleet_routes() -> tuple[Any, Any]:
    """The two Fleet route functions: Flower's node authentication, then Flower's handler per request."""
    from fastapi import HTTPException, Request, Response
    from flwr.proto.message_pb2 import PullObjectRequest, PushObjectRequest
    from flwr.superlink.dependencies.linkstate import get_linkstate
    from flwr.superlink.routers.fleet.node_auth import authenticate_node
    from flwr.superlink.servicer.fleet import fleet_handlers

    def for_the_node(request: Request, handle: Callable[[Any, Any], Any]) -> Callable[[list[Any]], list[Any]]:
        def answer(requests: list[Any]) -> list[Any]:
            # Flower's check of the signed headers and of the node id its protobuf request names:
            # given the first request; every other request must name the same node.
            request.state.protobuf_request = requests[0]
            authenticate_node(request)
            if any(r.node.node_id != requests[0].node.node_id for r in requests):
                raise HTTPException(status_code=401, detail="Invalid SuperNode authentication")
            state = get_linkstate(request)
            return [handle(r, state) for r in requests]

        return answer

    def confirm(request: Request) -> Callable[[list[Any]], Any]:
        def confirm_for_the_node(confirmings: list[Any]) -> Any:  # the node the batch authenticated
            state = get_linkstate(request)
            store = state.object_store
            return [fleet_handlers.confirm_message_received(c, state, store) for c in confirmings]

        return confirm_for_the_node

    async def fleet_pull_objects(request: Request) -> Response:
        return await _answer(
            request, PullObjectRequest, for_the_node(request, fleet_handlers.pull_object), confirm(request)
        )

    async def fleet_push_objects(request: Request) -> Response:
        return await _answer(request, PushObjectRequest, for_the_node(request, fleet_handlers.push_object))

    return fleet_pull_objects, fleet_push_objects


# --- the ServerApp's grid ---------------------------------------------------------------------
def batch_grid(grid: Any) -> "BatchedObjects | None":
    """Make a ServerApp's ``HttpGrid`` (the Runtime API's, as ``flwr-serverapp`` builds it) send
    through a :class:`BatchedObjects`, and return it; None (and one log line) where its source
    differs, None for any other grid (the inline and simulation engines move no objects over HTTP)."""
    from flwr.supercore import log

    try:
        from flwr.superlink.grid.http_grid import HttpGrid
    except ImportError:
        return None
    if not isinstance(grid, HttpGrid):
        return None
    if why := why_not_batch_grid():
        log(WARNING, "hetfed: the ServerApp's objects go one request each: %s", why)
        return None
    batched = BatchedObjects(grid._runtime_client, hop="SuperLink", node=grid.node)
    # The grid reads its client from this attribute at every call (HttpGrid._runtime_client).
    vars(grid)["_client"] = batched
    return batched


# --- the clients ------------------------------------------------------------------------------
class BatchedObjects:
    """A Flower protobuf client (the worker's or the ServerApp's Runtime API client, a SuperNode's
    Fleet client) that moves a message's objects in one request each way; every other call goes to
    ``client`` as it is.

    ``paths``: the (pull, push) routes of the server; ``hop``: the server, for the one log line
    saying it has no such routes; ``log_batches``: log each batch (the warm worker logs counts per
    task instead); ``node``: the node the batched pulls name where the pull request names none (the
    ServerApp's: Flower's SuperLink node)."""

    def __init__(
        self,
        client: Any,
        *,
        paths: tuple[str, str] = (PULL, PUSH),
        hop: str = "SuperNode",
        enabled: bool = True,
        log_batches: bool = False,
        node: Any = None,
    ) -> None:
        self.node = node
        self._client = client
        self.paths, self.hop, self.log_batches = paths, hop, log_batches
        self.enabled = enabled  # False once the server said it has no such routes
        self._lock = threading.Lock()  # Flower pushes and pulls objects from a few threads
        self._pulled: dict[str, PullObjectResponse] = {}
        self._uses: Counter[str] = Counter()  # how many of the pulled trees still want each object
        self._pushes: list[PushObjectRequest] = []
        self._to_push: set[str] = set()  # the ids the last PushMessages reply asked for, not yet buffered
        self._confirmed: set[str] = set()  # messages the server confirmed with their objects' batch
        self.moved = [0, 0]  # objects pulled and pushed through the batched routes
        self.confirms = 0  # messages confirmed with their objects' batch (no request of their own)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    def __enter__(self) -> "BatchedObjects":
        self._client.__enter__()
        return self

    def __exit__(self, *exc: object) -> Any:
        return self._client.__exit__(*exc)

    def PullMessages(self, request: Any) -> Any:  # noqa: N802
        """Flower's reply, and then every object of its messages' trees in one request, which also
        confirms the messages once all their objects are pulled (:data:`CONFIRM`)."""
        from flwr.proto.message_pb2 import PullObjectRequest, PullObjectResponse
        from flwr.supercore.inflatable.inflatable_object import iterate_object_tree

        reply = self._pull_messages(request)
        if self.enabled and reply.message_object_trees:
            node = getattr(request, "node", self.node)  # Fleet and SuperLink requests name the node and run
            # An object several messages share (e.g. an empty record) is asked for once and kept until
            # each of its trees took it: the server confirms every message of the batch at once, and
            # a confirmed message's objects are gone from its store.
            uses: Counter[str] = Counter()
            asked_by_id = {}
            for message, tree in zip(reply.messages_list, reply.message_object_trees, strict=True):
                for n in iterate_object_tree(tree):
                    uses[n.object_id] += 1
                    asked_by_id[n.object_id] = PullObjectRequest(
                        node=node, run_id=message.metadata.run_id, object_id=n.object_id
                    )
            asked = list(asked_by_id.values())
            roots = [tree.object_id for tree in reply.message_object_trees]
            try:
                answers = self._post(self.paths[0], asked, roots if len(roots) <= CONFIRM_AT_MOST else [])
            except Exception:  # noqa: BLE001 - a prefetch: Flower's own requests (and errors) follow
                answers = None
            if answers is not None:
                pulled = {
                    a.object_id: PullObjectResponse.FromString(b) for a, b in zip(asked, answers, strict=True)
                }
                with self._lock:
                    self._pulled, self._uses = pulled, uses
                self.moved[0] += sum(a.object_available for a in pulled.values())
                self._logged("pulled from", sum(a.object_available for a in pulled.values()))
        return reply

    def _pull_messages(self, request: Any) -> Any:
        return self._client.PullMessages(request)

    def PullObject(self, request: Any) -> Any:  # noqa: N802
        """From the batch when the object was there; else Flower's single request (e.g. a retry)."""
        with self._lock:
            answer = self._pulled.get(request.object_id)
            self._uses[request.object_id] -= 1
            if self._uses[request.object_id] <= 0:
                self._pulled.pop(request.object_id, None)
                del self._uses[request.object_id]
        if answer is not None and answer.object_available:
            return answer
        return self._client.PullObject(request)

    def ConfirmMessageReceived(self, request: Any) -> Any:  # noqa: N802
        """Answered here for a message the server confirmed with its objects' batch; else Flower's."""
        from flwr.proto.message_pb2 import ConfirmMessageReceivedResponse

        with self._lock:
            confirmed = request.message_object_id in self._confirmed
            self._confirmed.discard(request.message_object_id)
        return ConfirmMessageReceivedResponse() if confirmed else self._client.ConfirmMessageReceived(request)

    def PushMessages(self, request: Any) -> Any:  # noqa: N802
        """Flower's reply; its ``objects_to_push`` are buffered until all are in (:meth:`PushObject`)."""
        reply = self._client.PushMessages(request)
        with self._lock:
            self._to_push = set(reply.objects_to_push)
        return reply

    def PushObject(self, request: Any) -> Any:  # noqa: N802
        """Buffered; the call that completes the objects the PushMessages reply asked for sends them
        all in one request and answers as Flower's single request would for the first not stored."""
        from flwr.proto.message_pb2 import PushObjectResponse

        if not self.enabled:
            return self._client.PushObject(request)
        with self._lock:
            self._pushes.append(request)
            self._to_push.discard(request.object_id)
            if self._to_push:
                return PushObjectResponse(stored=True)
            pushes, self._pushes = self._pushes, []
        return self._push(pushes)

    def flush(self) -> None:
        """Send what is buffered (objects of a reply whose PushMessages did not say what to push)."""
        with self._lock:
            pushes, self._pushes, self._to_push = self._pushes, [], set()
        if pushes:
            self._push(pushes)

    def _push(self, pushes: list[Any]) -> Any:
        """``pushes`` in one request (one each without the route): the answer to the first not
        stored, else the last (Flower's push function raises ObjectPushError on ``stored=False``)."""
        from flwr.proto.message_pb2 import PushObjectResponse

        answers = self._post(self.paths[1], pushes)
        if answers is None:
            replies = [self._client.PushObject(p) for p in pushes]
        else:
            self.moved[1] += len(pushes)
            replies = [PushObjectResponse.FromString(a) for a in answers]
            self._logged("pushed to", sum(r.stored for r in replies))
        return next((r for r in replies if not r.stored), replies[-1])

    def _logged(self, moved: str, count: int) -> None:
        if self.log_batches:
            from flwr.supercore import log

            log(INFO, "hetfed: %d objects %s the %s in one request", count, moved, self.hop)

    def _post(self, path: str, requests: list[Any], confirm: list[str] | None = None) -> list[bytes] | None:
        """The frames of the reply to ``requests`` at ``path``; None (and batching off) where the
        server does not offer the route (:data:`NOT_OFFERED`); None for any other refusal or a
        failed connection, so that Flower's single requests meet it and handle it Flower's way (its
        retries; a stopped run's revoked token, 401, ends the ServerApp as an interruption).
        ``confirm``: the messages the server is asked to confirm once it pulled all their objects."""
        import httpx
        from flwr.supercore import log

        content = framed(r.SerializeToString() for r in requests)
        asked = {CONFIRM: ",".join(confirm)} if confirm else {}
        try:
            response = self._send(path, content, requests[0], MEDIA_TYPE, headers=asked)
        except httpx.TransportError:
            return None
        if response.status_code in NOT_OFFERED:
            if self.enabled:
                log(WARNING, "hetfed: the %s has no batched object routes: one request per object", self.hop)
            self.enabled = False
            return None
        if not response.is_success:
            return None
        answers = frames(response.content)
        if len(answers) != len(requests):
            raise ValueError(f"{path}: {len(answers)} answers to {len(requests)} requests")
        if confirmed := [i for i in response.headers.get(CONFIRMED, "").split(",") if i in (confirm or ())]:
            with self._lock:
                self._confirmed.update(confirmed)
            self.confirms += len(confirmed)
        return answers

    def _send(
        self,
        path: str,
        content: bytes,
        message: Any,
        media_type: str,
        timeout: float | None = None,
        headers: dict[str, str] | None = None,
    ) -> "httpx.Response":
        """POST ``content`` to ``path`` through the client's interceptors (Flower's signing, version
        headers); ``message``: the protobuf request they see; ``headers``: more headers."""
        from flwr.supercore.protobuf.client import ProtobufRequestContext

        client: ProtobufClient = self._client
        http_request = client._client.build_request(
            "POST",
            f"{client._base_url}{path}",
            content=content,
            headers={"content-type": media_type, "accept": media_type, **(headers or {})},
            timeout=client._client.timeout if timeout is None else timeout,
        )
        context = ProtobufRequestContext(rpc_method=path, message=message, request=http_request)
        return client._send(context)
