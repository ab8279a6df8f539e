"""Neyman-Pearson classification on the Wisconsin breast-cancer data (docs/algorithms.md 2).

Labels: ``y = 1`` is **malignant** (sklearn's target 0, 212 rows), ``y = 0`` is
**benign** (sklearn's target 1, 357 rows). The model is logistic regression
``z = w'x + b`` predicting malignancy, and for client i

    f_i(w) = mean_{x in benign_i}    log(1 + exp(z))      (false-alarm loss, minimised)
    g_i(w) = mean_{x in malignant_i} log(1 + exp(-z)) - r  (missed-cancer loss, bounded by r)

so the constraint protects the class whose errors are costly (the spec's experiment a).

Split rule (heterogeneous label skew, reproducible from ``instance_seed``, which
defaults to the run seed): for each class separately, shuffle its rows, give every
client ``min_per_class`` of them, then split the rest in proportions drawn from
``Dirichlet(dirichlet_alpha * 1_n)`` (counts by largest remainder). Each client then
holds out a stratified ``test_fraction`` of each of its classes (floor) as its test split.

Features are z-scored with the statistics of the whole public data set (all 569
rows, no labels used): a shared linear model needs one common feature scale, and
per-client statistics would give every client a different meaning for the same
weight. The statistics are a fixed, public preprocessing schema, like a unit convention.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from sklearn.datasets import load_breast_cancer

from hetfed.problems.constrained import check_batch_size, check_partition, parse_params, require, seeded_model

NUM_FEATURES = 30


@dataclass(frozen=True)
class NPConfig:
    """Parameters of the NP task (see the module docstring for their meaning)."""

    r: float = 0.2
    dirichlet_alpha: float = 0.5
    min_per_class: int = 5
    test_fraction: float = 0.2
    instance_seed: int | None = None

    def __post_init__(self) -> None:
        require(self.r >= 0, "r", f"the loss bound must be >= 0, got {self.r!r}")
        require(
            self.dirichlet_alpha > 0, "dirichlet_alpha", f"must be positive, got {self.dirichlet_alpha!r}"
        )
        require(
            isinstance(self.min_per_class, int) and self.min_per_class >= 0,
            "min_per_class",
            f"must be a non-negative integer, got {self.min_per_class!r}",
        )
        require(
            0 <= self.test_fraction < 1, "test_fraction", f"must be in [0, 1), got {self.test_fraction!r}"
        )


@dataclass(frozen=True)
class NPBatch:
    """Benign rows ``x0`` (enter f) and malignant rows ``x1`` (enter g), standardised."""

    x0: torch.Tensor
    x1: torch.Tensor


def load_dataset() -> tuple[np.ndarray, np.ndarray]:
    """All 569 rows: features z-scored with the global statistics [569, 30], labels (1 = malignant)."""
    data = load_breast_cancer()
    x = data.data.astype(np.float64)
    x = (x - x.mean(axis=0)) / x.std(axis=0)
    return x, (data.target == 0).astype(np.int64)


def dirichlet_partition(
    labels: np.ndarray, num_partitions: int, alpha: float, min_per_class: int, seed: int
) -> list[np.ndarray]:
    """Row indices of every client under the split rule of the module docstring (sorted per client)."""
    rng = np.random.default_rng(seed)
    parts: list[list[np.ndarray]] = [[] for _ in range(num_partitions)]
    for cls in np.unique(labels):
        rows = rng.permutation(np.flatnonzero(labels == cls))
        reserved = min_per_class * num_partitions
        require(
            reserved <= rows.size,
            "min_per_class",
            f"{min_per_class} rows of class {cls} for each of {num_partitions} clients need {reserved}, "
            f"but the class has {rows.size}",
        )
        shares = rng.dirichlet(np.full(num_partitions, alpha)) * (rows.size - reserved)
        counts = np.floor(shares).astype(np.int64)
        # Largest remainder: hand the rows lost to flooring to the largest fractional parts.
        counts[np.argsort(counts - shares, kind="stable")[: rows.size - reserved - counts.sum()]] += 1
        counts += min_per_class
        for client, chunk in enumerate(np.split(rows, np.cumsum(counts)[:-1])):
            parts[client].append(chunk)
    return [np.sort(np.concatenate(chunks)) for chunks in parts]


def train_test_rows(
    rows: np.ndarray, labels: np.ndarray, test_fraction: float, seed: int, partition_id: int
) -> tuple[np.ndarray, np.ndarray]:
    """Stratified split of one client's ``rows``: floor(test_fraction * n_c) of each class go to test."""
    rng = np.random.default_rng([seed, partition_id])
    train, test = [np.empty(0, np.int64)], [np.empty(0, np.int64)]  # a client may hold no rows at all
    for cls in np.unique(labels[rows]):
        own = rng.permutation(rows[labels[rows] == cls])
        n_test = int(np.floor(test_fraction * own.size))
        test.append(own[:n_test])
        train.append(own[n_test:])
    return np.sort(np.concatenate(train)), np.sort(np.concatenate(test))


def make_model(seed: int, **params: Any) -> torch.nn.Module:
    """Logistic regression ``z = w'x + b`` on the 30 standardised features (PyTorch default init)."""
    parse_params(NPConfig, params)
    return seeded_model(lambda: torch.nn.Linear(NUM_FEATURES, 1), seed)


def _logits(model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    return model(x).squeeze(-1)


def benign_loss(model: torch.nn.Module, x0: torch.Tensor) -> torch.Tensor:
    """mean log(1 + exp(z)) over benign rows (logistic loss with label 0)."""
    logits = _logits(model, x0)
    return F.binary_cross_entropy_with_logits(logits, torch.zeros_like(logits))


def malignant_loss(model: torch.nn.Module, x1: torch.Tensor) -> torch.Tensor:
    """mean log(1 + exp(-z)) over malignant rows (logistic loss with label 1)."""
    logits = _logits(model, x1)
    return F.binary_cross_entropy_with_logits(logits, torch.ones_like(logits))


@dataclass
class NPClassificationTask:
    """Client ``partition_id``'s NP task; holds only this client's rows."""

    name: str
    partition_id: int
    seed: int
    config: NPConfig
    train_rows: np.ndarray  # indices into the public data set, for provenance and tests
    test_rows: np.ndarray
    train: NPBatch
    test: NPBatch

    def make_model(self) -> torch.nn.Module:
        return make_model(self.seed)

    def sample_batch(
        self, rng: np.random.Generator, size: int, model: torch.nn.Module | None = None
    ) -> NPBatch:
        """``size`` rows of each class without replacement (all of a class that has fewer)."""
        size = check_batch_size(size)

        def pick(x: torch.Tensor) -> torch.Tensor:
            rows = rng.choice(x.shape[0], size=min(size, x.shape[0]), replace=False)
            return x[torch.from_numpy(rows)]

        return NPBatch(pick(self.train.x0), pick(self.train.x1))

    def f(self, model: torch.nn.Module, batch: NPBatch) -> torch.Tensor:
        return benign_loss(model, batch.x0)

    def g(self, model: torch.nn.Module, batch: NPBatch) -> torch.Tensor:
        return malignant_loss(model, batch.x1) - self.config.r

    def evaluate(self, model: torch.nn.Module) -> dict[str, float]:
        """f, g and error rates on the training rows; the same with a ``test_`` prefix on held-out rows.

        ``false_alarm_rate`` = share of benign rows with z > 0, ``miss_rate`` = share of
        malignant rows with z <= 0. A test class with no rows gives NaN for its metrics.
        """
        out: dict[str, float] = {}
        with torch.no_grad():
            for prefix, split in (("", self.train), ("test_", self.test)):
                out[f"{prefix}f"] = _mean_or_nan(split.x0, lambda x: benign_loss(model, x))
                out[f"{prefix}g"] = _mean_or_nan(split.x1, lambda x: malignant_loss(model, x)) - self.config.r
                out[f"{prefix}false_alarm_rate"] = _mean_or_nan(
                    split.x0, lambda x: (_logits(model, x) > 0).double().mean()
                )
                out[f"{prefix}miss_rate"] = _mean_or_nan(
                    split.x1, lambda x: (_logits(model, x) <= 0).double().mean()
                )
        return out


def _mean_or_nan(x: torch.Tensor, metric: Callable[[torch.Tensor], torch.Tensor]) -> float:
    return float(metric(x)) if x.shape[0] else float("nan")


def load_client(partition_id: int, num_partitions: int, seed: int, **params: Any) -> NPClassificationTask:
    """Client ``partition_id`` of ``num_partitions`` (default run: 10 clients).

    Raises ``ValueError`` naming the client if its training split has no malignant
    row (g_i undefined) or no benign row (f_i undefined).
    """
    check_partition(partition_id, num_partitions)
    config = parse_params(NPConfig, params)
    split_seed = seed if config.instance_seed is None else config.instance_seed
    x, y = load_dataset()
    rows = dirichlet_partition(y, num_partitions, config.dirichlet_alpha, config.min_per_class, split_seed)[
        partition_id
    ]
    train_rows, test_rows = train_test_rows(rows, y, config.test_fraction, split_seed, partition_id)
    name = f"client-{partition_id}"
    for cls, role in ((1, "malignant rows (g undefined)"), (0, "benign rows (f undefined)")):
        if not np.any(y[train_rows] == cls):
            raise ValueError(
                f"{name}: its training split has no {role}; raise min_per_class or dirichlet_alpha"
            )

    def split(idx: np.ndarray) -> NPBatch:
        xt = torch.from_numpy(x[idx]).float()
        yt = y[idx]
        return NPBatch(xt[torch.from_numpy(yt == 0)], xt[torch.from_numpy(yt == 1)])

    return NPClassificationTask(
        name, partition_id, seed, config, train_rows, test_rows, split(train_rows), split(test_rows)
    )
