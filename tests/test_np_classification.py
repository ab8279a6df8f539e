"""Neyman-Pearson classification task, plus the shared helpers of hetfed.problems.constrained."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn.datasets import load_breast_cancer
from sklearn.metrics import log_loss

from hetfed.problems import np_classification as npc
from hetfed.problems.constrained import ConstrainedClientTask, parse_params
from hetfed.strategies.softmax_switching import theory_defaults

N = 10


@pytest.fixture(scope="module")
def tasks() -> list[npc.NPClassificationTask]:
    return [npc.load_client(i, N, seed=3) for i in range(N)]


def _random_model(seed: int) -> torch.nn.Module:
    model = npc.make_model(seed)
    with torch.no_grad():  # default init gives tiny logits; spread them so the losses are informative
        model.weight.mul_(5.0)
    return model


def _probs(model: torch.nn.Module, x: np.ndarray) -> np.ndarray:
    w = model.weight.detach().double().numpy().ravel()
    b = float(model.bias.detach())
    return 1.0 / (1.0 + np.exp(-(x @ w + b)))


def test_dataset_labels_and_global_standardisation() -> None:
    x, y = npc.load_dataset()
    raw = load_breast_cancer()
    assert x.shape == (569, 30)
    assert y.sum() == 212 and list(raw.target_names) == ["malignant", "benign"]
    np.testing.assert_array_equal(y, raw.target == 0)  # y = 1 is malignant
    np.testing.assert_allclose(
        x * raw.data.std(axis=0) + raw.data.mean(axis=0), raw.data, rtol=1e-10, atol=1e-12
    )
    np.testing.assert_allclose(x.mean(axis=0), 0, atol=1e-10)


def test_partition_covers_every_row_once_with_minimum_per_class() -> None:
    _, y = npc.load_dataset()
    parts = npc.dirichlet_partition(y, N, alpha=0.5, min_per_class=5, seed=11)
    np.testing.assert_array_equal(np.sort(np.concatenate(parts)), np.arange(y.size))
    for part in parts:
        assert (y[part] == 0).sum() >= 5 and (y[part] == 1).sum() >= 5
    again = npc.dirichlet_partition(y, N, alpha=0.5, min_per_class=5, seed=11)
    other = npc.dirichlet_partition(y, N, alpha=0.5, min_per_class=5, seed=12)
    assert all(np.array_equal(a, b) for a, b in zip(parts, again, strict=True))
    assert not all(np.array_equal(a, b) for a, b in zip(parts, other, strict=True))


def test_partition_alpha_controls_skew() -> None:
    _, y = npc.load_dataset()
    # A huge Dirichlet concentration gives (nearly) equal shares: each class split within +-1 row.
    even = npc.dirichlet_partition(y, N, alpha=1e9, min_per_class=0, seed=0)
    for cls, total in ((0, 357), (1, 212)):
        counts = np.array([(y[p] == cls).sum() for p in even])
        assert counts.max() - counts.min() <= 1 and counts.sum() == total
    skewed = npc.dirichlet_partition(y, N, alpha=0.5, min_per_class=5, seed=0)
    share = np.array([y[p].mean() for p in skewed])
    assert share.max() - share.min() > 0.3


def test_client_holds_only_its_own_stratified_rows(tasks) -> None:
    x, y = npc.load_dataset()
    parts = npc.dirichlet_partition(y, N, alpha=0.5, min_per_class=5, seed=3)
    for task, part in zip(tasks, parts, strict=True):
        assert task.name == f"client-{task.partition_id}"
        np.testing.assert_array_equal(np.sort(np.concatenate([task.train_rows, task.test_rows])), part)
        for cls in (0, 1):
            assert (y[task.test_rows] == cls).sum() == math.floor(0.2 * (y[part] == cls).sum())
        train_y = y[task.train_rows]
        np.testing.assert_allclose(task.train.x0.numpy(), x[task.train_rows][train_y == 0], rtol=1e-6)
        np.testing.assert_allclose(task.train.x1.numpy(), x[task.train_rows][train_y == 1], rtol=1e-6)
        assert (
            task.train.x0.shape[0] + task.train.x1.shape[0] + task.test.x0.shape[0] + task.test.x1.shape[0]
            == part.size
        )


def test_f_and_g_match_sklearn_log_loss(tasks) -> None:
    model = _random_model(0)
    for task in tasks[:3]:
        batch = task.train
        p0 = _probs(model, batch.x0.double().numpy())
        p1 = _probs(model, batch.x1.double().numpy())
        ref_f = log_loss(np.zeros(p0.size), p0, labels=[0, 1])
        ref_g = log_loss(np.ones(p1.size), p1, labels=[0, 1]) - 0.2
        assert task.f(model, batch).item() == pytest.approx(ref_f, rel=1e-5)
        assert task.g(model, batch).item() == pytest.approx(ref_g, rel=1e-5, abs=1e-6)


def test_gradients_match_finite_differences(tasks) -> None:
    task = tasks[1]
    model = _random_model(1).double()
    batch = npc.NPBatch(task.train.x0.double(), task.train.x1.double())
    for fn in (task.f, task.g):
        model.zero_grad()
        fn(model, batch).backward()
        analytic = torch.cat([model.weight.grad.ravel(), model.bias.grad])
        params = torch.cat([model.weight.detach().ravel(), model.bias.detach()])
        numeric = torch.zeros_like(params)
        for k in range(params.numel()):
            values = []
            for step in (1e-6, -1e-6):
                shifted = params.clone()
                shifted[k] += step
                with torch.no_grad():
                    model.weight.copy_(shifted[:-1].view(1, -1))
                    model.bias.copy_(shifted[-1:])
                    values.append(fn(model, batch).item())
            numeric[k] = (values[0] - values[1]) / 2e-6
        with torch.no_grad():
            model.weight.copy_(params[:-1].view(1, -1))
            model.bias.copy_(params[-1:])
        torch.testing.assert_close(analytic, numeric, rtol=1e-5, atol=1e-7)


def test_evaluate_matches_numpy_on_train_and_test(tasks) -> None:
    model = _random_model(2)
    task = tasks[2]
    out = task.evaluate(model)
    for prefix, split in (("", task.train), ("test_", task.test)):
        p0 = _probs(model, split.x0.double().numpy())
        p1 = _probs(model, split.x1.double().numpy())
        assert out[f"{prefix}f"] == pytest.approx(-np.mean(np.log1p(-p0)), rel=1e-5)
        assert out[f"{prefix}g"] == pytest.approx(-np.mean(np.log(p1)) - 0.2, rel=1e-5, abs=1e-6)
        assert out[f"{prefix}false_alarm_rate"] == pytest.approx(np.mean(p0 > 0.5))
        assert out[f"{prefix}miss_rate"] == pytest.approx(np.mean(p1 <= 0.5))


def test_sample_batch_draws_without_replacement_from_each_class(tasks) -> None:
    task = tasks[0]
    batch = task.sample_batch(np.random.default_rng(5), 4, None)
    assert batch.x0.shape == (4, 30) and batch.x1.shape == (4, 30)
    for drawn, pool in ((batch.x0, task.train.x0), (batch.x1, task.train.x1)):
        matches = (drawn[:, None, :] == pool[None, :, :]).all(-1)
        assert (matches.sum(1) >= 1).all() and len({int(m.nonzero()[0, 0]) for m in matches}) == 4
    again = task.sample_batch(np.random.default_rng(5), 4, None)
    assert torch.equal(batch.x0, again.x0) and torch.equal(batch.x1, again.x1)
    whole = task.sample_batch(np.random.default_rng(0), 10_000, None)
    assert whole.x0.shape[0] == task.train.x0.shape[0] and whole.x1.shape[0] == task.train.x1.shape[0]


def test_clients_are_heterogeneous(tasks) -> None:
    share = np.array([t.train.x1.shape[0] / (t.train.x0.shape[0] + t.train.x1.shape[0]) for t in tasks])
    assert share.max() - share.min() > 0.3
    model = _random_model(4)
    values = np.array([t.f(model, t.train).item() for t in tasks])
    assert values.std() > 0.05 * values.mean()


def test_seed_reproduces_and_instance_seed_decouples_split() -> None:
    a, b = npc.load_client(4, N, seed=7), npc.load_client(4, N, seed=7)
    np.testing.assert_array_equal(a.train_rows, b.train_rows)
    assert not np.array_equal(a.train_rows, npc.load_client(4, N, seed=8).train_rows)
    fixed = npc.load_client(4, N, seed=8, instance_seed=7)
    np.testing.assert_array_equal(a.train_rows, fixed.train_rows)


def test_model_same_on_server_and_clients_and_global_rng_untouched(tasks) -> None:
    torch.manual_seed(123)
    expected_next = torch.rand(1)
    torch.manual_seed(123)
    server = npc.make_model(3)
    assert torch.equal(torch.rand(1), expected_next)
    for task in tasks[:2]:
        client = task.make_model()
        assert all(torch.equal(p, q) for p, q in zip(server.parameters(), client.parameters(), strict=True))
    assert not torch.equal(server.weight, npc.make_model(4).weight)
    assert isinstance(tasks[0], ConstrainedClientTask)


def test_no_malignant_rows_names_the_client() -> None:
    _, y = npc.load_dataset()
    parts = npc.dirichlet_partition(y, N, alpha=0.05, min_per_class=0, seed=0)
    empty = next(j for j, part in enumerate(parts) if not (y[part] == 1).any())
    with pytest.raises(ValueError, match=f"client-{empty}.*no malignant"):
        npc.load_client(empty, N, seed=0, dirichlet_alpha=0.05, min_per_class=0)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"r": -0.1}, "^r:"),
        ({"dirichlet_alpha": 0.0}, "dirichlet_alpha"),
        ({"test_fraction": 1.0}, "test_fraction"),
        ({"min_per_class": 30}, "min_per_class"),
        ({"bound": 0.2}, "unknown parameter.*bound"),
    ],
)
def test_bad_params_name_the_key(kwargs, match) -> None:
    with pytest.raises(ValueError, match=match):
        npc.load_client(0, N, seed=0, **kwargs)


def test_bad_partition_and_batch_size() -> None:
    with pytest.raises(ValueError, match="partition_id"):
        npc.load_client(N, N, seed=0)
    with pytest.raises(ValueError, match="num_partitions"):
        npc.load_client(0, 0, seed=0)
    with pytest.raises(ValueError, match="size"):
        npc.load_client(0, N, seed=0).sample_batch(np.random.default_rng(0), 0, None)


def test_hyphenated_run_config_keys_are_accepted() -> None:
    assert parse_params(npc.NPConfig, {"test-fraction": 0.3}).test_fraction == 0.3


def test_centralised_training_on_f_reduces_f(tasks) -> None:
    model = npc.make_model(0)
    x0 = torch.cat([t.train.x0 for t in tasks])
    before = npc.benign_loss(model, x0).item()
    optimiser = torch.optim.SGD(model.parameters(), lr=0.5)
    for _ in range(50):
        optimiser.zero_grad()
        npc.benign_loss(model, x0).backward()
        optimiser.step()
    assert npc.benign_loss(model, x0).item() < 0.5 * before


def test_theory_defaults_formulas() -> None:
    out = theory_defaults(D=2.0, L=4.0, K=50, E=5, eps=0.1, m=8)
    assert out["eta"] == pytest.approx(2.0 / (4.0 * 20.0))
    assert out["gamma"] == pytest.approx(2.0 / (4.0 * 5 * 20.0))
    assert out["threshold"] == pytest.approx(0.05)
    assert out["alpha_min"] == pytest.approx(2 * math.log(8) / 0.1)
    with pytest.raises(ValueError, match="^K:"):
        theory_defaults(D=1.0, L=1.0, K=0, E=1, eps=0.1, m=2)
    with pytest.raises(ValueError, match="^eps:"):
        theory_defaults(D=1.0, L=1.0, K=1, E=1, eps=0.0, m=2)


@settings(max_examples=200, deadline=None)
@given(
    g=st.lists(st.floats(-5, 5, allow_nan=False), min_size=1, max_size=12),
    eps=st.floats(1e-3, 1.0),
)
def test_alpha_min_makes_threshold_rounds_eps_feasible(g, eps) -> None:
    """alpha = alpha_min: <softmax(alpha g), g> <= eps/2 implies max g <= eps (the documented eps' = eps)."""
    values = np.array(g)
    alpha = theory_defaults(D=1.0, L=1.0, K=1, E=1, eps=eps, m=values.size)["alpha_min"]
    weights = np.exp(alpha * (values - values.max()))
    weighted = float(weights @ values / weights.sum())
    assert values.max() <= weighted + eps / 2 + 1e-9
