"""``hetfed federation``: a local deployment that outlives one command, and one host's part of a real one.

- ``up`` / ``down`` / ``status``: a SuperLink and N SuperNodes on this machine, each
  SuperNode its own process with its own node config (partition, data path, state
  dir); optionally over TLS with node authentication (keys made and registered here).
- ``superlink`` / ``silo``: the command one real machine runs (the SuperLink host, or
  one organisation's SuperNode), checked first: files exist, plain HTTP only on
  loopback, node authentication on by default. The SuperLink host's folder gets
  ``federation.json`` and a flwr connection, so ``hetfed run --engine deployment
  --federation-dir DIR``, ``register`` and ``status`` work on that host.

``federation.json`` (:class:`hetfed.engines.federation_info.FederationInfo`, which the deployment
engine reads) records the SuperLink address, its CA (if TLS), whether node authentication is on, the
number of SuperNodes expected and the process groups that ``down`` stops.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hetfed import audit, silo_identity
from hetfed.config import ConfigError
from hetfed.credentials import TlsFiles, certificate_names, write_node_key
from hetfed.engines.federation_info import FederationInfo
from hetfed.engines.flower import (
    DEFAULT_RUNTIME,
    LocalFlower,
    end_processes_of,
    flower_env,
    is_loopback,
    split_address,
    stop_process_groups,
    superlink_args,
    superlink_command,
    superlink_database,
    supernode_args,
    supernode_command,
)
from hetfed.paths import (
    PLACEHOLDER,
    check_existing,
    check_port,
    check_writable_folder,
    exclusive_lock,
    flock_holder,
    per_partition,
)


def node_config(
    index: int, nodes: int, root: Path, data_path: str | None, state_dir: str | None
) -> dict[str, Any]:
    """Node ``index``'s config: its partition, and its own data path and state dir.

    ``{partition}`` in ``data_path`` / ``state_dir`` is replaced by the partition id.
    """
    cfg: dict[str, Any] = {"partition-id": index, "num-partitions": nodes}
    if data_path:
        cfg["data-path"] = str(Path(data_path.replace(PLACEHOLDER, str(index))).resolve())
    state = state_dir.replace(PLACEHOLDER, str(index)) if state_dir else str(root / "state" / f"node-{index}")
    cfg["state-dir"] = str(Path(state).resolve())
    return cfg


def check_up_arguments(
    nodes: int, data_path: str | None, state_dir: str | None, port: int, root: Path
) -> list[dict[str, Any]]:
    """Every node's config, after refusing in one line what cannot start: a node count below 1, a
    port outside 0-65535, a brace other than {partition}, a missing data path, a state dir that is
    a file or not writable."""
    if nodes < 1:
        raise ConfigError(f"--nodes {nodes}: must be >= 1")
    check_port("--port", port)
    if data_path:
        check_existing("--data-path", data_path, per_partition("--data-path", data_path, nodes))
    if state_dir:
        for path in per_partition("--state-dir", state_dir, nodes):
            check_writable_folder("--state-dir", path, shown=state_dir)
    return [node_config(i, nodes, root, data_path, state_dir) for i in range(nodes)]


def federation_up(
    root: Path,
    nodes: int,
    *,
    app_dir: Path,
    data_path: str | None = None,
    state_dir: str | None = None,
    port: int = 0,
    tls_dir: Path | None = None,
    node_auth: bool = False,
    runtime: str = DEFAULT_RUNTIME,
    approved_apps: Path | None = None,
    superlink_state: str = "memory",
    timeout: float | None = None,
    superlink_asgi: str = "gated",
    signed_keys: bool = True,
) -> FederationInfo:
    """Start a SuperLink (cwd ``app_dir``) and ``nodes`` SuperNodes; wait until all are online.

    The SuperNodes come up a few at a time (``LocalFlower.start_supernodes``) and get ``timeout``
    seconds to come online (default :func:`~hetfed.engines.flower.nodes_timeout`: proportional to
    ``nodes``); past it, one line says how many did and every process started is stopped.

    With ``tls_dir`` the SuperLink serves HTTPS with its certificates; with ``node_auth``
    each SuperNode gets a key pair under ``root/keys`` that is registered before it starts.
    ``runtime`` is the SuperNodes' ClientApp runtime (``warm``: a long-lived worker each;
    ``stock``: Flower's process per message). With ``approved_apps`` (an allow-list of
    FAB hashes, see ``approve``) every SuperNode runs only the app builds listed there.
    ``superlink_state`` is ``memory`` (fast; gone when the SuperLink stops, as the whole local
    federation is with ``down``) or ``file`` (``root/state.db``). ``superlink_asgi``: ``gated``
    (hetfed-superlink) or ``stock`` (flower-superlink; bench/superlink_asgi.py compares them).
    Every SuperNode gets a signing identity and the federation's roster (:func:`install_identities`),
    unless ``signed_keys`` is False (semi-honest secure aggregation, as bench/secure_aggregation.py
    compares).
    """
    superlink_database(superlink_state, root)  # refuse a bad value before starting anything
    if timeout is not None and not timeout > 0:  # NaN too
        raise ConfigError(f"--timeout {timeout:g}: must be > 0 seconds")
    root = Path(root).resolve()
    configs = check_up_arguments(nodes, data_path, state_dir, port, root)
    check_writable_folder("--dir", root)
    tls = TlsFiles.from_dir(tls_dir) if tls_dir else None
    if node_auth and tls is None:
        raise ValueError("--node-auth needs --tls-dir: Flower authenticates SuperNodes only over TLS")
    if approved_apps is not None:
        approved_apps = _approved_apps_file(approved_apps)
        for cfg in configs:
            cfg["approved-apps"] = str(approved_apps)  # the ClientApp reports what its silo approved
    # Two `up` on one folder started together would both find no federation.json and both start.
    lock = exclusive_lock(root / UP_LOCK)
    if lock is None:
        raise RuntimeError(
            f"another `hetfed federation up`{flock_holder(root / UP_LOCK)} is starting a federation in "
            f"{root}; wait for it, or `hetfed federation down --dir {root}`"
        )
    try:
        if (root / "federation.json").exists():  # checked under the lock: another `up` may just have ended
            raise RuntimeError(f"a federation is already up in {root}; run `hetfed federation down` first")
        if signed_keys:
            install_identities(configs, root / IDENTITIES)
        return _start_processes(
            root,
            configs,
            app_dir,
            LocalFlower(
                root,
                link_port=port,
                tls=tls,
                node_auth=node_auth,
                runtime=runtime,
                approved_apps=approved_apps,
                state=superlink_state,
                superlink_asgi=superlink_asgi,
            ),
            timeout,
        )
    finally:
        os.close(lock)


UP_LOCK = ".up.lock"
IDENTITIES = "identities"  # under a local federation's folder: silo-<i>.key and roster.toml


def install_identities(configs: list[dict[str, Any]], folder: Path) -> None:
    """An identity per silo (kept across `up`s) and their roster in ``folder``, named in each node
    config (``secagg-identity``, ``secagg-roster``): secure aggregation with signed keys
    (hetfed/silo_identity.py). On one machine the operator of every silo is the same; across
    machines each silo makes its own (``hetfed federation identity``)."""
    keys, roster = silo_identity.make_federation(folder, len(configs))
    for cfg, key in zip(configs, keys, strict=True):
        cfg |= {"secagg-identity": str(key), "secagg-roster": str(roster)}


def _start_processes(
    root: Path, configs: list[dict[str, Any]], app_dir: Path, flower: LocalFlower, timeout: float | None
) -> FederationInfo:
    """Start the SuperLink (cwd ``app_dir``) and a SuperNode per node config; wait until all are online."""
    nodes, tls, node_auth = len(configs), flower.tls, flower.node_auth
    try:
        flower.start_superlink(cwd=app_dir)
        keys = [_node_key(root / "keys" / f"node-{i}") for i in range(nodes)] if node_auth else []
        for i, key in enumerate(keys):
            flower.register(key.with_name(key.name + ".pub"), name=f"node-{i}")
        flower.start_supernodes(configs, keys, timeout)
    except BaseException:
        flower.stop()
        end_processes_of(flower.home)  # SuperExecs run in sessions of their own
        raise
    info = FederationInfo(
        root,
        flower.link_port,
        nodes,
        [p.pid for p in flower.processes.values()],
        tls_dir=tls.ca.parent if tls else None,
        node_auth=node_auth,
        extra={"state-dirs": [str(cfg["state-dir"]) for cfg in configs]},
    )
    info.save()
    return info


def federation_down(root: Path) -> tuple[int, int]:
    """Stop every process the federation in ``root`` started; returns (groups signalled, others ended).

    First any running ServerApp (``flwr-serverapp``: SIGTERM, so it records its run
    interrupted), before its SuperNodes go: stopped after them, it could record the round in
    progress from the clients left. Then the process groups of ``federation.json``
    (SuperNodes, then the SuperLink), then every process still running with the federation's
    ``FLWR_HOME``: Flower's SuperExec and the ServerApp and ClientApp processes it starts run
    in sessions of their own, and an orphaned ServerApp would otherwise outlive the federation.
    """
    info = FederationInfo.load(root)
    if info.extra.get("role") == "superlink-host":
        raise RuntimeError(
            f"the SuperLink in {info.root} was started by `hetfed federation superlink`; stop it where it "
            "runs (Ctrl-C, or `systemctl stop hetfed-superlink`)"
        )
    audit.record_down(info.flower())  # the runs it is about to end, while the SuperLink can say which
    others = end_processes_of(info.root / "flwr-home", program="flwr-serverapp")
    stop_process_groups(list(reversed(info.pids)))
    others += end_processes_of(info.root / "flwr-home")
    (info.root / "federation.json").unlink()
    return len(info.pids), others


def _node_key(path: Path) -> Path:
    """The private key at ``path``, made on first use (a node keeps its key, and so its node id)."""
    if not path.exists():
        write_node_key(path)
    return path


# --- one host of a federation across machines ---------------------------------------------------
@dataclass(frozen=True)
class HostCommand:
    """A Flower daemon to run in the foreground: argv, environment and working folder.

    ``proxy``: the reverse proxy's command line, run and supervised next to the daemon.
    """

    argv: list[str]
    env: dict[str, str]
    cwd: Path
    proxy: list[str] | None = None

    def exec(self) -> None:
        """Become the daemon (systemd then supervises Flower itself), or supervise it and its proxy."""
        os.chdir(self.cwd)
        if self.proxy is None:
            os.execvpe(self.argv[0], self.argv, self.env)
        from hetfed.nginx_proxy import supervise

        raise SystemExit(supervise(self.argv, self.proxy, self.env, self.cwd))


def superlink_host(
    root: Path,
    *,
    host: str,
    port: int,
    tls_dir: Path | None,
    node_auth: bool,
    silos: int = 0,
    proxy: bool = False,
    local_port: int = 0,
    state: str = "file",
    isolation: str = "subprocess",
) -> HostCommand:
    """Prepare ``root`` (state database, flwr connection, ``federation.json``) and the SuperLink command.

    Plain HTTP (``tls_dir=None``) is allowed only when binding to loopback. The
    flwr connection goes to 127.0.0.1 when binding to all interfaces; the server
    certificate must name that address (``hetfed federation certs`` always adds it).

    With ``proxy`` the SuperLink listens on 127.0.0.1:``local_port`` (default ``port``
    + 1) only, and nginx (``hetfed.nginx_proxy``, config in ``root/proxy``) serves
    ``host:port`` with TLS, forwarding the Fleet API and ``/health`` only.

    ``state`` ``file`` (the default: ``root/state.db``) keeps registered keys, nodes and runs
    across SuperLink restarts; ``memory`` is faster and must re-register every key after one.

    ``isolation`` ``subprocess`` (the default) runs each ServerApp as a child of the SuperLink
    (results in ``root/results``); ``process`` leaves it to a separate ``flower-superexec``
    that reaches the Runtime API on 127.0.0.1 (the compose TLS topology).
    """
    check_port("--port", port, free=False)
    if local_port:
        check_port("--local-port", local_port, free=False)
    check_writable_folder("--dir", Path(root))
    database = superlink_database(state, Path(root).resolve())
    if silos < 0:
        raise ValueError(f"--silos must be >= 0, got {silos}")
    if proxy and tls_dir is None:
        raise ValueError("the reverse proxy serves TLS: give --tls-dir (or --no-proxy with --insecure)")
    public_host, public_port = host, port
    if proxy:
        host, port = "127.0.0.1", local_port or port + 1
        if port == public_port:
            raise ValueError(f"--local-port must differ from --port ({port}): the proxy listens there")
    if tls_dir is None and not is_loopback(host):
        raise ValueError(
            f"refusing plain HTTP on --host {host}: traffic would leave this machine unencrypted; "
            "give --tls-dir (see `hetfed federation certs`) or bind to 127.0.0.1"
        )
    if node_auth and tls_dir is None:
        raise ValueError("node authentication needs TLS: give --tls-dir, or --no-node-auth on loopback")
    tls = TlsFiles.from_dir(tls_dir) if tls_dir else None
    local = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)
    if tls and local not in certificate_names(tls.cert):
        raise ValueError(
            f"the server certificate {tls.cert} does not name {local} (it names "
            f"{', '.join(certificate_names(tls.cert))}); the SuperLink's own executor connects there: "
            f"re-issue it with `hetfed federation certs --out {tls.cert.parent} --host {local} ...`"
        )
    root = Path(root).resolve()
    (root / "results").mkdir(parents=True, exist_ok=True)
    proxy_argv = None
    if proxy:
        from hetfed.nginx_proxy import check_nginx_conf, write_nginx_conf

        assert tls is not None
        if "localhost" not in certificate_names(tls.cert):  # the proxy verifies the SuperLink as localhost
            raise ValueError(f"the server certificate {tls.cert} does not name localhost; re-issue it")
        _, proxy_argv = write_nginx_conf(
            root / "proxy", host=public_host, port=public_port, upstream_port=port, tls=tls
        )
        check_nginx_conf(proxy_argv)
    args = superlink_args(
        host=host, port=port, database=database, tls=tls, node_auth=node_auth, isolation=isolation
    )
    info = FederationInfo(
        root,
        port,
        silos,
        [],  # not started by us: stopped by systemd or Ctrl-C, not by `down`
        host=local,
        tls_dir=tls.ca.parent if tls else None,
        node_auth=node_auth,
        extra={
            "role": "superlink-host",
            "superlink-pid": os.getpid(),  # exec (or the proxy's supervisor) keeps the pid
            "public-address": f"{public_host}:{public_port}",
            "proxy": "nginx" if proxy else "",
        },
    )
    flower = info.flower()  # writes the flwr connection
    info.save()
    # The ServerApp writes results relative to the SuperLink's working folder: root/results.
    return HostCommand(superlink_command(args), flower.env, root, proxy=proxy_argv)


def silo_host(
    *,
    superlink: str,
    ca: Path | None,
    key: Path | None,
    partition_id: int,
    num_partitions: int,
    state_dir: Path,
    data_path: Path | None = None,
    port: int = 9094,
    runtime: str = DEFAULT_RUNTIME,
    approved_apps: Path | None = None,
    policy: Path | None = None,
    identity: Path | None = None,
    roster: Path | None = None,
) -> HostCommand:
    """The SuperNode command of one silo: its partition, data, state and key; HTTPS unless on loopback.

    ``runtime`` ``warm`` runs ``hetfed-supernode`` with a long-lived ClientApp worker;
    ``stock`` runs Flower's own SuperNode exactly as installed. ``approved_apps`` is the
    silo's allow-list of app builds (``hetfed federation approve``); it must list one at
    least; None runs any app the SuperLink sends. ``policy`` is the silo's own policy file
    (client/silo_policy.py), checked here so a malformed one stops the silo at start, in one line.
    ``identity`` and ``roster`` (both or neither): the silo's signing identity and the federation's
    roster (hetfed/silo_identity.py), checked here to agree for the partition; without them the
    silo's secure aggregation trusts the server to forward its peers' keys.
    """
    host, _ = split_address(superlink)
    if ca is None and not is_loopback(host):
        raise ValueError(
            f"refusing plain HTTP to --superlink {superlink}: give --ca with the federation's ca.crt"
        )
    if not 0 <= partition_id < num_partitions:
        raise ValueError(f"--partition-id {partition_id} is outside [0, --num-partitions={num_partitions})")
    check_port("--port", port, free=False)
    check_writable_folder("--state-dir", Path(state_dir))
    for flag, path in (("--ca", ca), ("--key", key), ("--data-path", data_path)):
        if path is not None and not Path(path).exists():
            raise FileNotFoundError(f"{flag} '{path}' does not exist")
    state = Path(state_dir).resolve()
    state.mkdir(parents=True, exist_ok=True)
    cfg: dict[str, Any] = {"partition-id": partition_id, "num-partitions": num_partitions}
    if data_path is not None:
        cfg["data-path"] = str(Path(data_path).resolve())
    cfg["state-dir"] = str(state)
    if approved_apps is not None:
        approved_apps = _approved_apps_file(approved_apps)
        cfg["approved-apps"] = str(approved_apps)  # the ClientApp reports what its silo approved
    if policy is not None:
        from hetfed.client.silo_policy import load

        cfg["policy"] = load(str(Path(policy).resolve())).path
    if (identity is None) != (roster is None):
        raise ValueError(
            "--identity and --roster go together: the silo's signing key and the roster it trusts"
        )
    if identity is not None and roster is not None:
        signed = {
            "secagg-identity": str(Path(identity).resolve()),
            "secagg-roster": str(Path(roster).resolve()),
        }
        silo_identity.load(signed["secagg-identity"], signed["secagg-roster"], partition_id)
        cfg |= signed
    args = supernode_args(
        superlink=superlink,
        node_config=cfg,
        ca=Path(ca).resolve() if ca else None,
        key=Path(key).resolve() if key else None,
        port=port,
    )
    # Flower's own files (FABs) stay in the silo's state folder; ".flwr" is never a run's state key.
    return HostCommand(supernode_command(runtime, args, approved_apps), flower_env(state / ".flwr"), state)


def _approved_apps_file(path: Path) -> Path:
    """The allow-list at ``path``, resolved; one line if it approves no build (or is malformed)."""
    from hetfed.runtime.pinning import read_approved

    path = Path(path).resolve()
    if not read_approved(path):
        raise FileNotFoundError(
            f"no approved app build in {path}: approve the build this silo installed first, "
            f"e.g. `hetfed federation approve --file {path}` (or run any app with --any-app)"
        )
    return path


def register_keys(flower: LocalFlower, public_keys: Sequence[Path], wait: float = 0) -> list[str]:
    """Register each SuperNode public key; one line per key (node id, or already registered)."""
    if wait:
        flower.wait_healthy(wait)
    lines = []
    for pub in public_keys:
        if not Path(pub).is_file():
            raise FileNotFoundError(f"public key '{pub}' does not exist")
        name = Path(pub).name.removesuffix(".pub")
        try:
            lines.append(f"{pub}: node id {flower.register(Path(pub), name=name)}")
        except RuntimeError as exc:
            if "already in use" not in str(exc):
                raise
            lines.append(f"{pub}: already registered")  # idempotent, e.g. a restarted compose job
    return lines
