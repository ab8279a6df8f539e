"""Decision-focused losses: RSPO+ properties and finite-difference gradients on every family,
SPO+ / PFYL / DPO values and gradients against direct formulas with LP solutions from
scipy.linprog (independent of the library's oracles) and fixed noise seeds, OptNet gradients
against finite differences, and input validation."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.optimize import linprog

from hetfed.client.losses import dpo_loss, mse_loss, optnet_loss, pfyl_loss, rspo_plus_loss, spo_plus_loss
from hetfed.problems.polytope import GridFlowPolytope, KnapsackPolytope, Polytope, QuotaPolytope


def general_set(rng: np.random.Generator, d: int) -> Polytope:
    x0 = rng.uniform(-0.5, 0.5, d)
    A_ub, A_eq = rng.normal(size=(d // 2, d)), rng.normal(size=(2, d))
    return Polytope(A_ub, A_ub @ x0 + rng.uniform(0, 1, d // 2), A_eq, A_eq @ x0, -1.0, 1.0)


def make_sets() -> dict[str, Polytope]:
    rng = np.random.default_rng(0)
    weights = rng.uniform(0.5, 1.5, 20)
    return {
        "knapsack": KnapsackPolytope(weights, 0.4 * weights.sum()),
        "quota": QuotaPolytope(24, 5.5),
        "flow": GridFlowPolytope(5, (0, 4), (3, 1)),
        "general": general_set(rng, 10),
    }


SETS = make_sets()


def costs(poly: Polytope, n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(c_hat, c): true costs and noisy predictions, generic (unique LP solutions a.s.)."""
    g = torch.Generator().manual_seed(seed)
    c = torch.randn(n, poly.dim, generator=g, dtype=torch.float64) - 0.3
    return c + 0.8 * torch.randn(n, poly.dim, generator=g, dtype=torch.float64), c


def lp_solutions(poly: Polytope, c: torch.Tensor) -> torch.Tensor:
    """w*(c) row by row from scipy's HiGHS interface."""
    out = []
    for ci in c.reshape(-1, poly.dim).numpy():
        res = linprog(
            ci,
            A_ub=poly.A_ub if poly.A_ub.shape[0] else None,
            b_ub=poly.b_ub if poly.A_ub.shape[0] else None,
            A_eq=poly.A_eq if poly.A_eq.shape[0] else None,
            b_eq=poly.b_eq if poly.A_eq.shape[0] else None,
            bounds=np.column_stack([poly.lb, poly.ub]),
            method="highs",
        )
        assert res.status == 0
        out.append(res.x)
    return torch.tensor(np.array(out)).reshape(c.shape)


def central_difference_gradient(loss_of, c_hat: torch.Tensor, h: float) -> torch.Tensor:
    """Gradient of a per-sample loss [B] -> sum, by central differences, all coordinates in one batch."""
    n, d = c_hat.shape
    steps = h * torch.eye(d, dtype=torch.float64)
    grad = torch.empty_like(c_hat)
    for i in range(n):
        plus = loss_of(c_hat[i] + steps, i)
        minus = loss_of(c_hat[i] - steps, i)
        grad[i] = (plus - minus) / (2 * h)
    return grad


# ---------------------------------------------------------------------- RSPO+
@pytest.mark.parametrize("name", list(SETS))
@pytest.mark.parametrize("lam", [0.3, 2.0])
def test_rspo_plus_is_nonnegative_and_zero_at_truth(name, lam):
    poly = SETS[name]
    c_hat, c = costs(poly, 32, seed=1)
    loss = rspo_plus_loss(c_hat, c, poly, lam, reduction="none")
    assert loss.shape == (32,)
    assert (loss >= -1e-12).all()
    assert (loss > 1e-6).any()  # not trivially zero
    assert rspo_plus_loss(c, c, poly, lam, reduction="none").abs().max() <= 1e-12


@pytest.mark.parametrize("name", list(SETS))
def test_rspo_plus_matches_definition_and_identity(name):
    """l = (lam/2)(||p - w_c||^2 - ||p - w_u||^2) (docs/algorithms.md 1.1) and the identity
    l = (lam/2)(||w_c||^2 - ||w_u||^2) + u'(w_c - w_u), u = 2 c_hat - c, that the method's
    specification states, in numpy."""
    poly, lam = SETS[name], 0.7
    c_hat, c = costs(poly, 16, seed=2)
    loss = rspo_plus_loss(c_hat, c, poly, lam, reduction="none").numpy()
    u = (2 * c_hat - c).numpy()
    w_c = poly.project(-c / lam).numpy()
    w_u = poly.project(torch.from_numpy(-u / lam)).numpy()
    p = (c - 2 * c_hat).numpy() / lam
    definition = 0.5 * lam * (((p - w_c) ** 2).sum(1) - ((p - w_u) ** 2).sum(1))
    identity = 0.5 * lam * ((w_c**2).sum(1) - (w_u**2).sum(1)) + (u * (w_c - w_u)).sum(1)
    np.testing.assert_allclose(loss, definition, rtol=0, atol=1e-10)
    np.testing.assert_allclose(loss, identity, rtol=0, atol=1e-10)


@pytest.mark.parametrize("name", list(SETS))
def test_rspo_plus_gradient_matches_finite_differences(name):
    poly, lam = SETS[name], 0.5
    c_hat, c = costs(poly, 3, seed=3)
    c_hat.requires_grad_(True)
    rspo_plus_loss(c_hat, c, poly, lam, reduction="none").sum().backward()
    fd = central_difference_gradient(
        lambda x, i: rspo_plus_loss(x, c[i].expand_as(x), poly, lam, reduction="none"), c_hat.detach(), 1e-7
    )
    rel = (c_hat.grad - fd).norm(dim=1) / fd.norm(dim=1)
    assert (rel <= 1e-5).all(), rel
    # and the closed form 2(w_lam(c) - w_lam(2c_hat - c)) with projections computed here
    closed = 2 * (poly.regularized_argmin(c, lam) - poly.regularized_argmin(2 * c_hat.detach() - c, lam))
    assert torch.allclose(c_hat.grad, closed, atol=1e-12)


@pytest.mark.parametrize("name", list(SETS))
def test_rspo_plus_tends_to_spo_plus_as_lam_vanishes(name):
    poly = SETS[name]
    c_hat, c = costs(poly, 8, seed=4)
    spo = spo_plus_loss(c_hat, c, poly, reduction="none")
    w_star = lp_solutions(poly, c)
    gaps = []
    for lam in (1e-1, 1e-2, 1e-3, 1e-5):
        gap = (rspo_plus_loss(c_hat, c, poly, lam, reduction="none") - spo).abs()
        # Both are Bregman divergences, of -min_w(theta'w + (lam/2)||w||^2) and of -z*(theta); the
        # smoothing moves each value by at most (lam/2)R^2 and the linear terms differ by
        # 2 (w_lam(c) - w*(c))'(c_hat - c), which vanishes once w_lam(c) = w*(c) for small lam.
        shift = 2 * ((poly.regularized_argmin(c, lam) - w_star) * (c_hat - c)).sum(1).abs()
        assert (gap <= lam * poly.radius() ** 2 + shift + 1e-9).all()
        gaps.append(gap.max().item())
    assert gaps[-1] <= 1e-5 * poly.radius() ** 2 + 1e-9
    assert gaps[-1] < gaps[0]
    c_hat.requires_grad_(True)
    rspo_plus_loss(c_hat, c, poly, 1e-7).backward()
    rspo_grad = c_hat.grad.clone()
    c_hat.grad = None
    spo_plus_loss(c_hat, c, poly).backward()
    assert torch.allclose(rspo_grad, c_hat.grad, atol=1e-5)


def test_rspo_plus_cache_and_reductions():
    poly, lam = SETS["knapsack"], 0.4
    c_hat, c = costs(poly, 10, seed=5)
    cache = poly.regularized_argmin(c, lam)
    none = rspo_plus_loss(c_hat, c, poly, lam, reduction="none")
    assert torch.equal(rspo_plus_loss(c_hat, c, poly, lam, w_lam_c=cache, reduction="none"), none)
    assert torch.allclose(rspo_plus_loss(c_hat, c, poly, lam), none.mean(), atol=1e-15)
    single = rspo_plus_loss(c_hat[3], c[3], poly, lam, reduction="none")
    assert single.shape == () and torch.allclose(single, none[3], atol=1e-15)
    # a wrong cache is used as given: the trainer owns it (here, w*(c) instead of w_lam(c))
    assert not torch.allclose(
        rspo_plus_loss(c_hat, c, poly, lam, w_lam_c=poly.solve_lp(c), reduction="none"), none
    )


def test_rspo_plus_daqp_backend_agrees_with_exact():
    poly, lam = SETS["quota"], 0.9
    c_hat, c = costs(poly, 6, seed=6)
    exact = rspo_plus_loss(c_hat, c, poly, lam, reduction="none", backend="exact")
    daqp = rspo_plus_loss(c_hat, c, poly, lam, reduction="none", backend="daqp")
    assert torch.allclose(exact, daqp, atol=1e-10)


# ---------------------------------------------------------------------- SPO+, PFYL, DPO
@pytest.mark.parametrize("name", list(SETS))
def test_spo_plus_value_and_gradient_match_direct_formulas(name):
    poly = SETS[name]
    c_hat, c = costs(poly, 6, seed=7)
    c_hat.requires_grad_(True)
    loss = spo_plus_loss(c_hat, c, poly, reduction="none")
    loss.sum().backward()
    u = 2 * c_hat.detach() - c
    w_c, w_u = lp_solutions(poly, c), lp_solutions(poly, u)
    expected = -(u * w_u).sum(1) + 2 * (c_hat.detach() * w_c).sum(1) - (c * w_c).sum(1)
    assert torch.allclose(loss.detach(), expected, atol=1e-8)
    assert torch.allclose(c_hat.grad, 2 * (w_c - w_u), atol=1e-8)
    assert (loss >= -1e-12).all() and spo_plus_loss(c, c, poly, reduction="none").abs().max() <= 1e-12
    cached = spo_plus_loss(c_hat, c, poly, w_star=poly.solve_lp(c), reduction="none")
    assert torch.allclose(cached, loss, atol=1e-12)


@pytest.mark.parametrize("name", ["knapsack", "flow", "general"])
def test_pfyl_value_and_gradient_with_fixed_noise(name):
    poly, eps, m = SETS[name], 0.7, 5
    c_hat, c = costs(poly, 4, seed=8)
    c_hat.requires_grad_(True)
    loss = pfyl_loss(c_hat, c, poly, eps=eps, n_samples=m, generator=torch.Generator().manual_seed(11))
    loss.backward()
    z = torch.randn((m, 4, poly.dim), generator=torch.Generator().manual_seed(11), dtype=torch.float64)
    perturbed = c_hat.detach() + eps * z
    w_m = lp_solutions(poly, perturbed)
    w_c = lp_solutions(poly, c)
    value = (c_hat.detach() * w_c).sum(1) - (perturbed * w_m).sum(-1).mean(0)
    assert torch.allclose(loss.detach(), value.mean(), atol=1e-8)
    assert torch.allclose(c_hat.grad, (w_c - w_m.mean(0)) / 4, atol=1e-8)


@pytest.mark.parametrize("name", ["knapsack", "quota", "general"])
def test_dpo_value_and_score_function_gradient(name):
    poly, eps, m, n = SETS[name], 0.5, 6, 3
    c_hat, c = costs(poly, n, seed=9)
    c_hat.requires_grad_(True)
    loss = dpo_loss(c_hat, c, poly, eps=eps, n_samples=m, generator=torch.Generator().manual_seed(12))
    loss.backward()
    z = torch.randn(
        (m, n, poly.dim), generator=torch.Generator().manual_seed(12), dtype=torch.float64
    ).numpy()
    w_m = lp_solutions(poly, c_hat.detach() + eps * torch.from_numpy(z)).numpy()
    w_c = lp_solutions(poly, c).numpy()
    y_hat = w_m.mean(0)
    assert np.isclose(loss.item(), ((y_hat - w_c) ** 2).mean(), atol=1e-10)
    g = 2 * (y_hat - w_c) / (n * poly.dim)  # d loss / d y_hat
    grad = np.zeros((n, poly.dim))
    for b in range(n):  # leave-one-out baseline, written per sample
        r = np.array([w_m[k, b] @ g[b] for k in range(m)])
        baselined = np.array([r[k] - np.delete(r, k).mean() for k in range(m)])
        grad[b] = sum(z[k, b] * baselined[k] for k in range(m)) / (m * eps)
    np.testing.assert_allclose(c_hat.grad.numpy(), grad, atol=1e-10)


def test_perturbed_losses_reproduce_with_a_seed_and_vary_without():
    poly = SETS["knapsack"]
    c_hat, c = costs(poly, 4, seed=10)
    for fn in (pfyl_loss, dpo_loss):
        a = fn(c_hat, c, poly, generator=torch.Generator().manual_seed(3))
        b = fn(c_hat, c, poly, generator=torch.Generator().manual_seed(3))
        other = fn(c_hat, c, poly, generator=torch.Generator().manual_seed(4))
        assert torch.equal(a, b) and not torch.equal(a, other)


# ---------------------------------------------------------------------- OptNet, MSE
@pytest.mark.parametrize("backend", ["qpth", "exact"])
def test_optnet_gradient_matches_finite_differences(backend):
    poly, eps = SETS["knapsack"], 0.5
    c_hat, c = costs(poly, 2, seed=13)
    c_hat.requires_grad_(True)
    loss = optnet_loss(c_hat, c, poly, eps, reduction="none", backend=backend)
    loss.sum().backward()
    w_ref = poly.project(-c_hat.detach() / eps, backend="daqp")
    assert torch.allclose(loss.detach(), (c * w_ref).sum(1), atol=1e-5)

    def exact_loss(x: torch.Tensor, i: int) -> torch.Tensor:
        return (c[i] * poly.project(-x / eps, backend="daqp")).sum(-1)

    fd = central_difference_gradient(exact_loss, c_hat.detach(), 1e-6)
    tol = 1e-8 if backend == "exact" else 1e-4  # qpth stops at interior-point accuracy
    assert torch.allclose(c_hat.grad, fd, atol=tol * (1 + fd.abs().max()))


def test_mse_loss():
    c_hat = torch.tensor([[1.0, 2.0], [0.0, -1.0]], requires_grad=True)
    c = torch.tensor([[0.0, 2.0], [1.0, 1.0]])
    loss = mse_loss(c_hat, c)
    loss.backward()
    assert torch.isclose(loss, torch.tensor((1 + 0 + 1 + 4) / 4))
    assert torch.allclose(c_hat.grad, 2 * (c_hat.detach() - c) / 4)
    assert torch.allclose(mse_loss(c_hat, c, reduction="none"), torch.tensor([0.5, 2.5]))


# ---------------------------------------------------------------------- validation
def test_bad_inputs_raise_clear_errors():
    poly = SETS["knapsack"]
    c_hat, c = costs(poly, 3, seed=14)
    nan = c_hat.clone()
    nan[1, 2] = float("nan")
    cases = [
        (lambda: rspo_plus_loss(nan, c, poly, 1.0), "c_hat contains NaN or Inf"),
        (lambda: spo_plus_loss(c_hat, c * float("inf"), poly), "c contains NaN or Inf"),
        (lambda: rspo_plus_loss(c_hat[:, :5], c[:, :5], poly, 1.0), r"c_hat must have shape \[20\]"),
        (lambda: spo_plus_loss(c_hat, c[:2], poly), "same shape"),
        (lambda: rspo_plus_loss(c_hat, c, poly, 0.0), "lam must be finite and > 0"),
        (lambda: rspo_plus_loss(c_hat, c, poly, -1.0), "lam must be finite and > 0"),
        (lambda: rspo_plus_loss(c_hat, c, poly, float("nan")), "lam must be finite and > 0"),
        (lambda: rspo_plus_loss(c_hat, c, poly, 1.0, w_lam_c=c[:2]), "w_lam_c must have the same shape"),
        (lambda: spo_plus_loss(c_hat, c, poly, w_star=c[:, :3]), "w_star must have shape"),
        (lambda: pfyl_loss(c_hat, c, poly, eps=0.0), "eps must be finite and > 0"),
        (lambda: pfyl_loss(c_hat, c, poly, n_samples=0), "n_samples must be an integer >= 1"),
        (lambda: dpo_loss(c_hat, c, poly, n_samples=1), "n_samples must be an integer >= 2"),
        (lambda: optnet_loss(c_hat, c, poly, eps=-1.0), "eps must be finite and > 0"),
        (lambda: optnet_loss(c_hat, c, poly, eps=1.0, backend="daqp"), "differentiable projection"),
        (lambda: spo_plus_loss(c_hat, c, poly, reduction="sum"), "reduction must be one of"),
        (lambda: mse_loss(c_hat, c[:, :3]), "same shape"),
        (lambda: mse_loss(nan, c), "finite"),
    ]
    for call, message in cases:
        with pytest.raises(ValueError, match=message):
            call()
    with pytest.raises(ValueError, match="KnapsackPolytope"):  # the problem is named too
        rspo_plus_loss(nan, c, poly, 1.0)
