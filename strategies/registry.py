"""Strategy names -> the server-side algorithm and its initial model."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from client.models import make_mlp, model_record
from problems.registry import get_problem
from strategies.base import FederatedStrategy
from strategies.fedavg import FedAvg


def build_strategy(cfg: Mapping[str, Any]) -> FederatedStrategy:
    """The strategy named by ``cfg['strategy']``, with its seeded initial model."""
    name = cfg["strategy"]
    if name == "fedavg":
        in_dim, out_dim = get_problem(cfg["problem"]).model_dims(cfg)
        return FedAvg(cfg, model_record(make_mlp(in_dim, cfg["hidden"], out_dim, seed=cfg["seed"])))
    raise ValueError(f"unknown strategy {name!r}")
