"""Synthetic fractional knapsack with three heterogeneity axes (docs/algorithms.md 1.7).

Client j maximises item value under its own capacity, stored as the minimisation
``min_{w in S_j} c'w`` with negative costs and
``S_j = {0 <= w <= 1, a_j'w <= C_j}``. Generative law, with ``f(eta) =
max(2 Beta(1/eta, 1/eta), 1e-9)`` (mean 1, ``f(0) = 1``)::

    B      = Bernoulli(0.5)^{d x p} * u,  u_k ~ U[0.5, 1.5] per item      (shared)
    B_j    = B expm(eta_o G_j / ||G_j||_F),  G_j = A - A',  A ~ N(0,1)^{p x p}
    a_base ~ U[0.5, 1.5]^d,  C_base = ratio * d                             (shared)
    C_j    = C_base f(eta_c);  a_j = a_base * f(eta_c) per item
    mu_j   = eta_d N(0, I_p);  s_j = f(eta_d) per feature;  x = mu_j + s_j * N(0, I_p)
    signal = -(1 + (1 + B_j x / sqrt(p))^deg);  c = signal / mean|signal|   (per split)

Random streams: the shared parts come from ``SeedSequence([seed])``; client j's
parts from ``SeedSequence([seed, 1 + j])``, so a client draws its own data without
generating anyone else's, and client j's data do not depend on how many clients
there are. Features are z-scored with the client's own training statistics.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hetfed.problem_params import KnapsackParams  # the run config's knapsack keys, typed
from hetfed.problems.base import DecisionClientData, generated_client


@dataclass(frozen=True)
class KnapsackClientLaw:
    """Client j's generative law: everything except the sampled features/noise."""

    B: np.ndarray  # [d, p] feature-to-cost matrix B_j
    weights: np.ndarray  # [d] item weights a_j
    capacity: float  # C_j
    feature_mean: np.ndarray  # [p] mu_j
    feature_scale: np.ndarray  # [p] s_j


def scale_factor(eta: float, rng: np.random.Generator, size: int | None = None) -> np.ndarray | float:
    """``f(eta) = max(2 Beta(1/eta, 1/eta), 1e-9)``: mean-1 multiplicative noise, ``f(0) = 1``."""
    if eta == 0:
        return 1.0 if size is None else np.ones(size)
    return np.maximum(2.0 * rng.beta(1.0 / eta, 1.0 / eta, size=size), 1e-9)


def shared_law(params: KnapsackParams, seed: int) -> tuple[np.ndarray, np.ndarray, float]:
    """The parts every client shares: ``B`` [d, p], ``a_base`` [d], ``C_base``."""
    rng = np.random.default_rng(np.random.SeedSequence([seed]))
    d, p = params.num_items, params.num_features
    u = rng.uniform(0.5, 1.5, size=(d, 1))
    B = rng.binomial(1, 0.5, size=(d, p)) * u
    a_base = rng.uniform(0.5, 1.5, size=d)
    return B, a_base, params.capacity_ratio * d


def client_law(params: KnapsackParams, seed: int, partition_id: int) -> KnapsackClientLaw:
    """Client ``partition_id``'s B_j, a_j, C_j, mu_j, s_j (see the module docstring)."""
    B, a_base, c_base = shared_law(params, seed)
    rng = client_rng(seed, partition_id)
    p = params.num_features
    A = rng.standard_normal((p, p))
    G = A - A.T
    if params.eta_o > 0:
        # imported here: only objective heterogeneity needs SciPy's linear algebra (~16 MB of a worker)
        from scipy.linalg import expm

        rotation = expm(params.eta_o * G / np.linalg.norm(G))
    else:
        rotation = np.eye(p)
    capacity = c_base * float(scale_factor(params.eta_c, rng))
    weights = a_base * scale_factor(params.eta_c, rng, size=params.num_items)
    feature_mean = params.eta_d * rng.standard_normal(p)
    feature_scale = np.asarray(scale_factor(params.eta_d, rng, size=p))
    return KnapsackClientLaw(B @ rotation, weights, capacity, feature_mean, feature_scale)


def client_rng(seed: int, partition_id: int) -> np.random.Generator:
    """Client j's private stream for its law, ``SeedSequence([seed, 1 + j])``."""
    return np.random.default_rng(np.random.SeedSequence([seed, 1 + partition_id]))


def sample_costs(
    law: KnapsackClientLaw, params: KnapsackParams, n: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Draw ``n`` raw features x [n, p] and normalised costs c [n, d]."""
    p = params.num_features
    x = law.feature_mean + law.feature_scale * rng.standard_normal((n, p))
    signal = -(1.0 + (1.0 + x @ law.B.T / np.sqrt(p)) ** params.degree)
    return x, signal / np.mean(np.abs(signal))


def load_client(params: KnapsackParams, seed: int, partition_id: int) -> DecisionClientData:
    """Generate client ``partition_id``'s train/val/test data and its knapsack polytope."""
    from hetfed.problems.polytope import KnapsackPolytope

    if partition_id < 0:
        raise ValueError(f"knapsack partition_id must be >= 0, got {partition_id}")
    law = client_law(params, seed, partition_id)
    # Separate stream for samples, so the law's draws never shift with n_train etc.
    rng = np.random.default_rng(np.random.SeedSequence([seed, 1 + partition_id, 1]))
    splits = [sample_costs(law, params, n, rng) for n in (params.n_train, params.n_val, params.n_test)]
    return generated_client(partition_id, splits, KnapsackPolytope(law.weights, law.capacity))
