"""Feasible sets ``S = {w : A_ub w <= b_ub, A_eq w = b_eq, lb <= w <= ub}`` and their oracles.

Every decision-focused loss needs two oracles on a client's own polytope S:

* the LP oracle ``w*(c) = argmin_{w in S} c'w`` (:meth:`Polytope.solve_lp`), and
* the Euclidean projection ``Proj_S(v) = argmin_{w in S} ||w - v||^2`` (:meth:`Polytope.project`),
  which gives the regularized minimiser
  ``w_lam(theta) = argmin_{w in S} theta'w + (lam/2)||w||^2 = Proj_S(-theta/lam)``.

:class:`Polytope` handles any bounded polyhedron with HiGHS (LP) and DAQP / OSQP / qpth
(projection). The structured subclasses add exact batched torch oracles:
:class:`KnapsackPolytope`, :class:`QuotaPolytope` (sort/breakpoint projection, greedy LP) and
:class:`GridFlowPolytope` (DAG dynamic program for the LP).

All oracles take a torch tensor (or array) of shape ``[B, d]`` or ``[d]`` and return float64
torch tensors of the same shape. Solver workspaces are built once per polytope, lazily, and
are not pickled; SciPy and the solver packages are imported there, on first use, so a worker
whose polytopes have exact oracles never maps them.
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

LP_BACKENDS = ("auto", "highs", "highs-cold")
PROJECTION_BACKENDS = ("auto", "exact", "daqp", "highs", "osqp", "qpth")

#: Max abs error per coordinate each projection backend is held to (checked by the tests on
#: knapsack, quota, grid-flow and random general sets with entries of order 1-10). ``exact``
#: and ``daqp`` are exact up to rounding; ``osqp`` and ``qpth`` are iterative and stop at
#: the tolerances set below, so their error is larger.
PROJECTION_ACCURACY: dict[str, float] = {
    "exact": 1e-10,
    "daqp": 1e-9,
    "highs": 1e-9,
    "osqp": 1e-4,
    "qpth": 1e-5,
}

_OSQP_EPS = 1e-6  # OSQP eps_abs = eps_rel; with polishing this gives ~1e-6 or better
_DAQP_PRIMAL_TOL = 1e-12  # DAQP's default 1e-6 would leave constraints violated by up to 1e-6
_QPTH_MAX_ITER = 50


def quiet_highs() -> Any:
    """A ``highspy.Highs`` with its output off. HiGHS prints its banner on stdout when the first
    instance of a process is made, before any option can be set (ERGO-Code/HiGHS#2749): that
    construction runs with file descriptor 1 on /dev/null, so ``decide`` and a silo print nothing."""
    import highspy

    sys.stdout.flush()
    saved = os.dup(1)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 1)
            h = highspy.Highs()
    finally:
        os.dup2(saved, 1)
        os.close(saved)
    h.setOptionValue("output_flag", False)
    return h


def _as_float_array(x: Any, name: str, ndim: int) -> np.ndarray:
    """``x`` as a float64 numpy array with ``ndim`` dimensions (torch tensors accepted)."""
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu().numpy()
    arr = np.array(x, dtype=np.float64)
    if arr.ndim != ndim:
        raise ValueError(f"{name} must be {ndim}-dimensional; got shape {arr.shape}")
    return arr


def _check_positive_scalar(value: Any, name: str, owner: object) -> float:
    """``value`` as a float, which must be finite and > 0."""
    try:
        out = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a positive float for {owner!r}; got {value!r}") from None
    if not math.isfinite(out) or out <= 0:
        raise ValueError(f"{name} must be finite and > 0 for {owner!r}; got {value!r}")
    return out


def highspy_ok() -> Any:
    """HiGHS's ``kOk`` status (highspy imported on first use: it is a solver dependency)."""
    import highspy

    return highspy.HighsStatus.kOk


@dataclass(frozen=True)
class PolytopeLabels:
    """Names of a polytope's variables and rows, so that its messages name them (a user's LP file)."""

    variables: Sequence[str]
    ub_rows: Sequence[str]
    eq_rows: Sequence[str]


def _row_range(A: np.ndarray, lb: np.ndarray, ub: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(min, max)`` of each row ``A_i w`` over the box ``lb <= w <= ub`` (may be infinite)."""
    with np.errstate(invalid="ignore"):  # 0 * inf in the branch np.where discards
        low = np.where(A > 0, A * lb, np.where(A < 0, A * ub, 0.0)).sum(axis=1)
        high = np.where(A > 0, A * ub, np.where(A < 0, A * lb, 0.0)).sum(axis=1)
    return low, high


class Polytope:
    """``S = {w in R^d : A_ub w <= b_ub, A_eq w = b_eq, lb <= w <= ub}``, bounded and non-empty.

    Arguments may be numpy arrays or torch tensors; they are stored as float64 numpy arrays.
    ``lb`` / ``ub`` may be scalars, vectors or None (None means -inf / +inf). Construction checks
    shapes and finiteness, that S is non-empty (HiGHS) and that S is bounded.
    """

    def __init__(
        self,
        A_ub: Any = None,
        b_ub: Any = None,
        A_eq: Any = None,
        b_eq: Any = None,
        lb: Any = None,
        ub: Any = None,
        labels: PolytopeLabels | None = None,
    ) -> None:
        dim = self._infer_dim(A_ub, A_eq, lb, ub)
        self.dim = dim
        self.labels = labels  # names for messages (a user's LP file); None: indices
        self.A_ub, self.b_ub = self._rows(A_ub, b_ub, "A_ub", "b_ub", dim)
        self.A_eq, self.b_eq = self._rows(A_eq, b_eq, "A_eq", "b_eq", dim)
        self.lb = self._bound(lb, "lb", -np.inf, dim)
        self.ub = self._bound(ub, "ub", np.inf, dim)
        for arr in (self.A_ub, self.b_ub, self.A_eq, self.b_eq, self.lb, self.ub):
            arr.flags.writeable = False  # oracles cache workspaces built from these
        self._cache: dict[str, Any] = {}  # solver workspaces (native objects, not pickled)
        self._box: tuple[np.ndarray, np.ndarray] | None = None
        self._eq_rows: np.ndarray | None = None
        bad = np.flatnonzero(self.lb > self.ub)
        if bad.size:
            i = int(bad[0])
            raise ValueError(
                f"{self!r} is empty: {self._var(i)} has lower bound {self.lb[i]:.6g} "
                f"> upper bound {self.ub[i]:.6g}"
            )
        self._check_nonempty_and_bounded()

    # ------------------------------------------------------------------ construction helpers
    @staticmethod
    def _infer_dim(A_ub: Any, A_eq: Any, lb: Any, ub: Any) -> int:
        for name, x in (("A_ub", A_ub), ("A_eq", A_eq)):
            if x is not None:
                shape = np.shape(x.detach().cpu() if isinstance(x, torch.Tensor) else x)
                if len(shape) != 2:
                    raise ValueError(f"{name} must be 2-dimensional [m, d]; got shape {tuple(shape)}")
                return int(shape[1])
        for x in (lb, ub):
            if x is not None and np.ndim(x) == 1:
                return int(np.shape(x)[0])
        raise ValueError("Polytope needs A_ub, A_eq, or vector lb/ub to know the dimension d")

    def _rows(self, A: Any, b: Any, a_name: str, b_name: str, dim: int) -> tuple[np.ndarray, np.ndarray]:
        if (A is None) != (b is None):
            raise ValueError(f"{a_name} and {b_name} must be given together")
        if A is None:
            return np.zeros((0, dim)), np.zeros(0)
        A_arr = _as_float_array(A, a_name, 2)
        b_arr = _as_float_array(b, b_name, 1)
        if A_arr.shape[1] != dim or A_arr.shape[0] != b_arr.shape[0]:
            raise ValueError(
                f"{a_name} must be [m, {dim}] and {b_name} [m]; got {A_arr.shape} and {b_arr.shape}"
            )
        if not (np.isfinite(A_arr).all() and np.isfinite(b_arr).all()):
            raise ValueError(f"{a_name} and {b_name} must be finite (no NaN/Inf)")
        return A_arr, b_arr

    @staticmethod
    def _bound(x: Any, name: str, default: float, dim: int) -> np.ndarray:
        if x is None:
            return np.full(dim, default)
        arr = np.asarray(x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else x, dtype=np.float64)
        if arr.ndim == 0:
            arr = np.full(dim, float(arr))
        if arr.shape != (dim,):
            raise ValueError(f"{name} must be a scalar or a vector of length {dim}; got shape {arr.shape}")
        if np.isnan(arr).any() or (arr == -default).any():
            raise ValueError(f"{name} must not contain NaN or {-default}")
        return arr.copy()

    def _check_nonempty_and_bounded(self) -> None:
        """Name the first row that the box alone makes infeasible, then ask HiGHS about the rest."""
        min_ub, _ = _row_range(self.A_ub, self.lb, self.ub)
        min_eq, max_eq = _row_range(self.A_eq, self.lb, self.ub)
        for i in np.flatnonzero(min_ub > self.b_ub):
            raise ValueError(
                f"{self!r} is empty: {self._row('ub', i)} needs at least {min_ub[i]:.6g} "
                f"within the bounds but its right-hand side is {self.b_ub[i]:.6g}"
            )
        for i in np.flatnonzero((self.b_eq < min_eq) | (self.b_eq > max_eq)):
            raise ValueError(
                f"{self!r} is empty: {self._row('eq', i)} ranges over [{min_eq[i]:.6g}, {max_eq[i]:.6g}] "
                f"within the bounds but its right-hand side is {self.b_eq[i]:.6g}"
            )
        status = self._highs().feasibility()
        if status != "optimal":
            culprits = self._highs().infeasible_rows()
            named = f": {', '.join(self._row(*r) for r in culprits)} cannot all hold" if culprits else ""
            raise ValueError(
                f"{self!r} is empty: the constraints are jointly infeasible (HiGHS: {status}){named}"
            )
        if not (np.isfinite(self.lb).all() and np.isfinite(self.ub).all()):
            self.bounding_box()  # raises if some coordinate is unbounded

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(dim={self.dim}, {self.A_ub.shape[0]} inequalities, "
            f"{self.A_eq.shape[0]} equalities)"
        )

    def _var(self, i: int | np.integer) -> str:
        """Coordinate ``i`` as a message names it: its variable name, or ``w[i]``."""
        return f"variable {self.labels.variables[int(i)]!r}" if self.labels else f"w[{i}]"

    def _row(self, kind: str, i: int | np.integer) -> str:
        """Row ``i`` of ``A_ub`` (``kind`` 'ub') or ``A_eq`` ('eq') as a message names it."""
        if self.labels:
            return f"row {(self.labels.ub_rows if kind == 'ub' else self.labels.eq_rows)[int(i)]!r}"
        return f"row {i} of A_ub w <= b_ub" if kind == "ub" else f"row {i} of A_eq w = b_eq"

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_cache"] = {}  # rebuilt lazily after unpickling
        return state

    # ------------------------------------------------------------------ input validation
    def validate(self, x: Any, name: str) -> torch.Tensor:
        """``x`` as a float64 tensor of shape ``[d]`` or ``[B, d]``; ValueError naming ``name`` if not."""
        t = torch.as_tensor(x).to(torch.float64)
        if t.ndim not in (1, 2) or t.shape[-1] != self.dim:
            raise ValueError(
                f"{name} must have shape [{self.dim}] or [B, {self.dim}] for {self!r}; got {tuple(t.shape)}"
            )
        if not torch.isfinite(t.detach()).all():
            raise ValueError(f"{name} contains NaN or Inf ({self!r})")
        return t

    def _batched(self, x: Any, name: str) -> tuple[torch.Tensor, bool]:
        t = self.validate(x, name)
        return (t.unsqueeze(0), True) if t.ndim == 1 else (t, False)

    def max_violation(self, w: Any) -> torch.Tensor:
        """Largest constraint violation of each row of ``w`` (0 when in S); shape ``[B]`` or ``[]``."""
        wb, single = self._batched(w, "w")
        x = wb.detach().numpy()
        parts = [np.maximum(self.lb - x, 0.0), np.maximum(x - self.ub, 0.0)]
        if self.A_ub.shape[0]:
            parts.append(np.maximum(x @ self.A_ub.T - self.b_ub, 0.0))
        if self.A_eq.shape[0]:
            parts.append(np.abs(x @ self.A_eq.T - self.b_eq))
        out = torch.from_numpy(np.concatenate(parts, axis=1).max(axis=1))
        return out[0] if single else out

    # ------------------------------------------------------------------ LP oracle
    def solve_lp(self, c: Any, backend: str = "auto") -> torch.Tensor:
        """Minimisers ``w*(c) = argmin_{w in S} c'w`` (any minimiser when several exist).

        ``backend="auto"`` uses the exact structured oracle when the set has one, HiGHS otherwise;
        ``"highs"`` forces the persistent HiGHS model (warm started from the previous row);
        ``"highs-cold"`` solves each row from a cold start, so that among tied minimisers the one
        returned depends on that row's costs only (``hetfed decide``).
        """
        if backend not in LP_BACKENDS:
            raise ValueError(f"backend must be one of {LP_BACKENDS}; got {backend!r}")
        cb, single = self._batched(c, "c")
        cb = cb.detach()
        w = self._lp_structured(cb) if backend == "auto" else None
        if w is None:
            w = torch.from_numpy(self._highs().solve(cb.numpy(), cold=backend == "highs-cold"))
        return w[0] if single else w

    def _lp_structured(self, c: torch.Tensor) -> torch.Tensor | None:
        """Exact batched LP oracle of a structured set; None means "use HiGHS"."""
        return None

    def _highs(self) -> _Highs:
        if "lp" not in self._cache:
            self._cache["lp"] = _Highs(self)
        return self._cache["lp"]

    # ------------------------------------------------------------------ projection
    def project(self, v: Any, backend: str = "auto") -> torch.Tensor:
        """Euclidean projections ``Proj_S(v) = argmin_{w in S} ||w - v||^2``, row by row.

        Backends: ``exact`` (closed-form sort/breakpoint projection of the structured sets;
        differentiable), ``daqp`` (exact dual active set), ``highs`` (HiGHS's primal active-set
        QP solver), ``osqp`` (ADMM, set up once, warm started), ``qpth`` (batched interior point;
        differentiable). ``auto`` is ``exact`` where available, else ``daqp``. The solver
        workspaces are set up once per polytope. Accuracy per backend: :data:`PROJECTION_ACCURACY`.
        """
        vb, single = self._batched(v, "v")
        w = self._project(vb, backend)
        return w[0] if single else w

    def _project(self, v: torch.Tensor, backend: str) -> torch.Tensor:
        """:meth:`project` of a validated batch ``[B, d]``."""
        if backend not in PROJECTION_BACKENDS:
            raise ValueError(f"backend must be one of {PROJECTION_BACKENDS}; got {backend!r}")
        if backend == "auto":
            backend = "exact" if self.has_exact_projection else "daqp"
        if backend == "exact":
            if not self.has_exact_projection:
                raise ValueError(
                    f"backend 'exact' has no closed-form projection for {self!r}; "
                    "use 'daqp', 'highs', 'osqp' or 'qpth'"
                )
            return self._project_exact(v)
        if backend == "qpth":
            return self._solver(backend).project(v)
        return torch.from_numpy(self._solver(backend).project(v.detach().numpy()))

    has_exact_projection = False

    def _project_exact(self, v: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError  # only reached through has_exact_projection = True subclasses

    def _solver(self, backend: str) -> Any:
        """The projection workspace of ``backend``, built on first use."""
        if backend not in self._cache:
            solver: Any  # the backends' workspaces share no base class (their project() types differ)
            if backend == "daqp":
                solver = _DaqpProjector(self, fallback=lambda v: self._solver("highs").project(v))
            elif backend == "highs":
                solver = _Highs(self, quadratic=True)
            else:
                solver = {"osqp": _OsqpProjector, "qpth": _QpthProjector}[backend](self)
            self._cache[backend] = solver
        return self._cache[backend]

    def regularized_argmin(self, theta: Any, lam: float, backend: str = "auto") -> torch.Tensor:
        """``w_lam(theta) = argmin_{w in S} theta'w + (lam/2)||w||^2 = Proj_S(-theta/lam)``."""
        lam = _check_positive_scalar(lam, "lam", self)
        tb, single = self._batched(theta, "theta")
        w = self._project(-tb / lam, backend)
        return w[0] if single else w

    # ------------------------------------------------------------------ geometry
    def radius(self) -> float:
        """An upper bound on ``R = max_{w in S} ||w||``: the norm of the farthest corner of the
        tight bounding box of S (exact when that corner is in S, e.g. for a box)."""
        lo, hi = self.bounding_box()
        return float(np.sqrt(np.maximum(lo * lo, hi * hi).sum()))

    def bounding_box(self) -> tuple[np.ndarray, np.ndarray]:
        """``(min_{w in S} w_i, max_{w in S} w_i)`` for every i, from 2d LPs (cached)."""
        if self._box is None:
            self._box = self._highs().bounding_box(self)
        return self._box

    def independent_equalities(self) -> tuple[np.ndarray, np.ndarray]:
        """``(A_eq, b_eq)`` restricted to a linearly independent subset of rows (same set S)."""
        if self._eq_rows is None:
            self._eq_rows = np.arange(0)
            if self.A_eq.shape[0]:
                import scipy.linalg

                _, r, piv = scipy.linalg.qr(self.A_eq.T, mode="economic", pivoting=True)
                diag = np.abs(np.diag(r))
                rank = int((diag > diag[0] * max(self.A_eq.shape) * np.finfo(float).eps).sum())
                self._eq_rows = np.sort(piv[:rank])
        return self.A_eq[self._eq_rows], self.b_eq[self._eq_rows]


# ---------------------------------------------------------------------- solver workspaces
class _Highs:
    """One persistent HiGHS model of S; each solve only changes the costs (warm started).

    Minimises ``q'w`` (LP, dual simplex) or, with ``quadratic=True``, ``q'w + 0.5||w||^2``
    (HiGHS's active-set QP solver), so the projection of v is ``solve(-v)``.
    """

    def __init__(self, poly: Polytope, quadratic: bool = False) -> None:
        import highspy
        import scipy.sparse as sp

        self._status = highspy.HighsModelStatus
        h = quiet_highs()
        inf = highspy.kHighsInf
        A = sp.csc_matrix(np.vstack([poly.A_ub, poly.A_eq]))
        lp = highspy.HighsLp()
        lp.num_col_, lp.num_row_ = poly.dim, A.shape[0]
        lp.col_cost_ = np.zeros(poly.dim)
        lp.col_lower_ = np.where(np.isfinite(poly.lb), poly.lb, -inf)
        lp.col_upper_ = np.where(np.isfinite(poly.ub), poly.ub, inf)
        lp.row_lower_ = np.concatenate([np.full(poly.A_ub.shape[0], -inf), poly.b_eq])
        lp.row_upper_ = np.concatenate([poly.b_ub, poly.b_eq])
        lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
        lp.a_matrix_.start_, lp.a_matrix_.index_, lp.a_matrix_.value_ = A.indptr, A.indices, A.data
        h.passModel(lp)
        if quadratic:
            hessian = highspy.HighsHessian()
            hessian.dim_, hessian.format_ = poly.dim, highspy.HessianFormat.kTriangular
            hessian.start_ = np.arange(poly.dim + 1, dtype=np.int32)
            hessian.index_ = np.arange(poly.dim, dtype=np.int32)
            hessian.value_ = np.ones(poly.dim)
            h.passHessian(hessian)
            h.setOptionValue("qp_regularization_value", 0.0)  # default 1e-7 perturbs w by ~1e-7; H = I is PD
        self._h, self._idx, self._repr = h, np.arange(poly.dim, dtype=np.int32), repr(poly)
        self._n_ub = poly.A_ub.shape[0]

    def _run(self, cost: np.ndarray) -> Any:
        self._h.changeColsCost(cost.size, self._idx, cost)
        self._h.run()
        return self._h.getModelStatus()

    def feasibility(self) -> str:
        status = self._run(np.zeros(self._idx.size))
        return "optimal" if status == self._status.kOptimal else self._h.modelStatusToString(status)

    def infeasible_rows(self) -> list[tuple[str, int]]:
        """An irreducible infeasible subset of the rows (HiGHS's IIS), as ``("ub" | "eq", index)``."""
        self._h.setOptionValue("iis_strategy", 2)  # the default strategy returns no rows for LPs
        status, iis = self._h.getIis()
        if status != highspy_ok() or not iis.valid_:
            return []
        m_ub = self._n_ub
        return [("ub", int(r)) if r < m_ub else ("eq", int(r) - m_ub) for r in iis.row_index_]

    def solve(self, q: np.ndarray, cold: bool = False) -> np.ndarray:
        """Minimisers for each row of the costs ``q [B, d]``; ``cold``: each row from HiGHS's cold
        start, so that among tied minimisers the one returned depends on that row's costs only."""
        out = np.empty_like(q)
        for i, qi in enumerate(q):
            if cold:
                self._h.clearSolver()
            status = self._run(qi)
            if status != self._status.kOptimal:
                raise RuntimeError(f"HiGHS failed on {self._repr}: {self._h.modelStatusToString(status)}")
            out[i] = self._h.getSolution().col_value
        return out

    def project(self, v: np.ndarray) -> np.ndarray:
        """Projections of the rows of ``v`` (quadratic model): ``argmin 0.5||w||^2 - v'w``."""
        return self.solve(-v)

    def bounding_box(self, poly: Polytope) -> tuple[np.ndarray, np.ndarray]:
        lo, hi = poly.lb.copy(), poly.ub.copy()
        for i in range(poly.dim):
            for sign, target in ((1.0, lo), (-1.0, hi)):
                cost = np.zeros(poly.dim)
                cost[i] = sign
                status = self._run(cost)
                if status != self._status.kOptimal:
                    side = "-inf" if sign > 0 else "+inf"
                    raise ValueError(
                        f"{poly!r} is unbounded: {poly._var(i)} can go to {side}; a polytope must be bounded"
                    )
                target[i] = self._h.getSolution().col_value[i]
        return lo, hi


class _DaqpProjector:
    """DAQP (dual active set) workspace for ``min 0.5||w||^2 - v'w`` over S, set up once.

    DAQP's tolerances are absolute, so for points far outside S (``||v||`` of 1e5 and more,
    e.g. ``w_lam`` with a tiny lam) landing on a degenerate vertex it can report a false
    infeasibility; those rows go to ``fallback`` (HiGHS's active-set QP solver).
    """

    def __init__(self, poly: Polytope, fallback: Callable[[np.ndarray], np.ndarray]) -> None:
        import daqp

        A_eq, b_eq = poly.independent_equalities()
        A = np.ascontiguousarray(np.vstack([poly.A_ub, A_eq]))
        m_ub, m_eq = poly.A_ub.shape[0], A_eq.shape[0]
        upper = np.concatenate([poly.ub, poly.b_ub, b_eq])
        lower = np.concatenate([poly.lb, np.full(m_ub, -np.inf), b_eq])
        sense = np.concatenate([np.zeros(poly.dim + m_ub), np.full(m_eq, 5)]).astype(np.int32)  # 5 = equality
        self._model = daqp.Model()
        # Eliminating the equalities up front is ~3x faster on the grid-flow sets (measured).
        self._model.settings = {"primal_tol": _DAQP_PRIMAL_TOL, "eq_reduction": 1}
        exitflag, _ = self._model.setup(np.eye(poly.dim), np.zeros(poly.dim), A, upper, lower, sense)
        if exitflag < 0:
            raise RuntimeError(f"DAQP setup failed on {poly!r} (exitflag {exitflag})")
        self._fallback = fallback
        self._sense = sense

    def project(self, v: np.ndarray) -> np.ndarray:
        out = np.empty_like(v)
        failed = np.zeros(v.shape[0], dtype=bool)
        for i, vi in enumerate(v):
            # Passing the constraint senses again clears the previous row's active set: starting
            # from it took ~1.5x the iterations of a cold start (measured on the pilot's LPs).
            self._model.update(f=-vi, sense=self._sense.copy())
            x, _, exitflag, _ = self._model.solve()
            failed[i] = exitflag < 1
            out[i] = x
        if failed.any():
            out[failed] = self._fallback(v[failed])
        return out


class _OsqpProjector:
    """OSQP workspace (P = I, builtin algebra), set up once; each vector updates q and warm starts."""

    def __init__(self, poly: Polytope) -> None:
        import osqp
        import scipy.sparse as sp

        A = sp.vstack(
            [sp.identity(poly.dim), sp.csc_matrix(poly.A_ub), sp.csc_matrix(poly.A_eq)], format="csc"
        )
        lower = np.concatenate([poly.lb, np.full(poly.A_ub.shape[0], -np.inf), poly.b_eq])
        upper = np.concatenate([poly.ub, poly.b_ub, poly.b_eq])
        self._solver = osqp.OSQP(algebra="builtin")  # other algebras retry failed imports per setup
        self._solver.setup(
            sp.identity(poly.dim, format="csc"),
            np.zeros(poly.dim),
            A,
            lower,
            upper,
            verbose=False,
            eps_abs=_OSQP_EPS,
            eps_rel=_OSQP_EPS,
            polishing=True,
            warm_starting=True,
            max_iter=20000,
        )
        self._repr = repr(poly)

    def project(self, v: np.ndarray) -> np.ndarray:
        out = np.empty_like(v)
        for i, vi in enumerate(v):
            self._solver.update(q=-vi)
            res = self._solver.solve(raise_error=False)
            if res.info.status not in ("solved", "solved inaccurate"):
                raise RuntimeError(f"OSQP failed on {self._repr}: {res.info.status}")
            out[i] = res.x
        return out


class _QpthProjector:
    """qpth's batched primal-dual interior point on S (differentiable through its KKT system)."""

    def __init__(self, poly: Polytope) -> None:
        rows = [poly.A_ub]
        rhs = [poly.b_ub]
        finite_ub, finite_lb = np.isfinite(poly.ub), np.isfinite(poly.lb)
        eye = np.eye(poly.dim)
        rows += [eye[finite_ub], -eye[finite_lb]]
        rhs += [poly.ub[finite_ub], -poly.lb[finite_lb]]
        G = np.vstack(rows)
        if G.shape[0] == 0:
            raise ValueError(
                f"backend 'qpth' needs at least one inequality or finite bound; {poly!r} has none"
            )
        A_eq, b_eq = poly.independent_equalities()
        self._G, self._h = torch.from_numpy(G), torch.from_numpy(np.concatenate(rhs))
        self._A, self._b = torch.from_numpy(A_eq), torch.from_numpy(b_eq)
        self._Q = torch.eye(poly.dim, dtype=torch.float64)

    def project(self, v: torch.Tensor) -> torch.Tensor:
        from qpth.qp import QPFunction

        empty = torch.empty(0, dtype=torch.float64)
        A, b = (self._A, self._b) if self._A.shape[0] else (empty, empty)
        return QPFunction(verbose=-1, eps=1e-12, maxIter=_QPTH_MAX_ITER)(self._Q, -v, self._G, self._h, A, b)


# ---------------------------------------------------------------------- structured sets
def _argsort_rows(x: torch.Tensor) -> torch.Tensor:
    """``argsort`` along the last axis of a CPU tensor (order among ties unspecified).

    NumPy's introsort is ~2x faster than ``torch.sort`` on short rows like these (measured on
    [64, 100] float64), and the sort dominates the exact oracles' cost.
    """
    return torch.from_numpy(np.argsort(x.detach().numpy(), axis=-1))


def _greedy_fill(a_sorted: torch.Tensor, capacity: float) -> torch.Tensor:
    """Fill items of weights ``a_sorted`` in order: ``w_k = clip((C - sum_{j<k} a_j) / a_k, 0, 1)``."""
    before = a_sorted.cumsum(-1) - a_sorted
    return ((capacity - before) / a_sorted).clamp(0.0, 1.0)


class _BoxLinearProjection:
    """Batched exact projection onto ``{0 <= w <= hi, a'w <= cap}`` (``= cap`` if ``equality``),
    ``a > 0``, scalar ``hi > 0``; differentiable in the point.

    ``w(mu) = clip(v - mu a, 0, hi)`` and ``g(mu) = a'w(mu)`` is non-increasing and piecewise
    linear with breakpoints ``(v_i - hi)/a_i`` and ``v_i/a_i``. Sort the 2d breakpoints, accumulate
    the slopes to get g at each, find the segment where g crosses ``cap``, then take one exact
    active-set step on it: ``mu = (sum_free a_i v_i + hi sum_upper a_i - cap) / sum_free a_i^2``.
    For the inequality, ``mu = max(mu, 0)`` (the constraint is slack when the root is negative).
    """

    def __init__(self, a: torch.Tensor, hi: float, cap: float, equality: bool) -> None:
        self.a, self.hi, self.cap, self.equality = a, hi, cap, equality
        a2 = a * a
        self._a_col, self._a2_col = a[:, None], a2[:, None]
        self._inv_a = 1.0 / a
        self._width = hi * self._inv_a
        self._slope_steps = torch.cat((-a2, a2))  # slope change at (v_i - hi)/a_i and at v_i/a_i
        self._g_start = hi * float(a.sum())  # g(mu) left of every breakpoint: all at hi

    def __call__(self, v: torch.Tensor) -> torch.Tensor:
        # Degenerate sets (v * 0 keeps the output in the autograd graph, with a zero Jacobian).
        if self.cap <= 0:  # the set is {0}
            return v * 0.0
        if self.cap >= self._g_start:  # the linear row cannot bind
            return v * 0.0 + self.hi if self.equality else v.clamp(0.0, self.hi)
        vd = v.detach()
        t_lo = vd * self._inv_a  # w_i = 0 for mu >= t_lo, w_i = hi for mu <= t_hi
        t_hi = t_lo - self._width
        breakpoints = torch.cat((t_hi, t_lo), -1)
        order = _argsort_rows(breakpoints)
        bp = breakpoints.gather(-1, order)
        # slope of g right of each breakpoint
        slope = self._slope_steps.expand_as(order).gather(-1, order).cumsum(-1)
        g = self._g_start + (slope[:, :-1] * bp.diff(dim=-1)).cumsum(-1)  # g at breakpoints 1 .. 2d-1
        k = ((g > self.cap).sum(-1, keepdim=True) + 1).clamp_max(g.shape[-1])  # g(bp_{k-1}) > cap >= g(bp_k)
        ends = bp.gather(-1, torch.cat((k - 1, k), -1))
        left, right = ends[:, :1], ends[:, 1:]
        mid = 0.5 * (left + right)
        free = ((t_hi < mid) & (mid < t_lo)).to(v.dtype)
        at_hi = (mid <= t_hi).to(v.dtype)
        denom = free @ self._a2_col
        num = (v * free) @ self._a_col + self.hi * (at_hi @ self._a_col) - self.cap
        # denom = 0 only if rounding picked an empty segment; its end point is then the root.
        mu = torch.where(denom > 0, num / denom.clamp_min(1e-300), mid)
        mu = torch.clamp(mu, left, right)  # rounding must not leave the segment
        if not self.equality:
            mu = mu.clamp_min(0.0)
        return torch.clamp(v - mu * self.a, 0.0, self.hi)


class KnapsackPolytope(Polytope):
    """Fractional knapsack ``{w : 0 <= w <= 1, a'w <= C}`` with weights ``a > 0`` and ``C >= 0``."""

    has_exact_projection = True

    def __init__(self, weights: Any, capacity: float) -> None:
        a = _as_float_array(weights, "weights", 1)
        if a.size == 0 or not np.isfinite(a).all() or (a <= 0).any():
            raise ValueError(
                f"KnapsackPolytope weights must be a non-empty vector of finite values > 0; got {a}"
            )
        cap = float(capacity)
        if not math.isfinite(cap):
            raise ValueError(f"KnapsackPolytope capacity must be finite; got {capacity!r}")
        if cap < 0:
            raise ValueError(f"KnapsackPolytope is empty: capacity = {cap} < 0 but weights and w are >= 0")
        self.capacity = cap
        self._a = torch.from_numpy(a)
        self._projection = _BoxLinearProjection(self._a, 1.0, cap, equality=False)
        super().__init__(A_ub=a[None, :], b_ub=[cap], lb=0.0, ub=1.0)

    def _check_nonempty_and_bounded(self) -> None:
        pass  # w = 0 is feasible whenever capacity >= 0, checked above

    def __repr__(self) -> str:
        return f"KnapsackPolytope(dim={self.dim}, capacity={self.capacity:.6g})"

    def _lp_structured(self, c: torch.Tensor) -> torch.Tensor:
        """Greedy: items with ``c_i < 0`` in ascending ``c_i / a_i``, filled until the capacity."""
        negative = c < 0
        order = _argsort_rows(torch.where(negative, c / self._a, torch.inf))
        fill = _greedy_fill(self._a.expand_as(c).gather(-1, order), self.capacity) * negative.gather(
            -1, order
        )
        return torch.zeros_like(c).scatter_(-1, order, fill)

    def _project_exact(self, v: torch.Tensor) -> torch.Tensor:
        return self._projection(v)

    def radius(self) -> float:
        """Norm of the reference code's fill: items in ascending weight, whole while they fit, then
        the fraction of the next one that fits (``compute_knapsack_feasible_radius``). A lower
        bound on ``max_{w in S} ||w||``, exact when the fill ends on a whole item."""
        return float(_greedy_fill(self._a.sort().values, self.capacity).norm())


class QuotaPolytope(Polytope):
    """Daily quota ``{w : 0 <= w <= upper, sum_h w_h = quota}`` (buy ``quota`` units over ``dim`` slots)."""

    has_exact_projection = True

    def __init__(self, dim: int, quota: float, upper: float = 1.0) -> None:
        if isinstance(dim, bool) or not isinstance(dim, int | np.integer) or dim < 1:
            raise ValueError(f"QuotaPolytope dim must be an integer >= 1; got {dim!r}")
        self.upper = _check_positive_scalar(upper, "upper", f"QuotaPolytope(dim={dim})")
        q = float(quota)
        if not math.isfinite(q) or q < 0 or q > dim * self.upper:
            raise ValueError(
                f"QuotaPolytope is empty: quota = {quota!r} must lie in "
                f"[0, dim * upper] = [0, {dim * self.upper:.6g}]"
            )
        self.quota = q
        self._projection = _BoxLinearProjection(
            torch.ones(dim, dtype=torch.float64), self.upper, q, equality=True
        )
        # The cheapest-slots fill: slot of rank j gets clip(quota - j*upper, 0, upper).
        self._fill = (q - self.upper * torch.arange(dim, dtype=torch.float64)).clamp(0.0, self.upper)
        super().__init__(A_eq=np.ones((1, dim)), b_eq=[q], lb=0.0, ub=self.upper)

    def _check_nonempty_and_bounded(self) -> None:
        pass  # quota in [0, dim*upper] checked above

    def __repr__(self) -> str:
        return f"QuotaPolytope(dim={self.dim}, quota={self.quota:.6g}, upper={self.upper:.6g})"

    def _lp_structured(self, c: torch.Tensor) -> torch.Tensor:
        """Fill the cheapest slots first (ties broken by index order of the sort)."""
        return torch.zeros_like(c).scatter_(-1, _argsort_rows(c), self._fill.expand_as(c))

    def _project_exact(self, v: torch.Tensor) -> torch.Tensor:
        return self._projection(v)

    def radius(self) -> float:
        """Exact ``max ||w|| = upper sqrt(floor(D) + frac(D)^2)`` with ``D = quota / upper``
        (floor(D) full slots and one partial slot: the vertex farthest from the origin)."""
        return float(self._fill.norm())


class GridFlowPolytope(Polytope):
    """Unit ``source -> sink`` flows on the k x k grid graph, ``0 <= w <= 1``.

    Edge slots (d = 2k(k-1), the same for every source/sink): first the horizontal edges
    row-major (slot ``r*(k-1) + c`` joins nodes (r, c) and (r, c+1)), then the vertical edges
    row-major (slot ``k(k-1) + r*k + c`` joins (r, c) and (r+1, c)). Every horizontal edge points
    in the direction ``sign(col_sink - col_source)`` (right if equal), every vertical edge in
    ``sign(row_sink - row_source)`` (down if equal), so the graph is a DAG in which each
    source-sink path is monotone and stays in the source-sink rectangle. Node ``(r, c)`` has
    flow conservation row ``r*k + c``: out - in = 1 at the source, -1 at the sink, 0 elsewhere.
    """

    def __init__(self, k: int, source: Sequence[int] = (0, 0), sink: Sequence[int] | None = None) -> None:
        if isinstance(k, bool) or not isinstance(k, int | np.integer) or k < 2:
            raise ValueError(f"GridFlowPolytope k must be an integer >= 2; got {k!r}")
        sink = (k - 1, k - 1) if sink is None else sink
        self.k = int(k)
        self.source, self.sink = self._node(source, "source"), self._node(sink, "sink")
        if self.source == self.sink:
            raise ValueError(f"GridFlowPolytope(k={k}): sink {self.sink} equals source; no path to route")
        (rs, cs), (rt, ct) = self.source, self.sink
        self._dr, self._dc = (1 if rt >= rs else -1), (1 if ct >= cs else -1)
        self.edges = self._oriented_edges()
        nodes = k * k
        A = np.zeros((nodes, len(self.edges)))
        for e, ((r0, c0), (r1, c1)) in enumerate(self.edges):
            A[r0 * k + c0, e], A[r1 * k + c1, e] = 1.0, -1.0
        b = np.zeros(nodes)
        b[rs * k + cs], b[rt * k + ct] = 1.0, -1.0
        self._index_rectangle()
        super().__init__(A_eq=A, b_eq=b, lb=0.0, ub=1.0)

    def _node(self, node: Sequence[int], name: str) -> tuple[int, int]:
        try:
            r, c = (int(x) for x in node)
        except (TypeError, ValueError):
            raise ValueError(f"GridFlowPolytope {name} must be a (row, col) pair; got {node!r}") from None
        if not (0 <= r < self.k and 0 <= c < self.k):
            raise ValueError(f"GridFlowPolytope(k={self.k}): {name} {node!r} is outside the grid")
        return r, c

    def _oriented_edges(self) -> tuple[tuple[tuple[int, int], tuple[int, int]], ...]:
        """``(tail, head)`` node pairs in slot order."""
        k, edges = self.k, []
        for r in range(k):
            for c in range(k - 1):
                edges.append(((r, c), (r, c + 1)) if self._dc > 0 else ((r, c + 1), (r, c)))
        for r in range(k - 1):
            for c in range(k):
                edges.append(((r, c), (r + 1, c)) if self._dr > 0 else ((r + 1, c), (r, c)))
        return tuple(edges)

    def _index_rectangle(self) -> None:
        """Slots of the edges inside the source-sink rectangle, in rectangle coordinates:
        ``_h_slot[i, j]`` moves from rectangle column j to j+1 in row i, ``_v_slot[i, j]`` from
        row i to i+1 in column j (row/column 0 is the source's)."""
        (rs, cs), (rt, ct) = self.source, self.sink
        n_rows, n_cols = abs(rt - rs) + 1, abs(ct - cs) + 1
        k, dr, dc = self.k, self._dr, self._dc
        h_slot = [
            [(rs + dr * i) * (k - 1) + min(cs + dc * j, cs + dc * (j + 1)) for j in range(n_cols - 1)]
            for i in range(n_rows)
        ]
        v_slot = [
            [k * (k - 1) + min(rs + dr * i, rs + dr * (i + 1)) * k + cs + dc * j for j in range(n_cols)]
            for i in range(n_rows - 1)
        ]
        self._h_slot = torch.tensor(h_slot, dtype=torch.long).reshape(n_rows, n_cols - 1)
        self._v_slot = torch.tensor(v_slot, dtype=torch.long).reshape(n_rows - 1, n_cols)

    def _check_nonempty_and_bounded(self) -> None:
        pass  # the monotone staircase path from source to sink always exists (source != sink)

    def __repr__(self) -> str:
        return f"GridFlowPolytope(k={self.k}, source={self.source}, sink={self.sink})"

    def _lp_structured(self, c: torch.Tensor) -> torch.Tensor:
        """Shortest monotone path by dynamic programming, one rectangle row at a time.

        Within row i the path enters from above at some column m and moves right to column j,
        so ``dist_i[j] = min_{m <= j} (top_i[m] - S_i[m]) + S_i[j]`` with ``S_i`` the prefix sums
        of the row's edge costs and ``top_i = dist_{i-1} + (vertical costs)``: a ``cummin``.
        """
        batch = c.shape[0]
        n_rows, n_cols = self._v_slot.shape[0] + 1, self._h_slot.shape[1] + 1
        prefix = torch.cat((c.new_zeros(batch, n_rows, 1), c[:, self._h_slot].cumsum(-1)), -1)
        vertical = c[:, self._v_slot]
        top = torch.full((batch, n_cols), torch.inf, dtype=c.dtype)
        top[:, 0] = 0.0  # row 0 is entered only at the source
        entry = []
        for i in range(n_rows):
            best, arg = torch.cummin(top - prefix[:, i], dim=-1)
            entry.append(arg)
            if i + 1 < n_rows:
                top = best + prefix[:, i] + vertical[:, i]
        w = torch.zeros_like(c)
        cols = torch.arange(n_cols)
        leave = torch.full((batch, 1), n_cols - 1, dtype=torch.long)  # column where the path leaves row i
        for i in reversed(range(n_rows)):
            enter = entry[i].gather(-1, leave)
            w[:, self._h_slot[i]] = ((cols[:-1] >= enter) & (cols[:-1] < leave)).to(c.dtype)
            if i > 0:
                w[:, self._v_slot[i - 1]] = (cols == enter).to(c.dtype)
            leave = enter
        return w

    def radius(self) -> float:
        """Exact: vertices are monotone paths, all with |row_t - row_s| + |col_t - col_s| unit edges."""
        (rs, cs), (rt, ct) = self.source, self.sink
        return math.sqrt(abs(rt - rs) + abs(ct - cs))
