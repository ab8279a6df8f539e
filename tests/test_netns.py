"""A federation across "machines" on one machine: Linux network namespaces joined by a bridge.

Namespaces ``link`` (the SuperLink host), ``silo0``, ``silo1`` and ``rogue`` each have
their own network stack; the bridge lives in a fifth namespace, so the root namespace
is untouched. Every host runs exactly what a real machine runs (``deploy/start-*.sh``
with an env file), reaching the SuperLink by a host name that its certificate names.
TLS and node authentication are on; a real run completes across the namespaces and
only model parameters and scalar metrics cross the wire; plain HTTP and an
unregistered SuperNode are refused.

The SuperLink listens on 127.0.0.1 behind its reverse proxy (nginx): from a silo's
namespace and from the rogue one, starting a run, listing runs, registering a key and
the Runtime API are refused by the proxy (HTTP 403, and with `flwr` itself), the
SuperLink's own port is closed, while node authentication's signatures pass through
the proxy (the registered silos join, the unregistered one is refused) and the
operator's run on the SuperLink host completes. Each silo runs only the app build it
approved (``hetfed federation approve``).
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hetfed.config import parse_assignments
from hetfed.engines.flower import flower_env
from hetfed.engines.runner import run_experiment
from hetfed.problems.models import make_mlp
from tests.conftest import REPO, cannot_run, needs_nginx
from tests.http_probe import CLOSED
from tests.http_probe import SOURCE as PROBE_SOURCE

pytestmark = pytest.mark.deployment

BIN = Path(sys.executable).parent
LINK_NAME = "superlink.hetfed.test"  # resolved through each namespace's /etc/netns/<ns>/hosts
ADDRESSES = {"link": "10.77.0.1", "silo0": "10.77.0.10", "silo1": "10.77.0.11", "rogue": "10.77.0.99"}
FAST = ["num-items=10", "n-train=40", "n-test=30", "local-epochs=1", "num-rounds=2", "round-timeout=300.0"]


def sampled(run_dir: Path) -> list[tuple[str, str, str]]:
    """(round, exchange, client) of every client row: who took part in what."""
    with open(run_dir / "rounds.csv", newline="") as f:
        return sorted(
            (r["round"], r["exchange"], r["client"]) for r in csv.DictReader(f) if r["client"] != "server"
        )


def _cannot_make_namespaces() -> str:
    """Why namespaces cannot be made here ('' if they can)."""
    if os.geteuid() != 0:
        return "network namespaces need root (`ip netns add`); run as root to test across namespaces"
    if shutil.which("ip") is None:
        return "iproute2 is missing (`apt-get install -y iproute2`)"
    probe = f"hfprobe{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"`ip netns add` failed: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return ""


class Hosts:
    """Namespaces with one interface each on a shared bridge, and the processes started in them."""

    def __init__(self, addresses: dict[str, str], tag: str) -> None:
        self.addresses = addresses
        self.ns = {name: f"{tag}-{name}" for name in [*addresses, "sw"]}
        self.procs: list[subprocess.Popen] = []

    def __enter__(self) -> Hosts:
        try:
            self._setup()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _setup(self) -> None:
        sw = self.ns["sw"]
        _ip("netns", "add", sw)
        _ip("-n", sw, "link", "add", "br0", "type", "bridge")
        _ip("-n", sw, "link", "set", "br0", "up")
        for i, (name, address) in enumerate(self.addresses.items()):
            ns = self.ns[name]
            _ip("netns", "add", ns)
            _ip("-n", sw, "link", "add", f"p{i}", "type", "veth", "peer", "name", "eth0", "netns", ns)
            _ip("-n", sw, "link", "set", f"p{i}", "master", "br0", "up")
            _ip("-n", ns, "addr", "add", f"{address}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
            _ip("-n", ns, "link", "set", "lo", "up")
            hosts = Path("/etc/netns") / ns / "hosts"  # `ip netns exec` mounts it over /etc/hosts
            hosts.parent.mkdir(parents=True, exist_ok=True)
            hosts.write_text(f"127.0.0.1 localhost\n{self.addresses['link']} {LINK_NAME}\n")

    def start(
        self, host: str, cmd: list[str], log: Path, env: dict[str, str] | None = None
    ) -> subprocess.Popen:
        """Start a daemon in ``host``'s namespace, in its own process group."""
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                ["ip", "netns", "exec", self.ns[host], *cmd],
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                cwd=REPO,
                env=env,
            )
        self.procs.append(proc)
        return proc

    def run(self, host: str, cmd: list[str], timeout: float) -> subprocess.CompletedProcess:
        """Run a command to completion in ``host``'s namespace."""
        return subprocess.run(
            ["ip", "netns", "exec", self.ns[host], *cmd],
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=REPO,
        )

    def close(self) -> None:
        """Stop every process we started, then anything left in the namespaces, then the namespaces."""
        for proc in self.procs:
            _killpg(proc.pid, signal.SIGTERM)
        end = time.time() + 20
        while time.time() < end and any(p.poll() is None for p in self.procs):
            time.sleep(0.2)
        for proc in self.procs:
            _killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        for ns in self.ns.values():
            # Flower's executors start their own sessions; whatever still runs in our namespaces is ours.
            pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split()
            for pid in pids:
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except ProcessLookupError:
                    pass
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
            shutil.rmtree(Path("/etc/netns") / ns, ignore_errors=True)


def _ip(*args: str) -> None:
    out = subprocess.run(["ip", *args], capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {out.stderr.strip()}")


def _killpg(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _env_file(path: Path, values: dict[str, object]) -> Path:
    path.write_text("".join(f"{k}={v}\n" for k, v in values.items()))
    return path


def _wait_exit(proc: subprocess.Popen, timeout: float) -> int | None:
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        return None


@pytest.fixture(scope="module")
def hosts() -> Iterator[Hosts]:
    reason = _cannot_make_namespaces()
    if reason:
        cannot_run(reason)
    with Hosts(ADDRESSES, f"hf{os.getpid()}") as made:
        yield made


def test_tls_and_node_auth_federation_across_namespaces(hosts: Hosts, tmp_path: Path) -> None:
    needs_nginx()  # the SuperLink host's reverse proxy
    hetfed = [str(BIN / "hetfed")]
    py = [sys.executable, "-c"]
    tls, keys, link_dir = tmp_path / "tls", tmp_path / "keys", tmp_path / "link"
    made = subprocess.run(
        [*hetfed, "federation", "certs", "--out", str(tls), "--host", LINK_NAME],
        capture_output=True,
        text=True,
    )
    assert made.returncode == 0, made.stderr
    made = subprocess.run(
        [*hetfed, "federation", "keygen", *(str(keys / n) for n in ("silo-0", "silo-1", "rogue"))],
        capture_output=True,
        text=True,
    )
    assert made.returncode == 0, made.stderr

    link_env = _env_file(
        tmp_path / "superlink.env",
        {
            "HETFED_BIN": BIN / "hetfed",
            "HETFED_DIR": link_dir,
            "HETFED_HOST": "0.0.0.0",
            "HETFED_PORT": 8000,
            "HETFED_TLS_DIR": tls,
            "HETFED_NODE_AUTH": 1,
            "HETFED_SILOS": 2,
        },
    )
    superlink = hosts.start(
        "link", [str(REPO / "deploy" / "start-superlink.sh"), str(link_env)], tmp_path / "l.log"
    )
    end = time.time() + 30  # the start script writes federation.json, then becomes the SuperLink
    while not (link_dir / "federation.json").exists() and time.time() < end:
        time.sleep(0.2)
    registered = hosts.run(
        "link",
        [*hetfed, "federation", "register", "--dir", str(link_dir), "--wait", "60"]
        + [str(keys / "silo-0.pub"), str(keys / "silo-1.pub")],
        timeout=120,
    )
    assert registered.returncode == 0, registered.stderr + (tmp_path / "l.log").read_text()[-2000:]
    assert registered.stdout.count("node id") == 2, registered.stdout

    def approve_current_build() -> None:
        """Each silo approves the build it installed (here: this repository, as `hetfed run` submits it)."""
        for name in ("silo0", "silo1", "rogue"):
            out = hosts.run(
                name,
                [*hetfed, "federation", "approve", str(REPO), "--file", str(tmp_path / f"{name}-approved")],
                120,
            )
            assert out.returncode == 0, out.stderr

    approve_current_build()

    def silo_env(name: str, key: str, partition: int) -> Path:
        return _env_file(
            tmp_path / f"{name}.env",
            {
                "HETFED_BIN": BIN / "hetfed",
                "HETFED_SUPERLINK": f"{LINK_NAME}:8000",
                "HETFED_CA": tls / "ca.crt",
                "HETFED_KEY": keys / key,
                "HETFED_PARTITION_ID": partition,
                "HETFED_NUM_PARTITIONS": 2,
                "HETFED_STATE_DIR": tmp_path / f"{name}-state",
                "HETFED_APPROVED_APPS": tmp_path / f"{name}-approved",
            },
        )

    silo = str(REPO / "deploy" / "start-silo.sh")
    for i in range(2):
        hosts.start(f"silo{i}", [silo, str(silo_env(f"silo{i}", f"silo-{i}", i))], tmp_path / f"silo{i}.log")
    # Refused: a SuperNode whose key was never registered ...
    unregistered = hosts.start("rogue", [silo, str(silo_env("rogue", "rogue", 0))], tmp_path / "rogue.log")
    # ... and a plain-HTTP SuperNode.
    plain = hosts.start(
        "rogue",
        [
            str(BIN / "flower-supernode"),
            "--insecure",
            "--superlink",
            f"{LINK_NAME}:8000",
            "--max-retries",
            "1",
        ]
        + ["--port", "9095", "--node-config", "partition-id=1 num-partitions=2"],
        tmp_path / "plain.log",
        env=flower_env(tmp_path / "plain-home"),  # Flower's own flags and PATH, only TLS left out
    )

    online = hosts.run(
        "link",
        [*hetfed, "federation", "status", "--dir", str(link_dir), "--wait", "2", "--timeout", "120"],
        180,
    )
    assert online.returncode == 0, online.stdout + online.stderr
    assert "2 of 2 SuperNodes online" in online.stdout

    assert _wait_exit(unregistered, 60) not in (None, 0)
    assert "Failed to activate SuperNode" in (tmp_path / "rogue.log").read_text()
    assert _wait_exit(plain, 60) not in (None, 0)
    assert "Failed to initialize the connection to the SuperLink" in (tmp_path / "plain.log").read_text()
    # Plain HTTP to the SuperLink gets no answer, while HTTPS from the same namespace does.
    probe = (
        "import ssl, sys, urllib.request\n"
        "ctx = ssl.create_default_context(cafile=sys.argv[2]) if sys.argv[1] == 'https' else None\n"
        f"url = sys.argv[1] + '://{LINK_NAME}:8000/health'\n"
        "try:\n    print(urllib.request.urlopen(url, timeout=5, context=ctx).status)\n"
        "except Exception as exc:\n    print('refused', type(exc).__name__)\n"
    )
    assert hosts.run("rogue", [*py, probe, "http", ""], 30).stdout.startswith("refused")
    assert hosts.run("rogue", [*py, probe, "https", str(tls / "ca.crt")], 30).stdout.strip() == "200"

    # The Control and Runtime APIs are closed to the network: the proxy answers 403 to a silo and
    # to the rogue host alike, and the SuperLink's own port (127.0.0.1:8001) takes no connection.
    public, internal = f"https://{LINK_NAME}:8000", f"https://{LINK_NAME}:8001"
    for name in ("silo0", "rogue"):
        ca = str(tls / "ca.crt")
        codes = json.loads(hosts.run(name, [*py, PROBE_SOURCE, public, ca, "/health", *CLOSED], 60).stdout)
        assert codes == {"/health": 200, **dict.fromkeys(CLOSED, 403)}, (name, codes)
        direct = json.loads(hosts.run(name, [*py, PROBE_SOURCE, internal, ca, *CLOSED], 60).stdout)
        assert set(direct.values()) == {"ConnectionRefusedError"}, (name, direct)
        # ... and with Flower's own CLI, as an intruder would try it.
        home = tmp_path / f"{name}-flwr"
        home.mkdir(exist_ok=True)
        (home / "config.toml").write_text(
            f'[superlink]\ndefault = "x"\n\n[superlink.x]\naddress = "{LINK_NAME}:8000"\n'
            f'root-certificates = "{tls / "ca.crt"}"\n'
        )
        env = ["env", f"FLWR_HOME={home}", "FLWR_DISABLE_UPDATE_CHECK=1"]
        flwr = str(BIN / "flwr")
        for argv in (
            [flwr, "ls", "x", "--format", "json"],
            [flwr, "supernode", "register", str(keys / "rogue.pub"), "x", "--format", "json"],
            [flwr, "run", str(REPO), "x", "--format", "json"],
        ):
            out = hosts.run(name, [*env, *argv], 120)
            said = out.stdout + out.stderr
            assert out.returncode != 0 or '"success": false' in said, (name, argv[1], said[-1500:])
            assert '"success": true' not in said, (name, argv[1], said[-1500:])
    access = (link_dir / "proxy" / "access.log").read_text()
    # The operator sees the refused requests in the proxy's access log.
    assert access.count('"POST /v1/control/start-run HTTP/1.1" 403') >= 2, access[-2000:]

    results = tmp_path / "results"
    approve_current_build()  # the build `hetfed run` submits now (the same, unless the tree changed)
    overrides = dict(s.split("=", 1) for s in FAST) | {"audit-traffic": "true", "num-clients": "2"}
    run = hosts.run(
        "link",
        [*hetfed, "run", "--engine", "deployment", "--federation-dir", str(link_dir)]
        + ["--results-dir", str(results), "--timeout", "600", "--set", "run-name=netns"]
        + [arg for k, v in overrides.items() for arg in ("--set", f"{k}={v}")],
        timeout=660,
    )
    logs = "".join((tmp_path / f"silo{i}.log").read_text()[-1500:] for i in range(2))
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:] + logs
    summary = json.loads((results / "netns" / "summary.json").read_text())
    assert summary["status"] == "completed"
    # The same config on the inline engine (one process, no transport) gives the same clients and results.
    inline = run_experiment(
        "inline",
        {**parse_assignments([f"{k}={v}" for k, v in overrides.items()]), "run-name": "inline"},
        nodes=2,
        results_dir=results,
    )
    assert sampled(results / "netns") == sampled(results / "inline")
    assert sorted(summary["clients"]) == sorted(inline["clients"]) == ["client-00", "client-01"]
    for name, metrics in inline["clients"].items():
        for key, value in metrics.items():
            assert summary["clients"][name][key] == pytest.approx(value, rel=1e-6), (name, key)

    # Only model parameters and scalar metrics crossed the wire (never the silos' 40 x 8 data).
    shapes = [list(p.shape) for p in make_mlp(8, 64, 10, seed=0).state_dict().values()]
    entries = [json.loads(line) for line in (results / "netns" / "traffic.jsonl").read_text().splitlines()]
    assert len(entries) == 2 * 1 + 2  # 2 rounds x ceil(0.4 * 2) train replies + 2 evaluations
    for entry in entries:
        assert all(shape in shapes for shape in entry["arrays"].values()), entry
        assert set(entry["metrics"].values()) <= {"int", "float"}, entry
    assert superlink.poll() is None, (tmp_path / "l.log").read_text()[-2000:]
    for i in range(2):  # the silos served the run with the warm ClientApp runtime (a worker each)
        log = (tmp_path / f"silo{i}.log").read_text()
        assert "warm ClientApp runtime" in log and "hetfed warm worker" in log, log[-2000:]
