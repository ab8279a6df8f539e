"""Strategy names -> the server-side algorithm and its initial model."""

from __future__ import annotations

from collections.abc import Mapping
from pkgutil import resolve_name
from typing import Any

from hetfed.config import ConfigError
from problems.registry import get_problem
from strategies.base import FederatedStrategy

# Strategy name -> its class, "module:attribute", imported when a run builds it (an LSA run
# imports neither the torch models nor the decision and constrained strategies).

# Strategies of decision-focused tasks (ALGORITHMS.md 1): features -> LP costs, MLP models.
DECISION = {
    "fedavg": "strategies.fedavg:FedAvg",
    "fedrspo": "strategies.fedrspo:FedRSPO",
    "local-only": "strategies.fedrspo:LocalOnly",
}

# Strategies of constrained tasks (ALGORITHMS.md 2): the model comes from the task's make_model.
CONSTRAINED = {
    "softmax-switching": "strategies.softmax_switching:SoftmaxSwitching",
    "penalty": "strategies.constrained_baselines:FederatedPenalty",
    "primal-dual": "strategies.constrained_baselines:FederatedPrimalDual",
    "fedavg-unconstrained": "strategies.constrained_baselines:UnconstrainedFedAvg",
    "crpo": "strategies.constrained_baselines:ParallelCRPO",
}

# Strategies of linear systems from samples (ALGORITHMS.md 3): clients keep their own parameters.
LSA = {
    "pflsa": "strategies.pflsa:PFLSA",
    "fedlsa": "strategies.fedlsa:FedLSA",
    "scafflsa": "strategies.fedlsa:SCAFFLSA",
    "single-lsa": "strategies.lsa:SingleLSA",
}


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
        from problems.models import make_mlp, model_record
        from strategies.fedrspo import check_config

        check_config(cfg)
        in_dim, out_dim = spec.model_dims(cfg)
        return resolve_name(DECISION[name])(
            cfg, model_record(make_mlp(in_dim, cfg["hidden"], out_dim, seed=cfg["seed"]))
        )
    if name in CONSTRAINED:
        from problems.models import model_record

        return resolve_name(CONSTRAINED[name])(cfg, model_record(spec.make_model(cfg)))
    if name in LSA:
        return resolve_name(LSA[name])(cfg)
    raise ValueError(f"unknown strategy {name!r}")
