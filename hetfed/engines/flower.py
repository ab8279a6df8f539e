"""Real Flower processes on this machine: SuperLink, SuperNodes, and runs submitted with ``flwr``.

Used by the ``simulation`` and ``deployment`` engines, ``hetfed federation`` and
the integration tests. Every process gets its own session (process group), so
stopping it also stops the SuperExec and ClientApp processes it spawned. Every
federation has a private ``FLWR_HOME`` holding its SuperLink connection, and runs
with runtime dependency installation and the online update check disabled.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hetfed.config import to_toml

CONNECTION = "hetfed"
BIN = Path(sys.executable).parent  # flwr, flower-superlink, ... of this environment


class FlowerProcessError(RuntimeError):
    """A Flower process did not start, or a run could not be submitted."""


def free_port() -> int:
    """A free TCP port on 127.0.0.1."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def flower_env(flwr_home: Path) -> dict[str, str]:
    """Environment for every Flower process: private home, no dependency install, no update check."""
    return dict(
        os.environ,
        FLWR_HOME=str(flwr_home),
        FLWR_DISABLE_UPDATE_CHECK="1",
        FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION="1",
        PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
    )


def node_config_string(values: Mapping[str, Any]) -> str:
    """``--node-config`` syntax: ``partition-id=0 data-path="/x"`` (strings quoted)."""
    return " ".join(f'{k}="{v}"' if isinstance(v, str) else f"{k}={v}" for k, v in values.items())


@dataclass
class LocalFlower:
    """A SuperLink (deployment or simulation runtime) and SuperNodes on 127.0.0.1, under ``root``."""

    root: Path
    simulation: bool = False
    link_port: int = 0
    processes: dict[str, subprocess.Popen] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.root = Path(self.root).resolve()
        self.home = self.root / "flwr-home"
        self.home.mkdir(parents=True, exist_ok=True)
        self.link_port = self.link_port or free_port()
        self.env = flower_env(self.home)
        (self.home / "config.toml").write_text(
            f'[superlink]\ndefault = "{CONNECTION}"\n\n'
            f'[superlink.{CONNECTION}]\naddress = "127.0.0.1:{self.link_port}"\ninsecure = true\n'
        )

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.link_port}"

    # --- processes ------------------------------------------------------------------
    def spawn(self, name: str, cmd: list[str], cwd: Path | None = None) -> subprocess.Popen:
        """Start ``cmd`` in its own session, logging to ``root/<name>.log``."""
        log = open(self.root / f"{name}.log", "ab")
        proc = subprocess.Popen(
            cmd,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=self.env,
            cwd=cwd or self.root,
            start_new_session=True,
        )
        self.processes[name] = proc
        return proc

    def start_superlink(self, cwd: Path | None = None, timeout: float = 60) -> None:
        """Start the SuperLink and wait until its /health answers."""
        cmd = [
            str(BIN / "flower-superlink"),
            "--insecure",
            "--port",
            str(self.link_port),
            "--database",
            str(self.root / "state.db"),
            "--disable-runtime-dependency-installation",
        ]
        if self.simulation:
            cmd.append("--simulation")
        proc = self.spawn("superlink", cmd, cwd)
        url = f"http://{self.address}/health"
        self._wait(lambda: proc.poll() is None and _http_ok(url), timeout, "the SuperLink", "superlink")

    def start_supernode(self, index: int, node_config: Mapping[str, Any]) -> None:
        """Start SuperNode ``index`` with its own node config (its private partition)."""
        self.spawn(
            f"supernode-{index}",
            [
                str(BIN / "flower-supernode"),
                "--insecure",
                "--superlink",
                self.address,
                "--port",
                str(free_port()),
                "--max-retries",
                "10",
                "--node-config",
                node_config_string(node_config),
            ],
        )

    def wait_for_nodes(self, count: int, timeout: float = 90) -> None:
        """Wait until ``count`` SuperNodes are online."""
        self._wait(lambda: self.online_nodes() >= count, timeout, f"{count} SuperNodes online", "supernode-0")

    def online_nodes(self) -> int:
        try:
            res = self.flwr_json("supernode", "ls", CONNECTION, timeout=30)
        except (FlowerProcessError, subprocess.TimeoutExpired):
            return 0
        return sum(n.get("status") == "online" for n in res.get("nodes", []))

    def stop(self, timeout: float = 20) -> None:
        """SIGTERM every process group (SuperNodes first), SIGKILL what is left."""
        stop_process_groups([p.pid for p in reversed(self.processes.values())], timeout)
        for proc in self.processes.values():
            try:
                proc.wait(timeout=1)
            except subprocess.TimeoutExpired:
                pass

    def _wait(self, ready: Callable[[], bool], timeout: float, what: str, log_name: str) -> None:
        end = time.time() + timeout
        while time.time() < end:
            if ready():
                return
            time.sleep(0.3)
        tail = _tail(self.root / f"{log_name}.log")
        raise FlowerProcessError(f"timed out after {timeout:g} s waiting for {what}; log tail:\n{tail}")

    # --- runs ---------------------------------------------------------------------
    def flwr_json(self, *args: str, timeout: float = 120) -> dict[str, Any]:
        """Run a ``flwr`` CLI command with ``--format json`` and parse its answer."""
        out = subprocess.run(
            [str(BIN / "flwr"), *args, "--format", "json"],
            env=self.env,
            cwd=self.root,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        try:
            return json.loads(out.stdout)
        except json.JSONDecodeError:
            raise FlowerProcessError(
                f"flwr {' '.join(args)} failed: {(out.stdout + out.stderr).strip()[-2000:]}"
            ) from None

    def submit(self, app_dir: Path, run_config: Mapping[str, Any], num_supernodes: int = 0) -> str:
        """``flwr run <app_dir> <connection> --run-config <file>``; returns the run id."""
        overrides = self.root / f"run-config-{time.time_ns()}.toml"
        overrides.write_text(to_toml(run_config))
        args = ["run", str(app_dir), CONNECTION, "--run-config", str(overrides)]
        if self.simulation:
            args += ["--federation-config", f"num-supernodes={num_supernodes} client-resources-num-cpus=1"]
        res = self.flwr_json(*args, timeout=300)
        if "run-id" not in res:
            raise FlowerProcessError(f"flwr run did not start a run: {res}")
        return str(res["run-id"])

    def run_status(self, run_id: str) -> str:
        """``pending``, ``running``, ..., or ``finished:completed|failed|stopped``."""
        runs = self.flwr_json("ls", CONNECTION, "--run-id", run_id, timeout=60).get("runs", [])
        return str(runs[0]["status"]) if runs else "unknown"

    def wait_run(self, run_id: str, timeout: float, tick: Callable[[], None] = lambda: None) -> str:
        """Poll until the run finishes (``flwr run``'s exit code is not trustworthy); return its status."""
        end = time.time() + timeout
        while time.time() < end:
            status = self.run_status(run_id)
            tick()
            if status.startswith("finished"):
                return status
            time.sleep(2)
        raise FlowerProcessError(f"run {run_id} did not finish within {timeout:g} s")

    def run_log(self, run_id: str) -> str:
        """The ServerApp's log of a run."""
        out = subprocess.run(
            [str(BIN / "flwr"), "log", run_id, CONNECTION, "--show"],
            env=self.env,
            cwd=self.root,
            capture_output=True,
            text=True,
            timeout=120,
        )
        return out.stdout + out.stderr


def stop_process_groups(pids: list[int], timeout: float = 20) -> None:
    """SIGTERM the process group of each pid; SIGKILL any group still alive after ``timeout``."""
    for pid in pids:
        _signal_group(pid, signal.SIGTERM)
    end = time.time() + timeout
    while time.time() < end and any(_group_alive(pid) for pid in pids):
        time.sleep(0.2)
    for pid in pids:
        _signal_group(pid, signal.SIGKILL)


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _group_alive(pid: int) -> bool:
    try:
        os.killpg(pid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    # A group whose members are all zombies is as good as gone.
    out = subprocess.run(["ps", "-o", "stat=", "-g", str(pid)], capture_output=True, text=True)
    return any(not s.startswith("Z") for s in out.stdout.split())


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as r:
            return r.status == 200
    except OSError:
        return False


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"
