"""Real Flower processes on this machine: SuperLink, SuperNodes, and runs submitted with ``flwr``.

Used by the ``simulation`` and ``deployment`` engines, ``hetfed federation`` and
the integration tests. Every process gets its own session (process group), so
stopping it also stops the SuperExec and ClientApp processes it spawned. Every
federation has a private ``FLWR_HOME`` holding its SuperLink connection, and runs
with runtime dependency installation and the online update check disabled.

The ``*_args`` functions are the single place where Flower command lines are
written: local processes, ``hetfed federation superlink|silo`` on real machines
and the docker-compose generator all use them (tests parse them with Flower's
own argument parsers). With TLS, the SuperLink serves Fleet, Control and Runtime
APIs on one HTTPS port; with node authentication only SuperNodes whose public key
was registered (``flwr supernode register``) may connect.
"""

from __future__ import annotations

import ipaddress
import json
import os
import random
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hetfed.config import to_toml
from hetfed.credentials import TlsFiles
from hetfed.engines.errors import FlowerProcessError, SuperLinkUnreachable
from hetfed.runtime.seam import ASGI_MODES, RUNTIMES

if TYPE_CHECKING:
    from hetfed.engines.control_api import ControlApi

CONNECTION = "hetfed"
BIN = Path(sys.executable).parent  # flwr, hetfed-superlink, ... of this environment
DEFAULT_RUNTIME = "warm"
# Where the SuperLink keeps its state. "memory" is Flower's own default and ~3.5x faster per
# exchange here: with "file" (SQLite through SQLAlchemy) the SuperLink spent ~3.5 s of CPU per
# 4-SuperNode round on its database (docs/benchmarks.md). "file" survives a SuperLink restart
# (registered node keys, known nodes, run history), which a cross-machine SuperLink needs.
SUPERLINK_STATES = ("memory", "file")
IN_MEMORY_DATABASE = ":flwr-in-memory:"
# SuperNodes coming up at once (started, not yet online): each spends ~1-2 s of CPU importing
# Flower, and dozens started together on a 2-core machine starved each other past any fixed wait.
STARTUP_BATCH = max(4, 2 * (os.cpu_count() or 1))


def nodes_timeout(nodes: int) -> float:
    """Default seconds for ``nodes`` SuperNodes to come online: 30 s + 5 s per SuperNode (16 came
    up in 21 s on a quiet 2-core machine; a loaded one needs several times that)."""
    return 30.0 + 5.0 * nodes


def superlink_database(state: str, root: Path) -> str:
    """Flower's ``--database`` for ``state``: in memory, or ``root/state.db``."""
    if state not in SUPERLINK_STATES:
        raise ValueError(f"SuperLink state must be one of {', '.join(SUPERLINK_STATES)}, got {state!r}")
    return IN_MEMORY_DATABASE if state == "memory" else str(root / "state.db")


def port_in_use(host: str, port: int) -> bool:
    """Does a socket already listen on ``host:port``? (A port in TIME_WAIT after its server stopped is
    free: servers bind with SO_REUSEADDR, and so does this probe.)"""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError:
            return True
    return False


def free_port() -> int:
    """A free TCP port on 127.0.0.1, below the kernel's range of ephemeral ports when there is room.

    A port from that range (what binding port 0 gives) can be taken by any process's outgoing
    connection between this probe and the server's own bind: seen in CI, where a SuperNode's
    Runtime API then failed to start. Ports below the range are only ever taken by a listener.
    Successive calls walk up from a random start, so ports handed out before their servers bind
    are not handed out twice.
    """
    global _next_port
    low = _ephemeral_low()
    if low - LISTEN_PORTS_FROM >= 1000:
        for _ in range(100):
            if not LISTEN_PORTS_FROM <= _next_port < low:
                _next_port = random.SystemRandom().randrange(LISTEN_PORTS_FROM, low)
            port, _next_port = _next_port, _next_port + 1
            if not port_in_use("127.0.0.1", port):
                return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


LISTEN_PORTS_FROM = 20000  # free_port's lowest pick: above the ports servers commonly own
_next_port = 0  # free_port's next candidate (0: pick a random start)


def _ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range (net.ipv4.ip_local_port_range; 32768 if unknown)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def flower_env(flwr_home: Path) -> dict[str, str]:
    """Environment for every Flower process: private home, no dependency install, no update check,
    no telemetry unless asked for (hetfed.runtime.telemetry_off)."""
    return dict(
        os.environ,
        FLWR_HOME=str(flwr_home),
        FLWR_TELEMETRY_ENABLED=os.environ.get("FLWR_TELEMETRY_ENABLED", "0"),
        FLWR_DISABLE_UPDATE_CHECK="1",
        FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION="1",
        PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
    )


def node_config_string(values: Mapping[str, Any]) -> str:
    """``--node-config`` syntax: ``partition-id=0 data-path="/x"`` (strings quoted)."""
    return " ".join(f'{k}="{v}"' if isinstance(v, str) else f"{k}={v}" for k, v in values.items())


def is_loopback(host: str) -> bool:
    """True for localhost and loopback addresses (127.0.0.0/8, ::1): plain HTTP there stays on the host."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def split_address(address: str) -> tuple[str, int]:
    """``host:port`` (``[v6]:port`` too) -> (host, port); a clear error naming the address otherwise."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"SuperLink address {address!r} is not host:port (e.g. superlink.example.org:8000)")
    return host.strip("[]"), int(port)


def superlink_args(
    *,
    host: str,
    port: int,
    database: str,
    tls: TlsFiles | None,
    node_auth: bool = False,
    isolation: str = "subprocess",
    simulation: bool = False,
) -> list[str]:
    """``flower-superlink`` arguments: Fleet, Control and Runtime APIs on ``host:port``, HTTPS with ``tls``.

    ``node_auth`` admits only SuperNodes whose public key was registered; Flower requires TLS for it.
    """
    if node_auth and tls is None:
        raise ValueError("node authentication needs TLS: give --tls-dir (Flower refuses it over plain HTTP)")
    security = (
        ["--ssl-ca-certfile", str(tls.ca), "--ssl-certfile", str(tls.cert), "--ssl-keyfile", str(tls.key)]
        if tls
        else ["--insecure"]
    )
    args = [*security, "--isolation", isolation, "--host", host, "--port", str(port), "--database", database]
    args.append("--disable-runtime-dependency-installation")  # dependencies are installed beforehand
    if node_auth:
        args.append("--enable-supernode-auth")
    if simulation:
        args.append("--simulation")
    return args


def supernode_args(
    *,
    superlink: str,
    node_config: Mapping[str, Any],
    ca: str | os.PathLike | None,
    key: str | os.PathLike | None = None,
    host: str = "127.0.0.1",
    port: int = 9094,
    isolation: str = "subprocess",
    max_retries: int | None = None,
) -> list[str]:
    """``flower-supernode`` arguments: connect to ``superlink`` (HTTPS verified with ``ca``, else plain).

    ``host:port`` is the SuperNode's own Runtime API, where its ClientApp executor connects.
    """
    args = ["--root-certificates", str(ca)] if ca else ["--insecure"]
    args += ["--superlink", superlink, "--isolation", isolation, "--host", host, "--port", str(port)]
    if key:
        args += ["--auth-supernode-private-key", str(key)]
    if max_retries is not None:
        args += ["--max-retries", str(max_retries)]
    return [*args, "--node-config", node_config_string(node_config)]


def superlink_command(args: list[str], asgi: str = "gated") -> list[str]:
    """The SuperLink command line: ``hetfed-superlink <flower-superlink args>`` (``gated``: Flower's
    SuperLink with its HTTP middleware gated by API path, hetfed.runtime.superlink; stock Flower when
    its self-test fails) or ``flower-superlink`` exactly as installed (``stock``)."""
    if asgi not in ASGI_MODES:
        raise ValueError(f"SuperLink middleware must be one of {', '.join(ASGI_MODES)}, got {asgi!r}")
    return [str(BIN / ("hetfed-superlink" if asgi == "gated" else "flower-superlink")), *args]


def supernode_command(runtime: str, args: list[str], approved_apps: Path | None = None) -> list[str]:
    """The SuperNode command line: ``hetfed-supernode --runtime warm|stock <flower-supernode args>``.

    ``warm``: one long-lived ClientApp worker and adaptive waits (hetfed.runtime), stock
    Flower when its self-test fails; ``stock``: ``flower-supernode`` exactly as installed.
    ``approved_apps``: the silo's allow-list of app builds (hetfed.runtime.pinning).
    """
    if runtime not in RUNTIMES:
        raise ValueError(f"--runtime must be one of {', '.join(RUNTIMES)}, got {runtime!r}")
    pinning = ["--approved-apps", str(approved_apps)] if approved_apps else []
    return [str(BIN / "hetfed-supernode"), "--runtime", runtime, *pinning, *args]


def superexec_args(*, runtime_api: str, ca: str | os.PathLike | None) -> list[str]:
    """``flower-superexec`` arguments for an executor of ServerApps or ClientApps (process isolation)."""
    security = ["--root-certificates", str(ca)] if ca else ["--insecure"]
    return [*security, "--runtime-api-address", runtime_api]


def connection_toml(address: str, ca: str | os.PathLike | None) -> str:
    """``$FLWR_HOME/config.toml`` with the SuperLink connection ``hetfed`` (the flwr CLI reads it)."""
    security = f'root-certificates = "{Path(ca).resolve()}"' if ca else "insecure = true"
    return (
        f'[superlink]\ndefault = "{CONNECTION}"\n\n'
        f'[superlink.{CONNECTION}]\naddress = "{address}"\n{security}\n'
    )


@dataclass
class LocalFlower:
    """A SuperLink (deployment or simulation runtime) and SuperNodes started from here, under ``root``.

    ``host:link_port`` is where the flwr CLI and SuperNodes reach the SuperLink; ``ca``
    verifies its certificate (``None``: plain HTTP). ``tls`` (the SuperLink's own
    files) and ``node_auth`` matter only to :meth:`start_superlink`; ``runtime`` is the
    ClientApp runtime of the SuperNodes started here (``warm`` or ``stock``) and
    ``approved_apps`` their allow-list of app builds (None: any app). ``state`` is where the
    SuperLink keeps its state (``memory``, or ``file``: ``root/state.db``, which a restarted
    SuperLink reads back). ``superlink_asgi``: ``gated`` (hetfed-superlink) or ``stock``
    (flower-superlink), see :func:`superlink_command`.
    """

    root: Path
    simulation: bool = False
    link_port: int = 0
    host: str = "127.0.0.1"
    ca: Path | None = None
    tls: TlsFiles | None = None
    node_auth: bool = False
    runtime: str = DEFAULT_RUNTIME
    approved_apps: Path | None = None
    state: str = "memory"
    superlink_asgi: str = "gated"
    processes: dict[str, subprocess.Popen] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.root = Path(self.root).resolve()
        self.home = self.root / "flwr-home"
        self.home.mkdir(parents=True, exist_ok=True)
        self.link_port = self.link_port or free_port()
        if self.tls and not self.ca:
            self.ca = self.tls.ca
        self.env = flower_env(self.home)
        (self.home / "config.toml").write_text(connection_toml(self.address, self.ca))

    @property
    def address(self) -> str:
        return f"[{self.host}]:{self.link_port}" if ":" in self.host else f"{self.host}:{self.link_port}"

    @property
    def health_url(self) -> str:
        return f"{'https' if self.ca else 'http'}://{self.address}/health"

    def healthy(self, timeout: float = 2.0) -> bool:
        """Whether the SuperLink answers ``/health`` within ``timeout`` s (over HTTPS verified with
        ``ca`` when set)."""
        return _http_ok(self.health_url, self.ca, timeout)

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
        args = superlink_args(
            host=self.host,
            port=self.link_port,
            database=superlink_database(self.state, self.root),
            tls=self.tls,
            node_auth=self.node_auth,
            simulation=self.simulation,
        )
        proc = self.spawn("superlink", superlink_command(args, self.superlink_asgi), cwd)
        self._wait(lambda: proc.poll() is None and self.healthy(), timeout, "the SuperLink", "superlink")

    def start_supernode(self, index: int, node_config: Mapping[str, Any], key: Path | None = None) -> None:
        """Start SuperNode ``index`` with its own node config (its private partition) and auth ``key``."""
        args = supernode_args(
            superlink=self.address,
            node_config=node_config,
            ca=self.ca,
            key=key,
            port=free_port(),
            max_retries=10,
        )
        self.spawn(f"supernode-{index}", supernode_command(self.runtime, args, self.approved_apps))

    def register(self, public_key: Path, name: str = "") -> int:
        """``flwr supernode register``: admit the SuperNode holding this key; returns its node id."""
        named = ["--name", name] if name else []
        res = self.flwr_json("supernode", "register", str(public_key), CONNECTION, *named)
        if not res.get("success") or "node-id" not in res:
            raise FlowerProcessError(f"registering {public_key} failed: {res.get('error-message', res)}")
        return int(res["node-id"])

    def wait_healthy(self, timeout: float) -> None:
        """Wait until the SuperLink (started elsewhere) answers ``/health``."""
        end = time.time() + timeout
        while not self.healthy():
            if time.time() > end:
                raise FlowerProcessError(f"no SuperLink answered {self.health_url} within {timeout:g} s")
            time.sleep(0.5)

    def start_supernodes(
        self,
        node_configs: Sequence[Mapping[str, Any]],
        keys: Sequence[Path | None] = (),
        timeout: float | None = None,
    ) -> None:
        """Start SuperNode ``i`` with ``node_configs[i]`` (and auth key ``keys[i]``), at most
        :data:`STARTUP_BATCH` of them coming up at once (started, not yet online); all online within
        ``timeout`` seconds (default :func:`nodes_timeout`), else one line saying how many came online."""
        nodes = len(node_configs)
        timeout = nodes_timeout(nodes) if timeout is None else timeout
        end = time.time() + timeout
        for i in range(nodes):
            self._wait_online(i + 1 - STARTUP_BATCH, nodes, end, timeout)
            self.start_supernode(i, node_configs[i], key=keys[i] if keys else None)
        self._wait_online(nodes, nodes, end, timeout)

    def wait_for_nodes(self, count: int, timeout: float = 90) -> None:
        """Wait until ``count`` SuperNodes are online."""
        self._wait_online(count, count, time.time() + timeout, timeout)

    def _wait_online(self, count: int, total: int, end: float, timeout: float) -> None:
        """Wait until ``count`` SuperNodes are online; once ``end`` passes, or a SuperNode started here
        exits, one line saying how many of ``total`` came online."""
        with self.control() as control:
            while True:
                try:
                    online = control.online_nodes()
                except FlowerProcessError:
                    online = 0
                if online >= count:
                    return
                nodes = {n: p for n, p in self.processes.items() if n.startswith("supernode-")}
                exited = [n for n, p in nodes.items() if p.poll() is not None]
                if exited or time.time() > end:
                    why = (
                        f"{exited[0]} exited with code {nodes[exited[0]].returncode} "
                        f"({_tail(self.root / f'{exited[0]}.log', 1).strip()})"
                        if exited
                        else f"within {timeout:g} s"
                    )
                    raise FlowerProcessError(
                        f"only {online} of {total} SuperNodes came online: {why}; "
                        f"their logs: {self.root}/supernode-<i>.log"
                    )
                time.sleep(0.5)

    def online_nodes(self) -> int:
        """How many SuperNodes are online (0 when the SuperLink does not answer)."""
        with self.control() as control:
            try:
                return control.online_nodes()
            except FlowerProcessError:
                return 0

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

    def control(self, timeout: float = 10) -> ControlApi:
        """The SuperLink's Control API, asked in this process (no ``flwr`` process); close it after use."""
        from hetfed.engines.control_api import ControlApi

        return ControlApi(self.home, CONNECTION, timeout=timeout)

    def run_status(self, run_id: str) -> str:
        """``pending``, ``running``, ..., or ``finished:completed|failed|stopped``."""
        with self.control() as control:
            return control.run_status(run_id)

    def wait_run(
        self,
        run_id: str,
        timeout: float,
        tick: Callable[[], None] = lambda: None,
        lost_after: float = 20,
    ) -> str:
        """Ask the run's status every second until it finishes (``flwr run``'s exit code is not
        trustworthy); return it. ``tick`` runs after every poll.

        The status comes from the Control API in this process (:meth:`control`), never a ``flwr``
        process. ``/health`` decides whether the SuperLink lives: once it has not answered for
        ``lost_after`` seconds, :class:`SuperLinkUnreachable`: within ``lost_after`` + 3 s of the
        SuperLink's death, as a status call is bounded (by ``lost_after`` / 2, at most 10 s).
        """
        end = time.time() + timeout
        heard = time.time()  # when /health last answered
        with self.control(timeout=min(10, lost_after / 2)) as control:
            while time.time() < end:
                status = ""
                if self.healthy():
                    heard = time.time()
                    try:
                        status = control.run_status(run_id)
                    except FlowerProcessError:
                        pass  # slow or restarting: asked again next second, /health decides
                elif time.time() - heard >= lost_after:
                    raise SuperLinkUnreachable(
                        f"the SuperLink at {self.address} has not answered {self.health_url} for "
                        f"{time.time() - heard:.0f} s"
                    )
                tick()
                if status.startswith("finished"):
                    return status
                time.sleep(1)
        raise FlowerProcessError(f"run {run_id} did not finish within {timeout:g} s")

    def stop_run(self, run_id: str, timeout: float = 15) -> bool:
        """Ask the SuperLink to stop the run (``flwr stop``); False if it could not be asked."""
        if not self.healthy():
            return False
        with self.control(timeout) as control:
            try:
                return control.stop_run(run_id)
            except FlowerProcessError:
                return False

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


def processes_of(flwr_home: Path, program: str | None = None) -> list[int]:
    """Live processes started with ``FLWR_HOME=flwr_home`` (every Flower process of a federation).

    They are found by their environment (``/proc/<pid>/environ``): Flower's SuperExec and the
    ServerApp / ClientApp processes it starts run in sessions of their own, outside the process
    groups that were started. ``program`` keeps those running it (e.g. ``flwr-serverapp``). This
    process and its ancestors (a shell started with that ``FLWR_HOME``) are never listed.
    """
    marker = f"FLWR_HOME={Path(flwr_home).resolve()}".encode()
    spared = _ancestors(os.getpid())
    pids = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            env = (proc / "environ").read_bytes().split(b"\0")
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except (OSError, IndexError):
            continue
        if marker not in env or state == "Z" or int(proc.name) in spared:
            continue
        if program is None or any(Path(a.decode(errors="replace")).name == program for a in argv[:2]):
            pids.append(int(proc.name))
    return pids


def end_processes_of(
    flwr_home: Path, timeout: float = 15, program: str | None = None, *, force: bool = False
) -> int:
    """End every process of :func:`processes_of` (SIGTERM, then SIGKILL; ``force``: SIGKILL at
    once); returns how many there were.

    A run must not keep writing its results after ``hetfed run`` reported it stopped, and
    ``hetfed federation down`` must leave no Flower process behind.
    """
    pids = first = processes_of(flwr_home, program)
    for sig in (signal.SIGKILL,) if force else (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
        end = time.time() + timeout
        while (pids := [p for p in processes_of(flwr_home, program) if p in first]) and time.time() < end:
            time.sleep(0.2)
        if not pids:
            break
    return len(first)


def _ancestors(pid: int) -> set[int]:
    """``pid`` and every process above it."""
    out = set()
    while pid > 1 and pid not in out:
        out.add(pid)
        try:
            pid = int((Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            break
    return out


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


def _http_ok(url: str, ca: Path | None = None, timeout: float = 2.0) -> bool:
    context = ssl.create_default_context(cafile=str(ca)) if ca else None
    try:
        with urllib.request.urlopen(url, timeout=timeout, context=context) as r:
            return r.status == 200
    except OSError:
        return False


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"
