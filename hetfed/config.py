"""The run configuration: every tunable, its type, range and meaning.

Flower passes the run config (``[tool.flwr.app.config]`` merged with
``--run-config`` overrides) to the ServerApp and to every ClientApp. This module
is the single description of those keys, in groups: the run's own (:data:`RUN_KEYS`), each
method's (:data:`METHODS`, hetfed/methods: name -> strategy class and its typed parameters,
whose fields are its keys) and the problems' (:data:`PROBLEM_SCHEMA`); :data:`SCHEMA` is built
from them. ``validate`` checks a run config before
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

__all__ = [
    "INT64",
    "METHODS",
    "ConfigError",
    "Key",
    "Method",
    "Value",
    "check_name",
]

PROBLEMS = (
    "knapsack",
    "energy",
    "energy-pjm",
    "shortest-path",
    "garnet",
    "np-classification",
    "fair-classification",
    "safe-rl",
    "quadratic",
    "lp",
    "tabular",
)
ENGINES = ("", "inline", "simulation", "deployment")

STRATEGIES = tuple(METHODS)

# --- problems: which task, and how a client makes or reads its data (problems/registry.py) -----
# Synthetic features and costs (knapsack, shortest path; n-* also the constrained tasks).
DATA_KEYS: dict[str, Key] = {
    "num-features": Key(8, "Features p", low=1),
    "degree": Key(4, "Polynomial degree of the feature-to-cost map", low=1),
    "n-train": Key(100, "Training samples per client", low=1),
    "n-val": Key(10, "Validation samples per client", low=1),
    "n-test": Key(100, "Test samples per client", low=1),
}

# Knapsack (docs/algorithms.md 1.7).
KNAPSACK_KEYS: dict[str, Key] = {
    "num-items": Key(50, "Knapsack items d", low=1),
    "capacity-ratio": Key(0.6, "Base capacity C = ratio * d", low=0.0),
    "eta-o": Key(0.0, "Objective heterogeneity (rotation of B_j)", low=0.0),
    "eta-c": Key(0.0, "Constraint heterogeneity (capacities and weights)", low=0.0),
    "eta-d": Key(0.0, "Data heterogeneity (feature location and scale)", low=0.0),
}

# Energy purchasing (quota sets, docs/algorithms.md 1.2): energy (ERCOT), energy-pjm (a PJM-layout CSV).
ENERGY_KEYS: dict[str, Key] = {
    "energy-zones": Key(
        "", "Energy: comma-separated ERCOT zones, partition i takes the i-th; empty = all 13 (ERCOT_ZONES)"
    ),
    "energy-exclude-storm": Key(
        False, "Energy: drop the Feb 2021 winter-storm days (2021-02-12..20, up to $9,000/MWh) from training"
    ),
    "energy-train-days": Key(
        0, "Energy: train on only the last K days of the training split (cold start); 0 = all", low=0
    ),
    "energy-quota": Key(
        0,
        "Energy: every zone buys this many hours a day (equal demands); 0 = D_j = 4 + (5 k mod 9)",
        low=0,
        high=24,
    ),
}

# Grid shortest path (the flow polytope of docs/algorithms.md 1.2).
SHORTEST_PATH_KEYS: dict[str, Key] = {
    "grid-size": Key(5, "Shortest path: k of the k x k grid (PyEPO: 5; 12 works too)", low=2),
    "sp-endpoints": Key(
        "random",
        "Shortest path: sources/sinks: corners (all top-left -> bottom-right), diagonals, random",
        choices=("corners", "diagonals", "random"),
    ),
    "sp-terrain": Key(0.5, "Shortest path: terrain heterogeneity t (edge multipliers exp(t h_j))", low=0.0),
    "sp-noise": Key(0.5, "Shortest path: multiplicative noise U[1 - w, 1 + w], w < 1", low=0.0, high=0.99),
}

# A silo's own LP and samples (problems/lp.py): the model's inputs and outputs, the same on every silo.
LP_KEYS: dict[str, Key] = {
    "lp-features": Key("", "Own LP: comma-separated feature columns of samples.csv (the model's inputs)"),
    "lp-variables": Key("", "Own LP: comma-separated variables of the LP file (the model's outputs)"),
    "lp-relax-integers": Key(False, "Own LP: relax integer/binary variables to their bounds (else refused)"),
    "lp-train-fraction": Key(
        0.5,
        "Own LP: share of the rows (file order) that train when samples.csv has no split column",
        low=0.0,
        high=1.0,
        low_open=True,
    ),
    "lp-val-fraction": Key(
        0.1,
        "Own LP: share of the rows that validate when samples.csv has no split column (the rest test)",
        low=0.0,
        high=1.0,
        low_open=True,
    ),
}

# A silo's own table for the constrained classification tasks (problems/tabular.py, docs/algorithms.md 2):
# the model's inputs and the constraint, the same on every silo.
TABULAR_KEYS: dict[str, Key] = {
    "tabular-features": Key(
        "", "Tabular: comma-separated feature columns of each silo's samples.csv (the model's inputs)"
    ),
    "tabular-constraint": Key(
        "fairness",
        "Tabular: g_i = demographic-parity gap - tabular-delta (fairness, reads tabular-group) or the "
        "class-1 logistic loss - tabular-r (neyman-pearson; f_i = the class-0 loss)",
        choices=("fairness", "neyman-pearson"),
    ),
    "tabular-group": Key(
        "", "Tabular, fairness: the 0/1 group column of samples.csv the parity gap reads (1 = protected)"
    ),
    "tabular-delta": Key(0.05, "Tabular, fairness: demographic-parity tolerance delta", low=0.0),
    "tabular-r": Key(0.2, "Tabular, neyman-pearson: bound r on the class-1 logistic loss", low=0.0),
    "tabular-hidden": Key(0, "Tabular: MLP hidden units (ReLU); 0 = logistic regression", low=0),
    "tabular-test-fraction": Key(
        0.2,
        "Tabular: share of the rows (the last, file order) held out for test when samples.csv has no "
        "split column (< 1)",
        low=0.0,
        high=0.99,
    ),
}

# Simulated nodes have no node config of their own beyond their partition: `hetfed run --engine
# simulation --data-path/--state-dir` gives every node its paths through these ({partition} = its id).
SIMULATED_NODE_KEYS: dict[str, Key] = {
    "node-data-path": Key("", "Simulated nodes: data-path of each ({partition} = its id), from hetfed run"),
    "node-state-dir": Key("", "Simulated nodes: state-dir of each ({partition} = its id), from hetfed run"),
}

# Garnet MDPs for federated TD(0) (docs/algorithms.md section 3).
GARNET_KEYS: dict[str, Key] = {
    "garnet-seed": Key(-1, "Seed of the Garnet MDPs; -1 = seed (fix it to vary only the samples)", low=-1),
    "garnet-states": Key(10, "Garnet: states", low=2),
    "garnet-actions": Key(10, "Garnet: actions (uniform random policy)", low=1),
    "garnet-branching": Key(3, "Garnet: next states per (state, action)", low=1),
    "garnet-dim": Key(5, "Garnet: feature dimension d (the size of theta)", low=1),
    "garnet-gamma": Key(0.95, "Garnet: discount factor (< 1)", low=0.0, high=1.0),
    "garnet-zeta-ker": Key(0.0, "Garnet: transition-kernel heterogeneity zeta_ker", low=0.0),
    "garnet-zeta-rew": Key(0.0, "Garnet: reward heterogeneity zeta_rew", low=0.0),
}

# Constrained tasks (docs/algorithms.md section 2): NP and fair classification, safe RL, the quadratic test.
CONSTRAINED_TASK_KEYS: dict[str, Key] = {
    "np-r": Key(0.2, "NP classification: bound r on the class-1 loss", low=0.0),
    "np-dirichlet-alpha": Key(0.5, "NP classification: Dirichlet label skew", low=0.0, low_open=True),
    "np-min-per-class": Key(5, "NP classification: rows of each class per client", low=0),
    "fair-delta": Key(0.05, "Fair classification: demographic-parity tolerance delta", low=0.0),
    "fair-hidden": Key(32, "Fair classification: MLP hidden units", low=1),
    "fair-split-by": Key(
        "race", "Fair classification: client attribute", choices=("race", "workclass", "sex")
    ),
    "fair-protected": Key("sex", "Fair classification: protected attribute", choices=("sex", "race")),
    "rl-horizon": Key(200, "Safe RL: episode length H", low=1),
    "rl-budget": Key(0.05, "Safe RL: cost budget (fraction of H)", low=0.0, high=1.0),
    "rl-heterogeneity": Key(0.5, "Safe RL: spread of the clients' physics", low=0.0, high=1.5),
    "rl-hidden": Key(0, "Safe RL: policy hidden units (0 = linear)", low=0),
    "rl-eval-episodes": Key(32, "Safe RL: evaluation episodes per client", low=1),
    "rl-fall-cost": Key(True, "Safe RL: a fall also costs the steps left to the horizon"),
    "rl-advantage": Key(
        "gae",
        "Safe RL: policy-gradient weights (reward-to-go, or gae: advantages over a fitted value baseline)",
        choices=("reward-to-go", "gae"),
    ),
    "rl-gae-lambda": Key(1.0, "Safe RL: lambda of the generalised advantage estimate", low=0.0, high=1.0),
    "rl-trust-region": Key(
        0.01, "Safe RL: KL radius of a natural-gradient local step (TRPO's); 0 = plain steps", low=0.0
    ),
    "quadratic-dim": Key(3, "Quadratic test problem: dimension of w", low=1),
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
    "problem": Key("knapsack", "Task each client solves on its own data", choices=PROBLEMS),
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
        0, "Clients whose shares unmask a round (t); 0 = a majority of the round's clients, at least 2", low=0
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
    "dp-delta": Key(1e-5, "delta at which the accountant reports epsilon", low=0.0, low_open=True, high=0.5),
    "dp-epsilon": Key(0.0, "Budget: refuse a run whose planned rounds spend more epsilon; 0 = none", low=0.0),
}
RUN_KEYS |= PRIVACY_KEYS

PROBLEM_SCHEMA: dict[str, Key] = (
    DATA_KEYS
    | KNAPSACK_KEYS
    | ENERGY_KEYS
    | SHORTEST_PATH_KEYS
    | LP_KEYS
    | TABULAR_KEYS
    | SIMULATED_NODE_KEYS
    | GARNET_KEYS
    | CONSTRAINED_TASK_KEYS
)
# Every key: the run's, each method's (in registry order), then the problems'.
METHOD_SCHEMA: dict[str, Key] = {k: v for m in METHODS.values() for k, v in m.params.schema().items()}
SCHEMA: dict[str, Key] = RUN_KEYS | METHOD_SCHEMA | PROBLEM_SCHEMA


# The keys a ClientApp reads from its run config: which problem, and how its data are made or read
# (problems/registry.py). Everything a client's handlers need for the method (losses, schedules,
# step sizes, batch sizes, ...) arrives in each message's ConfigRecord, set by the strategy
# (strategies/base.py, client_settings); client/session.py shows a client these keys only.
PROBLEM_KEYS = frozenset({"problem", "seed"} | set(PROBLEM_SCHEMA))


def defaults() -> dict[str, Value]:
    """The default run config (the same values as pyproject.toml's [tool.flwr.app.config])."""
    return {name: key.default for name, key in SCHEMA.items()}


def validate(run_config: Mapping[str, Any]) -> dict[str, Value]:
    """Check every key of ``run_config`` against :data:`SCHEMA`; fill in defaults.

    Raises ConfigError on the first unknown key, wrong type or out-of-range value.
    """
    unknown = sorted(set(run_config) - set(SCHEMA))
    if unknown:
        raise ConfigError(f"run config: unknown key {unknown[0]!r}" + _did_you_mean(unknown[0]))
    resolved = defaults()
    for name, value in run_config.items():
        resolved[name] = SCHEMA[name].check(name, value)
    return resolved


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
