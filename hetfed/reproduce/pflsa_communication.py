"""PF-LSA, FedLSA and SCAFFLSA with local steps: error against messages (plans/pflsa-communication.toml).

The PF-LSA paper compares with FedLSA at one local step only; H local steps per round are how FedLSA
and SCAFFLSA save communication (one message per agent and round). PF-LSA runs as in Fig. 1 (one
step per message); a local step of FedLSA or SCAFFLSA is one agent's noisy step, so it takes the step
one agent can take alone. The metric is Fig. 1's ``(1/N) sum_c ||theta_c - theta_c*||^2``.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from hetfed.reproduce import pflsa as pf
from hetfed.reproduce.common import publish, render, save_figure
from hetfed.reproduce.plan import Plan

PLAN = Plan.load("pflsa-communication")
N = PLAN.budget["N"]
METHODS: dict[str, tuple[str, float, float, int]] = {  # label -> (strategy, eta, beta, H)
    "PF-LSA": ("pflsa", pf.ETA_SINGLE * N / 2, 1.0 / N, 1),
    **{f"FedLSA H={h}": ("fedlsa", pf.ETA_SINGLE, 0.0, h) for h in PLAN.axes["local-steps"]},
    **{f"SCAFFLSA H={h}": ("scafflsa", pf.ETA_SINGLE, 0.0, h) for h in PLAN.axes["local-steps"]},
}


def summarize(curve: pf.Curve, local_steps: int) -> dict[str, Any]:
    """The curve against messages (N per round of H iterations), and what the table reports."""
    messages = curve.iterations // local_steps * N
    mean = curve.per_run.mean(axis=0)
    std = curve.per_run.std(axis=0, ddof=1) if len(curve.per_run) > 1 else np.zeros_like(mean)
    return {
        "messages": messages.tolist(),
        "error-mean": mean.tolist(),
        "error-std": std.tolist(),
        "error-runs": curve.per_run.tolist(),
        "initial-error": float(mean[0]),
        "final-error": pf.tail_mean(messages, mean),
        "final-error-runs": [pf.tail_mean(messages, run) for run in curve.per_run],
        "messages-to-threshold": pf.iterations_to(messages, mean),
    }


def plot(result: dict[str, Any], path: Path) -> None:
    figure, axes = pf.log_panels(
        len(result["levels"]), (6, 4.2), "(1/N) sum ||theta_c - theta_c*||^2", "messages sent by the agents"
    )
    for ax, (level, methods) in zip(axes, result["levels"].items(), strict=True):
        for i, (label, m) in enumerate(methods.items()):
            x, y, runs = np.array(m["messages"]), np.array(m["error-mean"]), np.array(m["error-runs"])
            ls = "-" if label == "PF-LSA" else ("--" if label.startswith("FedLSA") else ":")
            ax.plot(x, y, ls, color=f"C{i}", label=label)
            ax.fill_between(x, runs.min(axis=0), runs.max(axis=0), color=f"C{i}", alpha=0.15)
        ax.set_title(f"zeta_ker = zeta_rew = {level}")
        ax.legend(fontsize=7)
    save_figure(figure, path)


def findings(result: dict[str, Any]) -> dict[str, Any]:
    """Per level: the FedLSA / SCAFFLSA curve with the lowest final error, and the first to 1e-2."""
    out = {}
    for level, methods in result["levels"].items():
        best = min((m for m in methods if m != "PF-LSA"), key=lambda m: methods[m]["final-error"])
        reached = [(m, v["messages-to-threshold"]) for m, v in methods.items() if v["messages-to-threshold"]]
        out[level] = {"best": best, "fastest": min(reached, key=lambda t: t[1]) if reached else None}
    return out


def markdown(result: dict[str, Any]) -> str:
    """The report (templates/pflsa-communication.md) from the JSON alone."""
    std = lambda values: float(np.std(values, ddof=1)) if len(values) > 1 else 0.0  # noqa: E731
    return render("pflsa-communication.md", r=result, s=result["settings"], facts=findings(result), std=std)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    pf.add_lsa_arguments(
        parser, "1 run, 60 rounds, zeta 0.5 only (CI)", "runs per curve (default 5; quick 1)"
    )
    parser.add_argument("--rounds", type=int, help="rounds per run (default 600; quick 60)")


def run(args: argparse.Namespace) -> int:
    b = PLAN.budget_for(args.quick)
    runs = b["runs"] if args.runs is None else args.runs  # --runs 0 is refused, not the default
    rounds = b["rounds"] if args.rounds is None else args.rounds
    every = b["report-rounds"]
    if runs < 1 or rounds < 2 * every:
        raise ValueError(f"--runs must be >= 1 and --rounds >= {2 * every}; got {runs}, {rounds}")
    started = time.time()
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="hetfed-pflsa-comm-") as scratch:
        runner = pf.Runner(PLAN, args.seed, args.results_dir or Path(scratch))
        for level in b["levels"]:
            for label, (strategy, eta, beta, h) in METHODS.items():
                curve = runner.curve(
                    strategy, N, rounds * h, (level, level), eta, runs, every * h, beta, local_steps=h
                )
                out.setdefault(str(level), {})[label] = summarize(curve, h)
    settings = {"quick": bool(args.quick), "seed": args.seed, "runs": runs, "rounds": rounds, "N": N}
    settings |= {"total-runs": runner.runs, "messages": runner.messages}
    result = {"settings": settings, "wall-time-s": round(time.time() - started, 1), "levels": out}
    data = publish(args.out, "pflsa-communication", result, markdown)
    plot(data, args.out / "pflsa-communication.png")
    print((args.out / "pflsa-communication.md").read_text())
    return 0
