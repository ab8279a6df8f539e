"""hetfed.problems.garnet: the generative law, the exact TD(0) quantities and the sampler."""

from __future__ import annotations

import numpy as np
import pytest

from hetfed.problems.garnet import GarnetAgent, garnet_base, make_agent, make_agents

SIZES = [dict(), dict(n_states=7, n_actions=3, branching=2, dim=4)]


@pytest.mark.parametrize("sizes", SIZES)
@pytest.mark.parametrize("seed", [0, 42])
def test_base_kernel_is_stochastic_with_exact_branching(seed: int, sizes: dict) -> None:
    base = garnet_base(seed, **sizes)
    branching = sizes.get("branching", 3)
    assert np.all(base.kernel >= 0)
    np.testing.assert_allclose(base.kernel.sum(axis=2), 1.0, atol=1e-12)
    assert np.all((base.kernel > 0).sum(axis=2) == branching)
    np.testing.assert_allclose(base.kernel[base.kernel > 0], 1.0 / branching)
    assert np.all((base.rewards >= 0) & (base.rewards <= 1))
    np.testing.assert_allclose(base.features.sum(axis=1), 1.0, atol=1e-12)
    assert np.all(base.features >= 0)


@pytest.mark.parametrize("sizes", SIZES)
def test_agent_kernels_stay_on_the_base_support_and_follow_the_noise_law(sizes: dict) -> None:
    seed, zeta_ker, zeta_rew = 3, 0.7, 0.4
    base = garnet_base(seed, **sizes)
    for agent in make_agents(4, seed, zeta_ker, zeta_rew, **sizes):
        assert np.all(agent.sa_kernel >= 0)
        np.testing.assert_allclose(agent.sa_kernel.sum(axis=2), 1.0, atol=1e-12)
        np.testing.assert_array_equal(agent.sa_kernel > 0, base.kernel > 0)
        # weights 1 + zeta u with u in [0, 1): any two support entries have ratio in [1/(1+zeta), 1+zeta]
        on_support = np.where(base.kernel > 0, agent.sa_kernel, np.nan)
        ratio = np.nanmax(on_support, axis=2) / np.nanmin(on_support, axis=2)
        assert np.all(ratio <= 1.0 + zeta_ker) and np.any(ratio > 1.0 + 1e-6)
        # uniform policy: P_c is the action average of K_c
        np.testing.assert_allclose(agent.kernel, agent.sa_kernel.mean(axis=1))
        np.testing.assert_allclose(agent.kernel.sum(axis=1), 1.0, atol=1e-12)
        noise = agent.rewards - base.rewards
        assert np.all((noise >= 0) & (noise <= zeta_rew)) and np.any(noise > 0)


@pytest.mark.parametrize("seed", [0, 1, 42])
def test_stationary_distribution(seed: int) -> None:
    for agent in make_agents(3, seed, 0.9, 0.9):
        mu, kernel = agent.mu, agent.kernel
        assert np.all(mu >= 0)
        assert mu.sum() == pytest.approx(1.0, abs=1e-12)
        np.testing.assert_allclose(mu @ kernel, mu, atol=1e-12)
        # independent route: the Perron eigenvector of P'
        values, vectors = np.linalg.eig(kernel.T)
        perron = np.real(vectors[:, np.argmin(np.abs(values - 1.0))])
        np.testing.assert_allclose(mu, perron / perron.sum(), atol=1e-10)


def test_exact_td_quantities_match_a_brute_force_sum_and_the_projected_bellman_equation() -> None:
    agent = make_agent(2, 7, 0.5, 0.5)
    phi, kernel, mu, r, gamma = agent.features, agent.kernel, agent.mu, agent.rewards, agent.gamma
    a_sum = sum(
        mu[s] * kernel[s, t] * np.outer(phi[s], phi[s] - gamma * phi[t]) for s in range(10) for t in range(10)
    )
    b_sum = sum(mu[s] * r[s] * phi[s] for s in range(10))
    np.testing.assert_allclose(agent.A_bar, a_sum, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(agent.b_bar, b_sum, rtol=1e-12, atol=1e-15)
    # TD(0) fixed point: Phi theta* = Proj_mu(r + gamma P Phi theta*), Proj_mu the D_mu-weighted projection
    d_mu = np.diag(mu)
    proj = phi @ np.linalg.solve(phi.T @ d_mu @ phi, phi.T @ d_mu)
    value = phi @ agent.theta_star
    np.testing.assert_allclose(value, proj @ (r + gamma * kernel @ value), rtol=1e-10)


@pytest.mark.parametrize("seed", range(6))
def test_a_bar_eigenvalues_have_positive_real_part(seed: int) -> None:
    for agent in make_agents(3, seed, 0.9, 0.9):
        assert np.linalg.eigvals(agent.A_bar).real.min() > 0
        # stronger (Tsitsiklis-Van Roy): the symmetric part is positive definite
        assert np.linalg.eigvalsh(agent.A_bar + agent.A_bar.T).min() > 0


def _same(a: GarnetAgent, b: GarnetAgent) -> bool:
    names = ("features", "sa_kernel", "kernel", "rewards", "mu", "A_bar", "b_bar", "theta_star")
    return all(np.array_equal(getattr(a, n), getattr(b, n)) for n in names)


def test_seeds_reproduce_and_differ() -> None:
    assert _same(make_agent(1, 42, 0.3, 0.3), make_agent(1, 42, 0.3, 0.3))
    assert not _same(make_agent(1, 42, 0.3, 0.3), make_agent(1, 43, 0.3, 0.3))
    rng_a, rng_b = np.random.default_rng(5), np.random.default_rng(5)
    agent = make_agent(0, 42)
    for x, y in zip(agent.sample(rng_a, 50), agent.sample(rng_b, 50), strict=True):
        np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("index", [0, 3, 9])
def test_agent_alone_equals_agent_in_any_federation(index: int) -> None:
    alone = make_agent(index, 11, 0.5, 0.8)
    for n_agents in (index + 1, 2 * index + 5):
        assert _same(alone, make_agents(n_agents, 11, 0.5, 0.8)[index])


def test_zeta_zero_gives_identical_agents_and_positive_zeta_does_not() -> None:
    same = make_agents(4, 42, 0.0, 0.0)
    assert all(_same(same[0], agent) for agent in same[1:])
    kernel_only = make_agents(2, 42, 0.5, 0.0)
    assert not np.allclose(kernel_only[0].kernel, kernel_only[1].kernel)
    np.testing.assert_array_equal(kernel_only[0].rewards, kernel_only[1].rewards)
    reward_only = make_agents(2, 42, 0.0, 0.5)
    np.testing.assert_array_equal(reward_only[0].kernel, reward_only[1].kernel)
    assert not np.allclose(reward_only[0].rewards, reward_only[1].rewards)
    assert not np.allclose(reward_only[0].theta_star, reward_only[1].theta_star)


def _assert_mean_within(samples: np.ndarray, expected: np.ndarray) -> None:
    """|sample mean - expected| <= 5 standard errors per entry (CLT; ~6e-7 false-alarm rate per entry)."""
    n = samples.shape[0]
    standard_error = samples.std(axis=0) / np.sqrt(n)
    assert np.all(np.abs(samples.mean(axis=0) - expected) <= 5 * standard_error + 1e-15)


def test_sample_means_converge_to_a_bar_and_b_bar() -> None:
    # n = 2e5 gives standard errors ~1e-4 against A_bar entries ~1e-2. Sampling s uniformly instead
    # of from mu, or s' from mu instead of P(s, .), moves some entry by > 13 standard errors here.
    agent = make_agent(1, 42, 0.5, 0.5)
    a, b = agent.sample(np.random.default_rng(0), 200_000)
    assert a.shape == (200_000, 5, 5) and b.shape == (200_000, 5)
    _assert_mean_within(a, agent.A_bar)
    _assert_mean_within(b, agent.b_bar)


def test_g_is_the_mean_residual_of_the_same_samples() -> None:
    agent = make_agent(0, 42, 0.5, 0.5)
    theta = np.linspace(-3.0, 5.0, 5)
    a, b = agent.sample(np.random.default_rng(9), 64)
    g = agent.g(theta, np.random.default_rng(9), 64)
    np.testing.assert_allclose(g, (a @ theta - b).mean(axis=0), rtol=1e-12, atol=1e-14)


def test_error_is_squared_distance_to_theta_star() -> None:
    agent = make_agent(0, 42)
    assert agent.error(agent.theta_star) == 0.0
    step = np.array([1.0, -2.0, 0.0, 0.5, 3.0])
    assert agent.error(agent.theta_star + step) == pytest.approx(float(step @ step))


@pytest.mark.parametrize(
    ("call", "name"),
    [
        (lambda: make_agent(-1, 0), "agent_index"),
        (lambda: make_agent(0, -5), "seed"),
        (lambda: make_agent(0, 0, zeta_ker=-0.1), "zeta_ker"),
        (lambda: make_agent(0, 0, zeta_rew=float("nan")), "zeta_rew"),
        (lambda: make_agent(0, 0, branching=11), "branching"),
        (lambda: make_agent(0, 0, dim=11), "dim"),
        (lambda: make_agent(0, 0, gamma=1.0), "gamma"),
        (lambda: make_agents(0, 0), "n_agents"),
        (lambda: make_agent(0, 0).sample(np.random.default_rng(0), 0), "batch"),
        (lambda: make_agent(0, 0).g(np.zeros(4), np.random.default_rng(0)), "theta"),
        (lambda: make_agent(0, 0).error(np.zeros(6)), "theta"),
    ],
)
def test_bad_input_names_the_argument(call, name: str) -> None:
    with pytest.raises(ValueError, match=name):
        call()


def test_reducible_kernel_is_rejected() -> None:
    # two absorbing states: stationary distribution not unique
    kernel = np.eye(3)[:, None, :]
    with pytest.raises(ValueError, match="stationary"):
        GarnetAgent(np.eye(3)[:, :2], kernel, np.zeros(3), 0.9)


def test_agent_arrays_are_read_only() -> None:
    agent = make_agent(0, 42)
    with pytest.raises(ValueError):
        agent.theta_star[0] = 1.0
