"""The run configuration: every tunable, its type, range and meaning, and the method registry.

Flower passes the run config (``[tool.flwr.app.config]`` merged with
``--run-config`` overrides) to the ServerApp and to every ClientApp. This module
is the single description of those keys, in groups: the run's own (:data:`RUN_KEYS`), each
method's (:data:`METHODS`: name -> strategy class and the keys it reads) and the problems'
(:data:`PROBLEM_SCHEMA`); :data:`SCHEMA` is built from them. ``validate`` checks a run config before
round 1 and names the culprit on error, ``parse_assignments`` turns
``hetfed run --set key=value`` into typed values, and a test keeps
``pyproject.toml`` in step with :data:`SCHEMA`.
"""

from __future__ import annotations

import math
import tomllib
import unicodedata
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

Value = bool | int | float | str


class ConfigError(ValueError):
    """A run configuration that cannot run; the message names the key."""


@dataclass(frozen=True)
class Key:
    """One run-config key: default (which fixes its type), range and help."""

    default: Value
    help: str
    choices: tuple[str, ...] | None = None
    low: float | None = None  # inclusive lower bound
    high: float | None = None  # inclusive upper bound
    low_open: bool = False  # lower bound is exclusive (e.g. a step size > 0)

    @property
    def kind(self) -> type:
        return type(self.default)

    def check(self, name: str, value: Any) -> Value:
        """Return ``value`` converted to this key's type, or raise ConfigError."""
        kind = self.kind
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise ConfigError(
                f"run config '{name}': expected {kind.__name__}, got {type(value).__name__} {value!r}"
            )
        value = cast(Value, value)  # isinstance against a runtime type narrows to object only
        if isinstance(value, int) and not INT64[0] <= value <= INT64[1]:
            raise ConfigError(
                f"run config '{name}': {value} does not fit a signed 64-bit integer (Flower's records "
                f"hold [{INT64[0]}, {INT64[1]}])"
            )
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"run config '{name}': must be finite, got {value!r}")
        if self.choices is not None and value not in self.choices:
            raise ConfigError(
                f"run config '{name}': unknown value {value!r}; choose one of {list(self.choices)}"
            )
        if self.low is not None and (value < self.low or (self.low_open and value == self.low)):
            op = ">" if self.low_open else ">="
            raise ConfigError(f"run config '{name}': must be {op} {self.low:g}, got {value!r}")
        if self.high is not None and value > self.high:
            raise ConfigError(f"run config '{name}': must be <= {self.high:g}, got {value!r}")
        if name in NAME_KEYS and value:
            check_name(f"run config '{name}'", str(value))
        return value


INT64 = (-(2**63), 2**63 - 1)
NAME_KEYS = ("run-name",)  # names a folder on the server and on every silo (client/state.py run_key)


def check_name(where: str, name: str) -> str:
    """A run name names a results folder and every silo's state folder: 1-200 bytes, no '/' or
    '\\', no control character (a newline), no blank at either end, not starting with '.'."""
    bad = sorted({c for c in name if c in "/\\" or unicodedata.category(c).startswith("C")})
    if len(name.encode()) > 200:
        why = f"{len(name.encode())} bytes (at most 200: it is part of file names)"
    elif bad:
        why = f"characters {''.join(bad)!r} not allowed"
    elif not name.strip():
        why = "empty or blank"
    elif name != name.strip():
        why = "a blank at either end"
    elif name.startswith("."):
        why = "must not start with '.'"
    else:
        return name
    shown = f"{name[:40]!r}{'...' if len(name) > 40 else ''}"
    raise ConfigError(f"{where}: {shown}: {why} (a run name names folders on the server and every silo)")


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
DECISION_LOSSES = ("mse", "spo+", "rspo+", "pfyl", "dpo", "mse->spo+", "optnet")

# --- methods: the keys each one reads beyond the run's own (RUN_KEYS) and its problem's ---------
# The decision and the constrained clients' mini-batch.
BATCH_SIZE = Key(64, "Mini-batch size (a client with fewer samples trains on one full batch)", low=1)

# Decision-focused training (docs/algorithms.md section 1): fedavg, fedrspo, local-only; the MLP, the
# losses, FedProx / Ditto and the personalization schedule of the decision client.
DECISION_KEYS: dict[str, Key] = {
    "fraction": Key(
        0.4, "Fraction of clients sampled per round (ceil(fraction * n))", low=0.0, high=1.0, low_open=True
    ),
    "local-epochs": Key(3, "Local epochs per round", low=1),
    "batch-size": BATCH_SIZE,
    "lr": Key(1e-3, "Client learning rate (Adam)", low=0.0, low_open=True),
    "clip-norm": Key(1.0, "Gradient-norm clip per parameter array; 0 = off", low=0.0),
    "loss": Key("mse", "Training loss of the decision-focused model", choices=DECISION_LOSSES),
    "hidden": Key(64, "Hidden units of the MLP; 0 = the linear predictor (no hidden layer, no bias)", low=0),
    "personal-rounds": Key(10, "Personalization rounds after the warm start (0 = none)", low=0),
    "personal-epochs": Key(1, "Local epochs per personalization round", low=1),
    "rspo-alpha": Key(
        0.01, "RSPO+ lr scale in the warm start: lr0_j = alpha lam0_j / 4", low=0.0, low_open=True
    ),
    "rspo-alpha-personal": Key(
        0.01, "RSPO+ lr scale in personalization (energy: 0.001)", low=0.0, low_open=True
    ),
    "calibration-norm": Key(
        "mean",
        "Scale of lam0_j = s(||c_i||) / R_j: mean (the paper) or median (robust to price spikes)",
        choices=("mean", "median"),
    ),
    "fixed-lam0": Key(
        0.0,
        "lam0 for every client instead of its calibration (0 = calibrate; paper's shortest path: 2)",
        low=0.0,
    ),
    "anneal": Key(True, "RSPO+ personalization: inverse-time schedules and freezing"),
    "kappa-lam": Key(1.0, "lam_t = lam0 / (1 + kappa_lam (t - 1))", low=0.0),
    "kappa-lr": Key(0.1, "lr_t = lr0 / (1 + kappa_lr (t - 1))", low=0.0),
    "coupled-lr": Key(False, "The paper's coupled schedule lr_t = alpha lam_t / 4 instead of kappa-lr"),
    "freeze-tau": Key(0.01, "Freeze lam and lr once U_t <= tau (energy: 0.03)", low=0.0),
    "freeze-extra-rounds": Key(3, "Rounds a frozen client still trains before it stops", low=0),
    "personal-trace": Key(
        False, "Diagnosis: each personalization round also reports the personal model's test regret"
    ),
    "monitor-size": Key(8, "Validation samples of the freeze statistic U_t", low=1),
    "proximal-mu": Key(0.0, "FedProx: (mu/2)||theta - theta_global||^2 added to every batch loss", low=0.0),
    "ditto-mu": Key(
        0.0, "Ditto: personal model trained with (mu/2)||v - theta_global||^2 (0 = off)", low=0.0
    ),
    "perturb-eps": Key(1.0, "PFYL/DPO: Gaussian perturbation scale", low=0.0, low_open=True),
    "perturb-samples": Key(10, "PFYL/DPO: perturbation samples", low=2),
    "optnet-mult": Key(0.1, "OptNet-style: QP regularisation eps = mult * lam0_j", low=0.0, low_open=True),
    "optnet-backend": Key(
        "exact", "OptNet-style QP layer: exact (structured sets) or qpth", choices=("exact", "qpth")
    ),
    "interp-dffl": Key(False, "Also evaluate Interp-DFFL: blend a local model with the federated one"),
    "interp-split": Key(
        0.2, "Interp-DFFL: calibration share of the training data", low=0.0, high=1.0, low_open=True
    ),
    "interp-local-epochs": Key(
        100, "Interp-DFFL: epochs of the local SPO+ model (trained to convergence)", low=1
    ),
}

# FedRSPO+'s per-client calibration: fedrspo, local-only.
CALIBRATION_KEYS: dict[str, Key] = {
    "per-client-calibration": Key(True, "Per-client lam0_j, lr0_j (false: their mean for every client)"),
}

# The constrained harness (docs/algorithms.md section 2): softmax-switching and its baselines.
CONSTRAINED_KEYS: dict[str, Key] = {
    "switching-eps": Key(0.05, "Constraint tolerance eps (max_i g_i <= eps)", low=0.0, low_open=True),
    "switching-threshold": Key(0.025, "Switch to the objectives when <q, g> <= threshold"),
    "switching-eta": Key(0.1, "Server step eta", low=0.0, low_open=True),
    "switching-gamma": Key(0.1, "Local step gamma", low=0.0, low_open=True),
    "switching-local-steps": Key(1, "Local steps E per round", low=1),
    "switching-m": Key(0, "Clients sampled per round m; 0 = all", low=0),
    "switching-theory-d": Key(
        0.0, "Diameter D; with switching-theory-l > 0 sets eta, gamma, threshold by theory", low=0.0
    ),
    "switching-theory-l": Key(0.0, "Lipschitz constant L of the f_i, g_i (see switching-theory-d)", low=0.0),
    "switching-eval-every": Key(
        10, "Evaluate F = max f_i, G = max g_i on all clients every k rounds (0 = at the end)", low=0
    ),
    "batch-zeta": Key(32, "Batch size of the f_i, g_i query", low=1),
    "batch-size": BATCH_SIZE,
}

# Softmax switching's own temperature.
SWITCHING_KEYS: dict[str, Key] = {
    "switching-alpha": Key(10.0, "Softmax temperature alpha of p, q", low=0.0, low_open=True),
}

PENALTY_KEYS: dict[str, Key] = {
    "penalty-rho": Key(10.0, "Penalty weight rho of f + rho max(g, 0)", low=0.0),
}

PRIMAL_DUAL_KEYS: dict[str, Key] = {
    "pd-dual-lr": Key(0.1, "Dual step of the primal-dual baseline", low=0.0),
    "pd-dual-step": Key(
        "mean", "Dual ascent on the mean or the max of the sampled g_i", choices=("mean", "max")
    ),
}

# Linear stochastic approximation (docs/algorithms.md section 3): pflsa, fedlsa, scafflsa, single-lsa.
LSA_KEYS: dict[str, Key] = {
    "lsa-eta": Key(0.2, "Step size eta of the LSA strategies", low=0.0, low_open=True),
    "lsa-batch": Key(1, "LSA: samples per agent and iteration (their mean is one step's sample)", low=1),
    "lsa-local-steps": Key(1, "LSA: local steps H per round (fedlsa, scafflsa, single-lsa; pflsa: 1)", low=1),
    "lsa-exact": Key(False, "LSA: noise-free steps with the exact means A_bar_c, b_bar_c"),
    "lsa-report-every": Key(
        1, "LSA: clients report ||theta_c - theta_c*||^2 every k rounds (and after the last)", low=1
    ),
}

PFLSA_KEYS: dict[str, Key] = {
    "pflsa-beta": Key(
        0.0, "PF-LSA weight beta of the agent's own update; 0 = 1/N (recommended)", low=0.0, high=1.0
    ),
}


@dataclass(frozen=True)
class Method:
    """One method of the registry: its strategy class, imported only when a run builds it
    (``module:Class``, strategies/registry.py), and the run-config keys it reads beyond
    :data:`RUN_KEYS` and its problem's (the class's ``config_keys`` and ``client_keys``; a test
    keeps the two equal)."""

    strategy: str
    keys: Mapping[str, Key]


METHODS: dict[str, Method] = {
    "fedavg": Method("strategies.fedavg:FedAvg", DECISION_KEYS),
    "fedrspo": Method("strategies.fedrspo:FedRSPO", DECISION_KEYS | CALIBRATION_KEYS),
    "local-only": Method("strategies.fedrspo:LocalOnly", DECISION_KEYS | CALIBRATION_KEYS),
    "softmax-switching": Method(
        "strategies.softmax_switching:SoftmaxSwitching", CONSTRAINED_KEYS | SWITCHING_KEYS
    ),
    "penalty": Method("strategies.constrained_baselines:FederatedPenalty", CONSTRAINED_KEYS | PENALTY_KEYS),
    "primal-dual": Method(
        "strategies.constrained_baselines:FederatedPrimalDual", CONSTRAINED_KEYS | PRIMAL_DUAL_KEYS
    ),
    "fedavg-unconstrained": Method("strategies.constrained_baselines:UnconstrainedFedAvg", CONSTRAINED_KEYS),
    "crpo": Method("strategies.constrained_baselines:ParallelCRPO", CONSTRAINED_KEYS),
    "pflsa": Method("strategies.pflsa:PFLSA", LSA_KEYS | PFLSA_KEYS),
    "fedlsa": Method("strategies.fedlsa:FedLSA", LSA_KEYS),
    "scafflsa": Method("strategies.fedlsa:SCAFFLSA", LSA_KEYS),
    "single-lsa": Method("strategies.lsa:SingleLSA", LSA_KEYS),
}
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
    "run-name": Key("", "Name of the results folder results-dir/<run-name>; empty = generated"),
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
METHOD_SCHEMA: dict[str, Key] = {k: v for method in METHODS.values() for k, v in method.keys.items()}
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
