"""Safe-RL CartPole CMDPs: per-client physics, rollouts and cost, the REINFORCE surrogate."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from gymnasium.envs.classic_control.cartpole import CartPoleVectorEnv

from hetfed.problems import safe_rl as sr
from hetfed.problems.constrained import ConstrainedClientTask

N = 10


def _numpy_cartpole_step(state: np.ndarray, push_right: bool, p: sr.CartPolePhysics) -> np.ndarray:
    """One Euler step of the cart-pole equations (Florian 2005), gravity 9.8, tau 0.02."""
    x, x_dot, theta, theta_dot = state
    total = p.masscart + p.masspole
    force = p.force_mag if push_right else -p.force_mag
    temp = (force + p.masspole * p.length * theta_dot**2 * math.sin(theta)) / total
    theta_acc = (9.8 * math.sin(theta) - math.cos(theta) * temp) / (
        p.length * (4 / 3 - p.masspole * math.cos(theta) ** 2 / total)
    )
    x_acc = temp - p.masspole * p.length * theta_acc * math.cos(theta) / total
    return np.array(
        [x + 0.02 * x_dot, x_dot + 0.02 * x_acc, theta + 0.02 * theta_dot, theta_dot + 0.02 * theta_acc]
    )


def test_physics_levels_are_spread_evenly_and_reproducibly() -> None:
    physics = [sr.client_physics(i, N, 0.5, instance_seed=4) for i in range(N)]
    levels = -1 + (2 * np.arange(N) + 1) / N
    for name in sr.PHYSICS_FIELDS:
        values = sorted(getattr(p, name) for p in physics)
        np.testing.assert_allclose(values, getattr(sr.CartPolePhysics(), name) * np.exp(0.5 * levels))
    assert physics == [sr.client_physics(i, N, 0.5, instance_seed=4) for i in range(N)]
    assert physics != [sr.client_physics(i, N, 0.5, instance_seed=5) for i in range(N)]
    assert {sr.client_physics(i, N, 0.0, instance_seed=4) for i in range(N)} == {sr.CartPolePhysics()}


def test_client_physics_change_the_dynamics_as_the_equations_say() -> None:
    state = np.array([0.3, -0.2, 0.05, 0.4])
    clients = [sr.load_client(i, N, seed=0) for i in (0, 1)]
    next_states = []
    for task in clients:
        env = CartPoleVectorEnv(num_envs=2)
        task.physics.apply(env)
        env.reset(seed=0)
        env.state = np.tile(state[:, None], (1, 2))
        obs, *_ = env.step(np.array([1, 0]))
        for k, push_right in enumerate((True, False)):
            np.testing.assert_allclose(
                obs[k], _numpy_cartpole_step(state, push_right, task.physics), rtol=1e-6
            )
        next_states.append(obs)
    assert np.abs(next_states[0] - next_states[1]).max() > 1e-3


def test_rollout_structure_and_documented_cost() -> None:
    task = sr.load_client(2, N, seed=0, horizon=60, x_safe=0.05, theta_safe=0.03, fall_cost=False)
    model = task.make_model()
    ep = task.sample_batch(np.random.default_rng(0), 12, model)
    mask = ep.mask.numpy()
    lengths = mask.sum(0)
    assert ep.num_episodes == 12 and mask.shape[0] == lengths.max() <= 60
    assert (np.cumsum(~mask, axis=0)[mask] == 0).all()  # each episode is a prefix of steps
    nxt, obs = ep.next_obs.numpy(), ep.obs.numpy()
    assert (np.abs(obs[0]) <= 0.05).all()
    for n, length in enumerate(lengths):
        np.testing.assert_array_equal(obs[1:length, n], nxt[: length - 1, n])
        out_of_bounds = (np.abs(nxt[:length, n, 0]) > 2.4) | (np.abs(nxt[:length, n, 2]) > 12 * math.pi / 180)
        assert not out_of_bounds[:-1].any() and (out_of_bounds[-1] or length == 60)
    expected_cost = ((np.abs(nxt[..., 0]) > 0.05) | (np.abs(nxt[..., 2]) > 0.03)).astype(np.float32)
    np.testing.assert_array_equal(ep.costs.numpy()[mask], expected_cost[mask])
    assert 0 < expected_cost[mask].mean() < 1  # both cases occur, so the comparison means something
    np.testing.assert_array_equal(ep.rewards.numpy()[mask], 1.0)
    again = task.sample_batch(np.random.default_rng(0), 12, model)
    assert torch.equal(ep.obs, again.obs) and torch.equal(ep.actions, again.actions)


def test_fall_cost_charges_a_fall_the_steps_left_to_the_horizon() -> None:
    """Same episodes (same rng) with and without ``fall_cost``: only the last step of an episode
    that fell before the horizon costs more, by H minus its length; the evaluation's cost with it."""
    params = {"horizon": 40, "x_safe": 0.5, "theta_safe": 0.1}
    plain = sr.load_client(1, N, seed=0, fall_cost=False, **params)
    falls = sr.load_client(1, N, seed=0, fall_cost=True, **params)
    model = plain.make_model()
    a = plain.sample_batch(np.random.default_rng(3), 16, model)
    b = falls.sample_batch(np.random.default_rng(3), 16, model)
    assert torch.equal(a.obs, b.obs) and torch.equal(a.mask, b.mask)
    lengths = a.mask.numpy().sum(0)
    assert (lengths < 40).any() and (lengths == 40).any()  # falls and survivors both occur
    extra = (b.costs - a.costs).numpy() * a.mask.numpy()
    for n, length in enumerate(lengths):
        expected = np.zeros(len(extra))
        expected[length - 1] = 40 - length  # 0 for an episode that reached the horizon
        np.testing.assert_array_equal(extra[:, n], expected)
    ea, eb = plain.evaluate(model), falls.evaluate(model)
    assert eb["episode_length"] == ea["episode_length"] and eb["return"] == ea["return"]
    assert eb["cost"] == pytest.approx(ea["cost"] + 40 - ea["episode_length"])
    assert eb["g"] == pytest.approx(eb["cost"] / 40 - 0.05)


def _tiny_episodes() -> sr.Episodes:
    gen = torch.Generator().manual_seed(0)
    obs = torch.randn(3, 2, 4, generator=gen)
    mask = torch.tensor([[True, True], [True, True], [True, False]])
    return sr.Episodes(
        obs=obs,
        actions=torch.tensor([[1, 0], [0, 0], [1, 1]]),
        rewards=torch.tensor([[1.0, 1.0], [1.0, 1.0], [1.0, 0.0]]),
        costs=torch.tensor([[0.0, 1.0], [1.0, 0.0], [1.0, 1.0]]),  # the masked step's cost must be ignored
        next_obs=torch.zeros(3, 2, 4),
        mask=mask,
    )


@pytest.mark.parametrize("which", ["f", "g"])
def test_surrogate_gradient_matches_explicit_policy_gradient_sum(which) -> None:
    task = sr.load_client(0, N, seed=0, horizon=5, budget=0.1, advantage="reward-to-go")
    model = task.make_model().double()
    ep = _tiny_episodes()
    ep = sr.Episodes(
        ep.obs.double(), ep.actions, ep.rewards.double(), ep.costs.double(), ep.next_obs, ep.mask
    )
    value = getattr(task, which)(model, ep)
    grad_w, grad_b = torch.autograd.grad(value, [model.weight, model.bias])

    per_step = (-ep.rewards if which == "f" else ep.costs).numpy() * ep.mask.numpy()
    w, b = model.weight.detach().numpy(), model.bias.detach().numpy()
    ref_w, ref_b, total = np.zeros_like(w), np.zeros_like(b), 0.0
    for n in range(2):
        for t in range(3):
            if not ep.mask[t, n]:
                continue
            s = ep.obs[t, n].numpy()
            logits = w @ s + b
            pi = np.exp(logits - logits.max()) / np.exp(logits - logits.max()).sum()
            score = np.eye(2)[int(ep.actions[t, n])] - pi  # d log softmax / d logits
            to_go = per_step[t:, n].sum()
            ref_w += np.outer(score, s) * to_go
            ref_b += score * to_go
            total += per_step[t, n]
    scale = 1 / (2 * 5)
    offset = 0.0 if which == "f" else 0.1
    assert value.item() == pytest.approx(total * scale - offset)
    np.testing.assert_allclose(grad_w.numpy(), ref_w * scale, rtol=1e-10)
    np.testing.assert_allclose(grad_b.numpy(), ref_b * scale, rtol=1e-10)


def test_surrogate_gradient_for_hidden_layer_policy_is_the_sum_of_logprob_gradients() -> None:
    task = sr.load_client(0, N, seed=0, horizon=4, hidden=3, advantage="reward-to-go")
    model = task.make_model()
    ep = _tiny_episodes()
    params = list(model.parameters())
    grads = torch.autograd.grad(task.f(model, ep), params)
    expected = [torch.zeros_like(p) for p in params]
    for n in range(2):
        length = int(ep.mask[:, n].sum())
        for t in range(length):
            log_prob = torch.log_softmax(model(ep.obs[t, n]), -1)[ep.actions[t, n]]
            to_go = -float(ep.rewards[t:length, n].sum())
            for acc, grad in zip(expected, torch.autograd.grad(log_prob, params), strict=True):
                acc += grad * to_go / (2 * 4)
    for got, want in zip(grads, expected, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-7)


def test_evaluate_is_deterministic_and_consistent() -> None:
    task = sr.load_client(5, N, seed=1, eval_episodes=6, horizon=80)
    model = task.make_model()
    first, second = task.evaluate(model), task.evaluate(model)
    assert first == second
    assert first["f"] == pytest.approx(-first["return"] / 80)
    assert first["g"] == pytest.approx(first["cost"] / 80 - 0.05)
    assert first["return"] == pytest.approx(first["episode_length"])  # reward 1 per step


def test_model_shared_between_server_and_clients() -> None:
    server = sr.make_model(7, hidden=8)
    client = sr.load_client(3, N, seed=7, hidden=8).make_model()
    assert all(torch.equal(p, q) for p, q in zip(server.parameters(), client.parameters(), strict=True))
    assert isinstance(sr.make_model(7), torch.nn.Linear)
    assert isinstance(sr.load_client(0, N, seed=0), ConstrainedClientTask)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"budget": 1.5}, "^budget:"),
        ({"horizon": 0}, "^horizon:"),
        ({"x_safe": 0.0}, "^x_safe:"),
        ({"hidden": -1}, "^hidden:"),
        ({"heterogeneity": 3.0}, "^heterogeneity:"),
        ({"gravity": 9.8}, "unknown parameter.*gravity"),
        ({"fall_cost": 1}, "^fall_cost:"),
    ],
)
def test_bad_params_name_the_key(kwargs, match) -> None:
    with pytest.raises(ValueError, match=match):
        sr.load_client(0, N, seed=0, **kwargs)


def test_bad_partition_and_batch_size() -> None:
    with pytest.raises(ValueError, match="partition_id"):
        sr.load_client(-1, N, seed=0)
    task = sr.load_client(0, N, seed=0)
    with pytest.raises(ValueError, match="size"):
        task.sample_batch(np.random.default_rng(0), 0, task.make_model())


def test_reinforce_on_f_alone_increases_return() -> None:
    task = sr.load_client(0, N, seed=0, horizon=100, eval_episodes=16)
    model = task.make_model()
    before = task.evaluate(model)["return"]
    optimiser = torch.optim.Adam(model.parameters(), lr=0.05)
    rng = np.random.default_rng(0)
    for _ in range(30):
        optimiser.zero_grad()
        task.f(model, task.sample_batch(rng, 16, model)).backward()
        optimiser.step()
    assert task.evaluate(model)["return"] > before + 30
