"""Problem names -> how a client loads its own data and what the server must know.

The server never loads client data: it only needs the model, derived from the run
config alone: its input/output sizes (:attr:`ProblemSpec.model_dims`, decision
problems) or the model itself (:attr:`ProblemSpec.make_model`, constrained tasks).
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from problems import garnet, knapsack

RunConfig = Mapping[str, Any]


@dataclass(frozen=True)
class ProblemSpec:
    """How to build one problem: a client's private data and the server's model size."""

    name: str
    family: str  # "decision" (features -> LP costs), "constrained" (f_i, g_i tasks), "lsa" (A theta = b)
    load_client: Callable[[RunConfig, int, int, Path | None], Any]
    model_dims: Callable[[RunConfig], tuple[int, int]] | None = None  # decision problems
    make_model: Callable[[RunConfig], Any] | None = None  # constrained tasks: the seeded torch model


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


def garnet_agent(cfg: RunConfig, partition_id: int) -> garnet.GarnetAgent:
    """Agent ``partition_id`` of the Garnet federation the run config describes (ALGORITHMS.md 3)."""
    return garnet.make_agent(
        partition_id,
        cfg["garnet-seed"] if cfg["garnet-seed"] >= 0 else cfg["seed"],
        cfg["garnet-zeta-ker"],
        cfg["garnet-zeta-rew"],
        n_states=cfg["garnet-states"],
        n_actions=cfg["garnet-actions"],
        branching=cfg["garnet-branching"],
        dim=cfg["garnet-dim"],
        gamma=cfg["garnet-gamma"],
    )


# Constrained tasks (problems.constrained): module, and run-config key -> task parameter.
CONSTRAINED: dict[str, tuple[str, dict[str, str]]] = {
    "np-classification": (
        "problems.np_classification",
        {"np-r": "r", "np-dirichlet-alpha": "dirichlet_alpha", "np-min-per-class": "min_per_class"},
    ),
    "fair-classification": (
        "problems.fair_classification",
        {
            "fair-delta": "delta",
            "fair-hidden": "hidden",
            "fair-split-by": "split_by",
            "fair-protected": "protected",
        },
    ),
    "safe-rl": (
        "problems.safe_rl",
        {
            "rl-horizon": "horizon",
            "rl-budget": "budget",
            "rl-heterogeneity": "heterogeneity",
            "rl-hidden": "hidden",
            "rl-eval-episodes": "eval_episodes",
        },
    ),
    "quadratic": ("problems.quadratic", {"quadratic-dim": "dim"}),
}
DATA_DIR_PARAM = {"fair-classification": "data_dir"}  # tasks that read a node's data-path


def constrained_params(name: str, cfg: RunConfig) -> dict[str, Any]:
    """The task parameters of constrained problem ``name`` from the run config."""
    return {param: cfg[key] for key, param in CONSTRAINED[name][1].items()}


@functools.lru_cache(maxsize=64)
def _constrained_client(name: str, pid: int, n: int, seed: int, params: tuple, data_path: str) -> Any:
    """Cached per process on the task's own parameters (not the run name): runs share loaded tasks."""
    kwargs = dict(params)
    if data_path and name in DATA_DIR_PARAM:
        kwargs[DATA_DIR_PARAM[name]] = data_path
    return importlib.import_module(CONSTRAINED[name][0]).load_client(pid, n, seed, **kwargs)


def _constrained_spec(name: str) -> ProblemSpec:
    def load(cfg: RunConfig, pid: int, n: int, path: Path | None) -> Any:
        params = tuple(sorted(constrained_params(name, cfg).items()))
        return _constrained_client(name, pid, n, int(cfg["seed"]), params, str(path) if path else "")

    def make_model(cfg: RunConfig) -> Any:
        module = importlib.import_module(CONSTRAINED[name][0])
        return module.make_model(int(cfg["seed"]), **constrained_params(name, cfg))

    return ProblemSpec(name=name, family="constrained", load_client=load, make_model=make_model)


PROBLEMS: dict[str, ProblemSpec] = {
    "knapsack": ProblemSpec(
        name="knapsack",
        family="decision",
        load_client=lambda cfg, pid, n, path: knapsack.load_client(knapsack_params(cfg), cfg["seed"], pid),
        model_dims=lambda cfg: (cfg["num-features"], cfg["num-items"]),
    ),
    "garnet": ProblemSpec(
        name="garnet",
        family="lsa",
        load_client=lambda cfg, pid, n, path: garnet_agent(cfg, pid),
        # theta is the linear value function V(s) = phi(s)'theta: d features in, one value out
        model_dims=lambda cfg: (cfg["garnet-dim"], 1),
    ),
    **{name: _constrained_spec(name) for name in CONSTRAINED},
}


def get_problem(name: str) -> ProblemSpec:
    """The spec of problem ``name`` (a clear error for an unknown name)."""
    try:
        return PROBLEMS[name]
    except KeyError:
        raise ValueError(f"unknown problem {name!r}; choose one of {sorted(PROBLEMS)}") from None
