"""docs/algorithms.md "How to add a decision problem", done once: a problem defined in this file only
(its typed parameters, its loader and model size, and its registration) becomes a choice of the run
config with its keys, runs as a real federation on the inline engine, and every client's reported test
regret equals the regret of the run's saved global model recomputed here by brute force.

The problem, budgeted selection: client j picks at most ``k_j = 1 + j mod (d - 1)`` of ``d`` items,
``S_j = {w in [0, 1]^d : sum(w) <= k_j}`` (a general polytope: HiGHS solves its LPs), with costs
``c = (B x / sqrt(p))^degree + 0.1 eps``, ``B ~ N(0, 1)^{d x p}`` shared, ``x, eps ~ N(0, I)``.
The set is integral (one totally unimodular row), so ``min_{w in S_j} c'w`` is attained at a 0/1
vector with at most ``k_j`` ones: the reference enumerates those.

The registration runs in a fresh interpreter, as it would in each process of a run, so this test
leaves the registry of the processes running the other tests as it was.
"""

from __future__ import annotations

import itertools
import json
import math
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from hetfed.config import Problem, register_problem
from hetfed.params import param
from hetfed.problem_params import SyntheticData
from hetfed.problems.base import DecisionClientData, generated_client
from hetfed.problems.polytope import Polytope
from tests.conftest import REPO

NAME = "budget-test"
MODULE = "tests.test_add_a_problem"


@dataclass(frozen=True)
class BudgetParams(SyntheticData):
    """The generated data's keys (num-features, degree, n-train, ..., shared with knapsack and
    shortest path) and the problem's own."""

    items: int = param(5, "Budget selection: items d", low=2, key="budget-items")


def budget(params: BudgetParams, partition_id: int) -> int:
    """Client ``partition_id``'s budget ``k_j``."""
    return 1 + partition_id % (params.items - 1)


def load_client(
    params: BudgetParams, seed: int, partition_id: int, num_partitions: int, data_path: Path | None
) -> DecisionClientData:
    """Client ``partition_id``'s train, validation and test draws and its polytope ``S_j``."""
    d, p = params.items, params.num_features
    B = np.random.default_rng(np.random.SeedSequence([seed])).standard_normal((d, p))
    rng = np.random.default_rng(np.random.SeedSequence([seed, 1 + partition_id]))

    def draw(n: int) -> tuple[np.ndarray, np.ndarray]:
        x = rng.standard_normal((n, p))
        return x, (x @ B.T / math.sqrt(p)) ** params.degree + 0.1 * rng.standard_normal((n, d))

    polytope = Polytope(A_ub=np.ones((1, d)), b_ub=[budget(params, partition_id)], lb=0.0, ub=1.0)
    return generated_client(
        partition_id, [draw(n) for n in (params.n_train, params.n_val, params.n_test)], polytope
    )


def model_dims(params: BudgetParams) -> tuple[int, int]:
    return params.num_features, params.items


def register() -> None:
    """What the problem's module does once, at import, in every process of a run."""
    register_problem(NAME, Problem("decision", BudgetParams, f"{MODULE}:load_client", f"{MODULE}:model_dims"))


RUN = {
    "strategy": "fedavg",
    "problem": NAME,
    "budget-items": 5,
    "degree": 1,  # a linear cost model: the linear predictor (hidden 0) can learn it
    "num-features": 4,
    "n-train": 40,
    "n-test": 30,
    "hidden": 0,
    "loss": "spo+",
    "fraction": 1.0,
    "local-epochs": 2,
    "lr": 0.05,
    "num-rounds": 3,
    "personal-rounds": 0,
    "run-name": "budget",
}
CLIENTS = 3

# In a fresh interpreter: register, check the schema and the registry's refusals, run the federation.
SCRIPT = """
import json, sys
from dataclasses import dataclass
from hetfed.config import PROBLEM_KEYS, PROBLEMS, SCHEMA, Problem, register_problem, validate
from hetfed.engines.inline import node_configs, run_inline
from hetfed.params import Params, param
from hetfed.problems.registry import get_problem
from tests.test_add_a_problem import CLIENTS, NAME, RUN, register

@dataclass(frozen=True)
class Clash(Params):
    n_train: int = param(7, "Rows per client", low=1)  # knapsack's n-train, another default and help

unknown = []
for cfg in ({"problem": NAME}, {"budget-items": 3}):
    try:
        validate(cfg)
    except ValueError as err:
        unknown.append(str(err))
register()
refused = []
for name in (NAME, "other"):
    try:
        register_problem(name, Problem("decision", Clash, "m:f", "m:g"))
    except ValueError as err:
        refused.append(str(err))
cfg = validate(RUN)
summary = run_inline({**RUN, "results-dir": sys.argv[1]}, node_configs(CLIENTS))
print(json.dumps({
    "unknown": unknown,
    "refused": refused,
    "choice": NAME in SCHEMA["problem"].choices and "other" not in PROBLEMS,
    "keys": {k: (k in SCHEMA, k in PROBLEM_KEYS) for k in ("budget-items", "n-train")},
    "validated": [cfg["budget-items"], cfg["n-val"]],
    "dims": list(get_problem(NAME).model_dims(cfg)),
    "status": summary["status"],
    "clients": summary["clients"],
}))
"""


def vertices(k: int, d: int) -> np.ndarray:
    """The 0/1 vectors with at most ``k`` ones: the vertices of ``S_j``."""
    return np.array([w for w in itertools.product((0.0, 1.0), repeat=d) if sum(w) <= k])


def test_a_problem_defined_here_runs_a_federation_and_its_regret_matches_brute_force(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path)], cwd=REPO, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    # Before registering, the problem and its key are unknown; after, both are run-config choices/keys.
    assert "'problem': unknown value 'budget-test'" in out["unknown"][0]
    assert "unknown key 'budget-items'" in out["unknown"][1]
    assert out["choice"] and out["keys"] == {"budget-items": [True, True], "n-train": [True, True]}
    assert out["validated"] == [5, 10] and out["dims"] == [4, 5]
    assert "registered already" in out["refused"][0]
    assert "'n-train' is a run-config key of another meaning" in out["refused"][1]
    assert out["status"] == "completed"

    # The reference: the saved global model's decisions on each client's test split, by enumeration.
    params = BudgetParams.from_config(RUN)
    weight = np.load(tmp_path / "budget" / "models.npz")["global/0.weight"]  # c_hat = W x (hidden 0)
    assert out["clients"].keys() == {f"client-{j:02d}" for j in range(CLIENTS)}
    for j in range(CLIENTS):
        test = load_client(params, 42, j, CLIENTS, None).test
        x, c = test.x.numpy(), test.c.numpy()
        V = vertices(budget(params, j), params.items)
        z_star = (c @ V.T).min(axis=1)
        chosen = V[np.argmin(x @ weight.T @ V.T, axis=1)]
        regret = (c * chosen).sum(axis=1) - z_star
        reported = out["clients"][f"client-{j:02d}"]
        assert reported["fed-num-examples"] == RUN["n-test"]
        assert reported["fed-abs-opt-sum"] == pytest.approx(np.abs(z_star).sum(), rel=1e-12)
        assert reported["fed-regret-sum"] == pytest.approx(regret.sum(), rel=1e-12, abs=1e-12)
        assert (
            0 < regret.sum() < np.abs(z_star).sum()
        )  # a trained model: better than no decision, not perfect
