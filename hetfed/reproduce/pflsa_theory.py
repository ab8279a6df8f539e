"""PF-LSA's theory on Garnet (plans/pflsa-theory.toml): the noise floor against eta (beta + 1/N),
beta in [0, 1], and Fig. 2 at convergence.

Two instruments: the exact expected error (lsa_moments.py; what infinitely many runs average to),
used where runs cannot reach (stationary floors, 10^5 iterations, every grid point), and real hetfed
runs (inline engine) at points where they reach what is checked, against the exact values.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from hetfed.problems.garnet import make_agents
from hetfed.reproduce import common
from hetfed.reproduce import pflsa as pf
from hetfed.reproduce.lsa_moments import LSAMoments
from hetfed.reproduce.plan import Plan

PLAN = Plan.load("pflsa-theory")


def time_constant(rho: float) -> float:
    """Iterations for the mean to shrink by e: ``-1 / ln rho`` (inf when rho >= 1)."""
    return float(-1.0 / np.log(rho)) if rho < 1.0 else float("inf")


def fit_floor(x: np.ndarray, y: np.ndarray) -> dict[str, float]:
    """Fit ``y = k x^s`` (free slope, least squares in logs) and ``y = k x`` (the theory's shape): R^2
    of each in log space, and the range of y / (k x) (``ratio-min``, ``ratio-max``)."""
    lx, ly = np.log(x), np.log(y)
    total = float(np.sum((ly - ly.mean()) ** 2))
    free = common.fit_line(lx, ly)
    log_k = float(np.mean(ly - lx))
    prop_r2 = 1.0 - float(np.sum((ly - log_k - lx) ** 2)) / total
    ratio = y / (np.exp(log_k) * x)
    return {
        "slope": free["c"],
        "k-free": float(np.exp(free["a"])),
        "r2-free": free["r2"],
        "k": float(np.exp(log_k)),
        "r2-proportional": prop_r2,
        "ratio-min": float(ratio.min()),
        "ratio-max": float(ratio.max()),
    }


def tail_window(curve: np.ndarray) -> np.ndarray:
    """The second half of a curve: where a run that settled within T/2 sits at its floor."""
    return curve[len(curve) // 2 :]


def floor_study(runner: pf.Runner, b: dict[str, Any]) -> dict[str, Any]:
    """Exact floors over (level, N, beta, eta); their fit to k eta (beta + 1/N); runs at the check points."""
    grid = []
    for zetas in map(tuple, b["floor_levels"]):
        for n in b["floor_sizes"]:
            agents = make_agents(n, runner.seed, *zetas)
            for beta in sorted({1.0 / n, 0.25, 0.5, 1.0}):  # the recommended 1/N, and more
                for eta in b["floor_etas"]:
                    moments = LSAMoments(agents, eta, beta)
                    rho = moments.spectral_radius()
                    point = {"zeta_ker": zetas[0], "zeta_rew": zetas[1], "N": n, "beta": beta, "eta": eta}
                    point |= {"theory": eta * (beta + 1.0 / n), "rho": rho, "tau": time_constant(rho)}
                    grid.append({**point, "floor": moments.floor() if rho < 1.0 else None})
    fits = {}
    for zetas in map(tuple, b["floor_levels"]):
        stable = [p for p in grid if (p["zeta_ker"], p["zeta_rew"]) == zetas and p["floor"] is not None]
        x = np.array([p["theory"] for p in stable])
        fits[f"({zetas[0]:g}, {zetas[1]:g})"] = fit_floor(x, np.array([p["floor"] for p in stable]))
    checks = []
    level, T = b["floor_levels"][-1], b["floor_iterations"]
    for n, beta, eta in b["floor_checks"]:
        moments = LSAMoments(make_agents(n, runner.seed, *level), eta, beta)
        exact = moments.curve(T, b["cadence"])
        curve = runner.curve("pflsa", n, T, level, eta, b["runs"], b["cadence"], beta)
        per_run = [float(tail_window(r).mean()) for r in curve.per_run]
        point = {"zeta_ker": level[0], "zeta_rew": level[1], "N": n, "beta": beta, "eta": eta}
        point |= {"tau": time_constant(moments.spectral_radius()), "floor": moments.floor()}
        point |= {"expected-tail": float(tail_window(exact).mean()), "runs-tail": per_run}
        checks.append({**point, "runs-tail-mean": float(np.mean(per_run)), "iterations": T})
    return {"grid": grid, "fits": fits, "checks": checks}


def beta_study(runner: pf.Runner, b: dict[str, Any]) -> dict[str, Any]:
    """Fig. 1's PF-LSA (N = 10, eta = 1) for beta from 0 to 1: each agent's limit, how fast, the floor.
    beta = 0 runs as FedLSA with one local step (identical from theta^0 = 0: every agent applies the
    same averaged update; PF-LSA's ``pflsa-beta = 0`` means 1/N)."""
    n, eta, level = b["beta_N"], b["beta_eta"], b["beta_level"]
    agents = make_agents(n, runner.seed, *level)
    theta_lim = pf.shared_limit(agents)
    star = np.array([a.theta_star for a in agents])
    horizons, every = b["beta_horizons"], b["beta_every"]
    rows = []
    for beta in b["beta_values"]:
        moments = LSAMoments(agents, eta, beta)
        rho = moments.contraction()  # at beta = 0 the mean keeps its consensus directions
        curve = moments.curve(max(horizons), every)
        # The limit of E theta_c^t, computed (not assumed): the mean after 50 time constants.
        limit = moments.mean_path(int(50 * time_constant(rho)))
        means = {str(t): moments.mean_path(t) for t in horizons}
        row: dict[str, Any] = {
            "beta": beta,
            "rho": rho,
            "tau": time_constant(rho),
            "floor": moments.floor() if beta > 0 else None,
            "expected": {str(t): float(curve[t // every]) for t in horizons},
            "mean-to-own": {t: pf.mean_sq_distance(mean, star) for t, mean in means.items()},
            "mean-to-shared": {t: pf.mean_sq_distance(mean, theta_lim) for t, mean in means.items()},
            "limit-to-own": pf.mean_sq_distance(limit, star),
            "limit-to-shared": pf.mean_sq_distance(limit, theta_lim),
            "curve": curve.tolist(),
        }
        if beta in b["beta_checks"]:
            strategy = "fedlsa" if beta == 0 else "pflsa"
            runs = runner.curve(strategy, n, b["beta_iterations"], level, eta, b["runs"], b["cadence"], beta)
            exact = moments.curve(b["beta_iterations"], b["cadence"])
            row["check"] = {
                "strategy": strategy,
                "iterations": runs.iterations.tolist(),
                "runs-mean": runs.per_run.mean(axis=0).tolist(),
                "runs-at-T": runs.per_run[:, -1].tolist(),
                "expected-at-T": float(exact[-1]),
                "expected": exact.tolist(),
            }
        rows.append(row)
    study = {"N": n, "eta": eta, "zeta_ker": level[0], "zeta_rew": level[1], "every": every}
    return {**study, "dispersion": pf.dispersion(agents), "rows": rows}


def fig2_convergence(seed: int, b: dict[str, Any]) -> dict[str, Any]:
    """Fig. 2's settings run to convergence, exactly: error at T, floors, iterations to 1e-2 and 1e-3."""
    T = b["fig2_iterations"]
    levels = []
    for zetas in map(tuple, b["fig2_levels"]):
        agents = make_agents(max(b["fig2_sizes"]), seed, *zetas)
        row: dict[str, Any] = {"zeta_ker": zetas[0], "zeta_rew": zetas[1], "N": {}}
        for n in b["fig2_sizes"]:
            cells: dict[str, Any] = {}
            for name, eta, beta in (("single", pf.ETA_SINGLE, 1.0), ("pflsa", 0.1 * n, 1.0 / n)):
                moments = LSAMoments(agents[:n], eta, beta)
                curve = moments.curve(T)
                its = np.arange(T + 1)
                cells[name] = {
                    "eta": eta,
                    "beta": beta,
                    "initial": float(curve[0]),
                    "at-T": float(curve[-1]),
                    "floor": moments.floor(),
                    "to-1e-2": pf.iterations_to(its, curve, 1e-2),
                    "to-1e-3": pf.iterations_to(its, curve, 1e-3),
                }
            for fraction in ("1e-2", "1e-3"):
                s, p = cells["single"][f"to-{fraction}"], cells["pflsa"][f"to-{fraction}"]
                cells[f"speed-up-{fraction}"] = s / p if s and p else None
            row["N"][str(n)] = cells
        levels.append(row)
    return {"T": T, "levels": levels}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    pf.add_lsa_arguments(
        parser, "small grids, short runs, 1 run (CI)", "runs per checked point (default 3; quick 1)"
    )


def run(args: argparse.Namespace) -> int:
    b = PLAN.budget_for(args.quick)
    if args.runs is not None:
        if args.runs < 1:
            raise ValueError(f"--runs must be >= 1, got {args.runs}")
        b["runs"] = args.runs
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="hetfed-pflsa-theory-") as scratch:
        runner = pf.Runner(PLAN, args.seed, args.results_dir or Path(scratch))
        floors = floor_study(runner, b)
        betas = beta_study(runner, b)
    fig2 = fig2_convergence(args.seed, b)
    settings = {"seed": args.seed, "quick": bool(args.quick), "gamma": 0.95, "runs": b["runs"]}
    settings |= {"inline-runs": runner.runs, "messages": runner.messages}
    result = {"settings": settings, "floor": floors, "beta": betas, "fig2": fig2}
    data = common.publish(
        args.out, "pflsa-theory", {**result, "wall-time-s": round(time.time() - started, 1)}, markdown
    )
    plot(data, args.out / "pflsa-theory.png")
    print(f"wrote {args.out}/pflsa-theory.md, pflsa-theory.json, pflsa-theory.png")
    return 0


def plot(result: dict[str, Any], path: Path) -> None:
    """The exact floors against eta (beta + 1/N) with the runs (x), and the beta sweep's curves."""
    fig, (ax1, ax2) = pf.log_panels(2, (6, 4.4), "(1/N) E sum_c ||theta_c - theta_c*||^2")
    floor = result["floor"]
    level, fit = list(floor["fits"].items())[-1]
    points = [p for p in floor["grid"] if pf.level_name(p) == level and p["floor"]]
    for i, n in enumerate(sorted({p["N"] for p in points})):
        theory, floors = zip(*[(p["theory"], p["floor"]) for p in points if p["N"] == n], strict=True)
        ax1.scatter(theory, floors, color=f"C{i}", s=14, label=f"N = {n}")
    x = np.array(sorted(p["theory"] for p in points))
    ax1.plot(x, fit["k"] * x, "k--", lw=0.9, label=f"{fit['k']:.3g} eta (beta + 1/N)")
    for c in floor["checks"]:
        spread = np.std(c["runs-tail"], ddof=1) if len(c["runs-tail"]) > 1 else None
        ax1.errorbar(c["eta"] * (c["beta"] + 1 / c["N"]), c["runs-tail-mean"], yerr=spread, fmt="kx", ms=7)
    ax1.set(xscale="log", xlabel="eta (beta + 1/N)", ylabel="noise floor (exact); x: runs")
    ax1.set_title(f"Noise floor, (zeta_ker, zeta_rew) = {level}")
    ax1.legend(fontsize=8)
    beta = result["beta"]
    t = np.arange(len(beta["rows"][0]["curve"])) * beta["every"]
    for i, row in enumerate(beta["rows"]):
        ax2.plot(t[1:], row["curve"][1:], color=f"C{i}", lw=1.1, label=f"beta = {row['beta']:g}")
        if check := row.get("check"):
            ax2.plot(check["iterations"][1:], check["runs-mean"][1:], color=f"C{i}", lw=0.6, alpha=0.6)
    ax2.axhline(beta["dispersion"], color="grey", ls=":", lw=0.9)
    ax2.set_xscale("log")
    ax2.set_title(f"beta sweep: N = {beta['N']}, eta = {beta['eta']:g}; thin: runs; dotted: dispersion")
    ax2.legend(fontsize=7)
    common.save_figure(fig, path)


def facts(result: dict[str, Any]) -> dict[str, Any]:
    """What the report's tables and findings read off the JSON beyond its values."""
    floor, beta, fig2 = result["floor"], result["beta"], result["fig2"]
    grid, last = floor["grid"], list(floor["fits"])[-1]
    ratio = {  # floor / theory at the last level
        (p["N"], p["beta"], p["eta"]): p["floor"] / p["theory"] if p["floor"] else None
        for p in grid
        if pf.level_name(p) == last
    }
    etas = sorted({p["eta"] for p in grid})
    positive = [r for r in beta["rows"] if r["beta"] > 0]
    largest = max(fig2["levels"][0]["N"], key=int)
    return {
        "stable": {
            level: sum(1 for p in grid if pf.level_name(p) == level and p["floor"]) for level in floor["fits"]
        },
        "unstable": [p for p in grid if p["floor"] is None],
        "etas": etas,
        "ratios": [
            (n, b, [ratio[n, b, e] for e in etas]) for n, b in sorted({(p["N"], p["beta"]) for p in grid})
        ],
        "check_ratios": [c["runs-tail-mean"] / c["expected-tail"] for c in floor["checks"]],
        "checks": [r for r in beta["rows"] if "check" in r],
        "positive": positive,
        "zero": [r for r in beta["rows"] if r["beta"] == 0],
        "worst": max((r["limit-to-own"] for r in positive), default=0.0),
        "largest": largest,
        "shrink": [
            row
            for row in fig2["levels"]
            if (c := row["N"][largest])["speed-up-1e-3"] and c["speed-up-1e-3"] < 0.75 * c["speed-up-1e-2"]
        ],
    }


def markdown(result: dict[str, Any]) -> str:
    """The report (templates/pflsa-theory.md) from the JSON alone."""
    parts = {k: result[k] for k in ("settings", "floor", "beta", "fig2")}
    return common.render("pflsa-theory.md", r=result, **parts, **facts(result), **pf.HELPERS, mean=np.mean)
