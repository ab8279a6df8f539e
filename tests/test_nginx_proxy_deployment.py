"""The SuperLink behind its reverse proxy, on this machine's loopback (no namespaces needed).

``hetfed federation superlink`` (as ``deploy/start-superlink.sh`` runs it) supervises the
SuperLink on 127.0.0.1:<port+1> and nginx on <port>. Through the proxy: the Control and
Runtime APIs get 403, ``/health`` answers, the registered silos join with node
authentication (their signatures pass through nginx) while an unregistered one is
refused, and the operator's run completes. nginx killed is restarted; SIGTERM stops all.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hetfed.credentials import write_certificates, write_node_key
from hetfed.engines.flower import free_port
from tests.conftest import REPO, needs_nginx
from tests.http_probe import CLOSED, codes

pytestmark = pytest.mark.deployment

BIN = Path(sys.executable).parent


def _start(cmd: list[str], log: Path) -> subprocess.Popen:
    with open(log, "wb") as out:
        return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, cwd=REPO)


def _stop(procs: list[subprocess.Popen]) -> None:
    for proc in procs:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    for proc in procs:
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"


def port_pair() -> int:
    """A free port whose successor is free too: the SuperLink takes --port + 1 behind the proxy, and
    with parallel tests another process may hold the successor of a port that is free."""
    while True:
        port = free_port()
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
        return port


def test_only_the_fleet_api_passes_the_proxy_and_node_auth_still_holds(tmp_path: Path) -> None:
    needs_nginx()
    hetfed = str(BIN / "hetfed")
    tls = write_certificates(tmp_path / "tls")
    keys = {n: write_node_key(tmp_path / n)[0] for n in ("silo-0", "silo-1", "rogue")}
    port, link = port_pair(), tmp_path / "link"
    procs: list[subprocess.Popen] = []
    try:
        superlink = _start(
            [hetfed, "federation", "superlink", "--dir", str(link), "--host", "127.0.0.1"]
            + ["--port", str(port), "--tls-dir", str(tls.ca.parent), "--silos", "2"],
            tmp_path / "superlink.log",
        )
        procs.append(superlink)
        end = time.time() + 60  # the command writes federation.json and the proxy config, then starts both
        while not (link / "federation.json").exists() and superlink.poll() is None and time.time() < end:
            time.sleep(0.2)
        out = subprocess.run(
            [hetfed, "federation", "register", "--dir", str(link), "--wait", "60"]
            + [str(keys[n]) + ".pub" for n in ("silo-0", "silo-1")],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert out.returncode == 0, out.stderr + (tmp_path / "superlink.log").read_text()[-2000:]
        info = json.loads((link / "federation.json").read_text())
        assert (info["host"], info["link-port"], info["proxy"]) == ("127.0.0.1", port + 1, "nginx")

        public = f"https://127.0.0.1:{port}"
        assert codes(public, tls.ca, ["/health", *CLOSED]) == {"/health": 200, **dict.fromkeys(CLOSED, 403)}
        assert codes(f"https://127.0.0.1:{port + 1}", tls.ca, ["/health"]) == {"/health": 200}  # this host

        def silo(name: str, partition: int) -> subprocess.Popen:
            proc = _start(
                [hetfed, "federation", "silo", "--superlink", f"127.0.0.1:{port}", "--ca", str(tls.ca)]
                + ["--key", str(keys[name]), "--partition-id", str(partition), "--num-partitions", "2"]
                + ["--state-dir", str(tmp_path / f"{name}-state"), "--port", str(free_port()), "--any-app"],
                tmp_path / f"{name}.log",
            )
            procs.append(proc)
            return proc

        silo("silo-0", 0), silo("silo-1", 1)
        rogue = silo("rogue", 0)
        online = subprocess.run(
            [hetfed, "federation", "status", "--dir", str(link), "--wait", "2", "--timeout", "120"],
            capture_output=True, text=True, timeout=180,
        )  # fmt: skip
        assert "2 of 2 SuperNodes online" in online.stdout, online.stdout + online.stderr
        assert f"reverse proxy nginx on 127.0.0.1:{port}: running" in online.stdout
        assert f"{len(CLOSED)} requests refused (403)" in online.stdout  # the CLOSED probes above
        assert rogue.wait(timeout=90) != 0
        assert "Failed to activate SuperNode" in (tmp_path / "rogue.log").read_text()
        access = (link / "proxy" / "access.log").read_text()
        assert '"POST /v1/fleet/activate-node HTTP/1.1" 200' in access  # the silos' signed calls passed
        assert '"POST /v1/control/start-run HTTP/1.1" 403' in access

        # nginx dies: the supervisor starts it again.
        nginx_pid = int((link / "proxy" / "nginx.pid").read_text())
        os.kill(nginx_pid, signal.SIGKILL)
        end = time.time() + 30

        def restarted() -> int:
            text = (link / "proxy" / "nginx.pid").read_text().strip() if time.time() < end else "0"
            return int(text) if text.isdigit() and int(text) != nginx_pid and _alive(int(text)) else 0

        while not restarted() and time.time() < end:
            time.sleep(0.5)
        assert restarted(), (tmp_path / "superlink.log").read_text()[-2000:]
        time.sleep(1)
        assert codes(public, tls.ca, ["/health"]) == {"/health": 200}
        assert "the proxy (nginx) exited" in (tmp_path / "superlink.log").read_text()

        run = subprocess.run(
            [hetfed, "run", "--engine", "deployment", "--federation-dir", str(link), "--results-dir"]
            + [str(tmp_path / "results"), "--timeout", "600", "--set", "run-name=proxied"]
            + [a for kv in ("num-items=10", "n-train=40", "n-test=30", "num-rounds=1", "num-clients=2")
               for a in ("--set", kv)],
            capture_output=True, text=True, timeout=660,
        )  # fmt: skip
        assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
        summary = json.loads((tmp_path / "results" / "proxied" / "summary.json").read_text())
        assert summary["status"] == "completed"
        # hetfed-superlink's Fleet routes pass the proxy too: batched objects; its held pull needs the
        # state in memory (this SuperLink's is on disk), so it answers 404 and the silos pull Flower's way.
        access = (link / "proxy" / "access.log").read_text()
        for path, status in (("pull-objects", 200), ("push-objects", 200), ("pull-messages", 404)):
            assert f'"POST /v1/fleet/hetfed/{path} HTTP/1.1" {status}' in access, path
        assert '"POST /v1/fleet/hetfed/pull-messages HTTP/1.1" 200' not in access
        assert "objects pulled from the SuperLink in one request" in (tmp_path / "silo-0.log").read_text()

        nginx_pid = int((link / "proxy" / "nginx.pid").read_text())
        superlink.send_signal(signal.SIGTERM)  # the supervisor stops the SuperLink and nginx
        superlink.wait(timeout=40)
        time.sleep(1)
        assert not _alive(nginx_pid)
        assert codes(public, tls.ca, ["/health"])["/health"] != 200
    finally:
        _stop(procs)
