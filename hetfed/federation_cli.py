"""``hetfed federation ...``: the subcommands that start, secure and inspect federations.

On one machine: ``up``, ``down``, ``status``; ``audit`` (the runs started, stopped and resumed),
``ledger`` (what left each silo).
Across machines: ``certs`` and ``keygen`` (credentials, made offline), ``identity`` (a silo's
signing identity for secure aggregation and its roster line), ``superlink`` (the
SuperLink host), ``silo`` (one organisation's SuperNode), ``register`` (admit a silo's key),
``approve`` (a silo approves an app build, by its FAB hash);
``compose`` writes a docker-compose file. Every subcommand is in docs/deployment.md.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from pathlib import Path

DEFAULT_DIR = ".hetfed/federation"


def cmd_up(args: argparse.Namespace) -> int:
    from hetfed.engines.runner import APP_DIR
    from hetfed.federation import federation_up

    info = federation_up(
        Path(args.dir),
        args.nodes,
        app_dir=APP_DIR,
        data_path=args.data_path,
        state_dir=args.state_dir,
        port=args.port,
        tls_dir=Path(args.tls_dir) if args.tls_dir else None,
        node_auth=args.node_auth,
        runtime=args.runtime,
        approved_apps=Path(args.approved_apps) if args.approved_apps else None,
        superlink_state=args.superlink_state,
        timeout=args.timeout,
    )
    scheme = "https" if info.tls_dir else "http"
    auth = ", node authentication on" if info.node_auth else ""
    print(
        f"federation up: SuperLink {scheme}://{info.host}:{info.link_port}, {info.nodes} SuperNodes online"
        f"{auth}, {args.runtime} ClientApp runtime, SuperLink state in {args.superlink_state} "
        f"(logs in {info.root})"
    )
    print(f"secure aggregation keys are signed: silo identities and roster in {info.root / 'identities'}")
    print("run an experiment on it with either of:")
    print(f"  hetfed run --engine deployment --federation-dir {args.dir} --set num-rounds=3")
    print(f'  FLWR_HOME={info.root / "flwr-home"} flwr run {APP_DIR} hetfed --run-config "num-rounds=3"')
    print(f"stop it with: hetfed federation down --dir {args.dir}")
    return 0


def cmd_down(args: argparse.Namespace) -> int:
    from hetfed.federation import federation_down

    groups, others = federation_down(Path(args.dir))
    print(f"federation down: stopped {groups} process groups and {others} other Flower processes")
    return 0


def state_dirs(args: argparse.Namespace) -> list[Path]:
    """The silo state dirs ``federation state`` looks in: ``--state-dir`` (repeated), else those
    the local federation in ``--dir`` records (federation.json), else ``<dir>/state/node-*``."""
    import json

    if args.state_dir:
        return [Path(d) for d in args.state_dir]
    root = Path(args.dir)
    try:
        return [Path(d) for d in json.loads((root / "federation.json").read_text())["state-dirs"]]
    except (OSError, ValueError, KeyError, TypeError):
        return sorted(p for p in (root / "state").glob("node-*") if p.is_dir())


def cmd_state(args: argparse.Namespace) -> int:
    """``federation state ls|rm``: the client state each run left on the silos, and its removal."""
    import shutil

    from hetfed.client.state import list_states

    dirs = state_dirs(args)
    states = [s for d in dirs for s in list_states(d)]
    if args.state_action == "ls":
        for s in states:
            print(
                f"{s.key:<40} partition {s.partition_id if s.partition_id is not None else '?':<3} "
                f"{_size(s.size):>9}  {s.created}  {s.path}"
            )
        total = sum(s.size for s in states)
        print(
            f"{len(states)} state folders of {len({s.key for s in states})} runs, {_size(total)}, "
            f"in {len(dirs)} state dirs"
        )
        return 0
    chosen = [s for s in states if args.run in (s.run_name, s.key)]
    _refuse_a_running_run(args, {args.run} | {s.run_name for s in chosen})
    if not chosen:
        runs = sorted({s.key for s in states})
        raise ValueError(
            f"--run {args.run}: no state of that run in {', '.join(map(str, dirs)) or 'no state dir'}"
            + (f" (runs: {', '.join(runs)})" if runs else "")
        )
    for s in chosen:
        shutil.rmtree(s.path)
        print(f"removed {s.path} ({_size(s.size)})")
    print(f"removed {len(chosen)} state folders of run {args.run}, {_size(sum(s.size for s in chosen))}")
    return 0


def _refuse_a_running_run(args: argparse.Namespace, names: set[str]) -> None:
    """With the local federation of ``--dir`` up: refuse to remove the state of a run it still runs
    (its SuperNodes would make the folders again, half filled, and the run would not notice)."""
    from hetfed.engines.federation_info import FederationInfo, FederationNotRunning

    try:
        flower = FederationInfo.load(Path(args.dir)).flower()
    except FederationNotRunning:
        return
    with flower.control() as control:
        running = control.unfinished_runs()
    for name in sorted(names & set(running)):
        run_id, status = running[name]
        raise ValueError(
            f"--run {args.run}: run {name} is {status} on the federation in {args.dir} (Flower run "
            f"{run_id}); its state is in use: stop it (`flwr stop {run_id}`) or let it end, then remove it"
        )


def cmd_ledger(args: argparse.Namespace) -> int:
    """``federation ledger``: per state dir, a summary of the replies that left the silo (ledger.jsonl)."""
    from hetfed.client.ledger import LEDGER_FILE, read, summary_lines

    dirs = state_dirs(args)
    if not dirs:
        raise ValueError(
            f"no state dir to read: give --state-dir, or --dir of a local federation (not {args.dir})"
        )
    for state_dir in dirs:
        entries = read(state_dir)
        print(f"{Path(state_dir) / LEDGER_FILE}: {len(entries)} replies left this silo")
        print("\n".join(f"  {line}" for line in summary_lines(entries, args.delta)))
    return 0


def _size(n: int) -> str:
    """Bytes as B, KiB, MiB or GiB."""
    value = float(n)
    for unit in ("B", "KiB", "MiB"):
        if value < 1024:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GiB"


def cmd_status(args: argparse.Namespace) -> int:
    """``federation status``: SuperNodes online, of a federation folder or of a named ``flwr``
    connection (a compose deployment); ``--wait N`` waits for N of them (default timeout
    proportional to N) and otherwise ends with one line saying how many came."""
    import time

    from hetfed.config import ConfigError
    from hetfed.engines.control_api import ControlApi, ControlApiError
    from hetfed.engines.federation_info import FederationInfo
    from hetfed.engines.flower import nodes_timeout

    timeout = nodes_timeout(args.wait) if args.timeout is None else args.timeout
    if args.wait < 0 or not timeout > 0:  # NaN too
        why = "need --wait >= 0 and --timeout > 0"
        raise ConfigError(f"--wait {args.wait}, --timeout {args.timeout}: {why}")
    info = None
    if args.connection:
        control = ControlApi(Path(args.flwr_home or flwr_home_default()), args.connection)
    else:
        info = FederationInfo.load(Path(args.dir))
        control = info.flower().control()
    end = time.time() + timeout
    with control:
        while True:
            try:
                online, silent = control.online_nodes(), ""
            except ControlApiError as exc:  # not up yet (compose: seconds after `up`) or gone
                online, silent = 0, str(exc)
            if not args.wait or online >= args.wait or time.time() >= end:
                break
            time.sleep(2)
    expected = f" of {info.nodes}" if info is not None and info.nodes else ""
    print(f"SuperLink {control.address}; {online}{expected} SuperNodes online")
    if info is not None:
        if info.extra.get("proxy"):
            print(proxy_line(info.root / "proxy", str(info.extra.get("public-address", "?"))))
        print(silo_report_lines([info.root / "results", *map(Path, args.results_dir or ["results"])]))
    if args.wait and online < args.wait:
        unanswered = f"; the SuperLink did not answer ({silent})" if silent else ""
        print(f"hetfed: only {online} of {args.wait} SuperNodes came online within {timeout:g} s{unanswered}",
              file=sys.stderr)  # fmt: skip
        return 1
    return 0


def flwr_home_default() -> str:
    """Where ``flwr`` keeps its connections: ``$FLWR_HOME``, else ``~/.flwr``."""
    return os.environ.get("FLWR_HOME") or str(Path.home() / ".flwr")


def cmd_audit(args: argparse.Namespace) -> int:
    """``federation audit``: the runs started, stopped and resumed on this federation (audit.jsonl)."""
    from hetfed import audit
    from hetfed.engines.federation_info import FederationInfo

    root = Path(args.dir)
    if not (root / audit.AUDIT_FILE).exists() and not (root / "federation.json").exists():
        raise ValueError(f"{root} holds no federation (no federation.json, no {audit.AUDIT_FILE})")
    entries = audit.read(root)
    for entry in entries:
        print(audit.describe(entry))
    print(f"{len(entries)} audit entries in {root / audit.AUDIT_FILE}")
    try:
        runs = audit.superlink_runs(FederationInfo.load(root).flower())
    except Exception as exc:  # a federation that is down still has its audit trail
        print(f"(the SuperLink was not asked which runs it knows: {type(exc).__name__}: {exc})")
        return 0
    outside = audit.unaudited(entries, runs)
    if outside:
        print("runs the SuperLink knows that no entry names (submitted without hetfed, e.g. flwr run):")
        print("\n".join(f"  {line}" for line in outside))
    return 0


def proxy_line(proxy_dir: Path, public: str) -> str:
    """Whether the reverse proxy runs, and how many requests it refused (its access log)."""
    import os

    try:
        pid = int((proxy_dir / "nginx.pid").read_text())
        os.kill(pid, 0)
        state = f"running (pid {pid})"
    except (OSError, ValueError):
        state = "NOT running"
    try:
        refused = sum(" 403 " in line for line in (proxy_dir / "access.log").read_text().splitlines())
    except OSError:
        refused = 0
    return (
        f"reverse proxy nginx on {public}: {state}; {refused} requests refused (403), "
        f"see {proxy_dir / 'access.log'}"
    )


def silo_report_lines(results_dirs: list[Path]) -> str:
    """Each silo's approved app builds as the silos reported them at the newest run's discovery."""
    import json

    reports = [p for d in results_dirs if d.is_dir() for p in d.glob("*/silos.json")]
    if not reports:
        return "approved app builds: not reported yet (each silo reports them at a run's discovery)"
    newest = max(reports, key=lambda p: p.stat().st_mtime)
    data = json.loads(newest.read_text())
    lines = [f"approved app builds, as each silo reported them in run {data['run-name']} ({data['time']}):"]
    for silo, report in data["silos"].items():
        hashes = ", ".join(h[:12] for h in report["approved-apps"])
        lines.append(f"  {silo}: {hashes} (by its {report['reported-by']})")
    return "\n".join(lines)


def cmd_certs(args: argparse.Namespace) -> int:
    from hetfed.credentials import CA_KEY, certificate_names, write_certificates

    files = write_certificates(Path(args.out), args.host or [], days=args.days)
    print(f"wrote {files.ca} (give it to every silo), {files.cert} and {files.key} (SuperLink only)")
    print(f"server certificate names: {', '.join(certificate_names(files.cert))}")
    print(f"keep {files.ca.parent / CA_KEY} off the SuperLink; it is needed only to re-issue certificates")
    return 0


def cmd_keygen(args: argparse.Namespace) -> int:
    from hetfed.credentials import write_node_key

    for path in args.paths:
        private, public = write_node_key(Path(path))
        print(f"wrote {private} (stays on the silo) and {public} (register it on the SuperLink host)")
    return 0


def cmd_register(args: argparse.Namespace) -> int:
    import tempfile

    from hetfed.engines.federation_info import FederationInfo
    from hetfed.engines.flower import LocalFlower, split_address
    from hetfed.federation import register_keys

    keys = [Path(k) for k in args.public_keys]
    if args.superlink:
        host, port = split_address(args.superlink)
        with tempfile.TemporaryDirectory(prefix="hetfed-register-") as tmp:
            flower = LocalFlower(Path(tmp), link_port=port, host=host, ca=Path(args.ca) if args.ca else None)
            lines = register_keys(flower, keys, wait=args.wait)
    else:
        lines = register_keys(FederationInfo.load(Path(args.dir)).flower(), keys, wait=args.wait)
    print("\n".join(lines))
    return 0


def cmd_superlink(args: argparse.Namespace) -> int:
    from hetfed.engines.flower import port_in_use
    from hetfed.federation import superlink_host

    tls_dir = None if args.insecure else Path(args.tls_dir)
    command = superlink_host(
        Path(args.dir),
        host=args.host,
        port=args.port,
        tls_dir=tls_dir,
        node_auth=tls_dir is not None and not args.no_node_auth,
        silos=args.silos,
        proxy=not (args.no_proxy or args.insecure),  # plain HTTP is loopback only: nothing to shield
        local_port=args.local_port,
        state=args.superlink_state,
        isolation=args.isolation,
    )
    print(shlex.join(command.argv), flush=True)
    if command.proxy:
        print(shlex.join(command.proxy), flush=True)
    if args.print:
        return 0
    link_port = args.local_port or args.port + 1
    listeners = [(args.host, args.port, "--port")]
    if command.proxy:
        listeners.append(("127.0.0.1", link_port, "--local-port (the SuperLink behind the proxy)"))
    for host, port, option in listeners:
        if port_in_use(host, port):
            raise ValueError(f"{host}:{port} is already in use ({option}): free it or choose another port")
    if command.proxy:
        print(
            f"silos reach https://{args.host}:{args.port} (nginx: Fleet API and /health only); the SuperLink "
            f"listens on 127.0.0.1:{args.local_port or args.port + 1} (flwr, Control API: this host only)",
            flush=True,
        )
    print(
        f"state, logs and results in {Path(args.dir).resolve()}; admit silos with: "
        f"hetfed federation register --dir {args.dir} <silo>.pub",
        flush=True,
    )
    command.exec()
    return 0  # not reached


def cmd_silo(args: argparse.Namespace) -> int:
    from hetfed.federation import silo_host
    from hetfed.runtime.pinning import APPROVED_FILE

    allow_list = Path(args.state_dir) / APPROVED_FILE
    command = silo_host(
        superlink=args.superlink,
        ca=None if args.insecure else Path(args.ca),
        key=Path(args.key) if args.key else None,
        partition_id=args.partition_id,
        num_partitions=args.num_partitions,
        state_dir=Path(args.state_dir),
        data_path=Path(args.data_path) if args.data_path else None,
        port=args.port,
        runtime=args.runtime,
        approved_apps=None if args.any_app else Path(args.approved_apps or allow_list),
        policy=Path(args.policy) if args.policy else None,
        identity=Path(args.identity) if args.identity else None,
        roster=Path(args.roster) if args.roster else None,
    )
    print(shlex.join(command.argv), flush=True)
    if not args.print:
        command.exec()
    return 0


def cmd_identity(args: argparse.Namespace) -> int:
    from hetfed.silo_identity import enrol

    public = enrol(Path(args.key), args.partition_id, Path(args.roster) if args.roster else None)
    print(f'{args.partition_id} = "{public}"')
    where = f"written to {args.roster}" if args.roster else "add it under [silos] of the federation's roster"
    print(
        f"partition {args.partition_id}'s identity {args.key} (keep it on this silo, mode 0600); its "
        f"roster line is above ({where}); every silo installs the same roster and names both in its node "
        "config (`hetfed federation silo --identity ... --roster ...`)"
    )
    return 0


def cmd_approve(args: argparse.Namespace) -> int:
    from hetfed.runtime.pinning import APPROVED_FILE, approve, fab_hash, read_approved, revoke

    path = Path(args.file or Path(args.state_dir) / APPROVED_FILE)
    if args.list:
        print("\n".join(read_approved(path)) or f"no app build approved in {path}")
        return 0
    if args.hash:
        digest, source = args.hash.strip().lower(), "given hash"
    else:
        from hetfed.engines.runner import APP_DIR

        app = Path(args.app_dir or APP_DIR).resolve()
        digest, source = fab_hash(app), str(app)
    if args.print:
        print(digest)
        return 0
    if args.revoke:
        done = revoke(path, digest)
        print(f"{'revoked' if done else 'was not approved:'} {digest} in {path}")
        return 0
    added = approve(path, digest, note=source)
    print(f"{'approved' if added else 'already approved:'} {digest} ({source}) in {path}")
    print(f"{len(read_approved(path))} app builds approved in {path}; a SuperNode reads it at each new run")
    return 0


def cmd_compose(args: argparse.Namespace) -> int:
    from hetfed.compose import identity_commands, write_compose

    argv = ["hetfed", "federation", "compose", "--silos", str(args.silos), "--problem", args.problem]
    argv += ["--tls"] * args.tls + ["--out", args.out, "--run-config", args.run_config]
    write_compose(Path(args.out), Path(args.run_config), args.silos, args.problem, args.tls, shlex.join(argv))
    print(f"wrote {args.out} ({args.silos} silos, problem {args.problem}) and {args.run_config}")
    print("build the image offline first (docs/deployment.md, 'Building the image offline'):")
    print("  hetfed docker wheelhouse && DOCKER_BUILDKIT=0 docker build --network none -t hetfed-app:local .")
    folder = Path(args.out).resolve().parent
    print(f"make the silos' signing identities and roster (kept if present), in {folder}:")
    for command in identity_commands(args.silos):
        print(f"  {'sudo ' if command[0] == 'chown' else ''}{shlex.join(command)}")
    print(f"then start it with: docker compose -f {args.out} up -d --no-build")
    return 0


def _add_runtime_argument(parser: argparse.ArgumentParser) -> None:
    from hetfed.engines.flower import DEFAULT_RUNTIME, RUNTIMES

    parser.add_argument(
        "--runtime",
        choices=RUNTIMES,
        default=DEFAULT_RUNTIME,
        help="ClientApp runtime of the SuperNode: warm (one long-lived worker, waits that follow the "
        "work; stock Flower if its self-test fails) or stock (a Flower ClientApp process per message); "
        f"default {DEFAULT_RUNTIME}",
    )


def _add_superlink_state_argument(parser: argparse.ArgumentParser, default: str, why: str) -> None:
    from hetfed.engines.flower import SUPERLINK_STATES

    parser.add_argument(
        "--superlink-state",
        choices=SUPERLINK_STATES,
        default=default,
        help=f"where the SuperLink keeps its state: memory (Flower's default, several times faster per "
        f"round) or file (state.db in --dir, survives a SuperLink restart); default {default} ({why})",
    )


def add_federation_parser(sub: argparse._SubParsersAction) -> None:
    """The ``federation`` subcommand and its actions."""
    fed = sub.add_parser("federation", help="start, secure and inspect federations (local, across machines)")
    actions = fed.add_subparsers(dest="action", required=True, metavar="ACTION")

    up = actions.add_parser("up", help="start a SuperLink and N SuperNodes on this machine")
    up.add_argument("--nodes", type=int, default=4)
    up.add_argument("--dir", default=DEFAULT_DIR, help="folder for logs, state and federation.json")
    up.add_argument("--data-path", help="node data path; {partition} is replaced by the partition id")
    up.add_argument("--state-dir", help="node state dir; default <dir>/state/node-<i>")
    up.add_argument("--port", type=int, default=0, help="SuperLink port (default: a free port)")
    up.add_argument("--tls-dir", help="serve HTTPS with ca.crt, server.pem, server.key from `certs`")
    up.add_argument("--node-auth", action="store_true", help="make, register and use a key per SuperNode")
    up.add_argument(
        "--timeout",
        type=float,
        metavar="SECONDS",
        help="how long the SuperNodes (a few coming up at a time) may take to come online; default "
        "30 + 5 per SuperNode (110 for 16); past it `up` says how many did and stops them all",
    )
    up.add_argument(
        "--approved-apps", metavar="FILE", help="app pinning: SuperNodes run only the builds in FILE"
    )
    _add_runtime_argument(up)
    _add_superlink_state_argument(up, "memory", "`down` ends the whole federation anyway")
    up.set_defaults(func=cmd_up)

    down = actions.add_parser(
        "down", help="stop every process the federation started by `up` (ServerApps and ClientApps too)"
    )
    down.add_argument("--dir", default=DEFAULT_DIR)
    down.set_defaults(func=cmd_down)

    status = actions.add_parser("status", help="how many SuperNodes are online")
    status.add_argument("--dir", default=DEFAULT_DIR, help="folder of `up` or `superlink`")
    status.add_argument(
        "--connection",
        metavar="NAME",
        help="ask the SuperLink of this flwr connection instead of --dir's (e.g. hetfed-compose)",
    )
    status.add_argument(
        "--flwr-home", help="with --connection: folder of flwr's config.toml (default $FLWR_HOME or ~/.flwr)"
    )
    status.add_argument("--wait", type=int, default=0, metavar="N", help="wait until N SuperNodes are online")
    status.add_argument(
        "--timeout",
        type=float,
        default=None,
        help="seconds --wait waits, then exit 1 saying how many came (default 30 + 5 per SuperNode)",
    )
    status.add_argument(
        "--results-dir",
        action="append",
        help="where runs write results (repeat; default: results/ and <dir>/results), for the silos' reports",
    )
    status.set_defaults(func=cmd_status)

    audit = actions.add_parser("audit", help="the runs started, stopped and resumed (audit.jsonl)")
    audit.add_argument("--dir", default=DEFAULT_DIR, help="folder of `up` or `superlink`")
    audit.set_defaults(func=cmd_audit)

    ledger = actions.add_parser("ledger", help="what left each silo: a summary of its ledger.jsonl")
    ledger.add_argument("--state-dir", action="append", help="a silo's state dir (repeat; default: --dir's)")
    ledger.add_argument("--dir", default=DEFAULT_DIR, help="the local federation's folder (its state dirs)")
    ledger.add_argument(
        "--delta",
        type=float,
        default=1e-5,
        help="delta of the silo's local-DP epsilon per run and over all runs (default 1e-5)",
    )
    ledger.set_defaults(func=cmd_ledger)

    state = actions.add_parser("state", help="list or remove the client state runs left on the silos")
    state_actions = state.add_subparsers(dest="state_action", required=True)
    for name, what in (
        ("ls", "list every run's state: run name.id, partition, size, made, folder"),
        ("rm", "remove one run's state from every state dir (all its partitions)"),
    ):
        action = state_actions.add_parser(name, help=what)
        action.add_argument(
            "--dir", default=DEFAULT_DIR, help="the local federation's folder (its state dirs)"
        )
        action.add_argument(
            "--state-dir", action="append", help="a silo's state dir (repeat for several; default: --dir's)"
        )
        if name == "rm":
            action.add_argument(
                "--run", required=True, help="the run: its name (every run of that name) or name.id"
            )
        action.set_defaults(func=cmd_state)

    certs = actions.add_parser("certs", help="make a CA and the SuperLink's server certificate")
    certs.add_argument("--out", required=True, help="folder for ca.crt, ca.key, server.pem, server.key")
    certs.add_argument(
        "--host",
        action="append",
        metavar="NAME_OR_IP",
        help="a name or address silos use to reach the SuperLink (repeat; loopback is always added)",
    )
    certs.add_argument("--days", type=int, default=365, help="server certificate validity")
    certs.set_defaults(func=cmd_certs)

    identity = actions.add_parser(
        "identity", help="make a silo's signing identity for secure aggregation and its roster line"
    )
    identity.add_argument("--key", required=True, help="the identity file (made if missing, mode 0600)")
    identity.add_argument("--partition-id", type=int, required=True, help="the silo's partition")
    identity.add_argument("--roster", help="a roster file to add (or replace) the partition's line in")
    identity.set_defaults(func=cmd_identity)

    keygen = actions.add_parser("keygen", help="make a SuperNode's authentication key pair (PATH, PATH.pub)")
    keygen.add_argument("paths", nargs="+", metavar="PATH")
    keygen.set_defaults(func=cmd_keygen)

    register = actions.add_parser("register", help="admit SuperNodes by their public keys")
    register.add_argument("public_keys", nargs="+", metavar="KEY.pub")
    where = register.add_mutually_exclusive_group()
    where.add_argument("--dir", default=DEFAULT_DIR, help="folder of `superlink` (or `up`) on this host")
    where.add_argument("--superlink", metavar="HOST:PORT", help="a SuperLink elsewhere (with --ca)")
    register.add_argument("--ca", help="the federation's ca.crt (with --superlink)")
    register.add_argument("--wait", type=float, default=0, help="seconds to wait for the SuperLink first")
    register.set_defaults(func=cmd_register)

    link = actions.add_parser("superlink", help="run the SuperLink of a federation across machines")
    link.add_argument("--dir", default="/var/lib/hetfed/superlink", help="state, logs, results")
    link.add_argument("--host", default="0.0.0.0", help="address to listen on")
    link.add_argument("--port", type=int, default=8000)
    security = link.add_mutually_exclusive_group(required=True)
    security.add_argument("--tls-dir", help="ca.crt, server.pem, server.key (from `certs`)")
    security.add_argument("--insecure", action="store_true", help="plain HTTP (only with a loopback --host)")
    link.add_argument("--no-node-auth", action="store_true", help="admit SuperNodes without registered keys")
    link.add_argument(
        "--no-proxy",
        action="store_true",
        help="no reverse proxy: the SuperLink itself on --host:--port (its Control API reachable there too)",
    )
    link.add_argument(
        "--local-port", type=int, default=0, help="SuperLink port on 127.0.0.1 behind the proxy (--port+1)"
    )
    link.add_argument(
        "--isolation",
        choices=["subprocess", "process"],
        default="subprocess",
        help="subprocess: the SuperLink runs each ServerApp; process: a separate flower-superexec does",
    )
    link.add_argument("--silos", type=int, default=0, help="number of silos expected (for `status`)")
    _add_superlink_state_argument(link, "file", "a restarted SuperLink keeps the registered silo keys")
    link.add_argument("--print", action="store_true", help="print the Flower command instead of running it")
    link.set_defaults(func=cmd_superlink)

    silo = actions.add_parser("silo", help="run one silo's SuperNode of a federation across machines")
    silo.add_argument("--superlink", required=True, metavar="HOST:PORT")
    trust = silo.add_mutually_exclusive_group(required=True)
    trust.add_argument("--ca", help="the federation's ca.crt")
    trust.add_argument("--insecure", action="store_true", help="plain HTTP (only to a loopback SuperLink)")
    silo.add_argument("--key", help="this silo's private key (from `keygen`), registered on the SuperLink")
    silo.add_argument("--partition-id", type=int, required=True)
    silo.add_argument("--num-partitions", type=int, required=True)
    silo.add_argument("--data-path", help="this silo's private data (problems that read files)")
    silo.add_argument("--state-dir", default="/var/lib/hetfed/silo", help="client state kept across restarts")
    silo.add_argument("--port", type=int, default=9094, help="local Runtime API port of the SuperNode")
    pin = silo.add_mutually_exclusive_group()
    pin.add_argument(
        "--approved-apps",
        metavar="FILE",
        help="the app builds this silo runs (from `approve`); default <state-dir>/approved-apps",
    )
    pin.add_argument("--any-app", action="store_true", help="run any app the SuperLink sends (no pinning)")
    silo.add_argument(
        "--policy", metavar="FILE", help="this silo's own policy (deploy/policy.example.toml); default: none"
    )
    _add_runtime_argument(silo)
    silo.add_argument(
        "--identity", metavar="FILE", help="this silo's signing identity (`federation identity`)"
    )
    silo.add_argument(
        "--roster", metavar="FILE", help="the federation's roster of silo identities (with --identity)"
    )
    silo.add_argument("--print", action="store_true", help="print the Flower command instead of running it")
    silo.set_defaults(func=cmd_silo)

    approve = actions.add_parser(
        "approve", help="approve an app build on this silo (its FAB hash, as `flwr run` builds it)"
    )
    approve.add_argument("app_dir", nargs="?", help="the app folder (default: the installed hetfed)")
    approve.add_argument("--hash", help="approve this FAB hash instead of building APP_DIR")
    approve.add_argument("--file", help="the allow-list (default <state-dir>/approved-apps)")
    approve.add_argument("--state-dir", default="/var/lib/hetfed/silo", help="the silo's state dir")
    approve.add_argument("--print", action="store_true", help="print the hash only, approve nothing")
    approve.add_argument("--revoke", action="store_true", help="remove the build from the allow-list")
    approve.add_argument("--list", action="store_true", help="list the approved hashes")
    approve.set_defaults(func=cmd_approve)

    compose = actions.add_parser("compose", help="write a docker-compose file for N silos")
    compose.add_argument("--silos", type=int, default=3)
    compose.add_argument("--problem", default="knapsack")
    compose.add_argument("--tls", action="store_true", help="TLS + node auth, credentials as secrets")
    compose.add_argument("--out", default="docker-compose.yml")
    compose.add_argument("--run-config", default="deploy/compose-run.toml", help="run config to submit")
    compose.set_defaults(func=cmd_compose)
