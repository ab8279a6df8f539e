"""Problem names -> how a client loads its own data and what the server must know.

The server never loads client data: it only needs the model, derived from the run
config alone: its input/output sizes (:attr:`ProblemSpec.model_dims`, decision
problems) or the model itself (:attr:`ProblemSpec.make_model`, constrained tasks).

Problem modules are imported when a spec's function first needs them, so looking up a
problem imports only that problem (the Garnet LSA task: NumPy, no torch, no SciPy).
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hetfed.problems import garnet, knapsack, shortest_path
    from hetfed.problems.base import DecisionClientData

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
    from hetfed.problems import knapsack

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


def shortest_path_params(cfg: RunConfig) -> shortest_path.ShortestPathParams:
    """The grid shortest-path generator's parameters from the run config."""
    from hetfed.problems import shortest_path

    return shortest_path.ShortestPathParams(
        grid_size=cfg["grid-size"],
        num_features=cfg["num-features"],
        degree=cfg["degree"],
        noise=cfg["sp-noise"],
        terrain=cfg["sp-terrain"],
        endpoints=cfg["sp-endpoints"],
        n_train=cfg["n-train"],
        n_val=cfg["n-val"],
        n_test=cfg["n-test"],
    )


# --- energy purchasing (hetfed.problems.energy) -----------------------------------------------------
def energy_zones(cfg: RunConfig) -> tuple[str, ...]:
    """The ERCOT zones of the run, partition i taking the i-th: ``energy-zones`` or all of ERCOT_ZONES."""
    from hetfed.problems import energy

    return energy.parse_zones(str(cfg["energy-zones"]))


def ercot_client(cfg: RunConfig, pid: int, n: int, path: Path | None) -> DecisionClientData:
    """Partition ``pid`` of the ERCOT task: zone ``energy_zones(cfg)[pid]``, read from the node's
    ``data-path`` (a directory made by ``hetfed data ercot``) or, without one, the cache."""
    zones = energy_zones(cfg)
    if not 0 <= pid < n <= len(zones):
        raise ValueError(
            f"problem 'energy': num-partitions {n} needs at most {len(zones)} zones (energy-zones) "
            f"and partition-id {pid} in [0, {n})"
        )
    from hetfed.problems import energy

    return energy.ercot_zone_client(
        zones[pid],
        pid,
        str(path) if path else "",
        cfg["energy-exclude-storm"],
        cfg["energy-train-days"],
        cfg["energy-quota"],
    )


def pjm_client(cfg: RunConfig, pid: int, n: int, path: Path | None) -> DecisionClientData:
    """Partition ``pid`` of a PJM-layout CSV (the node's ``data-path``), see hetfed.problems.energy."""
    if path is None:
        raise ValueError("problem 'energy-pjm' needs a node data-path: a CSV in the PJM layout (PJM_COLUMNS)")
    from hetfed.problems import energy

    data = energy.load_pjm_client(path, pid, n)
    return energy.restrict_training(data, energy.last_days(len(data.train), cfg["energy-train-days"]))


def ercot_dims(cfg: RunConfig) -> tuple[int, int]:
    """Model sizes of the ERCOT task; checks ``energy-zones`` on the server before round 1."""
    from hetfed.problems import energy

    energy_zones(cfg)
    return len(energy.FEATURE_NAMES), energy.HOURS


def pjm_dims(cfg: RunConfig) -> tuple[int, int]:
    """Model sizes of a PJM-layout task."""
    from hetfed.problems import energy

    return len(energy.PJM_FEATURES), energy.HOURS


# --- a silo's own LP and samples (hetfed.problems.lp) ---------------------------------------------
def lp_names(cfg: RunConfig) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """``(lp-features, lp-variables)``: the model's inputs and outputs, checked (the server's and every
    silo's view: the model's size comes from these keys, never from a silo's data)."""
    from hetfed.problems.lp import parse_names

    if cfg["lp-train-fraction"] + cfg["lp-val-fraction"] >= 1:
        raise ValueError(
            "run config 'lp-val-fraction': lp-train-fraction + lp-val-fraction must be < 1 "
            "(the rest is the test split)"
        )
    features = parse_names(cfg["lp-features"], "lp-features")
    return features, parse_names(cfg["lp-variables"], "lp-variables", variables=True)


def lp_client(cfg: RunConfig, pid: int, n: int, path: Path | None) -> DecisionClientData:
    """Silo ``pid``'s own LP file and samples.csv, in the folder of its node's ``data-path``."""
    if path is None:
        raise ValueError(
            "problem 'lp' needs a node data-path: a folder with problem.lp (or .mps) and samples.csv"
        )
    from hetfed.problems import lp

    features, variables = lp_names(cfg)
    return lp.load_client(
        path,
        pid,
        features,
        variables,
        cfg["lp-relax-integers"],
        cfg["lp-train-fraction"],
        cfg["lp-val-fraction"],
    )


def model_io_names(cfg: RunConfig) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The names of a run's model inputs and outputs where the run config gives them (problem
    ``lp``; ``tabular``: its features, the output is the logit of ``label``), else empty: a manifest
    records them."""
    if cfg.get("problem") == "tabular":
        from hetfed.problems.lp import parse_names
        from hetfed.problems.tabular import LABEL

        return parse_names(cfg["tabular-features"], "tabular-features"), (LABEL,)
    return lp_names(cfg) if cfg.get("problem") == "lp" else ((), ())


def lp_dims(cfg: RunConfig) -> tuple[int, int]:
    features, variables = lp_names(cfg)
    return len(features), len(variables)


def knapsack_client(cfg: RunConfig, pid: int, n: int, path: Path | None) -> DecisionClientData:
    """Partition ``pid`` of the generated knapsack task."""
    from hetfed.problems import knapsack

    return knapsack.load_client(knapsack_params(cfg), cfg["seed"], pid)


def shortest_path_client(cfg: RunConfig, pid: int, n: int, path: Path | None) -> DecisionClientData:
    """Partition ``pid`` of the generated grid shortest-path task."""
    from hetfed.problems import shortest_path

    return shortest_path.load_client(shortest_path_params(cfg), cfg["seed"], pid)


def garnet_agent(cfg: RunConfig, partition_id: int) -> garnet.GarnetAgent:
    """Agent ``partition_id`` of the Garnet federation the run config describes (docs/algorithms.md 3)."""
    from hetfed.problems import garnet

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


# Constrained tasks (hetfed.problems.constrained): module, and run-config key -> task parameter.
CONSTRAINED: dict[str, tuple[str, dict[str, str]]] = {
    "np-classification": (
        "hetfed.problems.np_classification",
        {"np-r": "r", "np-dirichlet-alpha": "dirichlet_alpha", "np-min-per-class": "min_per_class"},
    ),
    "fair-classification": (
        "hetfed.problems.fair_classification",
        {
            "fair-delta": "delta",
            "fair-hidden": "hidden",
            "fair-split-by": "split_by",
            "fair-protected": "protected",
        },
    ),
    "safe-rl": (
        "hetfed.problems.safe_rl",
        {
            "rl-horizon": "horizon",
            "rl-budget": "budget",
            "rl-heterogeneity": "heterogeneity",
            "rl-hidden": "hidden",
            "rl-eval-episodes": "eval_episodes",
            "rl-fall-cost": "fall_cost",
            "rl-advantage": "advantage",
            "rl-gae-lambda": "gae_lambda",
            "rl-trust-region": "trust_region",
        },
    ),
    "quadratic": ("hetfed.problems.quadratic", {"quadratic-dim": "dim"}),
    "tabular": (
        "hetfed.problems.tabular",
        {
            "tabular-features": "features",
            "tabular-constraint": "constraint",
            "tabular-group": "group",
            "tabular-delta": "delta",
            "tabular-r": "r",
            "tabular-hidden": "hidden",
            "tabular-test-fraction": "test_fraction",
        },
    ),
}
DATA_DIR_PARAM = {"fair-classification": "data_dir", "tabular": "data_dir"}  # tasks reading a data-path


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
        load_client=knapsack_client,
        model_dims=lambda cfg: (cfg["num-features"], cfg["num-items"]),
    ),
    "energy": ProblemSpec(name="energy", family="decision", load_client=ercot_client, model_dims=ercot_dims),
    "energy-pjm": ProblemSpec(
        name="energy-pjm",
        family="decision",
        load_client=pjm_client,
        model_dims=pjm_dims,
    ),
    "shortest-path": ProblemSpec(
        name="shortest-path",
        family="decision",
        load_client=shortest_path_client,
        model_dims=lambda cfg: (cfg["num-features"], shortest_path_params(cfg).num_edges),
    ),
    "lp": ProblemSpec(name="lp", family="decision", load_client=lp_client, model_dims=lp_dims),
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
