"""Regret, relative regret (per client, and over clients as the run's summary forms it) and the
QP-LP gap against direct numpy formulas with LP solutions from scipy.linprog."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy.optimize import linprog
from torch import nn

from hetfed.client.decision import decision_metrics
from hetfed.problems.base import DecisionSplit
from hetfed.problems.metrics import optimal_values, qp_lp_gap, regret, summarize_regret
from hetfed.problems.polytope import GridFlowPolytope, KnapsackPolytope, Polytope, QuotaPolytope
from hetfed.strategies.result_summary import summarize


def lp_solution(poly: Polytope, c: np.ndarray) -> np.ndarray:
    res = linprog(
        c,
        A_ub=poly.A_ub if poly.A_ub.shape[0] else None,
        b_ub=poly.b_ub if poly.A_ub.shape[0] else None,
        A_eq=poly.A_eq if poly.A_eq.shape[0] else None,
        b_eq=poly.b_eq if poly.A_eq.shape[0] else None,
        bounds=np.column_stack([poly.lb, poly.ub]),
        method="highs",
    )
    assert res.status == 0
    return res.x


def client(seed: int, n: int) -> tuple[KnapsackPolytope, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    weights = rng.uniform(0.5, 1.5, 12)
    c = -rng.uniform(0.5, 2.0, (n, 12)) * rng.uniform(0.5, 3.0)  # clients differ in cost scale
    return KnapsackPolytope(weights, 0.5 * weights.sum()), c + 0.6 * rng.normal(size=c.shape), c


@pytest.mark.parametrize(
    "poly", [KnapsackPolytope(np.linspace(0.5, 1.5, 12), 5.0), QuotaPolytope(12, 3.5), GridFlowPolytope(3)]
)
def test_regret_matches_linprog(poly):
    rng = np.random.default_rng(0)
    c = rng.normal(size=(10, poly.dim)) - 0.2
    c_hat = c + rng.normal(size=c.shape)
    expected = [
        ci @ lp_solution(poly, hi) - ci @ lp_solution(poly, ci) for ci, hi in zip(c, c_hat, strict=True)
    ]
    got = regret(torch.from_numpy(c_hat), torch.from_numpy(c), poly)
    np.testing.assert_allclose(got.numpy(), expected, atol=1e-9)
    assert (got >= -1e-12).all() and (got > 1e-6).any()
    assert regret(torch.from_numpy(c), torch.from_numpy(c), poly).abs().max() <= 1e-12
    assert regret(torch.from_numpy(3 * c), torch.from_numpy(c), poly).abs().max() <= 1e-12  # scale-invariant
    z = optimal_values(torch.from_numpy(c), poly)
    np.testing.assert_allclose(z.numpy(), [ci @ lp_solution(poly, ci) for ci in c], atol=1e-9)
    assert torch.allclose(
        regret(torch.from_numpy(c_hat), torch.from_numpy(c), poly, z_star=z), got, atol=1e-12
    )


def reported(poly: Polytope, c_hat: np.ndarray, c: np.ndarray) -> dict[str, float]:
    """What a client reports for a model predicting ``c_hat`` (client/decision.py)."""
    split = DecisionSplit(x=torch.from_numpy(c_hat), c=torch.from_numpy(c))
    return decision_metrics(nn.Identity(), split, poly)


def test_summary_macro_and_pooled_relative_regret():
    """Per client (problems/metrics.py), then over clients as the run's summary forms them
    (strategies/result_summary.py) from what the clients report."""
    clients = [client(1, 30), client(2, 5), client(3, 12)]
    summaries = [summarize_regret(torch.from_numpy(h), torch.from_numpy(c), p) for p, h, c in clients]
    per_client_regret, per_client_abs_z = [], []
    for (poly, c_hat, c), s in zip(clients, summaries, strict=True):
        r = np.array(
            [ci @ lp_solution(poly, hi) - ci @ lp_solution(poly, ci) for ci, hi in zip(c, c_hat, strict=True)]
        )
        z = np.abs([ci @ lp_solution(poly, ci) for ci in c])
        assert s.n == len(c)
        assert math.isclose(s.absolute, r.mean(), rel_tol=1e-9)
        assert math.isclose(s.relative, r.mean() / z.mean(), rel_tol=1e-9)
        assert math.isclose(s.mse, ((c_hat - c) ** 2).mean(), rel_tol=1e-12)
        per_client_regret.append(r)
        per_client_abs_z.append(z)
    macro = np.mean([r.mean() / z.mean() for r, z in zip(per_client_regret, per_client_abs_z, strict=True)])
    pooled = np.concatenate(per_client_regret).sum() / np.concatenate(per_client_abs_z).sum()
    aggregate = summarize({f"c{i}": reported(*x) for i, x in enumerate(clients)})["aggregate"]
    assert math.isclose(aggregate["relative-regret"], macro, rel_tol=1e-9)
    assert math.isclose(aggregate["pooled-relative-regret"], pooled, rel_tol=1e-9)
    assert abs(macro - pooled) > 1e-3  # the two aggregations genuinely differ here


def test_relative_regret_is_nan_when_every_optimum_is_zero():
    poly = KnapsackPolytope([1.0, 2.0], 1.0)
    c = torch.tensor([[1.0, 2.0], [0.5, 0.1]])  # positive costs: w* = 0, z* = 0
    c_hat = torch.tensor([[-1.0, 2.0], [0.3, 0.1]])
    s = summarize_regret(c_hat, c, poly)
    assert s.total_abs_optimal == 0 and s.absolute > 0 and math.isnan(s.relative)
    metrics = decision_metrics(nn.Identity(), DecisionSplit(x=c_hat, c=c), poly)
    assert math.isnan(summarize({"c0": metrics})["aggregate"]["pooled-relative-regret"])


def test_qp_lp_gap_matches_formula_and_shrinks_with_lam():
    poly, _, c = client(4, 20)
    c_t = torch.from_numpy(c)
    z = np.array([ci @ lp_solution(poly, ci) for ci in c])
    gaps = []
    for lam in (2.0, 0.5, 0.1, 1e-3):
        w_lam = poly.project(-c_t / lam, backend="highs").numpy()  # a different solver than auto's
        expected = ((c * w_lam).sum(1) - z).mean() / (np.abs(z).mean() + 1e-8)
        got = qp_lp_gap(c_t, poly, lam)
        assert math.isclose(got, expected, rel_tol=1e-8, abs_tol=1e-12)
        gaps.append(got)
    # c'w_lam(c) is non-decreasing in lam (more regularization, further from the LP optimum)
    assert all(a >= b - 1e-12 for a, b in zip(gaps, gaps[1:], strict=False)) and gaps[0] > gaps[-1]
    assert gaps[-1] <= 1e-6
    assert math.isclose(qp_lp_gap(c_t, poly, 0.5, z_star=torch.from_numpy(z)), gaps[1], rel_tol=1e-9)


def test_bad_inputs_raise_clear_errors():
    poly, c_hat, c = client(6, 4)
    c_hat_t, c_t = torch.from_numpy(c_hat), torch.from_numpy(c)
    nan = c_hat_t.clone()
    nan[0, 0] = float("nan")
    cases = [
        (lambda: regret(nan, c_t, poly), "c_hat contains NaN or Inf"),
        (lambda: regret(c_hat_t, c_t[:2], poly), "same shape"),
        (lambda: regret(c_hat_t[:, :3], c_t[:, :3], poly), r"c_hat must have shape \[12\]"),
        (lambda: regret(c_hat_t, c_t, poly, z_star=torch.zeros(3)), "z_star must have shape"),
        (lambda: qp_lp_gap(c_t, poly, 0.0), "lam must be finite and > 0"),
        (lambda: summarize_regret(c_hat_t * float("inf"), c_t, poly), "c_hat contains NaN or Inf"),
    ]
    for call, message in cases:
        with pytest.raises(ValueError, match=message):
            call()
