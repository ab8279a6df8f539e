"""PF-LSA (docs/algorithms.md 3): Fig. 1 and Fig. 2 of federated TD(0) on Garnet MDPs (plans/pflsa.toml).

Fig. 1: N = 10, single-agent LSA, PF-LSA and FedLSA (H = 1) at each (zeta_ker, zeta_rew), each beside
its exact expected curve (lsa_moments.py); Fig. 2: PF-LSA for N in {2, 8, 16} against single-agent
LSA. Every curve is the mean of real hetfed runs (inline engine) that differ only in their samples.
Single-agent LSA involves no communication, so one 16-agent run per level and seed gives the
single-agent curve of every N (the mean over agents 0..N-1).
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from hetfed.reproduce.common import OUT, publish, pyplot, render, save_figure
from hetfed.reproduce.plan import Job, Plan, run_jobs

PLAN = Plan.load("pflsa")
THRESHOLD, ETA_SINGLE = PLAN.budget["threshold"], PLAN.budget["eta_single"]
PLOT_POINTS = 200  # points per curve kept in the JSON for the figure
ERROR = "(1/N) sum_c ||theta_c - theta_c*||^2"  # the figures' y axis
FIG1_METHODS = {  # method -> (strategy, eta for N agents, beta: 1/N for PF-LSA; beta of LSAMoments)
    "single": ("single-lsa", lambda n: ETA_SINGLE, lambda n: 1.0),
    "pflsa": ("pflsa", lambda n: ETA_SINGLE * n / 2, lambda n: 1.0 / n),
    "fedlsa": ("fedlsa", lambda n: ETA_SINGLE * n, lambda n: 0.0),
}


@dataclass
class Curve:
    """Mean-over-runs error of each agent at the reported iterations: ``errors`` [K, N]."""

    iterations: np.ndarray
    errors: np.ndarray
    per_run: np.ndarray  # [runs, K]: each run's (1/N) sum_c ||theta_c - theta_c*||^2

    def mean(self, agents: int | None = None) -> np.ndarray:
        """``(1/N) sum_c ||theta_c - theta_c*||^2`` over the first ``agents`` agents, [K]."""
        return self.errors[:, :agents].mean(axis=1)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_lsa_arguments(
        parser, "a small budget (CI): one run, fewer levels", "Fig. 2 runs (default 5; quick 1)"
    )
    parser.add_argument("--fig1-runs", type=int, help="Fig. 1 runs (default 5; quick 1)")
    parser.add_argument("--fig1-iterations", type=int, help="Fig. 1 horizon T (default 10000; quick 400)")


def add_lsa_arguments(parser: argparse.ArgumentParser, quick: str, runs: str) -> None:
    """The options every PF-LSA reproduction takes (``quick``, ``runs``: the help of --quick, --runs)."""
    parser.add_argument("--quick", action="store_true", help=quick)
    parser.add_argument("--runs", type=int, help=runs)
    parser.add_argument("--seed", type=int, default=42, help="seed of the Garnet MDPs (default 42)")
    parser.add_argument("--out", type=Path, default=OUT, help="where the .md/.json/.png go (docs/results)")
    parser.add_argument("--results-dir", type=Path, help="keep every run's results here (default: temporary)")


def run(args: argparse.Namespace) -> int:
    b = PLAN.budget_for(args.quick)
    for name, value in (("--runs", args.runs), ("--fig1-runs", args.fig1_runs)):
        if value is not None and value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    if args.fig1_iterations is not None and args.fig1_iterations < 2 * b["fig1_cadence"]:
        raise ValueError(f"--fig1-iterations must be >= {2 * b['fig1_cadence']}, got {args.fig1_iterations}")
    b |= {
        "fig1_iterations": args.fig1_iterations or b["fig1_iterations"],
        "fig1_runs": args.fig1_runs or b["fig1_runs"],
        "fig2_runs": args.runs or b["fig2_runs"],
    }
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="hetfed-pflsa-") as scratch:
        runner = Runner(PLAN, args.seed, args.results_dir or Path(scratch))
        fig1 = figure1(runner, b)
        fig2 = figure2(runner, b)
    wall = time.time() - started
    skip = ("threshold", "eta_single", "fig1_N")
    settings = {"seed": args.seed, "quick": bool(args.quick), "gamma": 0.95, "threshold": THRESHOLD}
    settings |= {"runs": runner.runs, "messages": runner.messages}
    settings |= {k: v for k, v in b.items() if k not in skip}
    result = {"settings": settings, "fig1": fig1, "fig2": fig2["table"], "spec": PLAN.paper}
    publish(args.out, "pflsa", {**result, "wall-time-s": round(wall, 1)}, markdown)
    plot_fig1(fig1, args.out / "pflsa-fig1.png")
    plot_fig2(fig2, args.out / "pflsa-fig2.png")
    print(f"wrote {args.out}/pflsa.md, pflsa.json, pflsa-fig1.png, pflsa-fig2.png")
    print(f"wall time {wall:.1f} s ({runner.runs} runs, {runner.messages} client messages)")
    return 0


class Runner:
    """Runs LSA configurations of a plan on Garnet MDPs of seed ``seed`` (plan.run_jobs, inline
    engine) and reads their error curves back; counts the runs and the agents' messages."""

    def __init__(self, plan: Plan, seed: int, results_dir: Path) -> None:
        self.plan, self.seed, self.results_dir = plan, seed, results_dir
        self.args = argparse.Namespace(results_dir=results_dir, engine="inline", workers=1)  # for run_jobs
        self.runs = self.messages = 0

    def curve(
        self,
        strategy: str,
        nodes: int,
        iterations: int,
        zetas: tuple[float, float],
        eta: float,
        runs: int,
        cadence: int,
        beta: float = 0.0,
        local_steps: int = 0,
    ) -> Curve:
        """The run-averaged per-agent error curve, reported every ``cadence`` iterations;
        ``local_steps`` H per round (0: ``cadence`` for single-agent LSA, which needs no exchange,
        else 1)."""
        steps = local_steps or (cadence if strategy == "single-lsa" else 1)
        name = f"{strategy}-n{nodes}-k{zetas[0]:g}-r{zetas[1]:g}-h{steps}-s"
        settings = {"strategy": strategy, "garnet-seed": self.seed, "lsa-eta": eta, "pflsa-beta": beta}
        settings |= {"garnet-zeta-ker": zetas[0], "garnet-zeta-rew": zetas[1], "lsa-local-steps": steps}
        settings |= {"num-rounds": iterations // steps, "lsa-report-every": max(1, cadence // steps)}
        seeds = [*self.plan.seeds[:runs], *range(len(self.plan.seeds), runs)]
        per_run = []
        for seed in seeds:  # one at a time: each run's folder (10^5 rows) goes once its curve is read
            config = self.plan.config(False, **{"run-name": f"{name}{seed}", "seed": seed}, **settings)
            job = Job((strategy,), seed, config, nodes)
            (summary,) = run_jobs([job], self.args)
            folder = self.results_dir / job.config["run-name"]
            if summary["status"] != "completed":
                raise RuntimeError(f"run {folder.name} did not complete: {summary.get('error')}")
            per_run.append(read_errors(folder, steps, nodes))
            shutil.rmtree(folder, ignore_errors=True)
            self.runs += 1
            self.messages += nodes * (iterations // steps + 2)
        its = per_run[0][0]
        if any(not np.array_equal(it, its) for it, _ in per_run):
            raise RuntimeError(f"{strategy}: runs reported different iterations")
        errors = np.array([e for _, e in per_run])  # [runs, K, N]
        return Curve(its, errors.mean(axis=0), errors.mean(axis=2))


def read_errors(run_dir: Path, local_steps: int, nodes: int) -> tuple[np.ndarray, np.ndarray]:
    """Iterations [K] and per-client ``sq-error`` [K, N] of a run: a train row of round r reports
    iteration ``(r - 1) H``, the final evaluate row iteration ``T H``."""
    from hetfed.server.store import RunResult

    by_iteration: dict[int, dict[int, float]] = {}
    for row in RunResult.read(run_dir).rows:
        if row["exchange"] in ("train", "evaluate") and "sq-error" in row:
            r = int(row["round"]) - 1 if row["exchange"] == "train" else int(row["round"])
            by_iteration.setdefault(r * local_steps, {})[int(row["partition-id"])] = float(row["sq-error"])
    its = sorted(by_iteration)
    if any(len(by_iteration[i]) != nodes for i in its):
        raise RuntimeError(f"{run_dir}: some iterations lack a client's error")
    return np.array(its), np.array([[by_iteration[i][c] for c in range(nodes)] for i in its])


def iterations_to(iterations: np.ndarray, errors: np.ndarray, fraction: float = THRESHOLD) -> int | None:
    """First reported iteration with ``errors <= fraction * errors[0]`` (None: not within the run)."""
    hits = np.flatnonzero(errors <= fraction * errors[0])
    return int(iterations[hits[0]]) if hits.size else None


def tail_mean(iterations: np.ndarray, errors: np.ndarray) -> float:
    """Mean error over the last 10% of the iterations: the level a curve settles at, less noisy than t = T."""
    return float(errors[iterations >= 0.9 * iterations[-1]].mean())


def figure1(runner: Runner, b: dict[str, Any]) -> dict[str, Any]:
    """Each method at each level, with its exact expected curve (the mean over infinitely many runs)."""
    from hetfed.problems.garnet import make_agents
    from hetfed.reproduce.lsa_moments import LSAMoments

    n, T, cadence = b["fig1_N"], b["fig1_iterations"], b["fig1_cadence"]
    table = []
    for zetas in map(tuple, b["fig1_levels"]):
        agents = make_agents(n, runner.seed, *zetas)
        row: dict[str, Any] = {"zeta_ker": zetas[0], "zeta_rew": zetas[1], "methods": {}}
        for m, (strategy, eta_of, beta_of) in FIG1_METHODS.items():
            eta, beta = eta_of(n), beta_of(n)
            c = runner.curve(strategy, n, T, zetas, eta, b["fig1_runs"], cadence, beta)
            mean, runs = c.mean(), c.per_run
            moments = LSAMoments(agents, eta, beta)
            exact = moments.curve(T, cadence)
            keep = slice(None, None, max(1, len(mean) // PLOT_POINTS))
            row["methods"][m] = {
                "strategy": strategy,
                "eta": eta,
                **({"beta": beta} if strategy == "pflsa" else {}),
                "initial-error": float(mean[0]),
                "error-at-T": float(mean[-1]),
                "error-at-T-runs": runs[:, -1].tolist(),
                "error-last-10pct": tail_mean(c.iterations, mean),
                "error-last-10pct-runs": [tail_mean(c.iterations, r) for r in runs],
                "iterations-to-threshold": iterations_to(c.iterations, mean),
                "expected-at-T": float(exact[-1]),
                "expected-last-10pct": tail_mean(c.iterations, exact),
                "expected-iterations-to-threshold": iterations_to(c.iterations, exact),
                "floor": moments.floor() if beta > 0 else None,  # FedLSA settles at its bias instead
                "curve": {
                    "iterations": c.iterations[keep].tolist(),
                    "mean": mean[keep].tolist(),
                    "low": runs.min(axis=0)[keep].tolist(),
                    "high": runs.max(axis=0)[keep].tolist(),
                    "expected": exact[keep].tolist(),
                },
            }
        final = {m: v["error-last-10pct"] for m, v in row["methods"].items()}
        row["fedlsa-over-pflsa"] = final["fedlsa"] / final["pflsa"]
        row["dispersion"] = dispersion(agents)
        bias = final["fedlsa"] / row["dispersion"] if row["dispersion"] > 1e-12 else None
        row["fedlsa-over-dispersion"] = bias
        table.append(row)
    return {"N": n, "T": T, "runs": b["fig1_runs"], "levels": table}


def shared_limit(agents: list[Any]) -> np.ndarray:
    """``theta_lim = (sum_c A_bar_c)^{-1} sum_c b_bar_c``: FedLSA's (H = 1) noise-free limit."""
    return np.linalg.solve(sum(a.A_bar for a in agents), sum(a.b_bar for a in agents))


def mean_sq_distance(thetas: np.ndarray, targets: np.ndarray) -> float:
    """``(1/N) sum_c ||thetas_c - targets_c||^2`` (``targets`` [N, d], or one [d] for every c)."""
    return float(np.mean(np.sum((thetas - targets) ** 2, axis=-1)))


def dispersion(agents: list[Any]) -> float:
    """``(1/N) sum_c ||theta_lim - theta_c*||^2``: FedLSA's (H = 1) noise-free error."""
    return mean_sq_distance(np.array([a.theta_star for a in agents]), shared_limit(agents))


def figure2(runner: Runner, b: dict[str, Any]) -> dict[str, Any]:
    """PF-LSA (eta = 0.1 N, beta = 1/N) for each N against single-agent LSA: iterations to 1e-2, speed-up."""
    sizes = sorted(map(int, b["fig2_iterations"]))
    curves: dict[tuple[float, float], dict[str, Curve]] = {}
    table = []
    for zetas in map(tuple, b["fig2_levels"]):
        runs, cadence = b["fig2_runs"], b["fig2_single_cadence"]
        single = runner.curve(
            "single-lsa", max(sizes), b["fig2_single_iterations"], zetas, ETA_SINGLE, runs, cadence
        )
        curves[zetas] = {"single-agent LSA": single}
        row: dict[str, Any] = {"zeta_ker": zetas[0], "zeta_rew": zetas[1], "N": {}}
        for n in sizes:
            pf = curves[zetas][f"PF-LSA, N = {n}"] = runner.curve(
                "pflsa", n, b["fig2_iterations"][str(n)], zetas, 0.1 * n, runs, 1, 1.0 / n
            )
            it_single = iterations_to(single.iterations, single.mean(n))
            it_pf = iterations_to(pf.iterations, pf.mean())
            row["N"][str(n)] = {
                "eta": 0.1 * n,
                "beta": 1.0 / n,
                "single-iterations": it_single,
                "pflsa-iterations": it_pf,
                "speed-up": it_single / it_pf if it_single and it_pf else None,
            }
        table.append(row)
    return {"curves": curves, "table": {"runs": b["fig2_runs"], "levels": table}}


def log_panels(
    count: int,
    size: tuple[float, float],
    ylabel: str,
    xlabel: str = "iteration t",
    sharey: bool = False,
    title: str = "",
) -> tuple[Any, Any]:
    """A figure of ``count`` log-scale panels side by side, ``size`` each, and its axes; ``title``
    wrapped to the figure's width (a one-panel figure cut a one-line title off)."""
    figure, axes = pyplot().subplots(
        1, count, figsize=(size[0] * count, size[1]), sharey=sharey, squeeze=False
    )
    if title:
        figure.suptitle(textwrap.fill(title, int(11 * size[0] * count)))  # ~11 characters per inch
    for ax in axes[0]:
        ax.set(yscale="log", xlabel=xlabel, ylabel=ylabel)
        ax.grid(alpha=0.3, which="both")
    return figure, axes[0]


def plot_fig1(fig: dict[str, Any], path: Path) -> None:
    """Each method's mean over runs, the band of the runs, and the exact expected curve (dotted)."""
    n, runs = fig["N"], fig["runs"]
    title = f"Fig. 1: N = {n} agents, mean and range of {runs} run(s); dotted: exact expectation"
    figure, axes = log_panels(len(fig["levels"]), (4.2, 3.6), ERROR, sharey=True, title=title)
    labels = {"single": "single-agent LSA", "pflsa": "PF-LSA", "fedlsa": "FedLSA"}
    for ax, row in zip(axes, fig["levels"], strict=True):
        for i, (m, v) in enumerate(row["methods"].items()):
            c = v["curve"]
            ax.plot(c["iterations"], c["mean"], color=f"C{i}", label=labels[m], lw=1.2)
            ax.fill_between(c["iterations"], c["low"], c["high"], color=f"C{i}", alpha=0.15, lw=0)
            ax.plot(c["iterations"], c["expected"], color="k", ls=":", lw=0.9)
        ax.set_title(f"(zeta_ker, zeta_rew) = {level_name(row)}")
    axes[0].legend()
    save_figure(figure, path)


def plot_fig2(fig: dict[str, Any], path: Path) -> None:
    runs = fig["table"]["runs"]
    title = f"Fig. 2: eta = 0.1 N, beta = 1/N, mean of {runs} run(s); dotted: 1e-2 x start"
    figure, axes = log_panels(len(fig["curves"]), (4.2, 3.6), ERROR, sharey=True, title=title)
    for ax, (zetas, curves) in zip(axes, fig["curves"].items(), strict=True):
        for label, c in curves.items():
            ax.plot(
                c.iterations, c.mean(), "k--" if label == "single-agent LSA" else "-", lw=1.2, label=label
            )
        ax.axhline(THRESHOLD * curves["single-agent LSA"].mean()[0], color="grey", lw=0.8, ls=":")
        ax.set_title(f"(zeta_ker, zeta_rew) = ({zetas[0]:g}, {zetas[1]:g})")
    axes[0].legend(fontsize=8)
    save_figure(figure, path)


def level_name(row: dict[str, Any]) -> str:
    """``(zeta_ker, zeta_rew)`` as the tables and the spec write it, e.g. ``(0.9, 0.9)``."""
    return f"({row['zeta_ker']:g}, {row['zeta_rew']:g})"


def fmt(value: Any, digits: int = 3) -> str:
    if value is None:
        return "not reached"
    return f"{value:.{digits}g}" if isinstance(value, float) else str(value)


def spread(values: list[float]) -> str:
    """``mean ± std`` of a list of per-run values (just the value for one run)."""
    if len(values) == 1:
        return fmt(values[0])
    return f"{fmt(float(np.mean(values)))} ± {float(np.std(values, ddof=1)):.2g}"


HELPERS = {"level": level_name, "g": fmt, "spread": spread}  # the PF-LSA templates' formatting


def markdown(result: dict[str, Any]) -> str:
    """The results page (templates/pflsa.md): Fig. 1's and Fig. 2's tables, the comparison with the spec."""
    levels = {level_name(r): r for r in result["fig1"]["levels"]}
    s, f1, f2 = result["settings"], result["fig1"], result["fig2"]
    return render("pflsa.md", r=result, s=s, f1=f1, f2=f2, levels=levels, **HELPERS)
