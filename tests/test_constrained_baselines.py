"""Baselines of the switching method (penalty, primal-dual mean/max, FedAvg, parallel CRPO) against NumPy."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest

from hetfed.engines.inline import node_configs, run_inline
from hetfed.problems import quadratic
from hetfed.strategies.softmax_switching import SAMPLING_STREAM

BASE = {
    "problem": "quadratic",
    "seed": 11,
    "num-rounds": 25,
    "switching-m": 3,
    "switching-local-steps": 2,
    "switching-eta": 0.4,
    "switching-gamma": 0.15,
    "switching-threshold": 0.0,
    "switching-eval-every": 25,
    "penalty-rho": 3.0,
    "pd-dual-lr": 0.5,
}
CASES = {
    "penalty": {"strategy": "penalty"},
    "primal-dual mean": {"strategy": "primal-dual", "pd-dual-step": "mean"},
    "primal-dual max": {"strategy": "primal-dual", "pd-dual-step": "max"},
    "fedavg-unconstrained": {"strategy": "fedavg-unconstrained"},
    "crpo": {"strategy": "crpo"},
}


def reference(cfg: dict, n: int) -> tuple[np.ndarray, np.ndarray, list[float]]:
    """The baselines of docs/algorithms.md 2 on f_i = |w - a_i|^2 / 2, g_i = <b_i, w> - c_i, exact gradients.

    Returns the last iterate, the output average and the multipliers lambda_k used per round.
    """
    data = [quadratic.client_data(i, 3, cfg["seed"]) for i in range(n)]
    a, b, c = (np.array([d[k] for d in data]) for k in range(3))
    w = quadratic.make_model(cfg["seed"]).w.detach().numpy().copy()
    rng = np.random.default_rng(np.random.SeedSequence([cfg["seed"], SAMPLING_STREAM]))
    kind, E, gamma = cfg["strategy"], cfg["switching-local-steps"], cfg["switching-gamma"]
    lam, total, count, used = 0.0, np.zeros_like(w), 0, []
    for _ in range(cfg["num-rounds"]):
        sampled = np.sort(rng.choice(n, size=cfg["switching-m"], replace=False))
        g = b[sampled] @ w - c[sampled]
        on = g.mean() <= cfg["switching-threshold"]  # CRPO's test on the average constraint
        used.append(lam)
        step = np.zeros_like(w)
        for i in sampled:
            v = w.copy()
            for _ in range(E):
                grad_f, grad_g = v - a[i], b[i]
                grad = {
                    "penalty": grad_f + (cfg["penalty-rho"] * grad_g if b[i] @ v - c[i] > 0 else 0.0),
                    "primal-dual": grad_f + lam * grad_g,
                    "fedavg-unconstrained": grad_f,
                    "crpo": grad_f if on else grad_g,
                }[kind]
                v = v - gamma * grad
            step += (w - v) / (gamma * E) / len(sampled)
        if kind == "primal-dual":
            signal = g.max() if cfg["pd-dual-step"] == "max" else g.mean()
            lam = max(0.0, lam + cfg["pd-dual-lr"] * signal)
        if kind != "crpo" or on:
            total, count = total + w, count + 1
        w = w - cfg["switching-eta"] * step
    return w, total / count, used


@pytest.mark.parametrize("case", sorted(CASES))
def test_baseline_runs_equal_their_numpy_transcription(case: str, tmp_path: Path) -> None:
    cfg = {**BASE, **CASES[case]}
    summary = run_inline({**cfg, "results-dir": str(tmp_path), "run-name": "b"}, node_configs(5))
    assert summary["status"] == "completed"
    last, average, used = reference(cfg, 5)
    models = np.load(tmp_path / "b" / "models.npz")
    np.testing.assert_allclose(models["last/w"], last, rtol=0, atol=1e-10)
    np.testing.assert_allclose(models["average/w"], average, rtol=0, atol=1e-10)
    if case.startswith("primal-dual"):
        with open(tmp_path / "b" / "rounds.csv", newline="") as f:
            rows = [r for r in csv.DictReader(f) if r["client"] == "server" and r["round"] != "0"]
        np.testing.assert_allclose([float(r["multiplier"]) for r in rows], used, atol=1e-12)
        assert max(used) > 0  # the dual step did act
