"""The problems: name -> its family, its typed parameters and the functions that build it.

Each problem declares, as :class:`Problem`, its family, a :class:`hetfed.params.Params` dataclass
whose fields are its run-config keys (so the schema, ``hetfed config`` and pyproject.toml's table
come from it, as for the methods, hetfed/methods) and its loaders as ``module:function`` names,
imported only when a run builds that problem (problems/registry.py: ``get_problem``), so looking up
a problem imports only that problem. A problem defined outside the package registers itself with
``hetfed.config.register_problem`` (docs/algorithms.md 5, "How to add a decision problem").

Keys several problems read (``num-features``, ``degree``, ``n-train``, ...) are fields of one shared
base (:class:`SyntheticData`), so they mean the same in each.
"""

from __future__ import annotations

from dataclasses import dataclass

from hetfed.params import Params, param


@dataclass(frozen=True)
class Problem:
    """One problem of the registry: its family and typed parameters, and its functions by
    ``module:function`` name. The family fixes what they take and return:

    * ``decision`` (features -> LP costs, docs/algorithms.md 1) and ``lsa`` (A theta = b, 3):
      ``load_client(params, seed, partition_id, num_partitions, data_path)`` -> the client's private
      data (:class:`hetfed.problems.base.DecisionClientData`, a Garnet agent), and
      ``model_dims(params)`` -> (inputs, outputs) of the model the server builds;
    * ``constrained`` (f_i, g_i tasks, 2): the task protocol of problems/constrained.py,
      ``load_client(partition_id, num_partitions, seed, **fields)`` and ``make_model(seed, **fields)``
      with the parameters' fields by name.
    """

    family: str
    params: type[Params]
    load_client: str
    model_dims: str = ""
    make_model: str = ""

    def __post_init__(self) -> None:
        if self.family not in FAMILIES:
            raise ValueError(f"unknown problem family {self.family!r}; choose one of {list(FAMILIES)}")
        needs = "make_model" if self.family == "constrained" else "model_dims"
        if not getattr(self, needs):
            raise ValueError(f"a {self.family} problem needs its {needs} ('module:function')")


FAMILIES = ("decision", "constrained", "lsa")


# --- decision problems (docs/algorithms.md section 1) ------------------------------------------------
@dataclass(frozen=True)
class SyntheticData(Params):
    """The generated decision problems' features and sample counts (knapsack, shortest path)."""

    num_features: int = param(8, "Features p", low=1)
    degree: int = param(4, "Polynomial degree of the feature-to-cost map", low=1)
    n_train: int = param(100, "Training samples per client", low=1)
    n_val: int = param(10, "Validation samples per client", low=1)
    n_test: int = param(100, "Test samples per client", low=1)


@dataclass(frozen=True)
class KnapsackParams(SyntheticData):
    """Size and heterogeneity of the synthetic knapsack federation (problems/knapsack.py, 1.7)."""

    num_items: int = param(50, "Knapsack items d", low=1)
    capacity_ratio: float = param(0.6, "Base capacity C = ratio * d", low=0.0)
    eta_o: float = param(0.0, "Objective heterogeneity (rotation of B_j)", low=0.0)
    eta_c: float = param(0.0, "Constraint heterogeneity (capacities and weights)", low=0.0)
    eta_d: float = param(0.0, "Data heterogeneity (feature location and scale)", low=0.0)


ENDPOINTS = ("corners", "diagonals", "random")


@dataclass(frozen=True)
class ShortestPathParams(SyntheticData):
    """Size, cost law and heterogeneity of the grid shortest-path federation (problems/shortest_path.py);
    ``num_features`` defaults to the run config's 8 (PyEPO's p = 5: reproduce shortest-path)."""

    grid_size: int = param(5, "Shortest path: k of the k x k grid (PyEPO: 5; 12 works too)", low=2)
    endpoints: str = param(
        "random",
        "Shortest path: sources/sinks: corners (all top-left -> bottom-right), diagonals, random",
        choices=ENDPOINTS,
        key="sp-endpoints",
    )
    terrain: float = param(
        0.5, "Shortest path: terrain heterogeneity t (edge multipliers exp(t h_j))", low=0.0, key="sp-terrain"
    )
    noise: float = param(
        0.5, "Shortest path: multiplicative noise U[1 - w, 1 + w], w < 1", low=0.0, high=0.99, key="sp-noise"
    )

    @property
    def num_edges(self) -> int:
        """``d = 2k(k-1)`` edge slots."""
        return 2 * self.grid_size * (self.grid_size - 1)


@dataclass(frozen=True)
class EnergyParams(Params):
    """Energy purchasing (quota sets, docs/algorithms.md 1.2): energy (ERCOT), energy-pjm (a PJM-layout
    CSV)."""

    zones: str = param(
        "",
        "Energy: comma-separated ERCOT zones, partition i takes the i-th; empty = all 13 (ERCOT_ZONES)",
        key="energy-zones",
    )
    exclude_storm: bool = param(
        False,
        "Energy: drop the Feb 2021 winter-storm days (2021-02-12..20, up to $9,000/MWh) from training",
        key="energy-exclude-storm",
    )
    train_days: int = param(
        0,
        "Energy: train on only the last K days of the training split (cold start); 0 = all",
        low=0,
        key="energy-train-days",
    )
    quota: int = param(
        0,
        "Energy: every zone buys this many hours a day (equal demands); 0 = D_j = 4 + (5 k mod 9)",
        low=0,
        high=24,
        key="energy-quota",
    )


@dataclass(frozen=True)
class LPParams(Params):
    """A silo's own LP and samples (problems/lp.py, 1.8): the model's inputs and outputs, the same on
    every silo."""

    features: str = param(
        "", "Own LP: comma-separated feature columns of samples.csv (the model's inputs)", key="lp-features"
    )
    variables: str = param(
        "", "Own LP: comma-separated variables of the LP file (the model's outputs)", key="lp-variables"
    )
    relax_integers: bool = param(
        False,
        "Own LP: relax integer/binary variables to their bounds (else refused)",
        key="lp-relax-integers",
    )
    train_fraction: float = param(
        0.5,
        "Own LP: share of the rows (file order) that train when samples.csv has no split column",
        low=0.0,
        high=1.0,
        low_open=True,
        key="lp-train-fraction",
    )
    val_fraction: float = param(
        0.1,
        "Own LP: share of the rows that validate when samples.csv has no split column (the rest test)",
        low=0.0,
        high=1.0,
        low_open=True,
        key="lp-val-fraction",
    )


# --- constrained tasks (docs/algorithms.md section 2): fields named as the tasks' parameters ----------
@dataclass(frozen=True)
class TabularParams(Params):
    """A silo's own table for the constrained classification tasks (problems/tabular.py): the model's
    inputs and the constraint, the same on every silo."""

    features: str = param(
        "",
        "Tabular: comma-separated feature columns of each silo's samples.csv (the model's inputs)",
        key="tabular-features",
    )
    constraint: str = param(
        "fairness",
        "Tabular: g_i = demographic-parity gap - tabular-delta (fairness, reads tabular-group) or the "
        "class-1 logistic loss - tabular-r (neyman-pearson; f_i = the class-0 loss)",
        choices=("fairness", "neyman-pearson"),
        key="tabular-constraint",
    )
    group: str = param(
        "",
        "Tabular, fairness: the 0/1 group column of samples.csv the parity gap reads (1 = protected)",
        key="tabular-group",
    )
    delta: float = param(
        0.05, "Tabular, fairness: demographic-parity tolerance delta", low=0.0, key="tabular-delta"
    )
    r: float = param(
        0.2, "Tabular, neyman-pearson: bound r on the class-1 logistic loss", low=0.0, key="tabular-r"
    )
    hidden: int = param(
        0, "Tabular: MLP hidden units (ReLU); 0 = logistic regression", low=0, key="tabular-hidden"
    )
    test_fraction: float = param(
        0.2,
        "Tabular: share of the rows (the last, file order) held out for test when samples.csv has no "
        "split column (< 1)",
        low=0.0,
        high=0.99,
        key="tabular-test-fraction",
    )


@dataclass(frozen=True)
class NPClassificationParams(Params):
    """Neyman-Pearson classification (problems/np_classification.py)."""

    r: float = param(0.2, "NP classification: bound r on the class-1 loss", low=0.0, key="np-r")
    dirichlet_alpha: float = param(
        0.5, "NP classification: Dirichlet label skew", low=0.0, low_open=True, key="np-dirichlet-alpha"
    )
    min_per_class: int = param(
        5, "NP classification: rows of each class per client", low=0, key="np-min-per-class"
    )


@dataclass(frozen=True)
class FairClassificationParams(Params):
    """Fair classification on Adult (problems/fair_classification.py)."""

    delta: float = param(
        0.05, "Fair classification: demographic-parity tolerance delta", low=0.0, key="fair-delta"
    )
    hidden: int = param(32, "Fair classification: MLP hidden units", low=1, key="fair-hidden")
    split_by: str = param(
        "race",
        "Fair classification: client attribute",
        choices=("race", "workclass", "sex"),
        key="fair-split-by",
    )
    protected: str = param(
        "sex", "Fair classification: protected attribute", choices=("sex", "race"), key="fair-protected"
    )


@dataclass(frozen=True)
class SafeRLParams(Params):
    """Safe reinforcement learning (problems/safe_rl.py)."""

    horizon: int = param(200, "Safe RL: episode length H", low=1, key="rl-horizon")
    budget: float = param(0.05, "Safe RL: cost budget (fraction of H)", low=0.0, high=1.0, key="rl-budget")
    heterogeneity: float = param(
        0.5, "Safe RL: spread of the clients' physics", low=0.0, high=1.5, key="rl-heterogeneity"
    )
    hidden: int = param(0, "Safe RL: policy hidden units (0 = linear)", low=0, key="rl-hidden")
    eval_episodes: int = param(32, "Safe RL: evaluation episodes per client", low=1, key="rl-eval-episodes")
    fall_cost: bool = param(
        True, "Safe RL: a fall also costs the steps left to the horizon", key="rl-fall-cost"
    )
    advantage: str = param(
        "gae",
        "Safe RL: policy-gradient weights (reward-to-go, or gae: advantages over a fitted value baseline)",
        choices=("reward-to-go", "gae"),
        key="rl-advantage",
    )
    gae_lambda: float = param(
        1.0, "Safe RL: lambda of the generalised advantage estimate", low=0.0, high=1.0, key="rl-gae-lambda"
    )
    trust_region: float = param(
        0.01,
        "Safe RL: KL radius of a natural-gradient local step (TRPO's); 0 = plain steps",
        low=0.0,
        key="rl-trust-region",
    )


@dataclass(frozen=True)
class QuadraticParams(Params):
    """The quadratic test problem (problems/quadratic.py)."""

    dim: int = param(3, "Quadratic test problem: dimension of w", low=1, key="quadratic-dim")


# --- linear stochastic approximation (docs/algorithms.md section 3) ----------------------------------
@dataclass(frozen=True)
class GarnetParams(Params):
    """Garnet MDPs for federated TD(0) (problems/garnet.py)."""

    seed: int = param(
        -1, "Seed of the Garnet MDPs; -1 = seed (fix it to vary only the samples)", low=-1, key="garnet-seed"
    )
    states: int = param(10, "Garnet: states", low=2, key="garnet-states")
    actions: int = param(10, "Garnet: actions (uniform random policy)", low=1, key="garnet-actions")
    branching: int = param(3, "Garnet: next states per (state, action)", low=1, key="garnet-branching")
    dim: int = param(5, "Garnet: feature dimension d (the size of theta)", low=1, key="garnet-dim")
    gamma: float = param(0.95, "Garnet: discount factor (< 1)", low=0.0, high=1.0, key="garnet-gamma")
    zeta_ker: float = param(
        0.0, "Garnet: transition-kernel heterogeneity zeta_ker", low=0.0, key="garnet-zeta-ker"
    )
    zeta_rew: float = param(0.0, "Garnet: reward heterogeneity zeta_rew", low=0.0, key="garnet-zeta-rew")


def _task(module: str, params: type[Params]) -> Problem:
    """The constrained task of problems/<module>.py (its ``load_client`` and ``make_model``)."""
    where = f"hetfed.problems.{module}"
    return Problem("constrained", params, f"{where}:load_client", make_model=f"{where}:make_model")


# The built-in problems, in the order of their keys in the schema. The decision and LSA problems'
# loaders adapt their modules' functions to the family's signature (problems/registry.py).
REGISTRY = "hetfed.problems.registry"
PROBLEMS: dict[str, Problem] = {
    "knapsack": Problem(
        "decision", KnapsackParams, f"{REGISTRY}:knapsack_client", f"{REGISTRY}:knapsack_dims"
    ),
    "energy": Problem("decision", EnergyParams, f"{REGISTRY}:ercot_client", f"{REGISTRY}:ercot_dims"),
    "energy-pjm": Problem("decision", EnergyParams, f"{REGISTRY}:pjm_client", f"{REGISTRY}:pjm_dims"),
    "shortest-path": Problem(
        "decision", ShortestPathParams, f"{REGISTRY}:shortest_path_client", f"{REGISTRY}:shortest_path_dims"
    ),
    "lp": Problem("decision", LPParams, f"{REGISTRY}:lp_client", f"{REGISTRY}:lp_dims"),
    "tabular": _task("tabular", TabularParams),
    "garnet": Problem("lsa", GarnetParams, f"{REGISTRY}:garnet_client", f"{REGISTRY}:garnet_dims"),
    "np-classification": _task("np_classification", NPClassificationParams),
    "fair-classification": _task("fair_classification", FairClassificationParams),
    "safe-rl": _task("safe_rl", SafeRLParams),
    "quadratic": _task("quadratic", QuadraticParams),
}
