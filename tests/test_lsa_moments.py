"""The exact moments of federated LSA (hetfed/reproduce/lsa_moments.py) against sampling and closed forms."""

from __future__ import annotations

import numpy as np
import pytest

from bench.lsa_reference import exact_oracle, garnet_oracle, pflsa, stacked
from hetfed.problems.garnet import make_agents
from hetfed.reproduce.lsa_moments import LSAMoments


def test_the_sample_law_has_the_agents_means_and_is_the_law_the_clients_sample() -> None:
    agent = make_agents(3, 42, 0.5, 0.5)[2]
    p, a, b = agent.transitions()
    assert np.all(p >= 0) and p.sum() == pytest.approx(1.0, abs=1e-14)
    np.testing.assert_allclose(np.einsum("k,kij->ij", p, a), agent.A_bar, atol=1e-14)
    np.testing.assert_allclose(p @ b, agent.b_bar, atol=1e-14)
    # The clients' sampler draws from this law: its empirical second moment of A matches.
    draws, _ = agent.sample(np.random.default_rng(0), 200_000)
    exact = np.einsum("k,kij,kij->ij", p, a, a)
    np.testing.assert_allclose((draws * draws).mean(axis=0), exact, rtol=0.03, atol=1e-4)


@pytest.mark.parametrize(("beta", "eta"), [(0.25, 0.8), (0.0, 0.8), (1.0, 0.4)])
def test_the_expected_error_is_what_many_sampled_runs_average_to(beta: float, eta: float) -> None:
    """A vectorised Monte Carlo of 4000 runs of the update rule (the NumPy reference's sampler)."""
    n, runs, iterations = 4, 4000, 400
    agents = make_agents(n, 42, 0.5, 0.5)
    exact = LSAMoments(agents, eta, beta).curve(iterations)
    star = np.array([a.theta_star for a in agents])
    oracle = garnet_oracle(agents * runs, np.random.default_rng(7))
    theta = np.zeros((runs, n, star.shape[1]))
    errors = [np.sum((theta - star) ** 2, axis=-1).mean(axis=-1)]
    for _ in range(iterations):
        a, b = oracle()
        g = np.einsum("rnij,rnj->rni", a.reshape(runs, n, 5, 5), theta) - b.reshape(runs, n, 5)
        theta = theta - eta * beta * g - eta * (1.0 - beta) * g.mean(axis=1, keepdims=True)
        errors.append(np.sum((theta - star) ** 2, axis=-1).mean(axis=-1))
    errors_arr = np.array(errors)
    assert exact[0] == pytest.approx(errors_arr[0, 0], rel=1e-12)
    for t in (1, 10, 100, 400):
        se = errors_arr[t].std() / np.sqrt(runs)
        assert abs(errors_arr[t].mean() - exact[t]) < 4 * se, (t, errors_arr[t].mean(), exact[t], se)
    # Sensitive: the noise-free error (no noise term) is more than 6 standard errors away
    noiseless = np.sum((LSAMoments(agents, eta, beta).mean_path(400) - star) ** 2, axis=-1).mean()
    assert abs(noiseless - exact[400]) > 6 * errors_arr[400].std() / np.sqrt(runs)


def test_the_mean_path_is_the_noise_free_iteration() -> None:
    agents = make_agents(5, 42, 0.5, 0.5)
    a_bar, b_bar, star = stacked(agents)
    reference = pflsa(exact_oracle(a_bar, b_bar), np.zeros_like(star), 0.9, 0.3, 60)
    np.testing.assert_allclose(
        LSAMoments(agents, 0.9, 0.3).mean_path(60), reference[-1], rtol=1e-12, atol=1e-12
    )


def test_the_floor_is_the_fixed_point_the_recursion_settles_at() -> None:
    agents = make_agents(2, 42, 0.5, 0.5)
    moments = LSAMoments(agents, 1.6, 1.0)  # time constant ~340 iterations
    stationary = moments.stationary()
    _, again = moments.step(np.zeros((2, 5)), stationary)
    np.testing.assert_allclose(again, stationary, rtol=1e-10, atol=1e-14)
    assert moments.curve(12_000, every=12_000)[-1] == pytest.approx(moments.floor(), rel=1e-6)
    # the floor grows with the step: ~proportional to eta for small eta
    small = LSAMoments(agents, 0.1, 1.0).floor()
    assert small / moments.floor() == pytest.approx(0.1 / 1.6, rel=0.1)


def test_an_unstable_step_is_refused() -> None:
    moments = LSAMoments(make_agents(2, 42), 200.0, 1.0)
    assert moments.spectral_radius() > 1
    with pytest.raises(ValueError, match="unstable"):
        moments.floor()
    with pytest.raises(ValueError, match="beta"):
        LSAMoments(make_agents(2, 42), 0.1, 1.5)
