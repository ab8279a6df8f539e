"""Problem names -> how a client loads its own data and what the server must know.

The server never loads client data: it only needs the model's input/output sizes
(:attr:`ProblemSpec.model_dims`), derived from the run config alone.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from problems import knapsack

RunConfig = Mapping[str, Any]


@dataclass(frozen=True)
class ProblemSpec:
    """How to build one problem: a client's private data and the server's model size."""

    name: str
    family: str  # "decision" (features -> LP costs), later "constrained", "lsa"
    load_client: Callable[[RunConfig, int, int, Path | None], Any]
    model_dims: Callable[[RunConfig], tuple[int, int]]


def knapsack_params(cfg: RunConfig) -> knapsack.KnapsackParams:
    """The knapsack generator's parameters from the run config."""
    return knapsack.KnapsackParams(
        num_items=cfg["num-items"],
        num_features=cfg["num-features"],
        degree=cfg["degree"],
        capacity_ratio=cfg["capacity-ratio"],
        n_train=cfg["n-train"],
        n_val=cfg["n-val"],
        n_test=cfg["n-test"],
        eta_o=cfg["eta-o"],
        eta_c=cfg["eta-c"],
        eta_d=cfg["eta-d"],
    )


PROBLEMS: dict[str, ProblemSpec] = {
    "knapsack": ProblemSpec(
        name="knapsack",
        family="decision",
        load_client=lambda cfg, pid, n, path: knapsack.load_client(knapsack_params(cfg), cfg["seed"], pid),
        model_dims=lambda cfg: (cfg["num-features"], cfg["num-items"]),
    ),
}


def get_problem(name: str) -> ProblemSpec:
    """The spec of problem ``name`` (a clear error for an unknown name)."""
    try:
        return PROBLEMS[name]
    except KeyError:
        raise ValueError(f"unknown problem {name!r}; choose one of {sorted(PROBLEMS)}") from None
