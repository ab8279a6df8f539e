"""One buffered path for Flower's protobuf API calls, without ``BaseHTTPMiddleware``'s machinery.

Flower 1.42 serves its Fleet and Runtime APIs (the SuperLink's, and the Runtime API a SuperNode
offers its ClientApp processes) from FastAPI apps whose protobuf translation, error translation
and (Fleet) node authentication are ``BaseHTTPMiddleware`` layers: each runs the rest of the app
in a task group and streams its reply back through memory streams and events, per request, per
layer. py-spy found that machinery, not the handlers, to be most of a busy SuperLink's CPU.
:class:`ProtobufFastPath` calls the same three Flower functions in Flower's order,
``http_error_translator(ProtobufTranslationMiddleware.dispatch(NodeAuthMiddleware.dispatch(app)))``,
handing each a ``call_next`` that runs the app and returns its whole reply (a protobuf handler's
reply is a placeholder of a few bytes: the translation layer serialises the result afterwards).
Status, body and headers are what Flower sends (tests/test_superlink_gate.py compares them).

What it relies on (Flower 1.42.0): the source of the three dispatch functions, pinned by
SHA-256 in :data:`PINNED_SOURCE` (and, on a SuperNode, of the ``create_app`` that lists its
middleware, :data:`SUPERNODE_APP`), checked by the launchers before installing it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from hetfed.runtime.internals import extend_supernode_app, supernode_app_why_not

if TYPE_CHECKING:
    from starlette.types import ASGIApp, Receive, Scope, Send

FLEET, RUNTIME = "/v1/fleet/", "/v1/runtime/"

# What ProtobufFastPath calls: each dispatch only awaits call_next once and reads its Response.
PINNED_SOURCE: dict[str, str] = {
    "flwr.supercore.error.http:http_error_translator": (
        "63e39a121204a42b9a1c76f5089e1ca74811750906cc4b017c902038609bfe4d"
    ),
    "flwr.supercore.protobuf.translation:ProtobufTranslationMiddleware": (
        "5ff23a6fdd06d0f99db4c972721307fb8523778ca380a8e6e9427562e571fd0f"
    ),
    "flwr.superlink.routers.fleet.node_auth:NodeAuthMiddleware": (
        "36b9ef8b482a1722710dfe45def3d5d9620294c340f25b6dfed5130aaa66e90e"
    ),
}


class ProtobufFastPath:
    """ASGI middleware, Flower's whole middleware list in one: a unary Fleet or Runtime API call
    (a route of Flower's ``PROTOBUF_REQUEST_TYPES`` under /v1/fleet/ or /v1/runtime/, no Fleet
    event-log plugin) runs ``http_error_translator(ProtobufTranslation(NodeAuth(app)))`` with
    Flower's own dispatch functions and a buffered ``call_next``; a POST to one of ``own_routes``
    (hetfed's batched object routes, which authenticate the node themselves) runs
    ``http_error_translator(app)``; every other request goes through ``chain`` (the gated list)
    built around the same app."""

    def __init__(self, app: ASGIApp, /, chain: list[Any], own_routes: tuple[str, ...] = ()) -> None:
        from flwr.supercore.error.http import http_error_translator
        from flwr.supercore.protobuf.translation import (
            PROTOBUF_REQUEST_TYPES,
            ProtobufTranslationMiddleware,
        )
        from flwr.superlink.routers.fleet.node_auth import NodeAuthMiddleware

        self.app = self.chain = app
        for cls, args, kwargs in reversed(chain):  # as starlette builds a middleware stack
            self.chain = cls(self.chain, *args, **kwargs)
        self.routes = {key for key in PROTOBUF_REQUEST_TYPES if key[1].startswith((FLEET, RUNTIME))}
        self.own_routes = {("POST", path) for path in own_routes}
        self.translate_errors = http_error_translator
        self.protobuf = ProtobufTranslationMiddleware(app).dispatch
        self.node_auth = NodeAuthMiddleware(app).dispatch

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        from starlette.requests import Request

        path = scope.get("root_path", "") + scope.get("path", "")
        key = (scope.get("method"), path)
        if scope["type"] != "http" or (key not in self.routes and key not in self.own_routes):
            await self.chain(scope, receive, send)
            return
        fleet = path.startswith(FLEET)
        if fleet and getattr(scope["app"].state, "fleet_event_log_plugin", None) is not None:
            await self.chain(scope, receive, send)
            return

        async def handler(request: Request) -> Any:
            return await _buffered(self.app, scope, _replay(await request.body(), receive))

        if key in self.own_routes:  # not a protobuf body; the route authenticates the node itself
            await (await self.translate_errors(Request(scope, receive), handler))(scope, receive, send)
            return

        async def authenticated(request: Request) -> Any:
            return await self.node_auth(request, handler)

        async def translated(request: Request) -> Any:
            return await self.protobuf(request, authenticated if fleet else handler)

        response = await self.translate_errors(Request(scope, receive), translated)
        await response(scope, receive, send)


def _replay(body: bytes, receive: Receive) -> Receive:
    """``receive`` for the inner app: the body already read by the protobuf layer, then the client's."""
    pending = [{"type": "http.request", "body": body, "more_body": False}]

    async def replayed() -> Any:
        return pending.pop() if pending else await receive()

    return replayed


async def _buffered(app: ASGIApp, scope: Scope, receive: Receive) -> Any:
    """Run ``app`` and return its reply as one starlette Response, headers as the app sent them
    (what BaseHTTPMiddleware's ``call_next`` returns, without streaming it through a task group)."""
    from starlette.responses import Response

    start: dict[str, Any] = {}
    body: list[bytes] = []

    async def send(message: Any) -> None:
        if message["type"] == "http.response.start":
            start.update(message)
        elif message["type"] == "http.response.body":
            body.append(message.get("body", b""))

    await app(scope, receive, send)
    if not start:
        raise RuntimeError("No response returned.")
    response = Response(b"".join(body), status_code=start["status"])
    response.raw_headers = list(start["headers"])
    return response


# The SuperNode's Runtime API app: create_app adds ProtobufTranslationMiddleware, then
# http_error_translator outermost, and nothing else (read in Flower 1.42.0).
SUPERNODE_APP = {
    "flwr.supernode.main:create_app": "f7215c8a9ef9279faeb489ae80c9542525c2c131aa8ba35d0f9d75b6db2b3f7d"
}


def why_not_on_supernode(pinned: Mapping[str, str] | None = None) -> str:
    """What :func:`install_on_supernode` relies on and this Flower lacks ("" = it can be installed);
    ``pinned`` defaults to :data:`PINNED_SOURCE` and :data:`SUPERNODE_APP`."""
    return supernode_app_why_not({**PINNED_SOURCE, **SUPERNODE_APP} if pinned is None else pinned)


def install_on_supernode() -> str:
    """Make ``flwr.supernode.main.create_app`` put a :class:`ProtobufFastPath` around the SuperNode's
    Runtime API middleware (its error and protobuf translation). Returns "" when installed, else why
    not (the SuperNode then runs stock). Call before the SuperNode starts."""

    def around_the_middleware(app: Any) -> None:
        from starlette.middleware import Middleware

        app.user_middleware = [Middleware(ProtobufFastPath, chain=list(app.user_middleware))]

    return extend_supernode_app({**PINNED_SOURCE, **SUPERNODE_APP}, around_the_middleware)
