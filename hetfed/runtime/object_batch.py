"""All of a task's objects in one Runtime API request each way, between hetfed-supernode and its worker.

A Flower 1.42 ClientApp pulls its message's objects from the SuperNode one request each
(``PullObject``) and pushes its reply's the same way (``PushObject``): for hetfed's FedAvg
message, 12 of the ~19 local HTTP requests of a task, each parsed, authenticated and answered by
the SuperNode's FastAPI app, which made those requests about half of a SuperNode's and its worker's
CPU in a round (docs/benchmarks.md). hetfed-supernode adds two routes to its Runtime API,
:data:`PULL` and :data:`PUSH`, whose body is a list of Flower's own ``PullObjectRequest`` or
``PushObjectRequest`` messages and whose reply is the list of Flower's responses: each request is
answered by Flower's own handler (``runtime_handlers.pull_object`` / ``push_object``, the same
NodeState calls and checks) for the task that Flower's own task-token dependency authenticated, so
a batch is exactly what its requests sent one by one would have been. Only this local hop
changes; the Fleet API between SuperNode and SuperLink stays Flower's.

The warm worker sends through :class:`BatchedObjects`: when Flower's ``pull_task_input`` has the
message's object tree it pulls every object in one request and answers Flower's ``PullObject``
calls from that; Flower's ``push_message`` pushes into a buffer that :meth:`BatchedObjects.flush`
sends in one request. Against a SuperNode without the routes (404), it sends Flower's single
requests, as ``flwr-clientapp`` does.

Body and reply: frames of ``4-byte big-endian length + serialized protobuf``, in request order.

What it relies on (Flower 1.42.0), pinned by SHA-256 in :data:`PINNED_SOURCE` and checked by
:func:`install_on_supernode` before adding the routes: the two handlers, the task-token
dependency and the client's request path the worker sends through (the SuperNode's app factory,
whose app the routes join, is pinned with :mod:`hetfed.runtime.fast_path`).
"""

# No `from __future__ import annotations`: FastAPI reads the route functions' annotations (Flower's
# dependencies, imported inside _routes) as objects.
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from hetfed.runtime.internals import extend_supernode_app

if TYPE_CHECKING:
    from flwr.proto.message_pb2 import PullObjectResponse, PushObjectRequest
    from flwr.supercore.runtime import RuntimeHttpClient

PULL, PUSH = "/v1/runtime/hetfed/pull-objects", "/v1/runtime/hetfed/push-objects"
MEDIA_TYPE = "application/x-hetfed-protobuf-frames"
FRAME_HEADER = 4  # bytes of a frame's length, big-endian (as Flower's protobuf streams)

PINNED_SOURCE: dict[str, str] = {
    "flwr.supernode.servicer.runtime.runtime_handlers:pull_object": (
        "cf11db1e6a098b4a57a04d02f2eb2230ba1f6b8a65dbe4e51e840886a0595340"
    ),
    "flwr.supernode.servicer.runtime.runtime_handlers:push_object": (
        "c6dad970cb51b02bbf509eac14d8f59a17d0fa492dec2758f466b2288067566f"
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


# --- the SuperNode's side ---------------------------------------------------------------------
def install_on_supernode() -> str:
    """Make ``flwr.supernode.main.create_app`` add the :data:`PULL` and :data:`PUSH` routes.
    Returns "" when installed, else why not (the worker then sends single requests)."""

    def with_the_routes(app: Any) -> None:
        pull, push = _routes()
        app.add_api_route(PULL, pull, methods=["POST"], include_in_schema=False)
        app.add_api_route(PUSH, push, methods=["POST"], include_in_schema=False)

    return extend_supernode_app(PINNED_SOURCE, with_the_routes)


def _routes() -> tuple[Any, Any]:
    """The two route functions, with Flower's dependencies (state, handlers, authenticated task)."""
    from fastapi import HTTPException, Request, Response
    from flwr.proto.message_pb2 import PullObjectRequest, PushObjectRequest
    from flwr.supercore.dependencies.runtime import (
        RuntimeHandlersDependency,
        RuntimeStateDependency,
        TaskDependency,
    )
    from google.protobuf.message import DecodeError
    from starlette.concurrency import run_in_threadpool

    async def answer(request: Request, request_type: Any, handle: Any) -> Response:
        try:
            requests = [request_type.FromString(frame) for frame in frames(await request.body())]
        except (ValueError, DecodeError) as exc:
            raise HTTPException(status_code=400, detail=f"malformed batch: {exc}") from exc
        # Flower's handlers are plain functions: in the thread pool, as Flower's own routes run them.
        replies = await run_in_threadpool(lambda: [handle(r).SerializeToString() for r in requests])
        return Response(framed(replies), media_type=MEDIA_TYPE)

    async def pull_objects(
        request: Request,
        state: RuntimeStateDependency,
        handlers: RuntimeHandlersDependency,
        task: TaskDependency,
    ) -> Response:
        return await answer(request, PullObjectRequest, lambda r: handlers.pull_object(r, state, task))

    async def push_objects(
        request: Request,
        state: RuntimeStateDependency,
        handlers: RuntimeHandlersDependency,
        task: TaskDependency,
    ) -> Response:
        return await answer(request, PushObjectRequest, lambda r: handlers.push_object(r, state, task))

    return pull_objects, push_objects


# --- the worker's side ------------------------------------------------------------------------
class BatchedObjects:
    """A Runtime API client for Flower's ``pull_task_input`` and ``push_message`` that moves a
    message's objects in one request each way; every other call goes to ``client`` as it is."""

    def __init__(self, client: Any, *, enabled: bool = True) -> None:
        self._client = client
        self.enabled = enabled  # False once the SuperNode said it has no such routes
        self._pulled: dict[str, PullObjectResponse] = {}
        self._pushes: list[PushObjectRequest] = []
        self.moved = [0, 0]  # objects pulled and pushed through the batched routes (the task line says)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    def PullMessages(self, request: Any) -> Any:  # noqa: N802
        """Flower's reply, and then every object of its messages' trees in one request."""
        from flwr.proto.message_pb2 import PullObjectRequest, PullObjectResponse
        from flwr.supercore.inflatable.inflatable_object import iterate_object_tree

        reply = self._client.PullMessages(request)
        if self.enabled and reply.message_object_trees:
            ids = [
                node.object_id for tree in reply.message_object_trees for node in iterate_object_tree(tree)
            ]
            asked = [PullObjectRequest(object_id=i) for i in ids]
            answers = self._post(PULL, asked)
            if answers is not None:
                self._pulled = {
                    i: PullObjectResponse.FromString(a) for i, a in zip(ids, answers, strict=True)
                }
                self.moved[0] += sum(a.object_available for a in self._pulled.values())
        return reply

    def PullObject(self, request: Any) -> Any:  # noqa: N802
        """From the batch when the object was there; else Flower's single request (e.g. a retry)."""
        answer = self._pulled.pop(request.object_id, None)
        if answer is not None and answer.object_available:
            return answer
        return self._client.PullObject(request)

    def PushObject(self, request: Any) -> Any:  # noqa: N802
        """Buffered for :meth:`flush` (which raises Flower's ObjectPushError if it was not stored)."""
        from flwr.proto.message_pb2 import PushObjectResponse

        if not self.enabled:
            return self._client.PushObject(request)
        self._pushes.append(request)
        return PushObjectResponse(stored=True)

    def flush(self) -> None:
        """Push the buffered objects: one request, or one each without the route."""
        from flwr.proto.message_pb2 import PushObjectResponse
        from flwr.supercore.inflatable.inflatable_utils import ObjectPushError

        pushes, self._pushes = self._pushes, []
        if not pushes:
            return
        answers = self._post(PUSH, pushes)
        if answers is not None:
            self.moved[1] += len(pushes)
        else:
            answers = [self._client.PushObject(p).SerializeToString() for p in pushes]
        for push, answer in zip(pushes, answers, strict=True):
            if not PushObjectResponse.FromString(answer).stored:  # as Flower's push_object_fn raises
                raise ObjectPushError(push.object_id, push.run_id, push.session_id)

    def _post(self, path: str, requests: list[Any]) -> list[bytes] | None:
        """The frames of the reply to ``requests`` at ``path``; None (and batching off) on a 404."""
        import httpx
        from flwr.supercore.protobuf.client import ProtobufRequestContext

        client: RuntimeHttpClient = self._client
        http_request = client._client.build_request(
            "POST",
            f"{client._base_url}{path}",
            content=framed(r.SerializeToString() for r in requests),
            headers={"content-type": MEDIA_TYPE, "accept": MEDIA_TYPE},
        )
        context = ProtobufRequestContext(rpc_method=path, message=requests[0], request=http_request)
        response: httpx.Response = client._send(context)
        if response.status_code == 404:
            self.enabled = False
            return None
        response.raise_for_status()
        answers = frames(response.content)
        if len(answers) != len(requests):
            raise ValueError(f"{path}: {len(answers)} answers to {len(requests)} requests")
        return answers
