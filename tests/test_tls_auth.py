"""TLS certificates, node keys, and the commands of the SuperLink host and of a silo.

Certificates are verified with ``cryptography``'s own X.509 path validation; keys
and command lines are read by Flower's own loaders and argument parsers. The last
test starts a local federation with TLS and node authentication on loopback.
"""

from __future__ import annotations

import json
import re
import shlex
import stat
import subprocess
import sys
from ipaddress import ip_address
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.x509.verification import PolicyBuilder, Store, VerificationError
from flwr.cli.supernode.register import try_load_public_key
from flwr.common.args import try_obtain_root_certificates, try_obtain_server_certificates
from flwr.common.config import parse_config_args
from flwr.supercore.primitives.asymmetric import public_key_to_bytes
from flwr.superlink.cli.flower_superlink import _parse_args_run_superlink
from flwr.supernode.cli.flower_supernode import _parse_args_run_supernode, _try_setup_client_authentication

from hetfed.credentials import TlsFiles, write_certificates, write_node_key
from hetfed.engines.flower import _http_ok
from hetfed.federation import federation_down, silo_host, superlink_host
from hetfed.runtime.supernode import split_runtime
from tests.conftest import REPO, hetfed_cli, needs_nginx

DEPLOY = REPO / "deploy"


def verify(tls: TlsFiles, name: str) -> None:
    """X.509 path validation of the server certificate for ``name`` against the CA (raises if invalid)."""
    ca = x509.load_pem_x509_certificate(tls.ca.read_bytes())
    leaf = x509.load_pem_x509_certificate(tls.cert.read_bytes())
    try:
        subject = x509.IPAddress(ip_address(name))
    except ValueError:
        subject = x509.DNSName(name)
    PolicyBuilder().store(Store([ca])).build_server_verifier(subject).verify(leaf, [])


def test_server_certificate_is_valid_for_the_named_hosts_and_loopback_only(tmp_path: Path) -> None:
    tls = write_certificates(tmp_path, ["superlink.example.org", "203.0.113.7"])
    for name in ("superlink.example.org", "203.0.113.7", "localhost", "127.0.0.1", "::1"):
        verify(tls, name)
    for name in ("other.example.org", "203.0.113.8"):
        with pytest.raises(VerificationError):
            verify(tls, name)
    key = serialization.load_pem_private_key(tls.key.read_bytes(), None)
    leaf = x509.load_pem_x509_certificate(tls.cert.read_bytes())
    assert key.public_key() == leaf.public_key()
    for private in (tls.key, tmp_path / "ca.key"):
        assert stat.S_IMODE(private.stat().st_mode) == 0o600
    assert stat.S_IMODE(tls.cert.stat().st_mode) == 0o644

    # Re-issuing for a new name keeps the CA, so silos that trust it keep working.
    ca_before = tls.ca.read_bytes()
    again = write_certificates(tmp_path, ["superlink.example.org", "link2.example.org"])
    assert again.ca.read_bytes() == ca_before
    verify(again, "link2.example.org")
    with pytest.raises(VerificationError):
        verify(again, "203.0.113.7")
    with pytest.raises(ValueError, match="--days"):
        write_certificates(tmp_path / "x", days=0)


def test_node_keys_load_with_flowers_own_loaders(tmp_path: Path) -> None:
    private, public = write_node_key(tmp_path / "keys" / "silo-0", name="acme")
    args = _parse_args_run_supernode().parse_args(["--auth-supernode-private-key", str(private)])
    loaded_private, loaded_public = _try_setup_client_authentication(args)
    assert loaded_private.curve.name == "secp256r1"  # hetfed.runtime.node_key
    assert try_load_public_key(public) == public_key_to_bytes(loaded_public)
    assert public.read_text().split()[-1] == "acme"
    assert stat.S_IMODE(private.stat().st_mode) == 0o600
    with pytest.raises(FileExistsError, match="keeps its key"):
        write_node_key(private)


def test_superlink_host_command_serves_tls_with_node_auth_and_refuses_plain_http_off_loopback(
    tmp_path: Path,
) -> None:
    tls = write_certificates(tmp_path / "tls", ["superlink.example.org"])
    cmd = superlink_host(tmp_path / "link", host="0.0.0.0", port=8123, tls_dir=tls.ca.parent, node_auth=True)
    args = _parse_args_run_superlink().parse_args(cmd.argv[1:])
    assert Path(cmd.argv[0]).name == "hetfed-superlink"
    assert (args.host, args.port, args.enable_supernode_auth, args.insecure) == ("0.0.0.0", 8123, True, False)
    assert args.runtime_dependency_install is False
    assert try_obtain_server_certificates(args) == (
        tls.ca.read_bytes(),
        tls.cert.read_bytes(),
        tls.key.read_bytes(),
    )
    assert cmd.env["FLWR_DISABLE_UPDATE_CHECK"] == "1"
    assert cmd.env["FLWR_TELEMETRY_ENABLED"] == "0"
    assert cmd.env["FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION"] == "1"
    info = json.loads((tmp_path / "link" / "federation.json").read_text())
    assert (info["host"], info["link-port"], info["node-auth"]) == ("127.0.0.1", 8123, True)
    connection = (tmp_path / "link" / "flwr-home" / "config.toml").read_text()
    assert 'address = "127.0.0.1:8123"' in connection and str(tls.ca) in connection
    with pytest.raises(RuntimeError, match="started by `hetfed federation superlink`"):
        federation_down(tmp_path / "link")  # systemd (or Ctrl-C) stops it, not `down`

    with pytest.raises(ValueError, match="refusing plain HTTP on --host 0.0.0.0"):
        superlink_host(tmp_path / "l2", host="0.0.0.0", port=8000, tls_dir=None, node_auth=False)
    with pytest.raises(ValueError, match="node authentication needs TLS"):
        superlink_host(tmp_path / "l2", host="127.0.0.1", port=8000, tls_dir=None, node_auth=True)
    with pytest.raises(ValueError, match="does not name 10.0.0.5"):
        superlink_host(tmp_path / "l2", host="10.0.0.5", port=8000, tls_dir=tls.ca.parent, node_auth=True)
    with pytest.raises(FileNotFoundError, match="lacks ca.crt, server.pem, server.key"):
        superlink_host(tmp_path / "l2", host="0.0.0.0", port=8000, tls_dir=tmp_path, node_auth=True)
    local = superlink_host(tmp_path / "l3", host="127.0.0.1", port=8000, tls_dir=None, node_auth=False)
    assert _parse_args_run_superlink().parse_args(local.argv[1:]).insecure
    # The cross-machine SuperLink keeps its state in a file (a restart keeps the registered keys)
    # unless told otherwise; a bad value is refused before anything is written.
    assert args.database == str((tmp_path / "link" / "state.db").resolve())
    fast = superlink_host(
        tmp_path / "l4", host="127.0.0.1", port=8000, tls_dir=None, node_auth=False, state="memory"
    )
    assert _parse_args_run_superlink().parse_args(fast.argv[1:]).database == ":flwr-in-memory:"
    with pytest.raises(ValueError, match="SuperLink state must be one of memory, file, got 'disk'"):
        superlink_host(
            tmp_path / "l5", host="127.0.0.1", port=8000, tls_dir=None, node_auth=False, state="disk"
        )
    assert not (tmp_path / "l5").exists()


def test_silo_command_connects_with_its_key_partition_and_state(tmp_path: Path) -> None:
    tls = write_certificates(tmp_path / "tls", ["superlink.example.org"])
    key, _ = write_node_key(tmp_path / "silo.key")
    (tmp_path / "data").mkdir()
    cmd = silo_host(
        superlink="superlink.example.org:8000",
        ca=tls.ca,
        key=key,
        partition_id=2,
        num_partitions=3,
        state_dir=tmp_path / "state",
        data_path=tmp_path / "data",
    )
    runtime, flower_args = split_runtime(cmd.argv[1:])
    assert Path(cmd.argv[0]).name == "hetfed-supernode" and runtime == "warm"
    args = _parse_args_run_supernode().parse_args(flower_args)
    assert (args.superlink, args.insecure, args.auth_supernode_private_key) == (
        "superlink.example.org:8000",
        False,
        str(key),
    )
    assert try_obtain_root_certificates(args, args.superlink) == tls.ca.read_bytes()
    assert parse_config_args([args.node_config]) == {
        "partition-id": 2,
        "num-partitions": 3,
        "data-path": str(tmp_path / "data"),
        "state-dir": str(tmp_path / "state"),
    }
    assert args.host == "127.0.0.1" and args.runtime_dependency_install is False
    assert cmd.env["FLWR_HOME"] == str(tmp_path / "state" / ".flwr")

    common = {"partition_id": 0, "num_partitions": 2, "state_dir": tmp_path / "s", "key": None}
    with pytest.raises(ValueError, match="refusing plain HTTP to --superlink 10.1.2.3:8000"):
        silo_host(superlink="10.1.2.3:8000", ca=None, **common)
    with pytest.raises(FileNotFoundError, match="--key"):
        silo_host(superlink="h:8000", ca=tls.ca, **{**common, "key": tmp_path / "nope"})
    with pytest.raises(ValueError, match="--partition-id 2 is outside"):
        silo_host(superlink="h:8000", ca=tls.ca, **{**common, "partition_id": 2})
    with pytest.raises(ValueError, match="is not host:port"):
        silo_host(superlink="superlink.example.org", ca=tls.ca, **common)
    assert "--insecure" in silo_host(superlink="127.0.0.1:8000", ca=None, **common).argv


def env_keys(path: Path) -> set[str]:
    return {ln.split("=", 1)[0] for ln in path.read_text().splitlines() if re.match(r"^HETFED_\w+=", ln)}


def test_start_scripts_map_their_env_files_to_the_commands(tmp_path: Path) -> None:
    from hetfed.runtime.pinning import approve

    needs_nginx()

    approve(tmp_path / "state" / "approved-apps", "e" * 64)  # the silo approved a build
    tls = write_certificates(tmp_path / "tls")
    key, _ = write_node_key(tmp_path / "silo.key")
    hetfed = Path(sys.executable).parent / "hetfed"
    for script, example, values in (
        (
            "start-superlink.sh",
            "superlink.env.example",
            {"HETFED_DIR": tmp_path / "link", "HETFED_PORT": 8765, "HETFED_TLS_DIR": tls.ca.parent},
        ),
        (
            "start-silo.sh",
            "silo.env.example",
            {
                "HETFED_SUPERLINK": "superlink.example.org:8443",
                "HETFED_CA": tls.ca,
                "HETFED_KEY": key,
                "HETFED_PARTITION_ID": 1,
                "HETFED_NUM_PARTITIONS": 4,
                "HETFED_STATE_DIR": tmp_path / "state",
                "HETFED_RUNTIME": "stock",
            },
        ),
    ):
        # Every variable a script reads is documented in its example env file.
        used = set(re.findall(r"\$\{?(HETFED_\w+)", (DEPLOY / script).read_text()))
        assert used <= env_keys(DEPLOY / example), used - env_keys(DEPLOY / example)
        text = (DEPLOY / example).read_text()
        for k, v in {"HETFED_BIN": hetfed, **values}.items():
            text = re.sub(rf"^{k}=.*$", f"{k}={v}", text, flags=re.M)
        env_file = tmp_path / example
        env_file.write_text(text)
        out = subprocess.run(
            [str(DEPLOY / script), str(env_file), "--print"], capture_output=True, text=True, timeout=60
        )
        assert out.returncode == 0, out.stderr
        argv = shlex.split(out.stdout.splitlines()[0])
        if script == "start-superlink.sh":  # behind the proxy: the SuperLink on 127.0.0.1, port + 1
            args = _parse_args_run_superlink().parse_args(argv[1:])
            assert (args.port, args.host, args.enable_supernode_auth) == (8766, "127.0.0.1", True)
            assert args.ssl_certfile == str(tls.cert)
            proxy = shlex.split(out.stdout.splitlines()[1])
            assert Path(proxy[0]).name == "nginx" and proxy[-2:] == ["-g", "daemon off;"]
            assert "listen 0.0.0.0:8765 ssl;" in (tmp_path / "link" / "proxy" / "nginx.conf").read_text()
        else:
            runtime, flower_args = split_runtime(argv[1:])
            assert Path(argv[0]).name == "hetfed-supernode"
            assert runtime == values.get("HETFED_RUNTIME", "warm")
            args = _parse_args_run_supernode().parse_args(flower_args)
            assert (args.superlink, args.root_certificates) == ("superlink.example.org:8443", str(tls.ca))
            assert args.auth_supernode_private_key == str(key) and args.port == 9094
            assert parse_config_args([args.node_config])["partition-id"] == 1


def test_systemd_units_run_the_start_scripts_with_their_env_files() -> None:
    for unit, script, env in (
        ("hetfed-superlink.service", "start-superlink.sh", "/etc/hetfed/superlink.env"),
        ("hetfed-silo@.service", "start-silo.sh", "/etc/hetfed/silo-%i.env"),
    ):
        text = (DEPLOY / "systemd" / unit).read_text()
        exec_start = re.search(r"^ExecStart=(.+)$", text, re.M).group(1).split()
        assert exec_start == [f"/opt/hetfed/deploy/{script}", env]
        assert (DEPLOY / script).stat().st_mode & stat.S_IXUSR
        assert re.search(r"^User=hetfed$", text, re.M) and re.search(r"^Restart=on-failure$", text, re.M)
        assert re.search(r"^KillMode=control-group$", text, re.M)  # executors and apps stop with the unit


@pytest.mark.deployment
def test_local_federation_with_tls_and_node_auth(tmp_path: Path) -> None:
    tls_dir, root = tmp_path / "tls", tmp_path / "fed"

    def run(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        return hetfed_cli("federation", *args, timeout=timeout)

    assert run("certs", "--out", str(tls_dir)).returncode == 0
    refused = run("up", "--nodes", "1", "--dir", str(root), "--node-auth")
    assert refused.returncode == 2 and "--node-auth needs --tls-dir" in refused.stderr
    up = run("up", "--nodes", "2", "--dir", str(root), "--tls-dir", str(tls_dir), "--node-auth")
    try:
        assert up.returncode == 0, up.stderr
        assert "2 SuperNodes online, node authentication on" in up.stdout
        info = json.loads((root / "federation.json").read_text())
        port = info["link-port"]
        assert _http_ok(f"https://127.0.0.1:{port}/health", tls_dir / "ca.crt")
        assert not _http_ok(f"http://127.0.0.1:{port}/health")
        again = run("register", "--dir", str(root), str(root / "keys" / "node-0.pub"))
        assert again.returncode == 0 and "already registered" in again.stdout, again.stderr
        status = run("status", "--dir", str(root), "--wait", "2", timeout=120)
        assert status.returncode == 0 and "2 of 2 SuperNodes online" in status.stdout
    finally:
        down = run("down", "--dir", str(root), timeout=120)
    assert down.returncode == 0, down.stderr
