"""Softmax-weighted switching (docs/algorithms.md 2): its pieces by hand, and whole runs against NumPy."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy.special import softmax

from hetfed.client.constrained import local_objective, local_steps, normalised_update
from hetfed.config import ConfigError, validate
from hetfed.engines.inline import node_configs, run_inline
from hetfed.engines.runner import run_experiment
from hetfed.problems import quadratic
from hetfed.records import to_numpy
from hetfed.server.pool import FederationError
from hetfed.strategies.base import WeightedSum
from hetfed.strategies.softmax_switching import (
    SAMPLING_STREAM,
    masked_softmax,
    switching_decision,
    weighted_step,
)

# 3 clients, 2 sampled per round, 3 local steps: sampling, both modes and the local loop all matter.
QUAD = {
    "strategy": "softmax-switching",
    "problem": "quadratic",
    "seed": 3,
    "num-rounds": 50,
    "switching-m": 2,
    "switching-local-steps": 3,
    "switching-alpha": 4.0,
    "switching-threshold": 0.05,
    "switching-eta": 0.3,
    "switching-gamma": 0.2,
    "switching-eval-every": 10,
}


def server_rows(run_dir: Path) -> list[dict[str, str]]:
    with open(run_dir / "rounds.csv", newline="") as f:
        return [r for r in csv.DictReader(f) if r["client"] == "server" and r["round"] != "0"]


def reference_switching(
    a: np.ndarray,
    b: np.ndarray,
    c: np.ndarray,
    w0: np.ndarray,
    *,
    rounds: int,
    m: int,
    alpha: float,
    threshold: float,
    eta: float,
    gamma: float,
    E: int,
    seed: int,
) -> tuple[list[np.ndarray], np.ndarray, list[bool]]:
    """docs/algorithms.md 2 transcribed for f_i = |w - a_i|^2 / 2, g_i = <b_i, w> - c_i (exact gradients)."""
    rng = np.random.default_rng(np.random.SeedSequence([seed, SAMPLING_STREAM]))
    w, total, count, iterates, modes = w0.copy(), np.zeros_like(w0), 0, [w0.copy()], []
    for _ in range(rounds):
        sampled = np.sort(rng.choice(len(a), size=m, replace=False))
        f = 0.5 * ((w - a[sampled]) ** 2).sum(axis=1)
        g = b[sampled] @ w - c[sampled]
        p = np.exp(alpha * f - (alpha * f).max())
        p /= p.sum()
        q = np.exp(alpha * g - (alpha * g).max())
        q /= q.sum()
        on = bool(q @ g <= threshold)
        modes.append(on)
        if on:
            total, count = total + w, count + 1
        step = np.zeros_like(w)
        for j, i in enumerate(sampled):
            v = w.copy()
            for _ in range(E):
                v = v - gamma * ((v - a[i]) if on else b[i])
            step += (p[j] if on else q[j]) * (w - v) / (gamma * E)
        w = w - eta * step
        iterates.append(w.copy())
    return iterates, total / count, modes


def quad_reference(cfg: dict, n: int) -> tuple[list[np.ndarray], np.ndarray, list[bool]]:
    data = [quadratic.client_data(i, 3, cfg["seed"]) for i in range(n)]
    a, b, c = (np.array([d[k] for d in data]) for k in range(3))
    w0 = quadratic.make_model(cfg["seed"]).w.detach().numpy()
    return reference_switching(
        a,
        b,
        c,
        w0,
        rounds=cfg["num-rounds"],
        m=cfg["switching-m"],
        alpha=cfg["switching-alpha"],
        threshold=cfg["switching-threshold"],
        eta=cfg["switching-eta"],
        gamma=cfg["switching-gamma"],
        E=cfg["switching-local-steps"],
        seed=cfg["seed"],
    )


# --- the pieces, by hand --------------------------------------------------------------------------


def test_masked_softmax_is_the_softmax_of_the_sampled_entries() -> None:
    rng = np.random.default_rng(0)
    for _ in range(20):
        values = rng.normal(size=12) * 3
        mask = rng.random(12) < 0.5
        mask[rng.integers(12)] = True
        alpha = float(rng.uniform(0.1, 50))
        values_with_junk = np.where(mask, values, np.nan)  # unsampled clients have no value at all
        got = masked_softmax(values_with_junk, mask, alpha)
        np.testing.assert_allclose(got[mask], softmax(alpha * values[mask]), rtol=1e-12)
        assert np.all(got[~mask] == 0)
    # log-sum-exp: alpha * v = 1e5 would overflow exp() without the shift
    got = masked_softmax(np.array([1000.0, 999.0, 5.0]), np.array([True, True, False]), 100.0)
    np.testing.assert_allclose(got, [1 / (1 + np.exp(-100)), np.exp(-100) / (1 + np.exp(-100)), 0.0])
    with pytest.raises(ValueError, match="selects no entry"):
        masked_softmax(np.ones(3), np.zeros(3, dtype=bool), 1.0)


def test_indicator_and_G_by_hand() -> None:
    f = np.array([0.3, 0.1, 9.0])
    g = np.array([0.2, -0.4, 5.0])
    mask = np.array([True, True, False])
    # q = softmax(2 * [0.2, -0.4]) = [e^0.4, e^-0.8] / (e^0.4 + e^-0.8)
    q0 = np.exp(0.4) / (np.exp(0.4) + np.exp(-0.8))
    G = q0 * 0.2 + (1 - q0) * -0.4
    above = switching_decision(f, g, mask, alpha=2.0, threshold=G - 1e-9)
    at = switching_decision(f, g, mask, alpha=2.0, threshold=G + 1e-12)
    assert above.G == pytest.approx(G, abs=1e-15) and not above.indicator
    assert at.indicator  # 1_k = [G_k <= threshold]
    np.testing.assert_allclose(above.weights, [q0, 1 - q0, 0.0])  # constraint round: q
    p0 = np.exp(0.6) / (np.exp(0.6) + np.exp(0.2))
    np.testing.assert_allclose(at.weights, [p0, 1 - p0, 0.0])  # objective round: p


def test_large_alpha_puts_the_weight_on_the_worst_client_and_small_alpha_averages() -> None:
    f = np.array([0.31, 0.30, 0.12, 0.05])
    g = np.array([-0.1, 0.02, 0.04, -0.3])
    mask = np.ones(4, dtype=bool)
    sharp = switching_decision(f, g, mask, alpha=2000.0, threshold=0.0)
    assert sharp.p[0] > 1 - 1e-8 and sharp.q[2] > 1 - 1e-8
    assert sharp.G == pytest.approx(g.max(), abs=1e-8)
    flat = switching_decision(f, g, mask, alpha=1e-6, threshold=0.0)
    np.testing.assert_allclose(flat.p, 0.25, atol=1e-6)
    assert flat.G == pytest.approx(g.mean(), abs=1e-6)


def test_server_update_by_hand_and_renormalised_over_arrived_updates() -> None:
    w = {"w": np.array([1.0, 2.0]), "b": np.array([0.5], dtype=np.float32)}
    u = {
        4: {"w": np.array([1.0, 0.0]), "b": np.array([2.0], dtype=np.float32)},
        7: {"w": np.array([0.0, -3.0]), "b": np.array([-1.0], dtype=np.float32)},
    }
    new = weighted_step(w, summed(u, {4: 0.25, 7: 0.75}), eta=0.5)
    np.testing.assert_allclose(new["w"], [1.0 - 0.5 * 0.25, 2.0 - 0.5 * (0.75 * -3.0)])
    np.testing.assert_allclose(new["b"], [0.5 - 0.5 * (0.25 * 2.0 + 0.75 * -1.0)])
    assert new["b"].dtype == np.float32
    only = weighted_step(w, summed({7: u[7]}, {4: 0.25, 7: 0.75}), eta=0.5)  # client 4's update was lost
    np.testing.assert_allclose(only["w"], [1.0, 2.0 + 0.5 * 3.0])


def summed(updates: dict[int, dict[str, np.ndarray]], weights: dict[int, float]) -> WeightedSum:
    """The weighted sum the server gets of the arrived ``updates`` (plain, or secure aggregation's)."""
    total = {
        k: sum(weights[i] * u[k].astype(np.float64) for i, u in updates.items())
        for k in next(iter(updates.values()))
    }
    return WeightedSum(total, sum(weights[i] for i in updates), sorted(updates))


def test_normalised_update_of_local_steps_matches_the_closed_form() -> None:
    """On f = |w - a|^2 / 2, E steps of size gamma give u = (w - a)(1 - (1 - gamma)^E) / (gamma E)."""
    task = quadratic.load_client(1, 3, seed=5)
    model = task.make_model()
    start = {"w": model.w.detach().numpy().copy()}
    gamma, E = 0.3, 4
    local_steps(
        task,
        model,
        local_objective(task, "f"),
        gamma=gamma,
        steps=E,
        batch_size=1,
        rng=np.random.default_rng(),
    )
    u = normalised_update(start, {"w": model.w.detach().numpy()}, gamma, E)["w"]
    a = task.a.numpy()
    np.testing.assert_allclose(u, (start["w"] - a) * (1 - (1 - gamma) ** E) / (gamma * E), rtol=1e-13)
    model = task.make_model()
    local_steps(
        task,
        model,
        local_objective(task, "g"),
        gamma=gamma,
        steps=E,
        batch_size=1,
        rng=np.random.default_rng(),
    )
    u = normalised_update(start, {"w": model.w.detach().numpy()}, gamma, E)["w"]
    np.testing.assert_allclose(u, task.b.numpy(), rtol=1e-13)  # grad g_i = b_i at every step


def test_penalty_and_lagrangian_objectives_have_the_right_gradients() -> None:
    task = quadratic.load_client(0, 3, seed=2)
    a, b = task.a.numpy(), task.b.numpy()
    for w, rho in ((np.zeros(3), 7.0), (a.copy(), 7.0)):  # w = 0 is feasible; w = a_i is not
        model = quadratic.QuadraticModel(w)
        g_value = float(b @ w - task.c)
        for objective, expected in (
            ("penalty", (w - a) + (rho * b if g_value > 0 else 0.0)),
            ("lagrangian", (w - a) + rho * b),
        ):
            loss = local_objective(task, objective, rho)(model, None)
            (grad,) = torch.autograd.grad(loss, [model.w])
            np.testing.assert_allclose(grad.numpy(), expected, rtol=1e-13)
    with pytest.raises(ValueError, match="'objective': unknown value 'h'"):
        local_objective(task, "h")


# --- whole runs -------------------------------------------------------------------------------------


def test_fifty_rounds_equal_an_independent_numpy_transcription(tmp_path: Path) -> None:
    """Iterates w_0..w_50, the averaged model and the modes, to 1e-10; train carries no arrays."""
    seen: dict[int, np.ndarray] = {}
    train_instructions = []

    def observe(instruction, reply) -> None:
        kind = instruction.metadata.message_type
        if kind == "query.fg":
            seen.setdefault(int(instruction.metadata.group_id), to_numpy(instruction.content["arrays"])["w"])
        if kind == "train":
            train_instructions.append(instruction)
            assert not reply.has_error(), reply.error

    summary = run_inline(
        {**QUAD, "results-dir": str(tmp_path), "run-name": "q"}, node_configs(3), observers=[observe]
    )
    assert summary["status"] == "completed"
    iterates, average, modes = quad_reference(QUAD, 3)
    models = np.load(tmp_path / "q" / "models.npz")
    got = [seen[k] for k in range(1, 51)] + [models["last/w"]]
    np.testing.assert_allclose(np.array(got), np.array(iterates), rtol=0, atol=1e-10)
    np.testing.assert_allclose(models["average/w"], average, rtol=0, atol=1e-10)
    rows = server_rows(tmp_path / "q")
    assert [bool(float(r["indicator"])) for r in rows] == modes
    assert 5 < sum(modes) < 45  # both modes occur
    assert summary["aggregate"]["averaged-rounds"] == sum(modes)
    assert summary["aggregate"]["grad-evals"] == 50 * 2 * 3  # m clients x E local steps per round
    # The train exchange carries the mode and step sizes, never a model.
    assert len(train_instructions) == 50 * 2
    for instruction in train_instructions:
        assert not instruction.content.array_records
        config = instruction.content["config"]
        assert config["objective"] in ("f", "g") and config["gamma"] == QUAD["switching-gamma"]


def test_average_is_over_the_objective_rounds_only_and_F_G_are_worst_clients(tmp_path: Path) -> None:
    cfg = {**QUAD, "num-rounds": 20, "switching-eval-every": 20}
    run_inline({**cfg, "results-dir": str(tmp_path), "run-name": "a"}, node_configs(3))
    iterates, _, modes = quad_reference(cfg, 3)
    models = np.load(tmp_path / "a" / "models.npz")
    on = [w for w, mode in zip(iterates, modes, strict=False) if mode]
    np.testing.assert_allclose(models["average/w"], np.mean(on, axis=0), atol=1e-10)
    assert not np.allclose(models["average/w"], np.mean(iterates[:-1], axis=0), atol=1e-3)
    final = server_rows(tmp_path / "a")[-1]
    tasks = [quadratic.load_client(i, 3, cfg["seed"]) for i in range(3)]
    for prefix, w in (("", models["last/w"]), ("avg-", models["average/w"])):
        values = [t.evaluate(quadratic.QuadraticModel(w)) for t in tasks]
        assert float(final[prefix + "F"]) == pytest.approx(max(v["f"] for v in values), rel=1e-12)
        assert float(final[prefix + "G"]) == pytest.approx(max(v["g"] for v in values), rel=1e-12)


def test_per_client_weights_are_in_the_results_rows(tmp_path: Path) -> None:
    run_inline({**QUAD, "num-rounds": 3, "results-dir": str(tmp_path), "run-name": "w"}, node_configs(3))
    with open(tmp_path / "w" / "rounds.csv", newline="") as f:
        train = [r for r in csv.DictReader(f) if r["exchange"] == "train"]
    by_round: dict[str, float] = {}
    for r in train:
        by_round[r["round"]] = by_round.get(r["round"], 0.0) + float(r["weight"])
    assert by_round == pytest.approx({"1": 1.0, "2": 1.0, "3": 1.0})


def test_theory_settings_come_from_D_L_K_E_eps(tmp_path: Path) -> None:
    cfg = {
        **QUAD,
        "num-rounds": 8,
        "switching-theory-d": 3.0,
        "switching-theory-l": 2.0,
        "switching-eps": 0.1,
        "switching-m": 0,
    }
    summary = run_inline({**cfg, "results-dir": str(tmp_path), "run-name": "t"}, node_configs(3))
    agg = summary["aggregate"]
    assert agg["setting-eta"] == pytest.approx(3.0 / (2.0 * np.sqrt(8 * 8)))
    assert agg["setting-gamma"] == pytest.approx(3.0 / (2.0 * 3 * np.sqrt(8 * 8)))
    assert agg["setting-threshold"] == pytest.approx(0.05)
    assert agg["setting-alpha-min"] == pytest.approx(2 * np.log(3) / 0.1)
    assert agg["setting-m"] == 3
    with pytest.raises(ConfigError, match="'switching-theory-l'"):
        run_inline(
            {**cfg, "switching-theory-l": 0.0, "results-dir": str(tmp_path), "run-name": "t2"},
            node_configs(3),
        )


def test_a_resumed_run_ends_like_an_uninterrupted_one(tmp_path: Path) -> None:
    from flwr.common.constant import SUPERLINK_NODE_ID
    from flwr.supercore.task_identity import TaskIdentity

    from hetfed.client.app import app as client_app
    from hetfed.server.app import run_server
    from tests.test_resume import DyingGrid

    cfg = {**QUAD, "num-rounds": 6, "switching-eval-every": 2, "results-dir": str(tmp_path)}
    run_inline({**cfg, "run-name": "whole"}, node_configs(3))
    crash = {**cfg, "run-name": "crash"}
    # pushes: discovery, round-0 evaluation, query + train per round (+ evaluate in even rounds):
    # 2 + 2 + 3 + 2 = 9 after round 3; the 11th push, round 4's train, dies after its query
    grid = DyingGrid(client_app, node_configs(3), crash, die_at=11)
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, SUPERLINK_NODE_ID, 1
    with pytest.raises(ConnectionError):
        run_server(grid, crash)
    assert json.loads((tmp_path / "crash" / "progress.json").read_text())["round"] == 3
    run_inline({**crash, "resume": True}, node_configs(3))
    whole, resumed = np.load(tmp_path / "whole" / "models.npz"), np.load(tmp_path / "crash" / "models.npz")
    assert set(whole.files) == set(resumed.files)
    for key in whole.files:
        np.testing.assert_array_equal(whole[key], resumed[key])


# --- bad input ---------------------------------------------------------------------------------------


def test_bad_input_names_the_key_or_the_client(tmp_path: Path) -> None:
    for alpha in (0.0, -1.0):
        with pytest.raises(ConfigError, match="'switching-alpha': must be > 0"):
            validate({"switching-alpha": alpha})
    with pytest.raises(ConfigError, match="'switching-m': 4 clients per round, but only 3"):
        run_inline({**QUAD, "switching-m": 4, "results-dir": str(tmp_path), "run-name": "m"}, node_configs(3))
    assert "switching-m" in json.loads((tmp_path / "m" / "summary.json").read_text())["error"]
    with pytest.raises(ConfigError, match="'problem': strategy 'softmax-switching' needs a constrained"):
        run_inline(
            {**QUAD, "problem": "knapsack", "results-dir": str(tmp_path), "run-name": "k"}, node_configs(3)
        )
    # no minimum rows per class and a sharp label skew: with this seed client-0 has no malignant row
    np_cfg = {
        "strategy": "softmax-switching",
        "problem": "np-classification",
        "np-min-per-class": 0,
        "np-dirichlet-alpha": 0.05,
        "seed": 1,
        "num-rounds": 1,
    }
    with pytest.raises(
        FederationError, match=r"client-0: its training split has no malignant rows \(g undefined\)"
    ):
        run_inline({**np_cfg, "results-dir": str(tmp_path), "run-name": "np"}, node_configs(10))


# --- engines ------------------------------------------------------------------------------------------


@pytest.mark.simulation
def test_simulation_engine_agrees_with_inline(tmp_path: Path) -> None:
    cfg = {**QUAD, "switching-eval-every": 25}
    run_experiment("inline", {**cfg, "run-name": "inline"}, nodes=3, results_dir=tmp_path)
    sim = run_experiment("simulation", {**cfg, "run-name": "sim"}, nodes=3, results_dir=tmp_path, timeout=600)
    assert sim["status"] == "completed" and sim["engine"] == "simulation"
    a, b = np.load(tmp_path / "inline" / "models.npz"), np.load(tmp_path / "sim" / "models.npz")
    for key in ("last/w", "average/w"):
        np.testing.assert_allclose(b[key], a[key], rtol=0, atol=1e-6)
    rows_a, rows_b = server_rows(tmp_path / "inline"), server_rows(tmp_path / "sim")
    assert [r["indicator"] for r in rows_b] == [r["indicator"] for r in rows_a]
    assert [float(r["G-sampled"]) for r in rows_b] == pytest.approx([float(r["G-sampled"]) for r in rows_a])
