"""The long-lived ClientApp worker of one SuperNode (``python -m hetfed.runtime.worker``).

It does what Flower's ``flower-superexec`` + one ``flwr-clientapp`` process per message
do, in one process that stays up: claim a ClientApp task on the SuperNode's Runtime API
(``AcquireTask``), pull its input with Flower's own ``pull_task_input``, run the app's
ClientApp callable in-process, push the reply and the context with Flower's own
``push_message`` / ``push_task_output``, and send task heartbeats meanwhile. The app
is loaded once per build (FAB hash), so its imports and the silo's loaded data stay
warm between messages. Each task's log line ends with the worker's resident memory
(``RSS n MB (peak m MB)``). When the app raises, the reply is Flower's Error message
(``CLIENT_APP_RAISED_EXCEPTION``, or ``LOAD_CLIENT_APP_EXCEPTION`` when loading it fails).

With ``--approved-apps FILE`` (app pinning) a task whose app build (the SHA-256 of its
FAB's content) is not in FILE is answered with Flower's ``INVALID_FAB`` error naming the
hash, before the build is installed or any of its code imported.

A task of a different build than the one loaded is served by a fresh interpreter: the
worker re-executes itself with the task's token and its already pulled input, so no
module of the old build is left in memory. So is the first task of a new run when the
runs before it imported packages the app alone does not (torch): a run holds only what
its own problem needs.

With ``--wake-fd`` (started by :mod:`hetfed.runtime.supernode`) the worker waits on a
pipe that the SuperNode writes to once a message's task exists, and polls the Runtime API
only every 5 s otherwise, as a safety net (Flower's SuperExec polls every second: a request
per SuperNode per second that both processes pay for while the silo waits); without it (an
executor in another container) it polls with a :class:`~hetfed.runtime.waits.Backoff`. ``--status-fd`` reports
``busy <task-id>`` / ``done <task-id>`` lines to the supervisor.
"""

from __future__ import annotations

import argparse
import os
import select
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from logging import ERROR, INFO, WARNING
from pathlib import Path
from typing import Any, cast

import httpx

from hetfed.runtime.deferred_imports import deferring_unused_packages

with deferring_unused_packages():  # FastAPI and requests: Flower names them, a worker never uses them
    from flwr.app import Context, Message
    from flwr.app.error import Error
    from flwr.cli.install import install_from_fab
    from flwr.clientapp.client_app import ClientApp, LoadClientAppError
    from flwr.clientapp.utils import get_load_client_app_fn
    from flwr.common.constant import ErrorCode, SubStatus
    from flwr.proto.run_pb2 import Run as RunProto
    from flwr.proto.runtime_pb2 import AcquireTaskRequest, PullTaskInputRequest, PullTaskInputResponse
    from flwr.supercore import log
    from flwr.supercore.constant import TaskType
    from flwr.supercore.heartbeat import HeartbeatSender, make_task_heartbeat_fn_http
    from flwr.supercore.interceptors import RuntimeTokenHttpInterceptor, RuntimeVersionHttpInterceptor
    from flwr.supercore.retry import make_simple_http_retry_invoker
    from flwr.supercore.run import Run
    from flwr.supercore.runtime import RuntimeHttpClient
    from flwr.supernode.runtime.run_clientapp import pull_task_input, push_message, push_task_output

    from hetfed.runtime.object_batch import BatchedObjects
    from hetfed.runtime.pinning import AppRefused, reason_for, refused
    from hetfed.runtime.waits import Backoff, shorten_object_pull_backoff

WAKE_POLL = 5.0  # s between polls when the SuperNode wakes us after creating a task (safety net only)
UNREACHABLE_RETRY = 1.0  # s before asking a Runtime API that is not up (yet) again
EXTERNAL_POLL = Backoff(fast=0.02, slow=1.0)  # without a wake pipe


def runtime_client(address: str, certificates: bytes | None, interceptors: list[Any]) -> RuntimeHttpClient:
    """A Runtime API client of the SuperNode at ``address`` (HTTPS verified with ``certificates``)."""
    return RuntimeHttpClient.from_server_address(
        server_address=address,
        insecure=certificates is None,
        root_certificates=certificates,
        interceptors=interceptors,
        retry_invoker=make_simple_http_retry_invoker(),
    )


class _TaskInputReplay:
    """A Runtime client whose ``PullTaskInput`` answers with input already pulled (after a re-exec)."""

    def __init__(self, client: RuntimeHttpClient | BatchedObjects, task_input: PullTaskInputResponse) -> None:
        self._client, self._task_input = client, task_input

    def PullTaskInput(self, _request: PullTaskInputRequest) -> PullTaskInputResponse:  # noqa: N802
        return self._task_input

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)


class Worker:
    """Claims and runs this SuperNode's ClientApp tasks, one at a time, forever."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.address: str = args.runtime_api_address
        self.certificates = Path(args.root_certificates).read_bytes() if args.root_certificates else None
        self.control = runtime_client(
            self.address, self.certificates, [RuntimeVersionHttpInterceptor(component_name="SuperExec")]
        )
        self.fab_hash: str | None = None
        self.app: ClientApp | None = None
        self.app_packages: set[str] = set()  # the packages imported once the app was loaded
        self.run_id: int | None = None  # the run of the last task served
        self.problem = ""  # and its run config's problem
        self.batch_objects = True  # until the SuperNode answers that it has no batched object routes

    # --- the loop ---------------------------------------------------------------------
    def run_forever(self) -> None:
        log(
            INFO,
            "hetfed warm worker %d: serving the ClientApp tasks of %s; %s",
            os.getpid(),
            self.address,
            memory(),
        )
        if self.args.task_input:  # re-executed for a new build or run: first the task we hold
            path = Path(self.args.task_input)
            task_input = PullTaskInputResponse.FromString(path.read_bytes())
            path.unlink()
            self.serve(self.args.token, self.args.task_id, task_input)
        while True:
            claimed = self.acquire()
            if claimed is not None:
                self.serve(*claimed)
                EXTERNAL_POLL.reset()
                continue  # a round may hold more messages for this node
            self.wait()

    def acquire(self) -> tuple[str, int] | None:
        """Claim a pending ClientApp task: (token, task id), or None."""
        request = AcquireTaskRequest(supported_task_types=[TaskType.CLIENT_APP])
        try:
            res = self.control.AcquireTask(request)
        except httpx.HTTPError as err:  # the SuperNode's Runtime API is not up (yet): try again later
            log(WARNING, "hetfed warm worker: Runtime API %s not reachable (%s)", self.address, err)
            time.sleep(UNREACHABLE_RETRY)
            return None
        if res.HasField("task") and res.token:
            return res.token, int(res.task.task_id)
        return None

    def wait(self) -> None:
        """Until the SuperNode says a message arrived, or the next poll is due."""
        if self.args.wake_fd is None:
            time.sleep(EXTERNAL_POLL.next())
            return
        ready, _, _ = select.select([self.args.wake_fd], [], [], WAKE_POLL)
        if ready:
            os.read(self.args.wake_fd, 4096)  # drain: one poll answers every wake-up so far

    # --- one task ---------------------------------------------------------------------
    def serve(self, token: str, task_id: int, task_input: PullTaskInputResponse | None = None) -> None:
        """Run one ClientApp task as ``flwr-clientapp`` would (reply, context, status, heartbeats)."""
        self._status(f"busy {task_id}")
        clock = [time.perf_counter()]  # start, input pulled, app returned, reply pushed
        client = runtime_client(
            self.address,
            self.certificates,
            [
                RuntimeVersionHttpInterceptor(component_name="flwr-clientapp"),
                RuntimeTokenHttpInterceptor(token),
            ],
        )
        heartbeat = HeartbeatSender(after_the_first_interval(make_task_heartbeat_fn_http(client)))
        heartbeat.start()
        objects = BatchedObjects(client, enabled=self.batch_objects)  # a message's objects, one request
        message: Message | None = None
        context: Context | None = None
        reply: Message | None = None
        sub_status, details = SubStatus.FAILED, "ClientApp task failed due to unknown reason"
        try:
            if task_input is None:
                task_input = client.PullTaskInput(PullTaskInputRequest())
            why = self._refusal(task_input)
            if not why and (restart := self._restart_reason(task_input)):
                heartbeat.stop()  # a fresh interpreter for this task (a re-executed one has no app loaded)
                self._reexec(token, task_id, task_input, restart)  # does not return
            if task_input.fab.hash_str == self.fab_hash:  # loaded: drop the FAB (MBs, copied again below)
                task_input.fab.ClearField("content")
            replay = cast(RuntimeHttpClient, _TaskInputReplay(objects, task_input))  # a stand-in client
            message, context, run, fab = pull_task_input(replay)
            self.run_id, self.problem = run.run_id, run_problem(task_input.run)
            if why:  # before the build is installed or imported
                raise AppRefused(fab.hash_str, reason_for(context.node_config, why))
            app = self._load(run, fab.hash_str, fab.content)
            clock.append(time.perf_counter())
            reply = app(message=message, context=context)
            clock.append(time.perf_counter())
            sub_status, details = SubStatus.COMPLETED, ""
        except Exception as ex:  # the same Error reply as Flower's run_clientapp
            code, details = ErrorCode.CLIENT_APP_RAISED_EXCEPTION, f"{type(ex)}:<'{ex}'>"
            if isinstance(ex, LoadClientAppError):
                code, details = (
                    ErrorCode.LOAD_CLIENT_APP_EXCEPTION,
                    ("An exception was raised when attempting to load `ClientApp`"),
                )
            if isinstance(ex, AppRefused):
                code, details = ErrorCode.INVALID_FAB, ex.why
                log(ERROR, "hetfed pinning (warm worker): task %d %s", task_id, ex.why)
            else:
                log(ERROR, "ClientApp raised an exception", exc_info=ex)
            if message is not None:
                reply = Message(Error(code=code, reason=details), reply_to=message)
        finally:
            try:
                if reply is not None and context is not None:
                    push_message(cast(RuntimeHttpClient, objects), reply, context)
                    objects.flush()
            except Exception as ex:
                log(ERROR, "Failed to push reply message", exc_info=ex)
            finally:
                push_task_output(client, context, sub_status, details)
                self.batch_objects = objects.enabled
                if heartbeat.is_running:
                    heartbeat.stop()
                client.close()
                self._status(f"done {task_id}")
                clock.append(time.perf_counter())
                if len(clock) == 4:  # where a task's time went (bench/warm_runtime.py reads these lines)
                    steps = (b - a for a, b in zip(clock, clock[1:], strict=False))
                    log(
                        INFO,
                        "hetfed warm worker: task %d input %.3f s, ClientApp %.3f s, reply %.3f s; %s; "
                        "objects in one request each way: %d pulled, %d pushed; %d confirmed with them",
                        task_id,
                        *steps,
                        memory(),
                        *objects.moved,
                        objects.confirms,
                    )

    def _refusal(self, task_input: PullTaskInputResponse) -> str:
        """Why this silo refuses the task's app build ('' if approved or pinning is off)."""
        if not self.args.approved_apps:
            return ""
        return refused(Path(self.args.approved_apps), task_input.fab.hash_str, task_input.fab.content)

    def _restart_reason(self, task_input: PullTaskInputResponse) -> str:
        """Why this task is served by a fresh interpreter ('' if by this one).

        A new app build, so that no module of the old build is left; or a new run of another
        problem when the runs served so far imported packages beyond the app's own (hetfed's
        ClientApp imports a client class, its problem and torch or SciPy on a run's first
        message), so that a run holds only what its own problem needs: a NumPy run after a
        torch run does not keep torch (~250 MB). Nothing is imported ahead of a run's first
        message (that message imports what the run needs and the run's later messages find it
        loaded), so runs that import nothing new (NumPy after NumPy), and runs of the problem
        the last run had (torch after torch: the import is not paid again), stay here.
        """
        if self.fab_hash is None:
            return ""
        if task_input.fab.hash_str != self.fab_hash:
            return f"new app build {task_input.fab.hash_str[:12]}"
        extra = ", ".join(sorted(packages() - self.app_packages))
        new_problem = run_problem(task_input.run) != self.problem
        if task_input.run.run_id != self.run_id and new_problem and extra:
            return f"new run {task_input.run.run_id}, not keeping what earlier runs imported ({extra})"
        return ""

    def _load(self, run: Run, fab_hash: str, fab_content: bytes) -> ClientApp:
        """The run's ClientApp, installed and imported once per app build."""
        if self.app is None:
            install_from_fab(fab_content, skip_prompt=True)
            self.app = get_load_client_app_fn("", None, True)(run.fab_id, run.fab_version, fab_hash)
            self.fab_hash, self.app_packages = fab_hash, packages()
            log(
                INFO,
                "hetfed warm worker: loaded app %s %s (FAB %s)",
                run.fab_id,
                run.fab_version,
                fab_hash[:12],
            )
        return self.app

    def _reexec(self, token: str, task_id: int, task_input: PullTaskInputResponse, reason: str) -> None:
        """Serve a task in a fresh interpreter (same pid, same pipes), saying why."""
        fd, path = tempfile.mkstemp(prefix="hetfed-task-", suffix=".pb")
        with os.fdopen(fd, "wb") as f:
            f.write(task_input.SerializeToString())
        log(INFO, "hetfed warm worker: %s; restarting", reason)
        argv = [sys.executable, "-m", "hetfed.runtime.worker", *_own_flags(self.args)]
        argv += ["--token", token, "--task-id", str(task_id), "--task-input", path]
        os.execv(sys.executable, argv)

    def _status(self, line: str) -> None:
        if self.args.status_fd is not None:
            os.write(self.args.status_fd, f"{line}\n".encode())


def after_the_first_interval(heartbeat: Callable[[], bool]) -> Callable[[], bool]:
    """``heartbeat`` for Flower's HeartbeatSender, whose first beat goes out the moment a task starts,
    skipped once: the claim and the activation of the task already keep it alive for 30 s and 60 s
    (Flower's corestate), longer than the sender's next interval (at most 22.5 s), and most tasks end
    in milliseconds, so that first beat was one more request per task and nothing else."""
    pending = [True]

    def beat() -> bool:
        if pending:
            pending.clear()
            return True
        return heartbeat()

    return beat


def proc_memory(pid: int | str = "self") -> dict[str, float]:
    """``VmRSS`` and ``VmHWM`` (peak) of a process in MB, from /proc (Linux); {} where there is none."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return {}
    fields = (line.partition(":") for line in status.splitlines())
    return {k: int(v.split()[0]) / 1024 for k, _, v in fields if k in ("VmRSS", "VmHWM")}


def memory() -> str:
    """``RSS n MB (peak m MB)`` of this process ('' without /proc)."""
    mb = proc_memory()
    return f"RSS {mb['VmRSS']:.0f} MB (peak {mb['VmHWM']:.0f} MB)" if mb else ""


def run_problem(run: RunProto) -> str:
    """The run config's ``problem`` ('' when the run does not set it)."""
    return run.override_config["problem"].string if "problem" in run.override_config else ""


def packages() -> set[str]:
    """The top-level packages imported in this process, outside the standard library."""
    tops = {name.partition(".")[0] for name in sys.modules}
    return {name for name in tops if not name.startswith("_")} - set(sys.stdlib_module_names)


def _own_flags(args: argparse.Namespace) -> list[str]:
    """The flags this worker was started with, without the one-task ones."""
    flags = ["--runtime-api-address", args.runtime_api_address]
    for name in ("root_certificates", "approved_apps", "wake_fd", "status_fd", "parent_pid"):
        if getattr(args, name) is not None:
            flags += [f"--{name.replace('_', '-')}", str(getattr(args, name))]
    return flags


def _exit_with_parent(parent_pid: int) -> None:
    """Exit when the SuperNode that started us is gone (its SIGKILL does not reach us)."""

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(0.5)
        os._exit(0)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def _forget_hetfed_modules() -> None:
    """Let the app build's own copy of ``hetfed`` be imported, as in a fresh ``flwr-clientapp``.

    This worker runs from the installed hetfed; the ClientApp must see the modules of
    the FAB it runs (which may differ), so the installed ones are dropped from
    ``sys.modules`` (the worker keeps its references; it imports nothing more of hetfed).
    """
    for name in [n for n in sys.modules if n == "hetfed" or n.startswith("hetfed.")]:
        del sys.modules[name]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m hetfed.runtime.worker", description=__doc__.splitlines()[0])
    p.add_argument("--runtime-api-address", required=True, help="the SuperNode's Runtime API, host:port")
    p.add_argument("--root-certificates", help="CA of the Runtime API's certificate (if it serves HTTPS)")
    p.add_argument("--approved-apps", help="app pinning: the silo's allow-list of FAB hashes")
    p.add_argument("--wake-fd", type=int, help="pipe the SuperNode writes to when a message arrives")
    p.add_argument("--status-fd", type=int, help="pipe for busy/done lines to the supervisor")
    p.add_argument("--parent-pid", type=int, help="exit when this process is gone")
    p.add_argument("--token", help=argparse.SUPPRESS)
    p.add_argument("--task-id", type=int, help=argparse.SUPPRESS)
    p.add_argument("--task-input", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.wake_fd is None:  # started on its own (not by hetfed-supernode, which ran the self-test)
        from hetfed.runtime.internals import missing_internals

        if missing := missing_internals():
            log(
                WARNING,
                "hetfed warm worker off, running Flower's flower-superexec; missing or changed "
                "Flower internals: %s",
                "; ".join(missing),
            )
            tls = (
                ["--root-certificates", args.root_certificates] if args.root_certificates else ["--insecure"]
            )
            superexec = str(Path(sys.executable).parent / "flower-superexec")
            os.execv(superexec, [superexec, *tls, "--runtime-api-address", args.runtime_api_address])
    if args.parent_pid is not None:
        _exit_with_parent(args.parent_pid)
    shorten_object_pull_backoff()
    worker = Worker(args)
    _forget_hetfed_modules()
    worker.run_forever()


if __name__ == "__main__":
    main()
