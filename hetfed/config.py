"""The run configuration: every tunable, its type, range and meaning.

Flower passes the run config (``[tool.flwr.app.config]`` merged with
``--run-config`` overrides) to the ServerApp and to every ClientApp. This module
is the single description of those keys, in groups: the run's own (:data:`RUN_KEYS`), each
method's (:data:`METHODS`, hetfed/methods: name -> strategy class and its typed parameters,
whose fields are its keys) and the problems' (:data:`PROBLEM_SCHEMA`, from :data:`PROBLEMS`,
hetfed/problem_params.py, the same way); :data:`SCHEMA` is built from them, and
:func:`register_problem` adds a problem defined elsewhere. ``validate`` checks a run config before
round 1 and names the culprit on error, ``parse_assignments`` turns
``hetfed run --set key=value`` into typed values, and a test keeps
``pyproject.toml`` in step with :data:`SCHEMA`.
"""

from __future__ import annotations

import tomllib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from hetfed.methods import METHODS, Method
from hetfed.params import INT64, ConfigError, Key, Value, check_name
from hetfed.problem_params import PROBLEMS, Problem

__all__ = [
    "INT64",
    "METHODS",
    "ConfigError",
    "Key",
    "Method",
    "PROBLEMS",
    "Problem",
    "Value",
    "check_name",
]

ENGINES = ("", "inline", "simulation", "deployment")

STRATEGIES = tuple(METHODS)

# Simulated nodes have no node config of their own beyond their partition: `hetfed run --engine
# simulation --data-path/--state-dir` gives every node its paths through these ({partition} = its id).
SIMULATED_NODE_KEYS: dict[str, Key] = {
    "node-data-path": Key("", "Simulated nodes: data-path of each ({partition} = its id), from hetfed run"),
    "node-state-dir": Key("", "Simulated nodes: state-dir of each ({partition} = its id), from hetfed run"),
}

# --- the run: what every method and engine reads ------------------------------------------
RUN_KEYS: dict[str, Key] = {
    "run-name": Key(
        "", "Name of the results folder results-dir/<run-name>; empty = generated", names_folder=True
    ),
    "results-dir": Key("results", "Where runs write their results (relative to the ServerApp's cwd)"),
    "engine": Key("", "Engine label recorded with the results (set by `hetfed run`)", choices=ENGINES),
    "launch": Key(
        "", "How `hetfed run` launched the run (JSON: nodes, data-path, federation-dir); --resume reads it"
    ),
    "seed": Key(42, "Master seed: data generation, model init, client sampling, batch order", low=0),
    "strategy": Key("fedavg", "Server-side algorithm", choices=STRATEGIES),
    "problem": Key("knapsack", "Task each client solves on its own data", choices=PROBLEMS.keys()),
    "num-clients": Key(0, "Clients required before round 1; 0 = the nodes' num-partitions", low=0),
    "node-wait-timeout": Key(
        120.0, "Seconds to wait for the required clients to connect", low=0.0, low_open=True
    ),
    "round-timeout": Key(600.0, "Seconds to wait for the replies of one exchange", low=0.0, low_open=True),
    "resume": Key(False, "Continue the run named run-name from its last checkpoint"),
    "checkpoint-every": Key(
        1, "Write rounds.csv and the checkpoint every k rounds (0 = only at the end)", low=0
    ),
    "audit-traffic": Key(False, "Log the shape of every reply's arrays and metrics to traffic.jsonl"),
    "num-rounds": Key(10, "Federated rounds", low=1),
}

# --- private updates: secure aggregation and differential privacy (server/aggregation.py) -------
PRIVACY_KEYS: dict[str, Key] = {
    "secure-aggregation": Key(False, "SecAgg+ for every summed round: the server learns only the sum"),
    "secagg-threshold": Key(
        0,
        "Clients whose shares unmask a round (t); 0 = the smallest the clients accept: (m + c) // 2 + 1, "
        "at least 2",
        low=0,
    ),
    "secagg-tolerated-corrupt": Key(
        0,
        "Silos colluding with the server that secure aggregation tolerates (c): every client refuses a "
        "threshold t with 2t <= m + c",
        low=0,
    ),
    "secagg-max-weight": Key(
        0.0,
        "Largest weight a_j of a secure sum (its fixed-point slot); 0 = the strategy's own bound (the "
        "largest training set for data-size weights, else 1)",
        low=0.0,
    ),
    "secagg-bits": Key(32, "Bits of the fixed-point code of a value within secagg-range", low=8, high=48),
    "secagg-range": Key(
        100.0,
        "Values of an update beyond +-range are clipped before encoding (reply metric secagg-clipped)",
        low=0.0,
        low_open=True,
    ),
    "dp": Key(
        "off",
        "Differential privacy: central (server noise) or local (client noise)",
        choices=("off", "central", "local"),
    ),
    "dp-noise-multiplier": Key(1.0, "Gaussian noise z: standard deviation z * clip", low=0.0, low_open=True),
    "dp-clipping-norm": Key(
        1.0, "L2 clip S of each client's update (the start value when adaptive)", low=0.0, low_open=True
    ),
    "dp-clipping": Key(
        "fixed",
        "Fixed clip, or adaptive (towards dp-target-quantile of the norms)",
        choices=("fixed", "adaptive"),
    ),
    "dp-target-quantile": Key(
        0.5, "Adaptive clipping: quantile gamma of the update norms", low=0.0, high=1.0
    ),
    "dp-clip-learning-rate": Key(
        0.2, "Adaptive clipping: step eta_C of S <- S exp(-eta_C (b - gamma))", low=0.0, low_open=True
    ),
    "dp-clipped-count-stddev": Key(
        0.0, "Adaptive clipping: noise of the clipped count; 0 = clients/20", low=0.0
    ),
    "dp-sampling": Key(
        "public",
        "public: the seeded sample, listed in rounds.csv, accounted without amplification; secret (central "
        "DP): drawn from OS entropy, written nowhere (counts only), amplified by sampling",
        choices=("public", "secret"),
    ),
    "dp-delta": Key(1e-5, "delta at which the accountant reports epsilon", low=0.0, low_open=True, high=0.5),
    "dp-epsilon": Key(0.0, "Budget: refuse a run whose planned rounds spend more epsilon; 0 = none", low=0.0),
}
RUN_KEYS |= PRIVACY_KEYS

# --- robust aggregation against a bad silo, in plain mode (strategies/robust.py) ---------------
ROBUST_KEYS: dict[str, Key] = {
    "aggregation": Key(
        "mean",
        "A summed round's rule in plain mode: the weighted mean, or robust to a bad silo "
        "(trimmed-mean, median, krum)",
        choices=("mean", "trimmed-mean", "median", "krum"),
    ),
    "aggregation-trim": Key(
        0.1, "trimmed-mean: fraction of the weight trimmed at each end (below 0.5)", low=0.0, high=0.49
    ),
    "aggregation-krum-f": Key(
        1, "krum: bad updates tolerated f (needs n >= 2f + 3 clients per round)", low=0
    ),
    "aggregation-max-norm": Key(
        0.0, "Reject an update whose L2 norm exceeds this (rounds.csv names it); 0 = no bound", low=0.0
    ),
}
RUN_KEYS |= ROBUST_KEYS

# --- experiment tracking (server/tracking.py) ---------------------------------------------------
TRACKING_KEYS: dict[str, Key] = {
    "mlflow-tracking-uri": Key(
        "",
        "MLflow tracking URI (a server, sqlite:///path.db, or a file store path); empty = no tracking. "
        "Needs hetfed[mlflow] on the SuperLink host",
    ),
    "mlflow-experiment": Key("hetfed", "MLflow experiment the run is logged under"),
}
RUN_KEYS |= TRACKING_KEYS

# The problems' keys (hetfed/problem_params.py), then the simulated nodes'.
PROBLEM_SCHEMA: dict[str, Key] = {k: v for p in PROBLEMS.values() for k, v in p.params.schema().items()}
PROBLEM_SCHEMA |= SIMULATED_NODE_KEYS
# Every key: the run's, each method's (in registry order), then the problems'.
METHOD_SCHEMA: dict[str, Key] = {k: v for m in METHODS.values() for k, v in m.params.schema().items()}
SCHEMA: dict[str, Key] = RUN_KEYS | METHOD_SCHEMA | PROBLEM_SCHEMA


# The keys a ClientApp reads from its run config: which problem, and how its data are made or read
# (problems/registry.py). Everything a client's handlers need for the method (losses, schedules,
# step sizes, batch sizes, ...) arrives in each message's ConfigRecord, set by the strategy
# (strategies/base.py, client_settings); client/session.py shows a client these keys only.
PROBLEM_KEYS = {"problem", "seed"} | set(PROBLEM_SCHEMA)


def register_problem(name: str, problem: Problem) -> None:
    """Make ``name`` a choice of the run-config key ``problem`` and its parameters' fields run-config
    keys (docs/algorithms.md 5, "How to add a decision problem"). Every process of a run (the server,
    each ClientApp) must have registered it; a key it shares with another problem must mean the same."""
    if name in PROBLEMS:
        raise ValueError(f"problem {name!r} is registered already")
    keys = problem.params.schema()
    for key, spec in keys.items():
        if key in SCHEMA and (key not in PROBLEM_SCHEMA or PROBLEM_SCHEMA[key] != spec):
            raise ValueError(f"problem {name!r}: key {key!r} is a run-config key of another meaning already")
    PROBLEMS[name] = problem
    for table in (PROBLEM_SCHEMA, SCHEMA):  # the tables every lookup reads (validate, the ClientApp's)
        table |= keys
    PROBLEM_KEYS.update(keys)


def defaults() -> dict[str, Value]:
    """The default run config (the same values as pyproject.toml's [tool.flwr.app.config])."""
    return {name: key.default for name, key in SCHEMA.items()}


def validate(run_config: Mapping[str, Any]) -> dict[str, Value]:
    """Check every key of ``run_config`` against :data:`SCHEMA`; fill in defaults.

    Raises ConfigError on the first unknown key, wrong type or out-of-range value, a strategy
    on an engine it does not run on, or DP keys that do not go together (:func:`check_privacy`).
    """
    unknown = sorted(set(run_config) - set(SCHEMA))
    if unknown:
        raise ConfigError(f"run config: unknown key {unknown[0]!r}" + _did_you_mean(unknown[0]))
    resolved = defaults()
    for name, value in run_config.items():
        resolved[name] = SCHEMA[name].check(name, value)
    check_privacy(resolved)
    engines, engine = METHODS[str(resolved["strategy"])].engines, resolved["engine"]
    if engine and engines and engine not in engines:
        raise ConfigError(
            f"run config 'strategy': {resolved['strategy']!r} runs on the {' or '.join(engines)} engine "
            f"only, not {engine!r}"
        )
    return resolved


def check_privacy(resolved: Mapping[str, Value]) -> None:
    """The DP keys' cross-key rules (ConfigError naming the key). The ServerApp sees the merged run
    config (defaults and overrides), so a dp-* key differs from its default only when it was given:
    given while ``dp = off`` it would run without any DP, and is refused. Local DP sends no
    within-clip bit (it is not noised), which adaptive clipping needs, and its adversary, the server,
    sees the sample (no amplification: no secret sample). FedRSPO+'s shared calibration releases an
    un-noised mean of data-derived values, so it does not run under DP. The strategy's side of a
    secret sample is checked with the clients (server/aggregation.py ``Summation.start``)."""
    if resolved["dp"] == "off":
        for name in PRIVACY_KEYS:
            if name.startswith("dp-") and resolved[name] != PRIVACY_KEYS[name].default:
                raise ConfigError(
                    f"run config {name!r}: set while dp = off; set dp = central or local, or drop it"
                )
    if resolved["dp"] == "local" and resolved["dp-sampling"] == "secret":
        raise ConfigError(
            "run config 'dp-sampling': a secret sample amplifies only against those who cannot see it, "
            "and local DP's adversary is the server, which sees every release; use dp-sampling = public"
        )
    method = METHODS[str(resolved["strategy"])].params.schema()
    if (
        resolved["dp"] != "off"
        and "per-client-calibration" in method
        and not resolved["per-client-calibration"]
    ):
        raise ConfigError(
            "run config 'per-client-calibration': false shares the mean of the clients' calibration "
            "(lam0_j, lr0_j, computed from their data) without noise, outside the DP accountant; keep it "
            "true under dp"
        )
    if resolved["dp"] == "local" and resolved["dp-clipping"] == "adaptive":
        raise ConfigError(
            "run config 'dp-clipping': adaptive clipping needs each client's within-clip bit, which "
            "local DP does not release; use dp-clipping = fixed, or dp = central"
        )


def parse_assignments(items: Iterable[str]) -> dict[str, Value]:
    """Parse ``key=value`` strings (``hetfed run --set``) into typed values.

    Values are read as TOML (``0.5``, ``true``, ``'text'``); a bare word that is not
    TOML is taken as a string, so ``--set loss=mse`` works without quotes.
    """
    out: dict[str, Value] = {}
    for item in items:
        name, sep, text = item.partition("=")
        name = name.strip()
        if not sep or not name:
            raise ConfigError(f"--set {item!r}: expected key=value")
        if name not in SCHEMA:
            raise ConfigError(f"--set {item!r}: unknown key {name!r}" + _did_you_mean(name))
        try:
            value = tomllib.loads(f"v = {text.strip()}")["v"]
        except tomllib.TOMLDecodeError:
            value = text.strip()
        out[name] = SCHEMA[name].check(name, value)
    return out


def to_toml(values: Mapping[str, Value]) -> str:
    """Serialise run-config values as TOML (for ``flwr run --run-config <file>``).

    Keys are bare (letters, digits, ``-``), as every key of :data:`SCHEMA` is.
    """

    def lit(v: Value) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, str):
            return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
        return repr(v)

    return "".join(f"{k} = {lit(v)}\n" for k, v in values.items())


def sync_pyproject(path: Path) -> None:
    """Rewrite pyproject.toml's ``[tool.flwr.app.config]`` table from :data:`SCHEMA`."""
    text = path.read_text()
    head, sep, rest = text.partition("[tool.flwr.app.config]\n")
    if not sep:
        raise ValueError(f"{path} has no [tool.flwr.app.config] table")
    tail = rest[rest.index("\n[") + 1 :] if "\n[" in rest else ""
    table = "# Generated from hetfed/config.py (`hetfed config --sync-pyproject`); a test keeps them equal.\n"
    path.write_text(head + sep + table + to_toml(defaults()) + "\n" + tail)


def pyproject_config(path: Path) -> dict[str, Any]:
    """The flattened ``[tool.flwr.app.config]`` table of a pyproject.toml."""
    table = tomllib.loads(path.read_text())["tool"]["flwr"]["app"]["config"]
    flat: dict[str, Any] = {}

    def walk(prefix: str, node: Mapping[str, Any]) -> None:
        for k, v in node.items():
            if isinstance(v, Mapping):
                walk(f"{prefix}{k}.", v)
            else:
                flat[prefix + k] = v

    walk("", table)
    return flat


def _did_you_mean(name: str) -> str:
    import difflib

    close = difflib.get_close_matches(name, SCHEMA, n=1)
    return f" (did you mean {close[0]!r}?)" if close else f"; see `hetfed config` for the {len(SCHEMA)} keys"
