"""``hetfed-supernode``: Flower's own SuperNode, with a warm ClientApp runtime or stock.

    hetfed-supernode [--runtime warm|stock] [--approved-apps FILE] <flower-supernode arguments>

``stock`` replaces this process with ``flower-supernode`` (subprocess isolation: a
``flwr-clientapp`` process per message; nothing patched). ``warm`` (the default) first
runs the self-test of :mod:`hetfed.runtime.internals`; if anything is missing it says
so in one line and runs stock. Otherwise it

1. installs the adaptive waits of :mod:`hetfed.runtime.waits` in this process,
2. starts a :class:`WorkerSupervisor` thread that runs one :mod:`hetfed.runtime.worker`
   and restarts it when it exits (a task the dead worker held is answered at once
   with Flower's own "ClientApp crashed" error, by expiring its task token),
3. finishes the task of a message Flower's SuperNode dropped (:mod:`hetfed.runtime.dropped`:
   it would hold the one worker for Flower's 2 h object-pull limit),
4. runs Flower's ``flower-supernode`` entry point in-process with ``--isolation
   process`` (the SuperNode then starts no executor of its own).

With ``--approved-apps FILE`` (app pinning, :mod:`hetfed.runtime.pinning`) the SuperNode
answers every run whose app build is not in FILE with an error reply, in both runtimes:
the check is installed in this process (so ``stock`` then runs Flower's SuperNode
in-process instead of replacing itself), and the warm worker checks FILE again before it
loads a build. Where this Flower lacks what the SuperNode's check needs, the warm worker's
check alone pins the silo (said in one line); where there is no warm worker of this
SuperNode either (``--runtime stock``, ``--worker external``, or a warm runtime this Flower
cannot run), the SuperNode does not start (one line saying why).

TLS and node authentication of the SuperNode-SuperLink link are Flower's, unchanged.
"""

from __future__ import annotations

import argparse
import datetime
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from logging import ERROR, INFO, WARNING
from pathlib import Path

from hetfed.runtime import telemetry_off
from hetfed.runtime.internals import (
    IDLE_SLEEP,
    REPLY_SLEEP,
    missing_internals,
    missing_node_key_internals,
    missing_pinning_internals,
)
from hetfed.runtime.pinning import install_supernode_check
from hetfed.runtime.seam import RUNTIMES

WORKERS = ("local", "external")
IDLE_FAST = 0.1  # s between SuperLink pulls right after a message (grows x1.5 per empty pull to 3 s)
REPLY_FAST = 0.01  # s between checks for the worker's reply (grows to 0.5 s; the worker also signals)
BIN = Path(sys.executable).parent


def split_options(argv: list[str]) -> tuple[str, Path | None, list[str]]:
    """(``--runtime``, ``--approved-apps`` or None, the remaining arguments for Flower)."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--runtime", default="warm")
    parser.add_argument("--approved-apps")
    ours, rest = parser.parse_known_args(argv)
    if ours.runtime not in RUNTIMES:
        raise SystemExit(
            f"hetfed-supernode: --runtime must be one of {', '.join(RUNTIMES)}, got {ours.runtime!r}"
        )
    return ours.runtime, Path(ours.approved_apps) if ours.approved_apps else None, rest


def split_worker(argv: list[str]) -> tuple[str, list[str]]:
    """(``--worker`` value, the rest): ``local`` (default) or ``external``.

    ``external``: this SuperNode starts no worker; one runs elsewhere against its Runtime
    API (``python -m hetfed.runtime.worker --runtime-api-address HOST:PORT``, e.g. the
    ClientApp executor container of a compose silo). Only the waits are installed here.
    """
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--worker", default="local")
    ours, rest = parser.parse_known_args(argv)
    if ours.worker not in WORKERS:
        raise SystemExit(
            f"hetfed-supernode: --worker must be one of {', '.join(WORKERS)}, got {ours.worker!r}"
        )
    return ours.worker, rest


def split_runtime(argv: list[str]) -> tuple[str, list[str]]:
    """(``--runtime`` value, the remaining arguments for Flower); an unknown runtime is one line."""
    runtime, _, rest = split_options(argv)
    return runtime, rest


def with_isolation(argv: list[str], mode: str) -> list[str]:
    """``argv`` with ``--isolation mode`` (any given isolation replaced)."""
    out, skip = [], False
    for i, arg in enumerate(argv):
        if skip:
            skip = False
            continue
        if arg == "--isolation":
            skip = i + 1 < len(argv)
            continue
        if arg.startswith("--isolation="):
            continue
        out.append(arg)
    return [*out, "--isolation", mode]


def runtime_api(argv: list[str]) -> tuple[str, str | None]:
    """Where the worker reaches this SuperNode's Runtime API: (host:port, CA file or None)."""
    from flwr.supercore.constant import SUPERNODE_UVICORN_DEFAULT_PORT, UVICORN_DEFAULT_HOST

    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--host", default=UVICORN_DEFAULT_HOST)
    parser.add_argument("--port", type=int, default=SUPERNODE_UVICORN_DEFAULT_PORT)
    parser.add_argument("--ssl-ca-certfile")
    opts, _ = parser.parse_known_args(argv)
    host = {"0.0.0.0": "127.0.0.1", "::": "::1", "[::]": "::1"}.get(opts.host, opts.host)
    host = f"[{host}]" if ":" in host and not host.startswith("[") else host
    return f"{host}:{opts.port}", opts.ssl_ca_certfile


class WorkerSupervisor(threading.Thread):
    """Keeps one warm worker running; relays its busy/done reports to the SuperNode loop.

    ``reply_ready`` is set whenever the worker finished a task (the SuperNode's reply
    wait returns at once); ``expire_task(task_id)`` is called when the worker died
    holding a task. Restarts back off from 0.5 s to 30 s while the worker keeps dying
    within 10 s of its start.
    """

    def __init__(
        self,
        runtime_api_address: str,
        ca_file: str | None,
        reply_ready: threading.Event,
        expire_task: Callable[[int], None],
        approved_apps: Path | None = None,
    ) -> None:
        super().__init__(name="hetfed-worker-supervisor", daemon=True)
        self.address, self.ca_file = runtime_api_address, ca_file
        self.approved_apps = approved_apps
        self.reply_ready, self.expire_task = reply_ready, expire_task
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_w, False)
        self.worker: subprocess.Popen | None = None

    def wake(self) -> None:
        """A message arrived: let the worker claim it now."""
        try:
            os.write(self.wake_w, b"w")
        except BlockingIOError:  # the pipe is full of wake-ups already
            pass

    def run(self) -> None:
        from flwr.supercore import log

        delay = 0.5
        while True:
            started = time.monotonic()
            code, held = self._run_worker()
            if held is not None:
                self.expire_task(held)
            self.reply_ready.set()
            delay = 0.5 if time.monotonic() - started > 10 else min(30.0, delay * 2)
            task = (
                f" while running task {held} (answered with Flower's ClientApp-crashed error)" if held else ""
            )
            if code in (-signal.SIGTERM, -signal.SIGINT):  # the node's process group is being stopped
                log(INFO, "hetfed warm worker stopped by signal %d%s", -code, task)
                time.sleep(5.0)  # restart only if this SuperNode is still running by then
                continue
            log(ERROR, "hetfed warm worker exited with code %s%s; restarting it in %.1f s", code, task, delay)
            time.sleep(delay)

    def _run_worker(self) -> tuple[int, int | None]:
        """Run one worker until it exits: (exit code, the task it held or None)."""
        status_r, status_w = os.pipe()
        argv = [sys.executable, "-m", "hetfed.runtime.worker", "--runtime-api-address", self.address]
        argv += [
            "--wake-fd",
            str(self.wake_r),
            "--status-fd",
            str(status_w),
            "--parent-pid",
            str(os.getpid()),
        ]
        if self.ca_file:
            argv += ["--root-certificates", self.ca_file]
        if self.approved_apps:
            argv += ["--approved-apps", str(self.approved_apps)]
        self.worker = subprocess.Popen(argv, pass_fds=(self.wake_r, status_w))
        os.close(status_w)
        held: int | None = None
        with os.fdopen(status_r, "rb") as status:
            for line in status:
                kind, _, task = line.decode().strip().partition(" ")
                if kind == "busy":
                    held = int(task)
                elif kind == "done":
                    held = None
                    self.reply_ready.set()
        return self.worker.wait(), held


def node_state_expirer() -> Callable[[int], None]:
    """Capture the SuperNode's NodeState; return ``expire(task_id)``: its token expires now.

    Flower then does what it does for a ClientApp process that stopped sending
    heartbeats: the task is marked failed and the message gets an Error reply
    (``CLIENT_APP_CRASHED``), at the SuperNode's next look at its replies.
    """
    from flwr.supernode.nodestate import NodeState, NodeStateFactory

    states: list = []
    original = NodeStateFactory.state

    def state(self: NodeStateFactory) -> NodeState:
        instance = original(self)
        if not states:
            states.append(instance)
        return instance

    NodeStateFactory.state = state  # type: ignore[method-assign]

    def expire(task_id: int) -> None:
        if not states:
            return
        node_state = states[0]
        with node_state.lock_task_store:
            record = node_state.task_token_store.get(task_id)
            if record is not None:
                record.active_until = datetime.datetime.now(
                    tz=record.active_until.tzinfo
                ) - datetime.timedelta(seconds=1)

    return expire


def run_warm(flower_args: list[str], approved_apps: Path | None = None, worker: str = "local") -> None:
    """Flower's SuperNode in this process with adaptive waits and a supervised warm worker.

    ``worker = "external"``: no worker here (one runs elsewhere against the Runtime API);
    the reply waits then follow only their backoff.
    """
    from flwr.supercore import log
    from flwr.supernode.cli import flower_supernode

    from hetfed.runtime import dropped, fast_path, held_pull, node_key, object_batch, waits

    args = with_isolation(flower_args, "process")
    address, ca_file = runtime_api(args)
    reply_ready = threading.Event()
    if approved_apps is not None and not missing_pinning_internals():
        install_supernode_check(approved_apps)
    supervisor = WorkerSupervisor(address, ca_file, reply_ready, node_state_expirer(), approved_apps)
    # Before dropped.install(), which wraps the pull step this checks.
    if batch := held_pull.install_fleet_client():
        log(WARNING, "hetfed-supernode: Flower's Fleet client (no batched objects, no held pull): %s", batch)
    dropped.install()
    if key := missing_node_key_internals():
        log(WARNING, "hetfed-supernode: Flower's P-384 node key: this Flower lacks %s", "; ".join(key))
    else:
        node_key.install()
    fast = fast_path.install_on_supernode()
    if fast:
        log(WARNING, "hetfed-supernode: Runtime API on Flower's own middleware: %s", fast)
    if batch := object_batch.install_on_supernode():
        log(WARNING, "hetfed-supernode: a task's objects go one request each: %s", batch)
    waits.install(
        idle=waits.Backoff(IDLE_FAST, IDLE_SLEEP),
        reply=waits.Backoff(REPLY_FAST, REPLY_SLEEP),
        reply_ready=reply_ready,
        on_message=supervisor.wake if worker == "local" else lambda: None,
    )
    if worker == "local":
        supervisor.start()
        log(
            INFO,
            "hetfed-supernode: warm ClientApp runtime (one long-lived worker, adaptive waits%s)",
            "" if fast else ", buffered Runtime API",
        )
    else:
        log(INFO, "hetfed-supernode: warm ClientApp runtime, worker external on Runtime API %s", address)
    sys.argv = ["flower-supernode", *args]
    flower_supernode()


def pinning_checks(supernode_lacks: str, own_warm_worker: bool) -> list[str]:
    """Who checks a run's app build on a pinned SuperNode: ``"supernode"`` where this Flower lacks
    nothing its check needs (``supernode_lacks`` == ""), ``"worker"`` where a warm worker of its own
    runs (it checks before it loads a build); [] = nobody can, and the SuperNode must not start."""
    return ([] if supernode_lacks else ["supernode"]) + (["worker"] if own_warm_worker else [])


def main(argv: list[str] | None = None) -> None:
    telemetry_off()
    runtime, approved_apps, flower_args = split_options(list(sys.argv[1:] if argv is None else argv))
    worker, flower_args = split_worker(flower_args)
    warm_missing = missing_internals() if runtime == "warm" else []
    if warm_missing:
        from flwr.supercore import log

        log(
            WARNING,
            "hetfed-supernode: warm runtime off, running stock Flower; missing or changed "
            "Flower internals: %s",
            "; ".join(warm_missing),
        )
        runtime = "stock"
    if approved_apps is not None:
        missing = "; ".join(missing_pinning_internals())
        checks = pinning_checks(missing, runtime == "warm" and worker == "local")
        if not checks:
            no_worker = (
                f"the warm runtime lacks {'; '.join(warm_missing)}"
                if warm_missing
                else ("--worker external" if worker == "external" else "--runtime stock")
            )
            raise SystemExit(
                f"hetfed-supernode: app pinning cannot be checked on this Flower (the SuperNode's check "
                f"needs {missing}; no warm worker of this SuperNode: {no_worker}); not starting an "
                "unpinned SuperNode"
            )
        if "supernode" not in checks:
            from flwr.supercore import log

            log(
                WARNING,
                "hetfed-supernode: app pinning by the warm worker alone (it checks each app build before "
                "installing it); the SuperNode's own check needs %s",
                missing,
            )
    if runtime == "stock" and approved_apps is not None:  # Flower's SuperNode with the pinning check only
        from flwr.supernode.cli import flower_supernode

        install_supernode_check(approved_apps)
        sys.argv = ["flower-supernode", *flower_args]
        flower_supernode()
        return
    if runtime == "stock":  # Flower exactly as installed (its default isolation: subprocess)
        if worker == "external":  # the executor elsewhere serves it (and falls back to Flower's own)
            flower_args = with_isolation(flower_args, "process")
        os.execv(str(BIN / "flower-supernode"), ["flower-supernode", *flower_args])
    run_warm(flower_args, approved_apps, worker)


if __name__ == "__main__":
    main()
