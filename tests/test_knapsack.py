"""The synthetic knapsack generator against its definition (docs/algorithms.md 1.7)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hetfed.problems.knapsack import KnapsackParams, client_law, load_client, scale_factor, shared_law


def test_shapes_signs_and_cost_normalisation() -> None:
    params = KnapsackParams(num_items=12, num_features=5, n_train=30, n_val=7, n_test=20, eta_c=0.5)
    data = load_client(params, seed=3, partition_id=4)
    for split, n in ((data.train, 30), (data.val, 7), (data.test, 20)):
        assert split.x.shape == (n, 5) and split.c.shape == (n, 12)
        assert split.x.dtype == torch.float64 and split.c.dtype == torch.float64
        # c = signal / mean|signal| per split, and signal = -(1 + (.)^4) < 0
        assert torch.all(split.c < 0)
        assert float(split.c.abs().mean()) == pytest.approx(1.0, abs=1e-12)
    assert data.name == "client-04" and data.partition_id == 4
    assert data.num_features == 5 and data.num_costs == 12


def test_features_are_zscored_with_the_clients_training_statistics() -> None:
    params = KnapsackParams(n_train=50, eta_d=1.0)
    data = load_client(params, seed=1, partition_id=2)
    assert torch.allclose(data.train.x.mean(0), torch.zeros(8, dtype=torch.float64), atol=1e-12)
    assert torch.allclose(data.train.x.std(0, unbiased=False), torch.ones(8, dtype=torch.float64), atol=1e-12)
    # The other splits use the training statistics, so they are not exactly standardised.
    assert not torch.allclose(data.test.x.mean(0), torch.zeros(8, dtype=torch.float64), atol=1e-3)


def test_costs_follow_the_polynomial_law_of_the_raw_features() -> None:
    """Recover raw x from the law (eta_d = 0 => x ~ N(0, I)) and recompute the costs independently."""
    params = KnapsackParams(num_items=6, num_features=3, degree=2, n_train=400, eta_o=0.7)
    law = client_law(params, seed=5, partition_id=1)
    data = load_client(params, seed=5, partition_id=1)
    rng = np.random.default_rng(np.random.SeedSequence([5, 2, 1]))
    x_raw = rng.standard_normal((400, 3))  # the sample stream of client 1 (seed 5), first split
    signal = -(1.0 + (1.0 + x_raw @ law.B.T / np.sqrt(3)) ** 2)
    expected = signal / np.mean(np.abs(signal))
    np.testing.assert_allclose(data.train.c.numpy(), expected, rtol=1e-12)
    zs = (x_raw - x_raw.mean(0)) / x_raw.std(0)
    np.testing.assert_allclose(data.train.x.numpy(), zs, rtol=1e-10, atol=1e-12)


def test_eta_zero_gives_identical_laws_across_clients() -> None:
    params = KnapsackParams()
    laws = [client_law(params, seed=9, partition_id=j) for j in range(4)]
    B, a_base, c_base = shared_law(params, seed=9)
    for law in laws:
        np.testing.assert_array_equal(law.B, B)
        np.testing.assert_array_equal(law.weights, a_base)
        assert law.capacity == c_base == pytest.approx(0.6 * 50)
        np.testing.assert_array_equal(law.feature_mean, np.zeros(8))
        np.testing.assert_array_equal(law.feature_scale, np.ones(8))


@pytest.mark.parametrize("axis", ["eta_o", "eta_c", "eta_d"])
def test_each_axis_makes_clients_differ_in_its_part_only(axis: str) -> None:
    params = KnapsackParams(**{axis: 1.0})
    a, b = client_law(params, 9, 0), client_law(params, 9, 1)
    differs = {
        "eta_o": not np.allclose(a.B, b.B),
        "eta_c": a.capacity != b.capacity and not np.allclose(a.weights, b.weights),
        "eta_d": not np.allclose(a.feature_mean, b.feature_mean)
        and not np.allclose(a.feature_scale, b.feature_scale),
    }
    assert differs[axis]
    assert [k for k, v in differs.items() if v] == [axis]


def test_objective_axis_is_a_rotation_of_the_shared_matrix() -> None:
    """expm of a skew-symmetric matrix is orthogonal: B_j B_j' = B B'."""
    params = KnapsackParams(eta_o=1.0)
    B, _, _ = shared_law(params, 2)
    law = client_law(params, 2, 3)
    np.testing.assert_allclose(law.B @ law.B.T, B @ B.T, atol=1e-10)
    assert not np.allclose(law.B, B)


def test_scale_factor_has_mean_one() -> None:
    rng = np.random.default_rng(0)
    assert scale_factor(0.0, rng) == 1.0
    for eta in (0.5, 1.0):
        draws = scale_factor(eta, rng, size=200_000)
        # Var of 2 Beta(a, a) with a = 1/eta is 1/(2a + 1); 5 standard errors.
        se = np.sqrt(1 / (2 / eta + 1) / draws.size)
        assert abs(draws.mean() - 1) < 5 * se
        assert draws.min() >= 1e-9


def test_seeds_reproduce_and_clients_do_not_depend_on_each_other() -> None:
    params = KnapsackParams(eta_o=0.5, eta_c=0.5, eta_d=0.5, n_train=20)
    first = load_client(params, seed=11, partition_id=3)
    load_client(params, seed=11, partition_id=0)  # generating another client changes nothing
    again = load_client(params, seed=11, partition_id=3)
    torch.testing.assert_close(first.train.c, again.train.c, rtol=0, atol=0)
    other_seed = load_client(params, seed=12, partition_id=3)
    assert not torch.allclose(first.train.c, other_seed.train.c)


@pytest.mark.parametrize("bad", [{"num_items": 0}, {"eta_o": -0.1}, {"capacity_ratio": float("nan")}])
def test_bad_parameters_are_refused(bad: dict) -> None:
    """Built directly, the parameters are checked against their run-config keys (named in the error)."""
    with pytest.raises(ValueError, match=next(iter(bad)).replace("_", "-")):
        KnapsackParams(**bad)
