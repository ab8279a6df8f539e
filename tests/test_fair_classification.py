"""Fair classification on Adult: client split, BCE and parity gap against NumPy, batches, errors."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pytest
import torch

from hetfed.problems import adult
from hetfed.problems import fair_classification as fc
from hetfed.problems.constrained import ConstrainedClientTask

SHARED = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "adult"
RACES = ("White", "Asian-Pac-Islander", "Amer-Indian-Eskimo", "Other", "Black")


@pytest.fixture(scope="module")
def data_dir() -> str:
    """The project's test copy when present, else the real fetch (network, once)."""
    return str(SHARED if (SHARED / "adult.data.gz").is_file() else adult.fetch_adult())


@pytest.fixture(scope="module")
def tasks(data_dir) -> list[fc.FairClassificationTask]:
    return [fc.load_client(i, 5, seed=0, data_dir=data_dir) for i in range(5)]


def _raw_rows(data_dir: str, name: str) -> list[list[str]]:
    path = Path(data_dir) / name
    text = (
        path.read_text() if path.is_file() else gzip.decompress(Path(str(path) + ".gz").read_bytes()).decode()
    )
    return [[field.strip() for field in line.split(",")] for line in text.splitlines() if "," in line]


def _numpy_logits(model: torch.nn.Module, x: np.ndarray) -> np.ndarray:
    first, _, last = model
    hidden = np.maximum(
        x @ first.weight.detach().double().numpy().T + first.bias.detach().double().numpy(), 0
    )
    return hidden @ last.weight.detach().double().numpy().ravel() + float(last.bias.detach())


def test_clients_are_the_races_with_their_own_rows(tasks, data_dir) -> None:
    for split, name in (("train", "adult.data"), ("test", "adult.test")):
        rows = _raw_rows(data_dir, name)
        for task, race in zip(tasks, RACES, strict=True):
            assert task.name == f"race={race}"
            own = [row for row in rows if row[8] == race]
            batch = getattr(task, split)
            assert batch.x.shape == (len(own), adult.NUM_FEATURES)
            np.testing.assert_array_equal(batch.y.numpy(), [row[-1].rstrip(".") == ">50K" for row in own])
            np.testing.assert_array_equal(batch.s.numpy(), [row[9] == "Female" for row in own])
            assert batch.s.any() and (~batch.s).any()
            race_block = [adult.FEATURE_NAMES.index(f"race={r}") for r in RACES]
            np.testing.assert_array_equal(
                batch.x[:, race_block].sum(0).numpy(), [float(r == race) * len(own) for r in RACES]
            )


def test_client_encodes_only_its_own_rows(data_dir, monkeypatch) -> None:
    seen: list[np.ndarray] = []
    real = fc.encode_features
    monkeypatch.setattr(
        fc, "encode_features", lambda table: (seen.append(table.columns["race"]), real(table))[1]
    )
    fc.load_client(3, 5, seed=0, data_dir=data_dir)
    assert len(seen) == 2 and all(set(races.tolist()) == {"Other"} for races in seen)


def test_f_and_g_match_numpy(tasks) -> None:
    model = fc.make_model(1)
    for task in tasks[1:4]:
        batch = task.train
        z = _numpy_logits(model, batch.x.double().numpy())
        y, s = batch.y.numpy(), batch.s.numpy()
        p = 1 / (1 + np.exp(-z))
        ref_f = -np.mean(y * np.log(p) + (1 - y) * np.log(1 - p))
        ref_gap = abs(p[s].mean() - p[~s].mean())
        assert task.f(model, batch).item() == pytest.approx(ref_f, rel=1e-5)
        assert task.g(model, batch).item() == pytest.approx(ref_gap - 0.05, abs=1e-6)
        out = task.evaluate(model)
        assert out["dp_gap"] == pytest.approx(ref_gap, abs=1e-6)
        assert out["accuracy"] == pytest.approx(np.mean((z > 0) == (y == 1)))
        ref_test = _numpy_logits(model, task.test.x.double().numpy())
        assert out["test_accuracy"] == pytest.approx(np.mean((ref_test > 0) == (task.test.y.numpy() == 1)))


def test_gradients_match_finite_differences(tasks) -> None:
    task = tasks[3]
    model = fc.make_model(2, hidden=2).double()
    rows = slice(0, 60)
    batch = fc.FairBatch(task.train.x[rows].double(), task.train.y[rows].double(), task.train.s[rows])
    assert batch.s.any() and (~batch.s).any()
    params = list(model.parameters())
    for fn in (task.f, task.g):
        analytic = torch.autograd.grad(fn(model, batch), params)
        for param, grad in zip(params, analytic, strict=True):
            flat = param.data.view(-1)
            for k in range(0, flat.numel(), 7):  # a spread subset of coordinates keeps this fast
                original = flat[k].item()
                flat[k] = original + 1e-6
                plus = fn(model, batch).item()
                flat[k] = original - 1e-6
                minus = fn(model, batch).item()
                flat[k] = original
                assert grad.view(-1)[k].item() == pytest.approx((plus - minus) / 2e-6, rel=1e-4, abs=1e-8)


def test_sample_batch_is_stratified_and_reproducible(tasks) -> None:
    task = tasks[4]
    share = task.train.s.float().mean().item()
    batch = task.sample_batch(np.random.default_rng(0), 200, None)
    assert len(batch.y) == 200 and batch.s.sum().item() == round(200 * share)
    matches = (batch.x[:, None, :] == task.train.x[None, :, :]).all(-1)
    assert (matches.sum(1) >= 1).all()
    again = task.sample_batch(np.random.default_rng(0), 200, None)
    assert torch.equal(batch.x, again.x) and torch.equal(batch.s, again.s)
    tiny = task.sample_batch(np.random.default_rng(1), 2, None)
    assert tiny.s.sum().item() == 1  # both groups even in the smallest batch
    assert torch.isfinite(task.g(task.make_model(), tiny))


def test_clients_are_heterogeneous(tasks) -> None:
    base_rate = np.array([t.train.y.mean().item() for t in tasks])
    female_share = np.array([t.train.s.float().mean().item() for t in tasks])
    sizes = np.array([len(t.train.y) for t in tasks])
    assert base_rate.max() - base_rate.min() > 0.1
    assert female_share.max() - female_share.min() > 0.1
    assert sizes.max() > 50 * sizes.min()


def test_alternative_splits(data_dir) -> None:
    rows = _raw_rows(data_dir, "adult.data")
    gov = fc.load_client(2, 4, seed=0, data_dir=data_dir, split_by="workclass")
    assert gov.name == "workclass=Government"
    assert len(gov.train.y) == sum(row[1] in ("Federal-gov", "Local-gov", "State-gov") for row in rows)
    female = fc.load_client(0, 2, seed=0, data_dir=data_dir, split_by="sex", protected="race")
    assert female.name == "sex=Female"
    expected = [row[8] != "White" for row in rows if row[9] == "Female"]
    np.testing.assert_array_equal(female.train.s.numpy(), expected)


def test_model_shared_between_server_and_clients(tasks) -> None:
    server = fc.make_model(0, hidden=32)
    for task in tasks[:2]:
        assert all(
            torch.equal(p, q)
            for p, q in zip(server.parameters(), task.make_model().parameters(), strict=True)
        )
    assert server[0].in_features == adult.NUM_FEATURES and fc.make_model(0, hidden=8)[0].out_features == 8
    assert isinstance(tasks[0], ConstrainedClientTask)


def test_client_without_both_groups_is_rejected(data_dir) -> None:
    table = adult.read_adult("test", data_dir)
    males_only = table.select(table.columns["sex"] == "Male")
    with pytest.raises(ValueError, match="race=Other.*lacks"):
        fc.client_batch(males_only, fc.FairConfig(), "Other")


@pytest.mark.parametrize(
    ("num_partitions", "kwargs", "match"),
    [
        (4, {}, "num_partitions.*5 clients"),
        (5, {"delta": -1.0}, "^delta:"),
        (5, {"hidden": 0}, "^hidden:"),
        (5, {"split_by": "zip"}, "^split_by:"),
        (2, {"split_by": "sex"}, "^protected:.*cannot equal"),
        (5, {"lambda": 1}, "unknown parameter.*lambda"),
    ],
)
def test_bad_params_name_the_key(num_partitions, kwargs, match) -> None:
    with pytest.raises(ValueError, match=match):
        fc.load_client(0, num_partitions, seed=0, **kwargs)


def test_bad_batch_size(tasks) -> None:
    with pytest.raises(ValueError, match="size"):
        tasks[0].sample_batch(np.random.default_rng(0), 1, None)


def test_centralised_training_on_f_reduces_f(tasks) -> None:
    task = tasks[4]
    model = task.make_model()
    before = task.evaluate(model)["f"]
    optimiser = torch.optim.Adam(model.parameters(), lr=1e-2)
    rng = np.random.default_rng(0)
    for _ in range(60):
        optimiser.zero_grad()
        task.f(model, task.sample_batch(rng, 256, model)).backward()
        optimiser.step()
    after = task.evaluate(model)
    rate = task.train.y.mean().item()
    constant_bce = -(rate * np.log(rate) + (1 - rate) * np.log(1 - rate))  # best input-blind predictor
    assert after["f"] < constant_bce - 0.05 < before - 0.05
