"""Problem names -> how a client loads its own data and what the server must know.

The problems are declared in hetfed/problem_params.py (:data:`hetfed.problem_params.PROBLEMS`: family,
typed parameters, loaders by ``module:function``); :func:`get_problem` turns a declaration into the
:class:`ProblemSpec` a run calls with its run config. The server never loads client data: it only
needs the model, derived from the run config alone: its input/output sizes
(:attr:`ProblemSpec.model_dims`, decision and LSA problems) or the model itself
(:attr:`ProblemSpec.make_model`, constrained tasks). Below are the built-in decision and LSA
problems' loaders, each adapting its module's functions to the family's signature.

Problem modules are imported when a spec's function first needs them, so looking up a
problem imports only that problem (the Garnet LSA task: NumPy, no torch, no SciPy).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from pkgutil import resolve_name
from typing import TYPE_CHECKING, Any

from hetfed.problem_params import (
    PROBLEMS,
    EnergyParams,
    GarnetParams,
    KnapsackParams,
    LPParams,
    Problem,
    ShortestPathParams,
)

if TYPE_CHECKING:
    from hetfed.problems import garnet
    from hetfed.problems.base import DecisionClientData

RunConfig = Mapping[str, Any]


@dataclass(frozen=True)
class ProblemSpec:
    """How to build one problem: a client's private data and the server's model size."""

    name: str
    family: str  # "decision" (features -> LP costs), "constrained" (f_i, g_i tasks), "lsa" (A theta = b)
    load_client: Callable[[RunConfig, int, int, Path | None], Any]
    model_dims: Callable[[RunConfig], tuple[int, int]] | None = None  # decision and LSA problems
    make_model: Callable[[RunConfig], Any] | None = None  # constrained tasks: the seeded torch model


def get_problem(name: str) -> ProblemSpec:
    """The spec of problem ``name`` (a clear error for an unknown name): its declared functions
    (imported on first call) called with its parameters read from the run config."""
    try:
        problem = PROBLEMS[name]
    except KeyError:
        raise ValueError(f"unknown problem {name!r}; choose one of {sorted(PROBLEMS)}") from None
    if problem.family == "constrained":
        return _constrained_spec(name, problem)
    read = problem.params.from_config

    def load(cfg: RunConfig, pid: int, n: int, path: Path | None) -> Any:
        return resolve_name(problem.load_client)(read(cfg), int(cfg["seed"]), pid, n, path)

    def dims(cfg: RunConfig) -> tuple[int, int]:
        sizes: tuple[int, int] = resolve_name(problem.model_dims)(read(cfg))
        return sizes

    return ProblemSpec(name, problem.family, load, model_dims=dims)


# --- constrained tasks (hetfed.problems.constrained): the task protocol, fields by name ---------------
DATA_DIR_PARAM = {"fair-classification": "data_dir", "tabular": "data_dir"}  # tasks reading a data-path


@functools.lru_cache(maxsize=64)
def _constrained_client(name: str, pid: int, n: int, seed: int, params: Any, data_path: str) -> Any:
    """Cached per process on the task's own parameters (not the run name): runs share loaded tasks."""
    kwargs = dataclasses.asdict(params)
    if data_path and name in DATA_DIR_PARAM:
        kwargs[DATA_DIR_PARAM[name]] = data_path
    return resolve_name(PROBLEMS[name].load_client)(pid, n, seed, **kwargs)


def _constrained_spec(name: str, problem: Problem) -> ProblemSpec:
    def load(cfg: RunConfig, pid: int, n: int, path: Path | None) -> Any:
        params = problem.params.from_config(cfg)
        return _constrained_client(name, pid, n, int(cfg["seed"]), params, str(path) if path else "")

    def make_model(cfg: RunConfig) -> Any:
        params = dataclasses.asdict(problem.params.from_config(cfg))
        return resolve_name(problem.make_model)(int(cfg["seed"]), **params)

    return ProblemSpec(name, "constrained", load, make_model=make_model)


# --- the generated decision problems (hetfed.problems.knapsack, .shortest_path) ---------------------
def knapsack_client(
    params: KnapsackParams, seed: int, pid: int, n: int, path: Path | None
) -> DecisionClientData:
    """Partition ``pid`` of the generated knapsack task."""
    from hetfed.problems import knapsack

    return knapsack.load_client(params, seed, pid)


def knapsack_dims(params: KnapsackParams) -> tuple[int, int]:
    return params.num_features, params.num_items


def shortest_path_client(
    params: ShortestPathParams, seed: int, pid: int, n: int, path: Path | None
) -> DecisionClientData:
    """Partition ``pid`` of the generated grid shortest-path task."""
    from hetfed.problems import shortest_path

    return shortest_path.load_client(params, seed, pid)


def shortest_path_dims(params: ShortestPathParams) -> tuple[int, int]:
    return params.num_features, params.num_edges


# --- energy purchasing (hetfed.problems.energy) -----------------------------------------------------
def energy_zones(params: EnergyParams) -> tuple[str, ...]:
    """The ERCOT zones of the run, partition i taking the i-th: ``energy-zones`` or all of ERCOT_ZONES."""
    from hetfed.problems import energy

    return energy.parse_zones(params.zones)


def ercot_client(params: EnergyParams, seed: int, pid: int, n: int, path: Path | None) -> DecisionClientData:
    """Partition ``pid`` of the ERCOT task: zone ``energy_zones(params)[pid]``, read from the node's
    ``data-path`` (a directory made by ``hetfed data ercot``) or, without one, the cache."""
    zones = energy_zones(params)
    if not 0 <= pid < n <= len(zones):
        raise ValueError(
            f"problem 'energy': num-partitions {n} needs at most {len(zones)} zones (energy-zones) "
            f"and partition-id {pid} in [0, {n})"
        )
    from hetfed.problems import energy

    return energy.ercot_zone_client(
        zones[pid], pid, str(path) if path else "", params.exclude_storm, params.train_days, params.quota
    )


def pjm_client(params: EnergyParams, seed: int, pid: int, n: int, path: Path | None) -> DecisionClientData:
    """Partition ``pid`` of a PJM-layout CSV (the node's ``data-path``), see hetfed.problems.energy."""
    if path is None:
        raise ValueError("problem 'energy-pjm' needs a node data-path: a CSV in the PJM layout (PJM_COLUMNS)")
    from hetfed.problems import energy

    data = energy.load_pjm_client(path, pid, n)
    return energy.restrict_training(data, energy.last_days(len(data.train), params.train_days))


def ercot_dims(params: EnergyParams) -> tuple[int, int]:
    """Model sizes of the ERCOT task; checks ``energy-zones`` on the server before round 1."""
    from hetfed.problems import energy

    energy_zones(params)
    return len(energy.FEATURE_NAMES), energy.HOURS


def pjm_dims(params: EnergyParams) -> tuple[int, int]:
    """Model sizes of a PJM-layout task."""
    from hetfed.problems import energy

    return len(energy.PJM_FEATURES), energy.HOURS


# --- a silo's own LP and samples (hetfed.problems.lp) ---------------------------------------------
def lp_names(params: LPParams) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """``(lp-features, lp-variables)``: the model's inputs and outputs, checked (the server's and every
    silo's view: the model's size comes from these keys, never from a silo's data)."""
    from hetfed.problems.lp import parse_names

    if params.train_fraction + params.val_fraction >= 1:
        raise ValueError(
            "run config 'lp-val-fraction': lp-train-fraction + lp-val-fraction must be < 1 "
            "(the rest is the test split)"
        )
    features = parse_names(params.features, "lp-features")
    return features, parse_names(params.variables, "lp-variables", variables=True)


def lp_client(params: LPParams, seed: int, pid: int, n: int, path: Path | None) -> DecisionClientData:
    """Silo ``pid``'s own LP file and samples.csv, in the folder of its node's ``data-path``."""
    if path is None:
        raise ValueError(
            "problem 'lp' needs a node data-path: a folder with problem.lp (or .mps) and samples.csv"
        )
    from hetfed.problems import lp

    features, variables = lp_names(params)
    return lp.load_client(
        path, pid, features, variables, params.relax_integers, params.train_fraction, params.val_fraction
    )


def lp_dims(params: LPParams) -> tuple[int, int]:
    features, variables = lp_names(params)
    return len(features), len(variables)


def model_io_names(cfg: RunConfig) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The names of a run's model inputs and outputs where the run config gives them (problem
    ``lp``; ``tabular``: its features, the output is the logit of ``label``), else empty: a manifest
    records them."""
    if cfg.get("problem") == "tabular":
        from hetfed.problems.lp import parse_names
        from hetfed.problems.tabular import LABEL

        return parse_names(cfg["tabular-features"], "tabular-features"), (LABEL,)
    return lp_names(LPParams.from_config(cfg)) if cfg.get("problem") == "lp" else ((), ())


# --- Garnet MDPs for federated TD(0) (hetfed.problems.garnet, docs/algorithms.md 3) ------------------
def garnet_client(params: GarnetParams, seed: int, pid: int, n: int, path: Path | None) -> garnet.GarnetAgent:
    """Agent ``pid`` of the Garnet federation of ``garnet-seed`` (-1: the run's seed)."""
    from hetfed.problems import garnet

    return garnet.make_agent(
        pid,
        params.seed if params.seed >= 0 else seed,
        params.zeta_ker,
        params.zeta_rew,
        n_states=params.states,
        n_actions=params.actions,
        branching=params.branching,
        dim=params.dim,
        gamma=params.gamma,
    )


def garnet_dims(params: GarnetParams) -> tuple[int, int]:
    # theta is the linear value function V(s) = phi(s)'theta: d features in, one value out
    return params.dim, 1
