"""TRPO-style local steps and GAE for safe RL: against explicit matrices and a NumPy transcription."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch

from hetfed.client.trust_region import conjugate_gradient, natural_step
from hetfed.problems.safe_rl import gae, load_client, score_function_estimate, value_baseline


def test_conjugate_gradient_solves_a_positive_definite_system() -> None:
    rng = np.random.default_rng(0)
    m = rng.normal(size=(6, 6))
    a = torch.tensor(m @ m.T + 6 * np.eye(6))
    b = torch.tensor(rng.normal(size=6))
    x = conjugate_gradient(lambda v: a @ v, b, iterations=20)
    np.testing.assert_allclose(x.numpy(), np.linalg.solve(a.numpy(), b.numpy()), rtol=1e-8)


def test_the_natural_step_follows_the_fisher_direction_and_stays_in_the_trust_region() -> None:
    task = load_client(0, 4, seed=3, trust_region=0.01)
    model = task.make_model().double()
    batch = task.sample_batch(np.random.default_rng(1), 8, model.float())
    model = model.double()
    batch = type(batch)(
        batch.obs.double(), batch.actions, batch.rewards, batch.costs, batch.next_obs, batch.mask
    )
    params = list(model.parameters())
    loss = task.f(model, batch)
    grad = torch.cat([g.reshape(-1) for g in torch.autograd.grad(loss, params, retain_graph=True)])
    kl = task.kl_from(model, batch)
    start = torch.cat([p.detach().reshape(-1) for p in params])
    # The Fisher matrix, explicitly: the Hessian of the mean KL at the current parameters.
    shapes = [p.shape for p in params]

    def kl_of(flat: torch.Tensor) -> torch.Tensor:
        chunks = torch.split(flat, [int(np.prod(s)) for s in shapes])
        weight, bias = (c.view(s) for c, s in zip(chunks, shapes, strict=True))
        new = torch.log_softmax(batch.obs @ weight.T + bias, dim=-1)
        old = torch.log_softmax(batch.obs @ start[:8].view(2, 4).T + start[8:], dim=-1).detach()
        mask = batch.mask.double()
        return ((old.exp() * (old - new)).sum(-1) * mask).sum() / mask.sum()

    fisher = torch.autograd.functional.hessian(kl_of, start.clone())
    expected = torch.linalg.solve(fisher + 1e-2 * torch.eye(len(start), dtype=fisher.dtype), grad)
    moved = natural_step(params, loss, kl, radius=0.01)
    step = start - torch.cat([p.detach().reshape(-1) for p in params])
    cosine = float(step @ expected / (step.norm() * expected.norm()))
    assert cosine > 0.999, cosine
    assert 0.01 / 4 < moved <= 0.01  # the full step or one halving: KL ~ (1/2) s'Fs = radius
    assert float(kl().detach()) == pytest.approx(moved)


def test_a_step_that_cannot_meet_the_trust_region_leaves_the_policy_unchanged() -> None:
    task = load_client(0, 4, seed=3)
    model = task.make_model()
    batch = task.sample_batch(np.random.default_rng(1), 4, model)
    before = [p.detach().clone() for p in model.parameters()]
    kl = task.kl_from(model, batch)
    # The same Fisher matrix, but every step measures 1 above the radius: no step is accepted.
    moved = natural_step(list(model.parameters()), task.f(model, batch), lambda: kl() + 1.0, 0.01)
    assert moved == 0.0
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


def gae_reference(x: np.ndarray, v: np.ndarray, mask: np.ndarray, lam: float) -> np.ndarray:
    """Per episode, backwards: A_t = delta_t + lam A_{t+1}, delta_t = x_t + V_{t+1} - V_t (0 past the end)."""
    n = x.shape[1]
    out = np.zeros_like(x)
    for e in range(n):
        length = int(mask[:, e].sum())
        nxt = 0.0
        for t in range(length - 1, -1, -1):
            v_next = v[t + 1, e] if t + 1 < length else 0.0
            nxt = x[t, e] + v_next - v[t, e] + lam * nxt
            out[t, e] = nxt
    return out


def test_gae_equals_a_loop_transcription_and_is_reward_to_go_minus_baseline_at_lambda_one() -> None:
    rng = np.random.default_rng(4)
    lengths = np.array([7, 3, 10, 1])
    mask = np.arange(10)[:, None] < lengths[None, :]
    x = rng.normal(size=(10, 4)) * mask
    v = rng.normal(size=(10, 4)) * mask
    for lam in (0.0, 0.9, 1.0):
        got = gae(torch.tensor(x), torch.tensor(v), torch.tensor(mask), lam).numpy()
        np.testing.assert_allclose(got, gae_reference(x, v, mask, lam), atol=1e-12)
    to_go = np.flip(np.cumsum(np.flip(x, 0), 0), 0) * mask
    got = gae(torch.tensor(x), torch.tensor(v), torch.tensor(mask), 1.0).numpy()
    np.testing.assert_allclose(got, (to_go - v) * mask, atol=1e-12)


def test_the_fitted_baseline_lowers_the_variance_of_the_policy_gradient_weights() -> None:
    task = load_client(1, 4, seed=0, advantage="gae")
    model = task.make_model()
    batch = task.sample_batch(np.random.default_rng(2), 32, model)
    per_step = -batch.rewards * batch.mask
    to_go = per_step.flip(0).cumsum(0).flip(0)
    baseline = value_baseline(batch, to_go, task.config.horizon)
    live = batch.mask
    assert float((to_go - baseline)[live].var()) < 0.8 * float(to_go[live].var())
    # The estimate's value is the same whatever the weights; only its gradient changes.
    plain = score_function_estimate(model, batch, -batch.rewards, 200)
    with_gae = score_function_estimate(model, batch, -batch.rewards, 200, "gae", 0.95)
    assert float(plain.detach()) == pytest.approx(float(with_gae.detach()))


def test_a_safe_rl_run_with_trust_region_steps_and_gae_completes_on_the_inline_engine() -> None:
    from hetfed.engines.runner import run_experiment

    with tempfile.TemporaryDirectory() as tmp:
        summary = run_experiment(
            "inline",
            {
                "run-name": "trpo",
                "strategy": "softmax-switching",
                "problem": "safe-rl",
                "num-rounds": 3,
                "rl-trust-region": 0.01,
                "rl-advantage": "gae",
                "rl-eval-episodes": 4,
                "batch-zeta": 4,
                "batch-size": 4,
                "switching-eps": 0.02,
                "switching-eta": 2.0,
                "checkpoint-every": 0,
            },
            nodes=2,
            results_dir=Path(tmp),
        )
    assert summary["status"] == "completed"
    assert np.isfinite(summary["aggregate"]["F"]) and np.isfinite(summary["aggregate"]["G"])
