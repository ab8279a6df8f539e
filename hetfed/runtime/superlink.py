"""``hetfed-superlink``: Flower's own SuperLink, each HTTP middleware entered only on its own API's paths.

    hetfed-superlink [--asgi gated|stock] [--pull own|stock] [--objects batched|stock]
                     <flower-superlink arguments>

Flower 1.42's SuperLink serves the Fleet, Control and Runtime APIs from one FastAPI app whose
every request passes eight ``BaseHTTPMiddleware`` layers. Four act only on Control API paths
(``/v1/control/...``: sensitive-response headers, account authentication, license check, event
log) and two only on Fleet paths (``/v1/fleet/...``: node authentication, event log); on any
other path their ``dispatch`` only awaits ``call_next``, as the two event logs do on every path
while no event-log plugin is configured (Flower's default). Yet each layer costs every request a
task group, memory streams and events: py-spy on a 16-SuperNode federation found nearly all of
the SuperLink's CPU in that machinery, not in the handlers (docs/benchmarks.md). ``gated`` (the
default) enters each of those six layers only where it acts, through a plain ASGI gate: a Fleet
request passes three layers instead of eight, a Runtime API request (the ServerApp's) two; the
error translation and protobuf layers stay on every path.

Those two and node authentication are ``BaseHTTPMiddleware`` too, and a Fleet or Runtime API call
(every request of a round) needs exactly them: :class:`hetfed.runtime.fast_path.ProtobufFastPath`
runs them without ``BaseHTTPMiddleware``'s machinery; Control API calls and a Fleet API with an
event-log plugin keep the gated stack. Routes, handlers, wire protocol, TLS and node
authentication are Flower's, unchanged, so stock SuperNodes work against this SuperLink and
hetfed's against a stock one.

The gate relies on what was read in Flower 1.42.0: the middleware list and the source of each
gated layer and of the path tests it uses, pinned by SHA-256. :func:`missing_gate_internals`
checks them first; if anything differs the launcher says so in one line and runs stock.
``stock`` runs Flower's SuperLink unchanged, in this process.

``--pull own`` (the default; in-memory state) answers a SuperNode's pull from its own messages
only, once their objects are in (:mod:`hetfed.runtime.pull`, self-tested the same way), and adds a
Fleet route on which a hetfed-supernode's empty pull is held until one of its messages is complete
(:mod:`hetfed.runtime.held_pull`); ``stock`` keeps Flower's scan of every held message.

``--objects batched`` (the default) adds two Fleet routes on which a hetfed-supernode, and two
Runtime API routes on which hetfed's ServerApp, moves a message's objects in one request each way
(:mod:`hetfed.runtime.object_batch`: Flower's node authentication or task-token check, and Flower's
handlers; Flower's own routes unchanged); ``stock`` adds none.
"""

from __future__ import annotations

import argparse
import inspect
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hetfed.runtime import fast_path, held_pull, object_batch, pull, telemetry_off
from hetfed.runtime.fast_path import FLEET, ProtobufFastPath
from hetfed.runtime.internals import attr, changed_pinned
from hetfed.runtime.seam import ASGI_MODES

if TYPE_CHECKING:
    from starlette.types import ASGIApp, Receive, Scope, Send

PULL_MODES = ("own", "stock")
OBJECT_MODES = ("batched", "stock")
CONTROL = "/v1/control/"
_CONTROL = "flwr.superlink.routers.control.middlewares"

# The six path-specific layers, in the order flwr.superlink.main._get_middleware lists them: the
# prefix of the paths each acts on, and for the event logs the app-state plugin without which they
# pass every request on (Flower sets none unless FLWR_ENABLE_EVENT_LOG=1).
GATED: dict[str, tuple[str, str]] = {
    f"{_CONTROL}:ControlSensitiveResponseMiddleware": (CONTROL, ""),
    f"{_CONTROL}:ControlAuthenticationMiddleware": (CONTROL, ""),
    f"{_CONTROL}:ControlLicenseMiddleware": (CONTROL, ""),
    f"{_CONTROL}:ControlEventLogMiddleware": (CONTROL, "control_event_log_plugin"),
    "flwr.superlink.routers.fleet.node_auth:NodeAuthMiddleware": (FLEET, ""),
    "flwr.superlink.routers.fleet.middlewares:FleetEventLogMiddleware": (FLEET, "fleet_event_log_plugin"),
}

# SHA-256 of the source read in Flower 1.42.0: each gated layer (its dispatch passes every other
# path straight to call_next; NodeAuthMiddleware's is in fast_path.PINNED_SOURCE), the path tests
# they use, and the list create_app installs.
PINNED_SOURCE: dict[str, str] = {
    f"{_CONTROL}:ControlSensitiveResponseMiddleware": (
        "25cca938600324c2f1834aceba94915a6c8ea26871d796c5af5608ad9b18a90b"
    ),
    f"{_CONTROL}:ControlAuthenticationMiddleware": (
        "1495e41d9bbbd25d2fce0e7b81da0780ed9c9064fa9651a18987987daa87df21"
    ),
    f"{_CONTROL}:ControlLicenseMiddleware": (
        "0f57194171e921a3d5cbea4f1d59d8313c386c3b8a66ee79dfed6f845b0a15dc"
    ),
    f"{_CONTROL}:ControlEventLogMiddleware": (
        "d8db2d506ca7d0c5bc27c81bb5c1eebd6c41fc27e758e3ad47c687b0ee002636"
    ),
    f"{_CONTROL}:_is_control_path": "bfb5469e9013b25639a219e6c97b17e879e676253119b7d66f28ee27323f1291",
    f"{_CONTROL}:_is_control_sensitive_route": (
        "aae3ed426e1ef62ca20407ffc8e2193dac87ac8f99ea2e5e4005a57fa56c5961"
    ),
    f"{_CONTROL}:_is_control_auth_route": (
        "29389e405457044cc76d213dc23ed0203d8b79b6f1bde6382e9768d9ef06f2d7"
    ),
    "flwr.superlink.routers.fleet.middlewares:FleetEventLogMiddleware": (
        "4466ecde96fb2315fe44027e038b8ac693b49dc65c7a3810c2b2c5844305ae76"
    ),
    "flwr.superlink.main:_get_middleware": (
        "911d5e2a5aaf11ec21b9830e7f08948ba3676bbc9462da5b8f466fbb73e5724a"
    ),
}


class PathGate:
    """ASGI middleware: an HTTP request whose path starts with ``prefix`` (and, given ``plugin``,
    whose app state holds that plugin) goes through ``middleware``, built around the same inner
    app; every other request goes straight to the inner app."""

    def __init__(self, app: ASGIApp, /, middleware: type, prefix: str, plugin: str = "") -> None:
        self.app, self.prefix, self.plugin = app, prefix, plugin
        self.gated = middleware(app)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.gated(scope, receive, send)
            return
        # The layers test request.url.path (starlette: root_path + path) and request.app.state.
        path = scope.get("root_path", "") + scope["path"]
        enter = path.startswith(self.prefix)
        if enter and self.plugin:
            enter = getattr(scope["app"].state, self.plugin, None) is not None
        await (self.gated if enter else self.app)(scope, receive, send)


def gated_middleware(stock: Callable[[], list[Any]]) -> list[Any]:
    """Flower's middleware list (``stock()``) with each layer of :data:`GATED` behind a :class:`PathGate`."""
    from starlette.middleware import Middleware

    gates = {attr(path): gate for path, gate in GATED.items()}
    out = []
    for layer in stock():
        gate = gates.get(layer.cls)
        if gate is None or layer.args or layer.kwargs:  # Flower builds the gated layers bare
            out.append(layer)
        else:
            out.append(Middleware(PathGate, middleware=layer.cls, prefix=gate[0], plugin=gate[1]))
    return out


def missing_gate_internals(pinned: Mapping[str, str] | None = None) -> list[str]:
    """What the gate relies on and this Flower lacks ([] = all there): the ``pinned`` sources as read
    (default: :data:`PINNED_SOURCE` and the fast path's), no extension middleware, the gated layers in
    Flower's list, every sensitive Control route under /v1/control/, and create_app taking its list
    from ``_get_middleware``."""
    try:
        changed = changed_pinned({**PINNED_SOURCE, **fast_path.PINNED_SOURCE} if pinned is None else pinned)
        if changed:
            return changed
        missing = []
        if attr("flwr.superlink.extensions:get_middleware")():
            missing.append("no extension middleware (flwr.superlink.extensions)")
        listed = {layer.cls for layer in attr("flwr.superlink.main:_get_middleware")()}
        if not {attr(path) for path in GATED} <= listed:
            missing.append("the gated middleware in flwr.superlink.main._get_middleware")
        if not all(p.startswith(CONTROL) for _, p in attr(f"{_CONTROL}:CONTROL_SENSITIVE_ROUTE_KEYS")):
            missing.append("sensitive Control routes under /v1/control/")
        if "middleware=_get_middleware()" not in inspect.getsource(attr("flwr.superlink.main:create_app")):
            missing.append("create_app(middleware=_get_middleware())")
        return missing
    except (ImportError, AttributeError, OSError, TypeError) as exc:
        return [f"{type(exc).__name__}: {exc}"]


def hetfed_middleware(stock: Callable[[], list[Any]], own_routes: tuple[str, ...] = ()) -> list[Any]:
    """The SuperLink's middleware: one :class:`ProtobufFastPath` (which also serves ``own_routes``)
    around the gated list."""
    from starlette.middleware import Middleware

    return [Middleware(ProtobufFastPath, chain=gated_middleware(stock), own_routes=own_routes)]


def install_gate(own_routes: tuple[str, ...] = ()) -> None:
    """Make ``flwr.superlink.main.create_app`` build its app with :func:`hetfed_middleware`."""
    import flwr.superlink.main as superlink_main

    stock = superlink_main._get_middleware
    # create_app looks _get_middleware up in its module's globals at each call.
    vars(superlink_main)["_get_middleware"] = lambda: hetfed_middleware(stock, own_routes)


def main(argv: list[str] | None = None) -> None:
    """Run Flower's SuperLink with the gate (``--asgi gated``), the own-messages pull (``--pull
    own``) and the batched object routes (``--objects batched``), each after its self-test, or without."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--asgi", default="gated")
    parser.add_argument("--pull", default="own")
    parser.add_argument("--objects", default="batched")
    ours, rest = parser.parse_known_args(sys.argv[1:] if argv is None else argv)
    telemetry_off()
    for flag, value, modes in (
        ("--asgi", ours.asgi, ASGI_MODES),
        ("--pull", ours.pull, PULL_MODES),
        ("--objects", ours.objects, OBJECT_MODES),
    ):
        if value not in modes:
            raise SystemExit(f"hetfed-superlink: {flag} must be one of {', '.join(modes)}, got {value!r}")
    own_routes: tuple[str, ...] = ()
    if ours.objects == "batched":
        if why := object_batch.install_on_superlink():
            print(f"hetfed-superlink: no batched object routes: this Flower lacks {why}", file=sys.stderr)
        else:
            own_routes = (
                object_batch.FLEET_PULL,
                object_batch.FLEET_PUSH,
                object_batch.PULL,
                object_batch.PUSH,
            )
            print("hetfed-superlink: a message's objects in one Fleet request each way", file=sys.stderr)
    if ours.pull == "own":
        if not pull.state_in_memory(rest):
            why = "the state is on disk (--database)"
        else:
            missing = pull.missing_pull_internals()
            why = f"this Flower lacks {missing[0]}" if missing else ""
        if why:
            print(f"hetfed-superlink: stock message pull: {why}", file=sys.stderr)
        else:
            pull.install()
            print("hetfed-superlink: a node's pull sees its own complete messages", file=sys.stderr)
            if why := held_pull.install_on_superlink():
                print(f"hetfed-superlink: no held pull: this Flower lacks {why}", file=sys.stderr)
            else:
                own_routes += (held_pull.PULL_MESSAGES,)
                print(f"hetfed-superlink: an empty pull is held up to {held_pull.WAIT:g} s", file=sys.stderr)
    if ours.asgi == "gated":
        missing = missing_gate_internals()
        if missing:
            print(f"hetfed-superlink: running stock Flower: this Flower lacks {missing[0]}", file=sys.stderr)
        else:
            install_gate(own_routes)
            print("hetfed-superlink: HTTP middleware gated by API path", file=sys.stderr)
    from flwr.superlink.cli.flower_superlink import flower_superlink

    # Flower picks its exit telemetry event by the program name.
    sys.argv = [str(Path(sys.executable).with_name("flower-superlink")), *rest]
    flower_superlink()


if __name__ == "__main__":
    main()
