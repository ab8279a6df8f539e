"""Self-test of the Flower internals the warm runtime relies on (all of Flower 1.42.0).

The warm runtime reaches past Flower's public API in a few places: the sleeps inside
the SuperNode's main loop, the keyword defaults of the object-pull backoff, the
ClientApp process's task-input / reply / task-output helpers, the Runtime API client
and messages, and the SuperNode's in-memory task tokens (to answer a task at once when
its worker dies). :func:`missing_internals` checks each before anything is patched;
the launcher runs stock Flower when the list is not empty.

App pinning (:mod:`hetfed.runtime.pinning`) needs one check inside Flower's SuperNode in
both runtimes, so the stock runtime with an allow-list is no longer "nothing patched":
:func:`missing_pinning_internals` checks what that check relies on, and a SuperNode
with an allow-list refuses to start (rather than run unpinned) when anything is missing.
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
from collections.abc import Callable, Mapping
from typing import Any

FLOWER_VERSION = "1.42.0"  # the only release these internals were read in

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
    """What differs from the Flower the ``path -> SHA-256`` sources were read in, described for the
    launchers' one-line fallback: its version, else each pinned source that changed ([] = as read)."""
    if attr("flwr.supercore.version:package_version") != FLOWER_VERSION:
        return [f"flwr version {FLOWER_VERSION}"]
    return [f"the source of {path} as read in Flower {FLOWER_VERSION}" for path in changed_sources(pinned)]


def extend_supernode_app(pinned: Mapping[str, str], extend: Callable[[Any], None]) -> str:
    """Make ``flwr.supernode.main.create_app`` call ``extend(app)`` on each Runtime API app it creates,
    if every ``pinned`` source is as read. Returns "" when installed, else why not (nothing patched).
    Call before the SuperNode starts."""
    try:
        if changed := changed_sources(pinned):
            return f"the source of {changed[0]} differs from Flower's 1.42.0"
        import flwr.supernode.main as supernode_main
    except (ImportError, AttributeError, OSError, TypeError) as exc:
        return f"{type(exc).__name__}: {exc}"
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
    try:
        changed = changed_pinned({**pinned, **SUPERLINK_APP})
        import flwr.superlink.extensions as extensions
    except (ImportError, AttributeError, OSError, TypeError) as exc:
        return f"{type(exc).__name__}: {exc}"
    if changed:
        return changed[0]
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


def _version() -> bool:
    return bool(attr("flwr.supercore.version:package_version") == FLOWER_VERSION)


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


# (what it is, how to check it). Names are those of Flower 1.42.0.
CHECKS: list[tuple[str, Callable[[], bool]]] = [
    (f"flwr version {FLOWER_VERSION}", _version),
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
        "http_request_response makes a self-registered node's keys with generate_key_pairs "
        "(hetfed.runtime.node_key)",
        _source_has(
            "flwr.supernode.fleet_http_connection:http_request_response",
            "authentication_keys = generate_key_pairs()",
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


# What app pinning's check inside the SuperNode relies on (both runtimes).
PINNING_CHECKS: list[tuple[str, Callable[[], bool]]] = [
    (f"flwr version {FLOWER_VERSION}", _version),
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


def missing_internals() -> list[str]:
    """The description of every check that fails (empty: the warm runtime may run)."""
    return _failing(CHECKS)


def missing_pinning_internals() -> list[str]:
    """The description of every pinning check that fails (empty: pinning can be installed)."""
    return _failing(PINNING_CHECKS)


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
