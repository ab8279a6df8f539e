"""The NumPy reference of PF-LSA / FedLSA / SCAFFLSA / single-agent LSA against closed forms."""

from __future__ import annotations

import numpy as np
import pytest

from bench.lsa_reference import (
    exact_oracle,
    fedlsa,
    garnet_oracle,
    iterations_to_fraction,
    mean_sq_error,
    per_agent_oracle,
    pflsa,
    scafflsa,
    single_lsa,
    stacked,
    theta_lim,
)
from hetfed.problems.garnet import make_agents

N_AGENTS = 4
ETA = 20.0  # exact Garnet means: |eig(I - eta A_bar_c)| <= 0.91 here, so noise-free runs converge fast


@pytest.fixture(scope="module")
def garnet() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Strongly heterogeneous exact problem: A_bar [N, 5, 5], b_bar [N, 5], theta* [N, 5]."""
    return stacked(make_agents(N_AGENTS, 3, 1.0, 1.0))


def _fedlsa_limit(a_bar: np.ndarray, star: np.ndarray, eta: float, n_local: int) -> np.ndarray:
    """Fixed point of noise-free FedLSA: sum_c (I - (I - eta A_c)^H) (theta - theta_c*) = 0."""
    contraction = np.array(
        [np.eye(a.shape[0]) - np.linalg.matrix_power(np.eye(a.shape[0]) - eta * a, n_local) for a in a_bar]
    )
    return np.linalg.solve(contraction.sum(axis=0), np.einsum("nij,nj->i", contraction, star))


@pytest.mark.parametrize("beta", [0.25, 0.5, 1.0])
def test_pflsa_reaches_every_personal_solution(garnet, beta: float) -> None:
    a_bar, b_bar, star = garnet
    thetas = pflsa(exact_oracle(a_bar, b_bar), np.zeros_like(star), ETA, beta, 3000)
    np.testing.assert_allclose(thetas[-1], star, rtol=1e-8)
    assert np.all(np.diff(mean_sq_error(thetas, star)[-100:]) <= 0)


def test_pflsa_without_personal_term_keeps_initial_gaps(garnet) -> None:
    # beta = 0: every agent applies the same averaged update, so theta_c - theta_c' never changes
    a_bar, b_bar, star = garnet
    theta0 = np.arange(N_AGENTS * 5, dtype=float).reshape(N_AGENTS, 5)
    thetas = pflsa(exact_oracle(a_bar, b_bar), theta0, ETA, 0.0, 500)
    np.testing.assert_allclose(thetas[-1] - thetas[-1][0], theta0 - theta0[0], atol=1e-9)
    assert not np.allclose(thetas[-1], star, rtol=1e-2)


def test_pflsa_one_step_by_hand(garnet) -> None:
    a_bar, b_bar, _ = garnet
    theta0 = np.ones((N_AGENTS, 5))
    g = np.array([a_bar[c] @ theta0[c] - b_bar[c] for c in range(N_AGENTS)])
    expected = theta0 - 0.3 * 0.2 * g - 0.3 * 0.8 * g.mean(axis=0)
    one_step = pflsa(exact_oracle(a_bar, b_bar), theta0, 0.3, 0.2, 1)[1]
    np.testing.assert_allclose(one_step, expected, rtol=1e-14)


def test_single_agent_lsa_reaches_every_personal_solution(garnet) -> None:
    a_bar, b_bar, star = garnet
    thetas = single_lsa(exact_oracle(a_bar, b_bar), np.zeros_like(star), ETA, 1000)
    np.testing.assert_allclose(thetas[-1], star, rtol=1e-8)


def test_fedlsa_with_one_local_step_reaches_theta_lim(garnet) -> None:
    a_bar, b_bar, star = garnet
    shared = fedlsa(exact_oracle(a_bar, b_bar), np.zeros(5), ETA, 1, 1000, N_AGENTS)
    limit = theta_lim(a_bar, b_bar)
    np.testing.assert_allclose(shared[-1], limit, rtol=1e-8)
    # and theta_lim is no agent's solution: the heterogeneity bias FedLSA cannot remove
    assert mean_sq_error(limit[None], star)[0] > 1.0


def test_fedlsa_with_local_steps_has_the_closed_form_bias(garnet) -> None:
    a_bar, b_bar, star = garnet
    n_local = 50
    shared = fedlsa(exact_oracle(a_bar, b_bar), np.zeros(5), ETA, n_local, 300, N_AGENTS)
    biased = _fedlsa_limit(a_bar, star, ETA, n_local)
    np.testing.assert_allclose(shared[-1], biased, rtol=1e-8)
    # the bias is small here (kernel noise barely matters) but 1e4 times the convergence tolerance
    assert np.linalg.norm(biased - theta_lim(a_bar, b_bar)) > 1e-2


def test_scafflsa_removes_the_local_step_bias(garnet) -> None:
    a_bar, b_bar, star = garnet
    n_local = 50
    shared, xi = scafflsa(exact_oracle(a_bar, b_bar), np.zeros(5), ETA, n_local, 600, np.zeros((N_AGENTS, 5)))
    limit = theta_lim(a_bar, b_bar)
    np.testing.assert_allclose(shared[-1], limit, rtol=1e-10)
    xi_star = np.einsum("nij,nj->ni", a_bar, limit - star)  # entries ~4e-2
    np.testing.assert_allclose(xi, xi_star, atol=1e-10)
    np.testing.assert_allclose(xi.sum(axis=0), 0.0, atol=1e-10)


def _td_second_moments(agent) -> tuple[np.ndarray, np.ndarray]:
    """Exact E[A(Z)_ij^2] and E[b(Z)_i^2] by summing over all transitions (s, s')."""
    phi, weight = agent.features, agent.mu[:, None] * agent.kernel  # weight[s, s'] = P(s, s')
    a = phi[:, None, :, None] * (phi[:, None, None, :] - agent.gamma * phi[None, :, None, :])
    return (
        np.einsum("st,stij->ij", weight, a**2),
        np.einsum("s,si->i", agent.mu, (agent.rewards[:, None] * phi) ** 2),
    )


def test_garnet_oracle_draws_have_the_exact_means() -> None:
    agents = make_agents(3, 42, 0.5, 0.5)
    a_bar, b_bar, _ = stacked(agents)
    n = 200_000
    a, b = garnet_oracle(agents, np.random.default_rng(0), batch=n)()
    for c, agent in enumerate(agents):
        a_sq, b_sq = _td_second_moments(agent)
        # 5 exact standard errors (CLT); a sampler drawing s uniformly misses by > 40 of them
        assert np.all(np.abs(a[c] - a_bar[c]) <= 5 * np.sqrt((a_sq - a_bar[c] ** 2) / n) + 1e-15)
        assert np.all(np.abs(b[c] - b_bar[c]) <= 5 * np.sqrt((b_sq - b_bar[c] ** 2) / n) + 1e-15)


def test_per_agent_oracle_replays_what_clients_would_compute() -> None:
    # A client holding rng_c computes g_c = agent.g(theta_c, rng_c); the server mixes as in PF-LSA.
    agents = make_agents(3, 42, 0.5, 0.5)
    eta, beta, batch = 0.5, 0.3, 4
    client_rngs = [np.random.default_rng([7, c]) for c in range(3)]
    thetas = np.zeros((3, 5))
    for _ in range(20):
        g = np.array([agents[c].g(thetas[c], client_rngs[c], batch) for c in range(3)])
        thetas = thetas - eta * beta * g - eta * (1 - beta) * g.mean(axis=0)
    oracle = per_agent_oracle(agents, [np.random.default_rng([7, c]) for c in range(3)], batch)
    np.testing.assert_allclose(pflsa(oracle, np.zeros((3, 5)), eta, beta, 20)[-1], thetas, rtol=1e-12)


def test_iterations_to_fraction() -> None:
    errors = np.array([100.0, 50.0, 2.0, 0.9, 1.2, 0.5])
    assert iterations_to_fraction(errors, 1e-2) == 3
    assert iterations_to_fraction(errors, 1e-3) is None


def test_garnet_shape_fedlsa_plateaus_above_pflsa_and_pflsa_speeds_up() -> None:
    """Robust qualitative shape of Figs. 1-2 on stochastic TD(0) (seed 42, one run)."""
    agents = make_agents(10, 42, 1.0, 1.0)
    _, _, star = stacked(agents)
    oracle = garnet_oracle(agents, np.random.default_rng(0))
    pf = mean_sq_error(pflsa(oracle, np.zeros_like(star), 1.0, 0.1, 6000), star)
    fed = mean_sq_error(fedlsa(oracle, np.zeros(5), 2.0, 1, 6000, 10), star)
    assert fed[-1000:].mean() >= 10 * pf[-1000:].mean()

    agents = make_agents(16, 42)
    _, _, star = stacked(agents)
    oracle = garnet_oracle(agents, np.random.default_rng(1))
    theta0 = np.zeros_like(star)
    it_single = iterations_to_fraction(mean_sq_error(single_lsa(oracle, theta0, 0.2, 2500), star))
    it_pf = iterations_to_fraction(mean_sq_error(pflsa(oracle, theta0, 1.6, 1 / 16, 600), star))
    assert it_single is not None and it_pf is not None
    assert 4 * it_pf < it_single  # linear speed-up predicts 8x at N = 16
