"""The SuperLink host's reverse proxy without a network: its routes, its config, the commands that make it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from hetfed.credentials import write_certificates
from hetfed.engines.federation_info import FederationInfo
from hetfed.federation import superlink_host
from hetfed.nginx_proxy import HEALTH, check_nginx_conf, fleet_routes, write_nginx_conf
from hetfed.runtime.held_pull import PULL_MESSAGES
from hetfed.runtime.object_batch import FLEET_PULL, FLEET_PUSH
from tests.conftest import needs_nginx


@pytest.fixture
def nginx() -> str:
    return needs_nginx()


def test_the_proxy_forwards_exactly_the_fleet_routes_and_health(tmp_path: Path, nginx: str) -> None:
    from flwr.superlink.main import create_app, iter_route_contexts

    routes = fleet_routes()
    # What Flower's whole app serves (hetfed-superlink's routes are not installed in this process) ...
    app_paths = {getattr(c.route, "path", "") for c in iter_route_contexts(create_app().routes)}
    flowers = {p for p in app_paths if p.startswith("/v1/fleet/")}
    assert flowers and HEALTH in app_paths
    # ... every Fleet route of it, and hetfed-superlink's three (tests/test_warm_runtime.py runs them)
    assert set(routes) == flowers | {FLEET_PULL, FLEET_PUSH, PULL_MESSAGES}
    assert not {FLEET_PULL, FLEET_PUSH, PULL_MESSAGES} & flowers
    assert any(p.startswith("/v1/control/") for p in app_paths)  # what must not pass
    tls = write_certificates(tmp_path / "tls", ["superlink.example.org"])
    conf, argv = write_nginx_conf(tmp_path / "proxy", host="0.0.0.0", port=8443, upstream_port=8444, tls=tls)
    check_nginx_conf(argv)  # nginx -t
    text = conf.read_text()
    forwarded = re.findall(r"location = (\S+) \{", text)
    assert sorted(forwarded) == sorted([HEALTH, *routes])
    assert text.count("proxy_pass https://127.0.0.1:8444;") == len(forwarded)
    assert "location / {\n            return 403;" in text and "/v1/control" not in text
    assert "listen 0.0.0.0:8443 ssl;" in text and f"ssl_certificate {tls.cert};" in text
    assert "proxy_ssl_verify on;" in text and f"proxy_ssl_trusted_certificate {tls.ca};" in text


def test_superlink_host_binds_loopback_behind_the_proxy(tmp_path: Path, nginx: str) -> None:
    tls = write_certificates(tmp_path / "tls", ["superlink.example.org"])
    cmd = superlink_host(
        tmp_path / "link", host="0.0.0.0", port=8000, tls_dir=tls.ca.parent, node_auth=True, proxy=True
    )
    assert cmd.argv[cmd.argv.index("--host") + 1] == "127.0.0.1"
    assert cmd.argv[cmd.argv.index("--port") + 1] == "8001"
    assert cmd.proxy is not None and Path(cmd.proxy[0]).name == "nginx"
    info = FederationInfo.load(tmp_path / "link")
    assert (info.host, info.link_port) == ("127.0.0.1", 8001)  # flwr and `register` stay on this host
    assert info.extra["public-address"] == "0.0.0.0:8000" and info.extra["proxy"] == "nginx"
    with pytest.raises(ValueError, match="serves TLS"):
        superlink_host(tmp_path / "l2", host="::1", port=8000, tls_dir=None, node_auth=False, proxy=True)
    with pytest.raises(ValueError, match="must differ"):
        superlink_host(
            tmp_path / "l3", host="0.0.0.0", port=8000, tls_dir=tls.ca.parent, node_auth=True, proxy=True,
            local_port=8000,
        )  # fmt: skip


def test_a_superlink_port_already_in_use_is_named_before_anything_starts(tmp_path: Path, nginx: str) -> None:
    """`federation superlink` refuses in one line when --port or the SuperLink's port behind the proxy
    (--port + 1 unless --local-port) is taken, instead of a SuperLink that dies on bind."""
    import socket
    import subprocess
    import sys

    from hetfed.engines.flower import free_port

    tls = write_certificates(tmp_path / "tls")
    hetfed = str(Path(sys.executable).parent / "hetfed")
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        busy = held.getsockname()[1]
        port = free_port()
        for extra, option in ((["--port", str(port), "--local-port", str(busy)], "--local-port"),
                              (["--port", str(busy)], "--port")):  # fmt: skip
            out = subprocess.run(
                [hetfed, "federation", "superlink", "--dir", str(tmp_path / option), "--host", "127.0.0.1"]
                + ["--tls-dir", str(tls.ca.parent), *extra],
                capture_output=True, text=True, timeout=60,
            )  # fmt: skip
            assert out.returncode == 2, out.stdout + out.stderr
            assert f"127.0.0.1:{busy} is already in use ({option}" in out.stderr.strip().splitlines()[-1]
