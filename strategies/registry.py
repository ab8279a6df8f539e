"""Strategy names -> the server-side algorithm and its initial model."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from client.models import make_mlp, model_record
from hetfed.config import ConfigError
from problems.registry import get_problem
from strategies.base import FederatedStrategy
from strategies.constrained_baselines import (
    FederatedPenalty,
    FederatedPrimalDual,
    ParallelCRPO,
    UnconstrainedFedAvg,
)
from strategies.fedavg import FedAvg
from strategies.fedlsa import SCAFFLSA, FedLSA
from strategies.fedrspo import FedRSPO, LocalOnly, check_config
from strategies.lsa import SingleLSA
from strategies.pflsa import PFLSA
from strategies.softmax_switching import SoftmaxSwitching

# Strategies of decision-focused tasks (ALGORITHMS.md 1): features -> LP costs, MLP models.
DECISION = {"fedavg": FedAvg, "fedrspo": FedRSPO, "local-only": LocalOnly}

# Strategies of constrained tasks (ALGORITHMS.md 2): the model comes from the task's make_model.
CONSTRAINED = {
    "softmax-switching": SoftmaxSwitching,
    "penalty": FederatedPenalty,
    "primal-dual": FederatedPrimalDual,
    "fedavg-unconstrained": UnconstrainedFedAvg,
    "crpo": ParallelCRPO,
}

# Strategies of linear systems from samples (ALGORITHMS.md 3): clients keep their own parameters.
LSA = {"pflsa": PFLSA, "fedlsa": FedLSA, "scafflsa": SCAFFLSA, "single-lsa": SingleLSA}


def build_strategy(cfg: Mapping[str, Any]) -> FederatedStrategy:
    """The strategy named by ``cfg['strategy']``, with its seeded initial model."""
    name = cfg["strategy"]
    spec = get_problem(cfg["problem"])
    family = "constrained" if name in CONSTRAINED else "lsa" if name in LSA else "decision"
    if spec.family != family:
        raise ConfigError(
            f"run config 'problem': strategy {name!r} needs a {family} problem, "
            f"but {spec.name!r} is a {spec.family} problem"
        )
    if name in DECISION:
        check_config(cfg)
        in_dim, out_dim = spec.model_dims(cfg)
        return DECISION[name](cfg, model_record(make_mlp(in_dim, cfg["hidden"], out_dim, seed=cfg["seed"])))
    if name in CONSTRAINED:
        return CONSTRAINED[name](cfg, model_record(spec.make_model(cfg)))
    if name in LSA:
        return LSA[name](cfg)
    raise ValueError(f"unknown strategy {name!r}")
