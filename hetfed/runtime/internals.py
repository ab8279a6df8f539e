"""Self-test of the Flower internals the warm runtime relies on (all of Flower 1.42.0).

The warm runtime reaches past Flower's public API in a few places: the sleeps inside
the SuperNode's main loop, the keyword defaults of the object-pull backoff, the
ClientApp process's task-input / reply / task-output helpers, the Runtime API client
and messages, and the SuperNode's in-memory task tokens (to answer a task at once when
its worker dies). :func:`missing_internals` checks each before anything is patched;
the launcher runs stock Flower when the list is not empty.

App pinning (:mod:`hetfed.runtime.pinning`) installs one check inside Flower's SuperNode in
both runtimes, so the stock runtime with an allow-list is no longer "nothing patched":
:func:`missing_pinning_internals` checks what that check relies on. Where it is missing, the warm
worker's own check of each app build still pins a silo; a SuperNode with neither refuses to start.

Every check is of the installed Flower's code, not of its version: a function hetfed replaces or
wraps is pinned by the SHA-256 of its source as read in Flower 1.42.0, so a later Flower whose code
there is the same keeps the feature, and one whose code changed runs that feature stock
(:mod:`hetfed.runtime.features` lists them; ``hetfed runtime check`` prints the verdicts).
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
from collections.abc import Callable, Mapping
from typing import Any

FLOWER_VERSION = "1.42.0"  # the release these internals were read in (and their source hashed)

# Literal sleeps of flwr.supernode.start_client_internal (idle pull; reply and object waits).
IDLE_SLEEP = 3
REPLY_SLEEP = 0.5


def attr(path: str) -> Any:
    """``package.module:attr.sub`` -> the object (ImportError / AttributeError if absent)."""
    module, _, attrs = path.partition(":")
    obj: Any = importlib.import_module(module)
    for name in filter(None, attrs.split(".")):
        obj = getattr(obj, name)
    return obj


def changed_sources(pinned: Mapping[str, str]) -> list[str]:
    """The ``path -> SHA-256 of its source`` entries whose source differs now ([] = all as read)."""
    return [
        path
        for path, digest in pinned.items()
        if hashlib.sha256(inspect.getsource(attr(path)).encode()).hexdigest() != digest
    ]


def changed_pinned(pinned: Mapping[str, str]) -> list[str]:
    """Each ``path -> SHA-256`` source that differs from the one read in Flower 1.42.0, described for
    the launchers' one-line fallback ([] = all as read)."""
    return [f"the source of {path} as read in Flower {FLOWER_VERSION}" for path in changed_sources(pinned)]


def why_not_as_read(pinned: Mapping[str, str]) -> str:
    """ "" when every ``pinned`` source is as read in Flower 1.42.0, else the first difference (or
    what is gone)."""
    changed = _changed(pinned)
    return changed[0] if changed else ""


def supernode_app_why_not(pinned: Mapping[str, str]) -> str:
    """What :func:`extend_supernode_app` needs and this Flower lacks ("" = it can be installed)."""
    return why_not_as_read(pinned) or _gone("flwr.supernode.main:create_app")


def superlink_app_why_not(pinned: Mapping[str, str]) -> str:
    """What :func:`extend_superlink_app` needs and this Flower lacks ("" = it can be installed)."""
    return why_not_as_read({**pinned, **SUPERLINK_APP}) or _gone("flwr.superlink.extensions:configure_app")


def _gone(path: str) -> str:
    """ "" when ``path`` exists in this Flower, else what is missing."""
    try:
        attr(path)
    except (ImportError, AttributeError) as exc:
        return f"{type(exc).__name__}: {exc}"
    return ""


def extend_supernode_app(pinned: Mapping[str, str], extend: Callable[[Any], None]) -> str:
    """Make ``flwr.supernode.main.create_app`` call ``extend(app)`` on each Runtime API app it creates,
    if every ``pinned`` source is as read. Returns "" when installed, else why not (nothing patched).
    Call before the SuperNode starts."""
    if why := supernode_app_why_not(pinned):
        return why
    import flwr.supernode.main as supernode_main

    stock = supernode_main.create_app

    def create_app(*args: Any, **kwargs: Any) -> Any:
        app = stock(*args, **kwargs)
        extend(app)
        return app

    # flower_supernode imports create_app from its module when it starts the Runtime API.
    vars(supernode_main)["create_app"] = create_app
    return ""


def extend_superlink_app(pinned: Mapping[str, str], extend: Callable[[Any], None]) -> str:
    """Make ``flwr.superlink.main.create_app`` call ``extend(app)`` once it added its routers (through
    Flower's extension hook ``extensions.configure_app``), if this is the Flower 1.42.0 every
    ``pinned`` source (and create_app's) was read in. Returns "" when installed, else why not
    (nothing patched). Call before the SuperLink starts."""
    if why := superlink_app_why_not(pinned):
        return why
    import flwr.superlink.extensions as extensions

    stock = extensions.configure_app

    def configure_app(app: Any) -> None:
        stock(app)
        extend(app)

    extensions.configure_app = configure_app  # create_app calls it by module attribute
    return ""


# create_app, which calls extensions.configure_app(app) after adding its routers (Flower 1.42.0).
SUPERLINK_APP = {
    "flwr.superlink.main:create_app": "ee966b630c8ba8b56315e8db3296df6c2ae6d9bd3a9826e28be63c85e321dbe1"
}


def _source_has(path: str, *snippets: str) -> Callable[[], bool]:
    return lambda: all(s in inspect.getsource(attr(path)) for s in snippets)


def _kwdefaults(path: str, *names: str) -> Callable[[], bool]:
    return lambda: all(n in (attr(path).__kwdefaults__ or {}) for n in names)


def _module_time() -> bool:
    import time

    return attr("flwr.supernode.start_client_internal:time") is time


def _fields(path: str, *names: str) -> Callable[[], bool]:
    return lambda: all(n in attr(path).DESCRIPTOR.fields_by_name for n in names)


def _keyword_call(path: str, *names: str) -> Callable[[], bool]:
    """``path`` takes every name as a keyword and ``start_client_internal`` passes each by keyword."""

    def check() -> bool:
        params = inspect.signature(attr(path)).parameters
        source = inspect.getsource(attr("flwr.supernode.start_client_internal"))
        return all(n in params and f"{n}=" in source for n in names)

    return check


_SCI = "flwr.supernode.start_client_internal"
# The SuperNode's pull step (wrapped by hetfed.runtime.dropped, .waits and .pinning) and the
# ClientApp process's main function (what the warm worker does, task after task), as read.
PULL_STEP = {
    f"{_SCI}:_pull_and_store_message": "eaf5d0e36dc34e4cf46a490511d077ac55cc8edbbcdbe938c1f6dbcb758628be"
}
RUN_CLIENTAPP = {
    "flwr.supernode.runtime.run_clientapp:run_clientapp": (
        "6ce09559f3a2f5dcafb7d08f4b443585d76b9b53b9cb29ba1ec06a6982163443"
    )
}

WARM_PINNED = {**RUN_CLIENTAPP, **PULL_STEP}

# (what it is, how to check it): the rest of what the warm ClientApp runtime relies on (besides
# WARM_PINNED). Names are those of Flower 1.42.0.
CHECKS: list[tuple[str, Callable[[], bool]]] = [
    ("start_client_internal uses module `time`", _module_time),
    (
        f"start_client_internal sleeps {IDLE_SLEEP} s idle and {REPLY_SLEEP} s for replies",
        _source_has(
            "flwr.supernode.start_client_internal",
            f"time.sleep({IDLE_SLEEP})",
            f"time.sleep({REPLY_SLEEP})",
            "run_id = _pull_and_store_message(",
        ),
    ),
    (
        "start_client_internal._pull_and_store_message",
        lambda: callable(attr("flwr.supernode.start_client_internal:_pull_and_store_message")),
    ),
    (
        "_pull_and_store_message creates the task and stores the message before pulling its objects "
        "(hetfed.runtime.dropped)",
        lambda: (
            _source_has(
                "flwr.supernode.start_client_internal:_pull_and_store_message",
                "task_id = state.create_task(",
                "state.store_message(message)",
                "except RunNotRunningException:",
            )()
            and _keyword_call(
                "flwr.supernode.start_client_internal:_pull_and_store_message", "state", "object_store"
            )()
        ),
    ),
    (
        "pull_objects / pull_and_inflate_object_from_tree backoff keywords",
        lambda: (
            _kwdefaults(
                "flwr.supercore.inflatable.inflatable_utils:pull_objects", "initial_backoff", "backoff_cap"
            )()
            and _kwdefaults(
                "flwr.supercore.inflatable.inflatable_utils:pull_and_inflate_object_from_tree",
                "initial_backoff",
                "backoff_cap",
            )()
        ),
    ),
    (
        "Runtime API defaults",
        lambda: (
            isinstance(attr("flwr.supercore.constant:UVICORN_DEFAULT_HOST"), str)
            and isinstance(attr("flwr.supercore.constant:SUPERNODE_UVICORN_DEFAULT_PORT"), int)
        ),
    ),
    ("flower_supernode entry point", lambda: callable(attr("flwr.supernode.cli:flower_supernode"))),
    ("isolation mode `process`", lambda: attr("flwr.common.constant:ISOLATION_MODE_PROCESS") == "process"),
    ("NodeStateFactory.state", lambda: callable(attr("flwr.supernode.nodestate:NodeStateFactory.state"))),
    (
        "InMemoryNodeState task tokens (task_token_store, lock_task_store, active_until)",
        _source_has(
            "flwr.supercore.corestate.in_memory_corestate",
            "self.task_token_store: dict[int, TokenRecord]",
            "self.lock_task_store",
            "record.active_until < current",
        ),
    ),
    (
        "a claimed task lives HEARTBEAT_DEFAULT_INTERVAL s before its first heartbeat "
        "(hetfed.runtime.worker.after_the_first_interval)",
        _source_has(
            "flwr.supercore.corestate.in_memory_corestate",
            "active_until=claimed_at + timedelta(seconds=HEARTBEAT_DEFAULT_INTERVAL)",
            "seconds=HEARTBEAT_PATIENCE * HEARTBEAT_DEFAULT_INTERVAL",
        ),
    ),
    (
        "run_clientapp helpers pull_task_input / push_message / push_task_output",
        lambda: all(
            callable(attr(f"flwr.supernode.runtime.run_clientapp:{n}"))
            for n in ("pull_task_input", "push_message", "push_task_output")
        ),
    ),
    (
        "RuntimeHttpClient calls",
        lambda: all(
            hasattr(attr("flwr.supercore.runtime:RuntimeHttpClient"), n)
            for n in (
                "from_server_address",
                "AcquireTask",
                "PullTaskInput",
                "PullMessages",
                "SendTaskHeartbeat",
                "close",
            )
        ),
    ),
    ("Runtime API messages", _fields("flwr.proto.runtime_pb2:AcquireTaskRequest", "supported_task_types")),
    ("TaskType.CLIENT_APP", lambda: bool(attr("flwr.supercore.constant:TaskType.CLIENT_APP"))),
    (
        "runtime interceptors, retry invoker, heartbeat sender",
        lambda: all(
            callable(attr(p))
            for p in (
                "flwr.supercore.interceptors:RuntimeTokenHttpInterceptor",
                "flwr.supercore.interceptors:RuntimeVersionHttpInterceptor",
                "flwr.supercore.retry:make_simple_http_retry_invoker",
                "flwr.supercore.heartbeat:HeartbeatSender",
                "flwr.supercore.heartbeat:make_task_heartbeat_fn_http",
            )
        ),
    ),
    (
        "FAB install and ClientApp loader",
        lambda: (
            callable(attr("flwr.cli.install:install_from_fab"))
            and callable(attr("flwr.clientapp.utils:get_load_client_app_fn"))
        ),
    ),
]


# What hetfed.runtime.node_key relies on.
NODE_KEY_CHECKS: list[tuple[str, Callable[[], bool]]] = [
    (
        "http_request_response makes a self-registered node's keys with generate_key_pairs",
        _source_has(
            "flwr.supernode.fleet_http_connection:http_request_response",
            "authentication_keys = generate_key_pairs()",
        ),
    ),
]

# What app pinning's check inside the SuperNode relies on (both runtimes), besides PULL_STEP.
PINNING_CHECKS: list[tuple[str, Callable[[], bool]]] = [
    (
        "start_client_internal._pull_and_store_message(state, object_store, node_config, receive, get_run, "
        "get_fab), called with keywords",
        _keyword_call(
            "flwr.supernode.start_client_internal:_pull_and_store_message",
            "state",
            "object_store",
            "node_config",
            "receive",
            "get_run",
            "get_fab",
        ),
    ),
    (
        "start_client_internal._insert_message",
        lambda: callable(attr("flwr.supernode.start_client_internal:_insert_message")),
    ),
    ("ErrorCode.INVALID_FAB", lambda: attr("flwr.common.constant:ErrorCode.INVALID_FAB") == 7),
    ("flwr.cli.build.build_fab_from_disk", lambda: callable(attr("flwr.cli.build:build_fab_from_disk"))),
    ("flower_supernode entry point", lambda: callable(attr("flwr.supernode.cli:flower_supernode"))),
]


def missing_internals(pinned: Mapping[str, str] = WARM_PINNED) -> list[str]:
    """The description of every check that fails (empty: the warm runtime may run); ``pinned``: the
    sources it relies on as read."""
    return _changed(pinned) + _failing(CHECKS)


def missing_node_key_internals() -> list[str]:
    """The description of every node-key check that fails (empty: the P-256 key can be installed)."""
    return _failing(NODE_KEY_CHECKS)


def missing_pinning_internals(pinned: Mapping[str, str] = PULL_STEP) -> list[str]:
    """The description of every pinning check that fails (empty: the SuperNode's check can be installed)."""
    return _changed(pinned) + _failing(PINNING_CHECKS)


def _changed(pinned: Mapping[str, str]) -> list[str]:
    try:
        return changed_pinned(pinned)
    except (ImportError, AttributeError, OSError, TypeError) as exc:
        return [f"{type(exc).__name__}: {exc}"]


def _failing(checks: list[tuple[str, Callable[[], bool]]]) -> list[str]:
    missing = []
    for what, check in checks:
        try:
            ok = check()
        except Exception:  # an import or attribute that is gone is a miss, whatever it raises
            ok = False
        if not ok:
            missing.append(what)
    return missing
