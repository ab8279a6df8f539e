"""Feasible sets: projections against an independent QP reference, KKT, LP oracles against HiGHS
(scipy.linprog), radii against brute force, and input validation.

The projection reference is Clarabel (interior point, unrelated to every backend under test),
polished on its active face with numpy least squares and accepted only if a KKT certificate
(multipliers of the right signs fitted by an LP) holds to 1e-11.
"""

from __future__ import annotations

import itertools
import math
import pickle

import clarabel
import numpy as np
import pytest
import scipy.linalg
import scipy.sparse as sp
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.optimize import linprog
from threadpoolctl import threadpool_limits

from hetfed.problems.polytope import (
    PROJECTION_ACCURACY,
    GridFlowPolytope,
    KnapsackPolytope,
    Polytope,
    QuotaPolytope,
)

SETS_PER_FAMILY, POINTS_PER_SET = 25, 4  # 100 projection instances per family


@pytest.fixture(autouse=True, scope="module")
def _one_blas_thread():
    """The reference's small dense solves run ~30x slower when OpenBLAS threads fight a busy machine."""
    with threadpool_limits(1, user_api="blas"):
        yield


# ---------------------------------------------------------------------- independent references
def _inequalities(poly: Polytope) -> tuple[np.ndarray, np.ndarray]:
    """All inequalities ``G w <= h``: the rows of A_ub and the finite bounds."""
    fin_u, fin_l = np.isfinite(poly.ub), np.isfinite(poly.lb)
    eye = np.eye(poly.dim)
    G = np.vstack([poly.A_ub, eye[fin_u], -eye[fin_l]])
    return G, np.concatenate([poly.b_ub, poly.ub[fin_u], -poly.lb[fin_l]])


def kkt_residual(poly: Polytope, v: np.ndarray, w: np.ndarray, active_tol: float = 1e-9) -> float:
    """max(primal infeasibility, stationarity residual) of ``w`` as the projection of ``v``.

    Stationarity: ``v - w = A_eq'y + G_act'z`` with ``z >= 0`` on the constraints active at w
    (slack <= active_tol, so complementarity holds). The best multipliers in the max norm come
    from a small LP: ``min t  s.t.  |M'(y, z) - (v - w)| <= t``.
    """
    G, h = _inequalities(poly)
    slack = h - G @ w
    primal = max(-slack.min(initial=0.0), np.abs(poly.A_eq @ w - poly.b_eq).max(initial=0.0))
    active = slack <= active_tol
    M = np.vstack([poly.A_eq, G[active]])
    r = v - w
    if M.shape[0] == 0:
        return max(primal, float(np.abs(r).max()))
    ones = np.ones((poly.dim, 1))
    res = linprog(
        np.r_[np.zeros(M.shape[0]), 1.0],
        A_ub=np.block([[M.T, -ones], [-M.T, -ones]]),
        b_ub=np.r_[r, -r],
        bounds=[(None, None)] * poly.A_eq.shape[0] + [(0, None)] * int(active.sum()) + [(0, None)],
        method="highs",
        options={"primal_feasibility_tolerance": 1e-10, "dual_feasibility_tolerance": 1e-10},
    )
    assert res.status == 0
    return max(primal, float(np.abs(M.T @ res.x[:-1] - r).max()))


def reference_projection(poly: Polytope, v: np.ndarray) -> np.ndarray:
    """Clarabel at tight tolerances, then an exact solve on the active face, KKT-certified."""
    G, h = _inequalities(poly)
    A = sp.csc_matrix(np.vstack([poly.A_eq, G]))
    b = np.concatenate([poly.b_eq, h])
    cones = [clarabel.ZeroConeT(poly.A_eq.shape[0]), clarabel.NonnegativeConeT(G.shape[0])]
    opts = clarabel.DefaultSettings()
    opts.verbose = False
    opts.tol_gap_abs = opts.tol_gap_rel = opts.tol_feas = 1e-12
    out = []
    for vi in v:
        x = np.array(
            clarabel.DefaultSolver(sp.identity(poly.dim, format="csc"), -vi, A, b, cones, opts).solve().x
        )
        out.append(_polish(poly, G, h, vi, x))
    return np.array(out)


def _polish(poly: Polytope, G: np.ndarray, h: np.ndarray, v: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Project ``v`` exactly onto the face where x is active, guessing the face with several
    slack thresholds (the interior point is only ~1e-7 accurate); return the first KKT-certified one."""
    for tol in (1e-7, 1e-6, 1e-8, 1e-5, 1e-9):
        active = G @ x >= h - tol
        M = np.vstack([poly.A_eq, G[active]])
        rhs = np.concatenate([poly.b_eq, h[active]])
        w = v + scipy.linalg.lstsq(M, rhs - M @ v, lapack_driver="gelsy", cond=1e-10)[0]  # min-norm step
        if kkt_residual(poly, v, w, active_tol=1e-12) < 1e-11:
            return w
    raise AssertionError(f"reference projection not certified on {poly!r}")


def linprog_value(poly: Polytope, c: np.ndarray) -> float:
    """``min c'w`` over S by scipy's HiGHS interface (its own model, built from the matrices)."""
    res = linprog(
        c,
        A_ub=poly.A_ub if poly.A_ub.shape[0] else None,
        b_ub=poly.b_ub if poly.A_ub.shape[0] else None,
        A_eq=poly.A_eq if poly.A_eq.shape[0] else None,
        b_eq=poly.b_eq if poly.A_eq.shape[0] else None,
        bounds=np.column_stack([poly.lb, poly.ub]),
        method="highs",
        options={"primal_feasibility_tolerance": 1e-10, "dual_feasibility_tolerance": 1e-10},
    )
    assert res.status == 0
    return float(res.fun)


# ---------------------------------------------------------------------- random instances
def random_knapsack(rng: np.random.Generator, d: int) -> KnapsackPolytope:
    weights = rng.uniform(0.5, 1.5, d)
    if rng.random() < 0.3:
        weights = np.round(weights * 4) / 4  # ties in the weights
    return KnapsackPolytope(weights, rng.uniform(0.0, 1.05) * weights.sum())


def random_quota(rng: np.random.Generator, d: int) -> QuotaPolytope:
    upper = 1.0 if rng.random() < 0.5 else rng.uniform(0.5, 3.0)
    quota = float(rng.integers(0, d + 1)) * upper if rng.random() < 0.3 else rng.uniform(0, d * upper)
    return QuotaPolytope(d, quota, upper)


def random_flow(rng: np.random.Generator, k: int) -> GridFlowPolytope:
    while True:
        source, sink = tuple(rng.integers(0, k, 2)), tuple(rng.integers(0, k, 2))
        if source != sink:
            return GridFlowPolytope(k, source, sink)


def random_general(rng: np.random.Generator, d: int) -> Polytope:
    """Inequalities and equalities around an interior point; some coordinates have no explicit bound
    (boundedness then comes from the rows)."""
    x0 = rng.uniform(-0.5, 0.5, d)
    A_ub = rng.normal(size=(d // 2, d))
    A_eq = rng.normal(size=(max(1, d // 10), d))
    lb, ub = np.full(d, -1.0), np.full(d, 1.0)
    free = rng.random(d) < 0.2
    lb[free], ub[free] = -np.inf, np.inf
    A_ub = np.vstack([A_ub, np.eye(d)[free], -np.eye(d)[free]])  # box rows for the unbounded coordinates
    b_ub = A_ub @ x0 + rng.uniform(0.0, 1.0, A_ub.shape[0])
    return Polytope(A_ub, b_ub, A_eq, A_eq @ x0, lb, ub)


FAMILIES = {
    "knapsack10": lambda rng: random_knapsack(rng, 10),
    "knapsack50": lambda rng: random_knapsack(rng, 50),
    "knapsack144": lambda rng: random_knapsack(rng, 144),
    "quota24": lambda rng: random_quota(rng, 24),
    "quota144": lambda rng: random_quota(rng, 144),
    "flow5x5": lambda rng: random_flow(rng, 5),
    "flow12x12": lambda rng: random_flow(rng, 12),
    "general10": lambda rng: random_general(rng, 10),
    "general50": lambda rng: random_general(rng, 50),
}


def random_points(rng: np.random.Generator, poly: Polytope, n: int) -> np.ndarray:
    """Points around the set at several scales, so every constraint type gets active."""
    center = 0.5 * (np.nan_to_num(poly.lb, neginf=-1.0) + np.nan_to_num(poly.ub, posinf=1.0))
    return center + rng.normal(size=(n, poly.dim)) * rng.choice([0.3, 1.0, 3.0], size=(n, 1))


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request: pytest.FixtureRequest) -> list[tuple[Polytope, np.ndarray, np.ndarray]]:
    """(set, points, reference projections) for SETS_PER_FAMILY random sets of one family."""
    rng = np.random.default_rng(list(FAMILIES).index(request.param))
    out = []
    for _ in range(SETS_PER_FAMILY):
        poly = FAMILIES[request.param](rng)
        v = random_points(rng, poly, POINTS_PER_SET)
        out.append((poly, v, reference_projection(poly, v)))
    return out


# ---------------------------------------------------------------------- projections
@pytest.mark.parametrize("backend", ["auto", "daqp"])
def test_exact_projections_match_reference_and_kkt(family, backend):
    if backend == "daqp" and not family[0][0].has_exact_projection:
        pytest.skip("auto is daqp on this family: covered by the auto case")
    for poly, v, ref in family:
        w = poly.project(torch.from_numpy(v), backend=backend)
        assert w.dtype == torch.float64 and w.shape == v.shape
        assert np.abs(w.numpy() - ref).max() <= 1e-8, poly
        for vi, wi in zip(v, w.numpy(), strict=True):
            assert kkt_residual(poly, vi, wi) <= 1e-8, poly


@pytest.mark.parametrize("backend", ["exact", "daqp", "highs", "osqp", "qpth"])
def test_backends_meet_stated_accuracy(family, backend):
    if backend == "exact" and not family[0][0].has_exact_projection:
        with pytest.raises(ValueError, match="no closed-form projection"):
            family[0][0].project(torch.from_numpy(family[0][1]), backend="exact")
        return
    sets = family[:10] if backend in ("osqp", "highs") else family
    if backend == "qpth":  # a dense interior point, up to seconds per call here: a few points only
        sets = [(poly, v[:1], ref[:1]) for poly, v, ref in family[:2]]
    for poly, v, ref in sets:
        w = poly.project(torch.from_numpy(v), backend=backend)
        assert np.abs(w.detach().numpy() - ref).max() <= PROJECTION_ACCURACY[backend], poly


def test_points_far_outside_stay_exact():
    """w_lam(c) for a tiny lam projects points of norm ~1e7, where DAQP's absolute tolerances fail
    on degenerate flow vertices and the HiGHS QP fallback takes over. For generic c and small
    enough lam, w_lam(c) is exactly the (unique) LP vertex, which scipy.linprog gives."""
    rng = np.random.default_rng(9)
    poly = GridFlowPolytope(5, (0, 4), (3, 1))
    c = rng.normal(size=(8, poly.dim))
    w = poly.regularized_argmin(torch.from_numpy(c), 1e-7, backend="daqp").numpy()
    for ci, wi in zip(c, w, strict=True):
        res = linprog(ci, A_eq=poly.A_eq, b_eq=poly.b_eq, bounds=(0, 1), method="highs")
        assert np.abs(wi - res.x).max() <= 1e-8


def test_single_vector_is_accepted_and_matches_batch():
    rng = np.random.default_rng(0)
    for poly in (random_knapsack(rng, 10), random_flow(rng, 4), random_general(rng, 10)):
        v = torch.from_numpy(random_points(rng, poly, 3))
        batch = poly.project(v)
        single = poly.project(v[1])
        assert single.shape == (poly.dim,)
        assert torch.allclose(single, batch[1], atol=1e-12)
        assert poly.solve_lp(v[1]).shape == (poly.dim,)


def test_regularized_argmin_is_projection_of_scaled_cost():
    rng = np.random.default_rng(1)
    poly = random_quota(rng, 24)
    theta = torch.from_numpy(rng.normal(size=(5, 24)))
    lam = 0.37
    w = poly.regularized_argmin(theta, lam)
    ref = reference_projection(poly, (-theta / lam).numpy())
    assert np.abs(w.numpy() - ref).max() <= 1e-10
    # it minimises theta'w + (lam/2)||w||^2: no feasible point does better
    objective = lambda x: (theta * x).sum(-1) + 0.5 * lam * (x * x).sum(-1)  # noqa: E731
    others = poly.project(torch.from_numpy(rng.normal(size=(5, 24)) * 2))
    assert (objective(w) <= objective(others) + 1e-12).all()


@pytest.mark.parametrize("make", [lambda r: random_knapsack(r, 12), lambda r: random_quota(r, 12)])
def test_exact_projection_gradient_matches_finite_differences(make):
    """The sort projection is differentiable; its Jacobian-vector product matches central differences."""
    rng = np.random.default_rng(2)
    for _ in range(10):
        poly = make(rng)
        v = torch.from_numpy(random_points(rng, poly, 1)[0]).requires_grad_(True)
        direction = torch.from_numpy(rng.normal(size=poly.dim))
        weight = torch.from_numpy(rng.normal(size=poly.dim))
        (poly.project(v, backend="exact") @ weight).backward()
        h = 1e-7
        with torch.no_grad():
            plus = poly.project(v + h * direction, backend="exact") @ weight
            minus = poly.project(v - h * direction, backend="exact") @ weight
        fd = (plus - minus) / (2 * h)
        assert abs(float(v.grad @ direction) - float(fd)) <= 1e-6 * (1 + abs(float(fd)))


def test_exact_projection_of_degenerate_sets_has_the_right_jacobian():
    """Single-point sets have a zero Jacobian; a knapsack row that cannot bind leaves a box clip."""
    v = torch.tensor([[-0.5, 0.3, 0.8, 1.7]], dtype=torch.float64, requires_grad=True)
    weight = torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=torch.float64)
    cases = [
        (KnapsackPolytope(np.ones(4), 0.0), torch.zeros(4)),
        (QuotaPolytope(4, 0.0), torch.zeros(4)),
        (QuotaPolytope(4, 8.0, upper=2.0), torch.zeros(4)),
        (KnapsackPolytope(np.ones(4), 10.0), torch.tensor([0.0, 2.0, 3.0, 0.0])),
    ]
    for poly, expected in cases:
        v.grad = None
        (poly.project(v, backend="exact") @ weight).sum().backward()
        assert torch.equal(v.grad[0], expected.double()), poly


def test_qpth_projection_is_differentiable():
    rng = np.random.default_rng(3)
    poly = random_knapsack(rng, 10)
    v = torch.from_numpy(random_points(rng, poly, 2)).requires_grad_(True)
    weight = torch.from_numpy(rng.normal(size=(2, 10)))
    (poly.project(v, backend="qpth") * weight).sum().backward()
    exact_v = v.detach().clone().requires_grad_(True)
    (poly.project(exact_v, backend="exact") * weight).sum().backward()
    assert torch.allclose(v.grad, exact_v.grad, atol=1e-4)


# ---------------------------------------------------------------------- property-based, degenerate sets
@settings(max_examples=40, deadline=None)
@given(
    d=st.integers(1, 8),
    seed=st.integers(0, 2**31 - 1),
    capacity_mode=st.sampled_from(["zero", "full", "above", "random"]),
    tie_weights=st.booleans(),
    tie_values=st.booleans(),
)
def test_knapsack_projection_properties(d, seed, capacity_mode, tie_weights, tie_values):
    rng = np.random.default_rng(seed)
    weights = np.full(d, 0.7) if tie_weights else rng.uniform(0.2, 2.0, d)
    capacity = {
        "zero": 0.0,
        "full": weights.sum(),
        "above": 2 * weights.sum(),
        "random": rng.uniform(0, weights.sum()),
    }
    poly = KnapsackPolytope(weights, capacity[capacity_mode])
    v = rng.normal(size=(3, d)) * 2
    if tie_values:
        v[:, :] = v[:, :1]
    w = poly.project(torch.from_numpy(v), backend="exact").numpy()
    for vi, wi in zip(v, w, strict=True):
        assert kkt_residual(poly, vi, wi) <= 1e-10
    if capacity_mode == "zero":
        assert np.abs(w).max() <= 1e-12
    if capacity_mode in ("full", "above"):  # the knapsack row cannot bind: a box clip
        assert np.abs(w - v.clip(0, 1)).max() <= 1e-12


@settings(max_examples=40, deadline=None)
@given(
    d=st.integers(1, 8),
    seed=st.integers(0, 2**31 - 1),
    quota_mode=st.sampled_from(["zero", "full", "integer", "random"]),
    upper=st.sampled_from([1.0, 0.5, 2.5]),
    tie_values=st.booleans(),
)
def test_quota_projection_properties(d, seed, quota_mode, upper, tie_values):
    rng = np.random.default_rng(seed)
    quota = {
        "zero": 0.0,
        "full": d * upper,
        "integer": float(rng.integers(0, d + 1)) * upper,
        "random": rng.uniform(0, d * upper),
    }[quota_mode]
    poly = QuotaPolytope(d, quota, upper)
    v = rng.normal(size=(3, d)) * 2
    if tie_values:
        v[:, :] = v[:, :1]
    w = poly.project(torch.from_numpy(v), backend="exact").numpy()
    for vi, wi in zip(v, w, strict=True):
        assert kkt_residual(poly, vi, wi) <= 1e-10
    if tie_values:  # symmetric input, unique projection: every slot gets quota/d
        assert np.abs(w - quota / d).max() <= 1e-12
    if quota_mode in ("zero", "full"):
        assert np.abs(w - quota / d).max() <= 1e-12


# ---------------------------------------------------------------------- LP oracles
@pytest.mark.parametrize("name", list(FAMILIES))
def test_lp_oracle_matches_highs(name):
    rng = np.random.default_rng(100 + list(FAMILIES).index(name))
    for _ in range(8):
        poly = FAMILIES[name](rng)
        c = rng.normal(size=(6, poly.dim))
        c[0] = np.round(c[0])  # ties between costs
        w = poly.solve_lp(torch.from_numpy(c))
        assert poly.max_violation(w).max() <= 1e-9
        for ci, wi in zip(c, w.numpy(), strict=True):
            ref = linprog_value(poly, ci)
            assert abs(ci @ wi - ref) <= 1e-9 * max(1.0, abs(ref)), poly


def test_highs_backend_matches_structured_oracle():
    rng = np.random.default_rng(4)
    for poly in (random_knapsack(rng, 20), random_quota(rng, 24), random_flow(rng, 6)):
        c = torch.from_numpy(rng.normal(size=(10, poly.dim)))
        z_struct = (c * poly.solve_lp(c)).sum(-1)
        z_highs = (c * poly.solve_lp(c, backend="highs")).sum(-1)
        assert torch.allclose(z_struct, z_highs, rtol=1e-9, atol=1e-9)


def test_grid_flow_lp_is_a_cheapest_monotone_path():
    """Brute force over every monotone path on small grids."""
    rng = np.random.default_rng(5)
    for k in (2, 3, 4):
        for source, sink in itertools.permutations(itertools.product(range(k), repeat=2), 2):
            poly = GridFlowPolytope(k, source, sink)
            paths = monotone_paths(poly)
            c = rng.normal(size=(3, poly.dim))
            w = poly.solve_lp(torch.from_numpy(c)).numpy()
            assert any(np.array_equal(w[0], p) for p in paths)  # a vertex, i.e. a path
            best = (c @ np.array(paths).T).min(axis=1)
            np.testing.assert_allclose((c * w).sum(axis=1), best, atol=1e-12)


def monotone_paths(poly: GridFlowPolytope) -> list[np.ndarray]:
    """Edge-indicator vectors of every source-sink path, enumerated from the edge list."""
    out_edges: dict[tuple[int, int], list[int]] = {}
    for e, (tail, _) in enumerate(poly.edges):
        out_edges.setdefault(tail, []).append(e)
    paths, stack = [], [(poly.source, [])]
    while stack:
        node, used = stack.pop()
        if node == poly.sink:
            x = np.zeros(poly.dim)
            x[used] = 1.0
            paths.append(x)
            continue
        stack += [(poly.edges[e][1], used + [e]) for e in out_edges.get(node, [])]
    return paths


def test_grid_flow_edge_layout():
    poly = GridFlowPolytope(3, source=(2, 2), sink=(0, 1))
    assert poly.dim == 2 * 3 * 2
    # slot r*(k-1)+c is horizontal between (r, c) and (r, c+1), pointing left (sink column < source column)
    assert poly.edges[1 * 2 + 0] == ((1, 1), (1, 0))
    # vertical slots after the horizontal ones, pointing up (sink row < source row)
    assert poly.edges[6 + 0 * 3 + 2] == ((1, 2), (0, 2))
    assert GridFlowPolytope(3, (0, 1), (2, 1)).edges[0] == ((0, 0), (0, 1))  # same column: right
    assert GridFlowPolytope(4, (1, 1), (2, 3)).dim == GridFlowPolytope(4).dim


# ---------------------------------------------------------------------- radius
def test_quota_radius_is_exact_and_matches_formula():
    for d, quota, upper in [(6, 2.5, 1.0), (5, 0.0, 1.0), (4, 4.0, 1.0), (6, 3.3, 2.0), (4, 1.7, 0.5)]:
        poly = QuotaPolytope(d, quota, upper)
        D = quota / upper
        assert math.isclose(
            poly.radius(), upper * math.sqrt(math.floor(D) + (D - math.floor(D)) ** 2), rel_tol=1e-12
        )
        vertices = []  # every vertex: slots at 0 or upper except at most one
        for pattern in itertools.product([0.0, upper], repeat=d):
            for j in range(d):
                x = np.array(pattern)
                x[j] = quota - (x.sum() - x[j])
                if -1e-12 <= x[j] <= upper + 1e-12:
                    vertices.append(x)
        assert math.isclose(poly.radius(), max(np.linalg.norm(x) for x in vertices), rel_tol=1e-12)


def test_knapsack_radius_follows_reference_fill():
    """Independent transcription of the reference code's compute_knapsack_feasible_radius."""
    rng = np.random.default_rng(6)
    for _ in range(20):
        weights = rng.uniform(0.5, 1.5, 7)
        capacity = rng.uniform(0, 1.1) * weights.sum()
        fill, remaining = np.zeros(7), capacity
        for i in np.argsort(weights, kind="stable"):
            if remaining <= 0:
                break
            fill[i] = 1.0 if weights[i] <= remaining else remaining / weights[i]
            remaining -= weights[i] * fill[i]
        poly = KnapsackPolytope(weights, capacity)
        assert math.isclose(poly.radius(), np.linalg.norm(fill), rel_tol=1e-12, abs_tol=1e-12)
        assert poly.max_violation(torch.from_numpy(fill)) <= 1e-12  # attained by a feasible point


def test_flow_radius_is_longest_path_norm():
    rng = np.random.default_rng(7)
    for _ in range(5):
        poly = random_flow(rng, 4)
        assert math.isclose(
            poly.radius(), max(np.linalg.norm(p) for p in monotone_paths(poly)), rel_tol=1e-12
        )


def test_general_radius_bounds_every_point():
    rng = np.random.default_rng(8)
    poly = random_general(rng, 10)
    vertices = poly.solve_lp(torch.from_numpy(rng.normal(size=(200, 10))))
    assert vertices.norm(dim=-1).max() <= poly.radius() + 1e-12
    lo, hi = poly.bounding_box()
    assert np.all(lo <= vertices.numpy().min(axis=0) + 1e-9) and np.all(
        hi >= vertices.numpy().max(axis=0) - 1e-9
    )
    box = Polytope(lb=np.zeros(3), ub=np.array([1.0, 2.0, 2.0]))
    assert math.isclose(box.radius(), 3.0, rel_tol=1e-12)  # the far corner is in the set: exact


# ---------------------------------------------------------------------- validation
@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: KnapsackPolytope([1.0, 2.0], -1.0), "capacity"),
        (lambda: KnapsackPolytope([1.0, 0.0], 1.0), "weights"),
        (lambda: KnapsackPolytope([1.0, np.nan], 1.0), "weights"),
        (lambda: QuotaPolytope(4, 4.5), "quota"),
        (lambda: QuotaPolytope(4, -0.1), "quota"),
        (lambda: QuotaPolytope(4, 1.0, upper=0.0), "upper"),
        (lambda: QuotaPolytope(0, 0.0), "dim"),
        (lambda: GridFlowPolytope(3, (1, 1), (1, 1)), "sink"),
        (lambda: GridFlowPolytope(3, (0, 0), (3, 0)), "outside"),
        (lambda: GridFlowPolytope(1), "k"),
        (lambda: Polytope(lb=[0.0, 2.0], ub=[1.0, 1.0]), r"w\[1\] has lower bound 2 > upper bound 1"),
        (lambda: Polytope(A_ub=[[1.0, 1.0]], b_ub=[-1.0], lb=0.0, ub=1.0), "row 0 of A_ub"),
        (lambda: Polytope(A_eq=[[1.0, 1.0]], b_eq=[3.0], lb=0.0, ub=1.0), "row 0 of A_eq"),
        (
            lambda: Polytope(A_ub=[[1.0, 0.0], [-1.0, 0.0]], b_ub=[0.2, -0.5], lb=-1.0, ub=1.0),
            r"jointly infeasible .*: row 0 of A_ub w <= b_ub, row 1 of A_ub w <= b_ub cannot all hold",
        ),
        (lambda: Polytope(A_ub=[[1.0, -1.0]], b_ub=[1.0], lb=0.0), "unbounded"),
        (lambda: Polytope(A_ub=[[1.0, 1.0]], b_ub=[1.0, 2.0]), "b_ub"),
        (lambda: Polytope(A_ub=[[1.0, np.inf]], b_ub=[1.0]), "finite"),
        (lambda: Polytope(lb=[0.0, np.nan], ub=1.0), "lb"),
        (lambda: Polytope(), "dimension"),
    ],
)
def test_invalid_sets_are_rejected(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_bad_inputs_name_the_argument_and_the_set():
    poly = KnapsackPolytope([1.0, 2.0, 3.0], 2.0)
    good = torch.zeros(2, 3)
    for bad, message in [
        (torch.tensor([[np.nan, 0.0, 0.0]]), "c contains NaN or Inf"),
        (torch.tensor([[np.inf, 0.0, 0.0]]), "c contains NaN or Inf"),
        (torch.zeros(2, 4), r"c must have shape \[3\] or \[B, 3\]"),
        (torch.zeros(2, 2, 3), r"c must have shape"),
    ]:
        with pytest.raises(ValueError, match=message) as info:
            poly.solve_lp(bad)
        assert "KnapsackPolytope" in str(info.value)
    with pytest.raises(ValueError, match="v contains NaN"):
        poly.project(torch.tensor([0.0, np.nan, 0.0]))
    with pytest.raises(ValueError, match="theta contains NaN"):
        poly.regularized_argmin(torch.tensor([0.0, np.inf, 0.0]), 1.0)
    for lam in (0.0, -1.0, np.nan, np.inf):
        with pytest.raises(ValueError, match="lam must be finite and > 0 for KnapsackPolytope"):
            poly.regularized_argmin(good, lam)
    with pytest.raises(ValueError, match="backend must be one of"):
        poly.project(good, backend="gurobi")
    with pytest.raises(ValueError, match="backend must be one of"):
        poly.solve_lp(good, backend="daqp")


def test_polytope_pickles_after_use():
    poly = GridFlowPolytope(4)
    v = torch.randn(2, poly.dim, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    before = poly.project(v)
    poly.solve_lp(v, backend="highs")
    clone = pickle.loads(pickle.dumps(poly))
    assert torch.allclose(clone.project(v), before, atol=1e-12)


def test_inputs_from_numpy_and_float32():
    poly = QuotaPolytope(4, 1.5)
    w = poly.project(np.array([0.3, 2.0, -1.0, 0.5], dtype=np.float32))
    assert w.dtype == torch.float64
    assert math.isclose(float(w.sum()), 1.5, rel_tol=1e-12)
