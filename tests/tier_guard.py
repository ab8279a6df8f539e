"""The fast tier's guard: a test of the fast tier (``make test``) starts no federation (SuperLink,
SuperNode or their executors, also a simulation's SuperLink), no Docker, no network namespace and no
browser -- the one test marked ``smoke`` aside.

A Python audit hook (PEP 578) sees every program this Python starts (``subprocess.Popen``,
``os.posix_spawn``, ``os.exec*``, ``os.spawn*``, ``os.system``). While a fast-tier test runs (the
guard armed), a forbidden program is refused before it starts (the call raises
:class:`ForbiddenProcess`) and recorded in a file. Arming also reaches the Python programs the test
starts (``hetfed`` commands, a run's workers, Flower's processes): ``PYTHONPATH`` leads them to
``tier_guard_site/sitecustomize.py``, which installs the same hook there, recording into the file
that ``HETFED_TIER_GUARD`` names. tests/conftest.py arms the guard before a fast-tier test's setup
and, after its teardown, fails the test naming what it started (also when the code under test
swallowed the exception).
"""

from __future__ import annotations

import os
import shlex
import tempfile
from collections.abc import Sequence
from pathlib import Path

RECORD_ENV = "HETFED_TIER_GUARD"  # the record file of the armed test
TEST_ENV = "HETFED_TIER_GUARD_TEST"  # the armed test's node id, for the messages of its processes
SITE = Path(__file__).resolve().parent / "tier_guard_site"

# Programs by the name they run as: Flower's and hetfed's process entry points...
_FEDERATION = {
    "flower-superlink": "a SuperLink",
    "hetfed-superlink": "a SuperLink",
    "flower-supernode": "a SuperNode",
    "hetfed-supernode": "a SuperNode",
    "flower-superexec": "a SuperExec",
    "hetfed-worker": "a SuperNode's ClientApp worker",
}
_MODULES = {  # ...the same run as `python -m <module>`
    "hetfed.runtime.superlink": "a SuperLink",
    "hetfed.runtime.supernode": "a SuperNode",
    "hetfed.runtime.worker": "a SuperNode's ClientApp worker",
}
_DOCKER = {"docker", "dockerd", "docker-compose", "containerd", "podman"}
_BROWSERS = {"chromium", "chrome", "google-chrome", "chromedriver", "firefox", "geckodriver"}
_NAMESPACES = {"unshare", "nsenter"}
_WRAPPERS = {"sudo", "env", "nohup", "setsid", "timeout", "nice"}  # run the program after their options
_EVENTS = {"subprocess.Popen", "os.posix_spawn", "os.exec", "os.spawn", "os.system"}


class ForbiddenProcess(RuntimeError):
    """A fast-tier test started a program of the full tier."""


def _words(args: object) -> list[str]:
    if isinstance(args, (str, bytes, os.PathLike)):
        args = [args]
    return [os.fsdecode(a) for a in args]  # type: ignore[union-attr]


def _program(argv: Sequence[str]) -> list[str]:
    """``argv`` without the wrappers before the program (sudo, env VAR=1, ``sh -c "..."``)."""
    argv = list(argv)
    while argv:
        name = os.path.basename(argv[0])
        if name in _WRAPPERS:
            argv = argv[1:]
            while argv and (argv[0].startswith("-") or "=" in argv[0] or argv[0].replace(".", "").isdigit()):
                argv = argv[1:]  # options, VAR=value, a timeout's duration
        elif name in {"sh", "bash", "dash"} and "-c" in argv[1:-1]:
            argv = shlex.split(argv[argv.index("-c") + 1])
        else:
            return argv
    return argv


def classify(argv: Sequence[str]) -> str | None:
    """What ``argv`` starts if it is a program of the full tier (e.g. ``"a SuperLink"``), else None."""
    argv = _program(argv)
    if not argv:
        return None
    name = os.path.basename(argv[0])
    if name.startswith("python") and len(argv) > 1:
        if argv[1] == "-m" and len(argv) > 2:
            return _MODULES.get(argv[2])
        if not argv[1].startswith("-"):  # python /venv/bin/flower-superlink ...
            name = os.path.basename(argv[1])
    if name in _FEDERATION:
        return f"{_FEDERATION[name]} ({name})"
    if name in _DOCKER:
        return f"Docker ({name})"
    if name in _BROWSERS or "playwright" in Path(argv[0]).parts:
        return f"a browser ({name})"
    if name in _NAMESPACES or (name == "ip" and {"netns", "-n", "-netns"} & set(argv[1:])):
        return f"a network namespace ({name})"
    return None


def _argv(event: str, args: tuple) -> list[str]:
    if event == "subprocess.Popen":  # (executable, args, cwd, env)
        return _words(args[1])
    if event == "os.system":  # (command,)
        return ["sh", "-c", os.fsdecode(args[0])]
    if event == "os.spawn":  # (mode, path, args, env)
        return _words(args[2])
    return _words(args[1])  # os.exec, os.posix_spawn: (path, argv, env)


def _hook(event: str, args: tuple) -> None:
    if event not in _EVENTS:
        return
    record = os.environ.get(RECORD_ENV)
    if not record:
        return
    argv = _argv(event, args)
    what = classify(argv)
    if what is None:
        return
    line = f"{what}: {shlex.join(argv)}"
    with open(record, "a") as f:
        f.write(line + "\n")
    raise ForbiddenProcess(refusal(os.environ.get(TEST_ENV, "this test"), [line]))


def refusal(test: str, started: list[str]) -> str:
    """The one-line error of ``test``, which tried to start the programs ``started`` describes."""
    return (
        f"{test} is in the fast tier and tried to start {'; '.join(started)} (mark it deployment, "
        "simulation, docker or slow for the full tier, see tests/conftest.py)"
    )


_installed = False


def install() -> None:
    """Install the audit hook in this Python (once; it acts only while ``HETFED_TIER_GUARD`` is set)."""
    global _installed
    if not _installed:
        import sys

        sys.addaudithook(_hook)
        _installed = True


def arm(test: str) -> dict[str, str | None]:
    """Guard ``test``: the forbidden programs it and the Python programs it starts try to run are
    refused and recorded in a new file. Returns what :func:`disarm` needs."""
    saved = {k: os.environ.get(k) for k in (RECORD_ENV, TEST_ENV, "PYTHONPATH")}
    fd, record = tempfile.mkstemp(prefix="hetfed-tier-guard-", suffix=".txt")
    os.close(fd)
    path = os.environ.get("PYTHONPATH")
    os.environ.update(
        {RECORD_ENV: record, TEST_ENV: test, "PYTHONPATH": os.pathsep.join(filter(None, [str(SITE), path]))}
    )
    return saved


def disarm(saved: dict[str, str | None]) -> list[str]:
    """Stop guarding (the environment as before :func:`arm`); the forbidden programs the test tried
    to start, one line each."""
    record = Path(os.environ[RECORD_ENV])
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    lines = record.read_text().splitlines()
    record.unlink()
    return lines
