"""A silo's own LP (problem ``lp``): its solver workspaces built once against a plain loop of fresh
solver calls and against the structured sets' exact oracles.

Two user LP files in CPLEX LP format, read with ``hetfed.problems.lp.read_lp`` as a silo reads its own:

* 24 variables: the worked pilot's first silo (``examples/pilot/silo-0/problem.lp``): buy 12 MWh a
  day, ``0 <= h <= 1.2``, hour-to-hour ramps of at most 0.4;
* 264 variables: 11 days x 24 hours of a similar buyer (``d01h01`` .. ``d11h24``): a quota row per
  day, ramp rows within and across days, the same bounds, and one weekly cap (the first 7 days'
  evening-peak purchases, h17-h21, at most 21 MWh).

For each, and for the closest structured set (``QuotaPolytope`` with the same quota and bounds and
no ramps), it times

* a training epoch: 512 regularized minimisers ``w_lam(theta) = Proj_S(-theta/lam)`` (RSPO+'s
  projection per batch row), theta ~ N(0, 1) and the trainer's ``lam0 = mean||theta|| / R``, through
  the polytope's DAQP workspace (set up once per polytope, before timing), a new DAQP model set up
  per row, a new HiGHS QP model per row, and the structured set's exact projection;
* a decision batch: 512 LP solves ``argmin_{w in S} c'w``, c ~ N(0, 1), through the persistent
  HiGHS model warm started from the previous row (``backend="highs"``), the same model cold started
  per row (``"highs-cold"``, what ``hetfed decide`` uses), a fresh ``scipy.optimize.linprog``
  (method ``highs``) per row, and the structured set's exact greedy oracle.

Every route's answers are checked against the persistent workspace's before any time is reported
(projections to 1e-6 max abs difference, LP objectives to 1e-7 relative, every answer feasible to
1e-7); the structured oracles are checked against the general solvers on the structured set itself.
Times are process CPU time (on a shared machine far less noisy than wall time, which is shown
too), best of up to ``REPEATS`` runs interleaved across routes (a route runs again only while its
runs so far took under ``BUDGET`` seconds, so the slow 264-variable routes run once), one torch
thread.

Run: ``python bench/lp_oracles.py [--note "what else was running"]`` (writes its section of
docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench._report import markdown_table, write_section  # noqa: E402
from hetfed.problems.lp import read_lp  # noqa: E402
from hetfed.problems.polytope import Polytope, QuotaPolytope  # noqa: E402

ROWS = 512  # rows of a training epoch and of a decision batch
REPEATS = 5  # at most this many runs of a route, interleaved across routes; the best is reported
BUDGET = 2.0  # CPU seconds: a route is run again only while its runs so far took less (keeps it < 60 s)
PROJECTION_TOL = 1e-6  # max abs difference between projection routes
OBJECTIVE_TOL = 1e-7  # relative difference of LP objectives (absolute below |objective| = 1)
FEASIBILITY_TOL = 1e-7
DAQP_SETTINGS = {"primal_tol": 1e-12, "eq_reduction": 1}  # the polytope's own DAQP settings

PILOT_LP = ROOT / "examples" / "pilot" / "silo-0" / "problem.lp"
# The 264-variable buyer (the pilot's silo-0 over 11 days).
DAYS, HOURS = 11, 24
QUOTA, UPPER, RAMP = 12.0, 1.2, 0.4
PEAK_HOURS, PEAK_DAYS, PEAK_CAP = range(17, 22), 7, 21.0


def buyer_lp() -> tuple[str, list[str]]:
    """The 264-variable LP file's text and its variables in order."""
    names = [f"d{d:02d}h{h:02d}" for d in range(1, DAYS + 1) for h in range(1, HOURS + 1)]

    def total(terms: list[str]) -> str:  # a long sum, 8 terms a line (the LP format continues lines)
        lines = [" + ".join(terms[i : i + 8]) for i in range(0, len(terms), 8)]
        return "\n   + ".join(lines)

    rows = []
    for d in range(DAYS):
        rows.append(f" quota_d{d + 1:02d}: {total(names[d * HOURS : (d + 1) * HOURS])} = {QUOTA:g}")
    for t in range(len(names) - 1):  # within a day and from one day's h24 to the next day's h01
        a, b = names[t], names[t + 1]
        rows.append(f" up_{a}: {b} - {a} <= {RAMP:g}")
        rows.append(f" down_{a}: {a} - {b} <= {RAMP:g}")
    peak = [f"d{d:02d}h{h:02d}" for d in range(1, PEAK_DAYS + 1) for h in PEAK_HOURS]
    rows.append(f" week_peak_cap: {total(peak)} <= {PEAK_CAP:g}")
    bounds = [f" 0 <= {n} <= {UPPER:g}" for n in names]
    text = "\n".join(["Minimize", f" obj: {total(names)}", "Subject To", *rows, "Bounds", *bounds, "End", ""])
    return text, names


# ---------------------------------------------------------------------- plain loops of fresh solver calls
def fresh_daqp(poly: Polytope) -> Callable[[np.ndarray], np.ndarray]:
    """Projections with a new DAQP model set up per row (same QP and settings as the workspace's)."""
    import daqp

    A = np.ascontiguousarray(np.vstack([poly.A_ub, poly.A_eq]))
    m_ub, m_eq = poly.A_ub.shape[0], poly.A_eq.shape[0]
    upper = np.concatenate([poly.ub, poly.b_ub, poly.b_eq])
    lower = np.concatenate([poly.lb, np.full(m_ub, -np.inf), poly.b_eq])
    sense = np.concatenate([np.zeros(poly.dim + m_ub), np.full(m_eq, 5)]).astype(np.int32)  # 5: equality
    H = np.eye(poly.dim)

    def project(v: np.ndarray) -> np.ndarray:
        out = np.empty_like(v)
        for i, vi in enumerate(v):
            model = daqp.Model()
            model.settings = DAQP_SETTINGS
            exitflag, _ = model.setup(H, -vi, A, upper, lower, sense)
            x, _, exitflag, _ = model.solve()
            if exitflag < 1:
                raise RuntimeError(f"fresh DAQP failed on row {i} of {poly!r} (exitflag {exitflag})")
            out[i] = x
        return out

    return project


def fresh_highs_qp(poly: Polytope) -> Callable[[np.ndarray], np.ndarray]:
    """Projections with a new HiGHS QP model (``min 0.5||w||^2 - v'w`` over S) built per row."""
    import highspy
    import scipy.sparse as sp

    inf = highspy.kHighsInf
    A = sp.csc_matrix(np.vstack([poly.A_ub, poly.A_eq]))
    col_lower = np.where(np.isfinite(poly.lb), poly.lb, -inf)
    col_upper = np.where(np.isfinite(poly.ub), poly.ub, inf)
    row_lower = np.concatenate([np.full(poly.A_ub.shape[0], -inf), poly.b_eq])
    row_upper = np.concatenate([poly.b_ub, poly.b_eq])
    diagonal = np.arange(poly.dim, dtype=np.int32)

    def project(v: np.ndarray) -> np.ndarray:
        out = np.empty_like(v)
        for i, vi in enumerate(v):
            h = highspy.Highs()
            h.setOptionValue("output_flag", False)
            h.setOptionValue("qp_regularization_value", 0.0)
            lp = highspy.HighsLp()
            lp.num_col_, lp.num_row_ = poly.dim, A.shape[0]
            lp.col_cost_, lp.col_lower_, lp.col_upper_ = -vi, col_lower, col_upper
            lp.row_lower_, lp.row_upper_ = row_lower, row_upper
            lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
            lp.a_matrix_.start_, lp.a_matrix_.index_, lp.a_matrix_.value_ = A.indptr, A.indices, A.data
            h.passModel(lp)
            hessian = highspy.HighsHessian()
            hessian.dim_, hessian.format_ = poly.dim, highspy.HessianFormat.kTriangular
            hessian.start_ = np.arange(poly.dim + 1, dtype=np.int32)
            hessian.index_, hessian.value_ = diagonal, np.ones(poly.dim)
            h.passHessian(hessian)
            h.run()
            status = h.getModelStatus()
            if status != highspy.HighsModelStatus.kOptimal:
                raise RuntimeError(f"fresh HiGHS QP failed on row {i}: {h.modelStatusToString(status)}")
            out[i] = h.getSolution().col_value
        return out

    return project


def fresh_linprog(poly: Polytope) -> Callable[[np.ndarray], np.ndarray]:
    """LP minimisers with a fresh ``scipy.optimize.linprog(method="highs")`` call per row."""
    from scipy.optimize import linprog

    bounds = np.column_stack([poly.lb, poly.ub])
    A_ub, b_ub = (poly.A_ub, poly.b_ub) if poly.A_ub.shape[0] else (None, None)
    A_eq, b_eq = (poly.A_eq, poly.b_eq) if poly.A_eq.shape[0] else (None, None)

    def solve(c: np.ndarray) -> np.ndarray:
        out = np.empty_like(c)
        for i, ci in enumerate(c):
            res = linprog(ci, A_ub=A_ub, b_ub=b_ub, A_eq=A_eq, b_eq=b_eq, bounds=bounds, method="highs")
            if res.status != 0:
                raise RuntimeError(f"linprog failed on row {i} of {poly!r}: {res.message}")
            out[i] = res.x
        return out

    return solve


# ---------------------------------------------------------------------- timing and checks
EPOCH, DECIDE = "training epoch", "decision batch"


@dataclass
class Route:
    batch: str  # EPOCH or DECIDE
    name: str
    run: Callable[[], np.ndarray]
    reference: bool = False  # the workspace built once that the batch's ratios are taken to
    times: list[float] = field(default_factory=list)  # CPU seconds per run
    walls: list[float] = field(default_factory=list)  # wall seconds per run
    answer: np.ndarray | None = None

    @property
    def best(self) -> float:
        return min(self.times)


def as_numpy(x: torch.Tensor) -> np.ndarray:
    return x.detach().numpy()


def time_routes(routes: list[Route]) -> None:
    """CPU and wall time of each route, repeats interleaved across routes; a route is repeated up to
    ``REPEATS`` times while its runs so far took less than ``BUDGET`` CPU seconds (at least once)."""
    for r in range(REPEATS):
        for route in routes:
            if r and sum(route.times) >= BUDGET:
                continue
            cpu, wall = time.process_time(), time.perf_counter()
            out = route.run()
            route.times.append(time.process_time() - cpu)
            route.walls.append(time.perf_counter() - wall)
            route.answer = out


def answers(routes: list[Route]) -> dict[str, np.ndarray]:
    out = {}
    for r in routes:
        if r.answer is None:
            raise AssertionError(f"{r.name} returned nothing")
        out[r.name] = r.answer
    return out


def check_feasible(poly: Polytope, name: str, route: str, w: np.ndarray) -> None:
    violation = float(poly.max_violation(torch.from_numpy(w)).max())
    if violation > FEASIBILITY_TOL:
        raise AssertionError(f"{name}: {route} leaves the set by {violation:.1e} (> {FEASIBILITY_TOL:g})")


def check_projections(poly: Polytope, name: str, by_route: dict[str, np.ndarray]) -> float:
    """Max abs difference of every route's projections from the first route's; raises above the
    tolerance or if an answer is infeasible."""
    ref_name, ref = next(iter(by_route.items()))
    worst = 0.0
    for route, w in by_route.items():
        check_feasible(poly, name, route, w)
        diff = float(np.abs(w - ref).max())
        if diff > PROJECTION_TOL:
            raise AssertionError(
                f"{name}: {route} differs from {ref_name} by {diff:.1e} (> {PROJECTION_TOL:g})"
            )
        worst = max(worst, diff)
    return worst


def check_objectives(poly: Polytope, name: str, c: np.ndarray, by_route: dict[str, np.ndarray]) -> float:
    """Max relative difference of every route's objectives ``c'w`` from the first route's
    (absolute below ``|c'w| = 1``); raises above tolerance. Tied minimisers may differ; objectives not."""
    ref_name, ref = next(iter(by_route.items()))
    ref_obj = (c * ref).sum(1)
    worst = 0.0
    for route, w in by_route.items():
        check_feasible(poly, name, route, w)
        rel = float((np.abs((c * w).sum(1) - ref_obj) / np.maximum(1.0, np.abs(ref_obj))).max())
        if rel > OBJECTIVE_TOL:
            raise AssertionError(
                f"{name}: {route}'s objectives differ from {ref_name}'s by {rel:.1e} relative"
            )
        worst = max(worst, rel)
    return worst


def lam0(theta: np.ndarray, poly: Polytope) -> float:
    """The trainer's calibration ``lam0 = mean_i ||theta_i|| / R``."""
    return float(np.linalg.norm(theta, axis=1).mean() / poly.radius())


def quota_name(quota: QuotaPolytope) -> str:
    return f"QuotaPolytope({quota.dim}, {quota.quota:g}, upper={quota.upper:g})"


def benchmark(label: str, poly: Polytope, quota: QuotaPolytope, rng: np.random.Generator) -> list[Route]:
    """Time and check every route on one user LP ``poly`` and its structured reference ``quota``."""
    theta_np, c_np = rng.normal(size=(ROWS, poly.dim)), rng.normal(size=(ROWS, poly.dim))
    theta, c = torch.from_numpy(theta_np), torch.from_numpy(c_np)
    lam, lam_q = lam0(theta_np, poly), lam0(theta_np, quota)
    v = -theta_np / lam
    # The workspaces built once, before timing (a silo builds them on first use and keeps them).
    poly.regularized_argmin(theta[:1], lam, backend="daqp")
    poly.solve_lp(c[:1], backend="highs")
    daqp_fresh, highs_fresh, linprog_fresh = fresh_daqp(poly), fresh_highs_qp(poly), fresh_linprog(poly)
    exact = f"structured exact, {quota_name(quota)}"
    epoch = [
        Route(EPOCH, BUILT_ONCE[EPOCH], lambda: as_numpy(poly.regularized_argmin(theta, lam, "daqp")), True),
        Route(EPOCH, FRESH_DAQP, lambda: daqp_fresh(v)),
        Route(EPOCH, FRESH_HIGHS, lambda: highs_fresh(v)),
        Route(EPOCH, exact, lambda: as_numpy(quota.regularized_argmin(theta, lam_q, "exact"))),
    ]
    decide = [
        Route(DECIDE, BUILT_ONCE[DECIDE], lambda: as_numpy(poly.solve_lp(c, "highs")), True),
        Route(DECIDE, COLD, lambda: as_numpy(poly.solve_lp(c, "highs-cold"))),
        Route(DECIDE, FRESH_LINPROG, lambda: linprog_fresh(c_np)),
        Route(DECIDE, exact, lambda: as_numpy(quota.solve_lp(c, "auto"))),
    ]
    routes = epoch + decide
    time_routes(routes)
    # Every route checked before any time is reported; the structured oracles on their own set.
    proj = check_projections(poly, label, answers(epoch[:-1]))
    quota_proj = {"DAQP on the quota set": as_numpy(quota.regularized_argmin(theta, lam_q, "daqp"))}
    proj = max(proj, check_projections(quota, quota_name(quota), quota_proj | answers(epoch[-1:])))
    obj = check_objectives(poly, label, c_np, answers(decide[:-1]))
    quota_lp = {"HiGHS on the quota set": as_numpy(quota.solve_lp(c, "highs"))}
    obj = max(obj, check_objectives(quota, quota_name(quota), c_np, quota_lp | answers(decide[-1:])))
    print(f"{label}: projections agree to {proj:.1e}, LP objectives to {obj:.1e} relative", flush=True)
    return routes


BUILT_ONCE = {EPOCH: "DAQP workspace built once", DECIDE: "HiGHS model built once, warm started"}
FRESH_DAQP = "new DAQP model per row"
FRESH_HIGHS = "new HiGHS QP model per row"
COLD = "HiGHS model built once, cold start per row (`hetfed decide`)"
FRESH_LINPROG = "new scipy `linprog(method='highs')` per row"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--note",
        default="nothing else was running on the machine",
        help="what else was running during the measurement (written into the report)",
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    load_before, started = os.getloadavg()[0], time.time()
    with tempfile.TemporaryDirectory(prefix="hetfed-bench-lp-") as tmp:
        big_path = Path(tmp) / "buyer-11-days.lp"
        text, big_names = buyer_lp()
        big_path.write_text(text)
        small = read_lp(PILOT_LP, [f"h{h:02d}" for h in range(1, HOURS + 1)]).minimisation_set
        big = read_lp(big_path, big_names).minimisation_set
    cases = {
        f"pilot's silo, d={small.dim}": (small, QuotaPolytope(small.dim, QUOTA, upper=UPPER)),
        f"11-day buyer, d={big.dim}": (big, QuotaPolytope(big.dim, QUOTA * DAYS, upper=UPPER)),
    }
    results: dict[str, list[Route]] = {}
    shapes = []
    for label, (poly, quota) in cases.items():
        shapes.append(f"{label}: {poly.A_ub.shape[0]} inequality and {poly.A_eq.shape[0]} equality rows")
        results[label] = benchmark(label, poly, quota, rng)
    elapsed, load_after = time.time() - started, os.getloadavg()[0]
    rows: list[list[object]] = []
    for label, routes in results.items():
        for batch in (EPOCH, DECIDE):
            ref = next(r for r in routes if r.batch == batch and r.reference)
            for r in (r for r in routes if r.batch == batch):
                ratio = r.best / ref.best
                rows.append(
                    [
                        label,
                        batch,
                        r.name,
                        len(r.times),
                        f"{r.best:.4f}",
                        f"{1e6 * r.best / ROWS:,.1f}",
                        f"{ratio:.3g}x",
                        f"{min(r.walls):.4f}",
                    ]
                )
                print(" | ".join(str(x) for x in rows[-1]), flush=True)
    print(f"took {elapsed:.0f} s; 1-minute load average {load_before:.2f} before, {load_after:.2f} after")
    header = ["LP", "batch", "route", "runs", "CPU s", "CPU us / row", "x built once", "wall s"]
    machine = (
        f"Machine: {os.cpu_count()} cores; 1-minute load average {load_before:.2f} before and "
        f"{load_after:.2f} after; {args.note}; the whole benchmark took {elapsed:.0f} s."
    )
    text = describe(shapes, machine) + "\n\n" + markdown_table(header, rows) + "\n\n" + verdict(results)
    write_section("lp_oracles", "User LPs: workspaces built once", text)


def describe(shapes: list[str], machine: str) -> str:
    return (
        "Two user LP files in CPLEX LP format, read with `hetfed.problems.lp.read_lp` "
        "as a silo reads its own: "
        "the pilot's first silo (its `problem.lp` in `examples/pilot`: 12 MWh a day, 0 <= h <= 1.2, "
        "ramps of 0.4) and an 11-day buyer of the same kind (a quota row per day, ramp rows within and "
        "across days, the same bounds, and a weekly cap: days 1-7's h17-h21 purchases at most "
        f"{PEAK_CAP:g} MWh); "
        f"{'; '.join(shapes)}. The structured reference is the `QuotaPolytope` with the same quota and "
        f"bounds and no ramp rows. A **training epoch** is {ROWS} regularized minimisers "
        "`Proj_S(-theta/lam)` (RSPO+'s projection per batch row), theta ~ N(0, 1), lam = the trainer's "
        f"lam0 = mean||theta|| / R of each set; a **decision batch** is {ROWS} LP solves, c ~ N(0, 1). "
        "The workspaces built once (the polytope's DAQP workspace and its HiGHS model) are built "
        "before timing; a *new ... per row* route sets up a solver for every row (the same QP, settings "
        "and data arrays). Before any time is reported every route is checked against the workspace built "
        f"once: projections to {PROJECTION_TOL:g} max abs difference, LP objectives to {OBJECTIVE_TOL:g} "
        f"relative, every answer feasible to {FEASIBILITY_TOL:g}; the structured oracles against DAQP and "
        "HiGHS on the structured set itself. Process CPU time (and, last column, wall time), best of the "
        f"runs (interleaved across routes; a route is re-run, up to {REPEATS} runs, while its runs so far "
        f"took under {BUDGET:g} CPU s), one torch "
        f"thread. {machine}"
    )


def verdict(results: dict[str, list[Route]]) -> str:
    """What the numbers show, in a few sentences built from them."""
    small, big = results

    def t(label: str, name: str) -> float:
        return next(r.best for r in results[label] if r.name == name)

    def exact(label: str, batch: str) -> float:
        return next(r.best for r in results[label] if r.batch == batch and r.name.startswith("structured"))

    def vs(route: float, ref: float) -> str:
        """``route``'s time against ``ref``'s as "N.Nx slower" / "N.Nx faster"."""
        return f"{route / ref:.1f}x slower" if route >= ref else f"{ref / route:.1f}x faster"

    daqp, highs = BUILT_ONCE[EPOCH], BUILT_ONCE[DECIDE]

    def both(name: str, ref: str) -> str:  # small / big
        return f"{vs(t(small, name), t(small, ref))} / {vs(t(big, name), t(big, ref))}"

    def both_exact(batch: str, ref: str) -> str:
        return f"{vs(exact(small, batch), t(small, ref))} / {vs(exact(big, batch), t(big, ref))}"

    us = {k: 1e6 * t(k, daqp) / ROWS for k in results}
    extra = {k: 1e6 * (t(k, FRESH_DAQP) - t(k, daqp)) / ROWS for k in results}
    iterations = (
        ": on the larger LP most of a projection is DAQP's own active-set iterations, which building "
        "the workspace once does not save"
        if extra[big] < 0.5 * us[big]
        else ""
    )
    return (
        f"Against the workspaces built once, on the {small} / {big} LPs: a new DAQP model per row is "
        f"{both(FRESH_DAQP, daqp)}, a new HiGHS QP model per row {both(FRESH_HIGHS, daqp)}, a new "
        f"`linprog` per row {both(FRESH_LINPROG, highs)}, and cold starts of the persistent HiGHS model "
        f"{both(COLD, highs)}. A new DAQP model costs {extra[small]:,.0f} / {extra[big]:,.0f} us a row more "
        f"than the workspace, whose projections take {us[small]:,.0f} / {us[big]:,.0f} us{iterations}. "
        "The structured quota oracles "
        f"(no ramp rows) are {both_exact(EPOCH, daqp)} than the DAQP workspace and "
        f"{both_exact(DECIDE, highs)} than the HiGHS model: what a user LP without a structured oracle "
        "pays per row."
    )


if __name__ == "__main__":
    main()
