"""Fair classification on UCI Adult with an MLP (docs/algorithms.md 2; the spec's experiment b).

Label ``y = 1`` is income >50K; ``pi(x) = sigmoid(z(x))`` is the MLP's predicted
probability. For client i, with ``P_i`` / ``U_i`` its protected / unprotected rows,

    f_i(w) = mean_i BCE(z(x), y)
    g_i(w) = | mean_{x in P_i} pi(x) - mean_{x in U_i} pi(x) | - delta     (demographic-parity gap)

Clients are split by a natural attribute of the census rows (``split_by``; client
order is the order of :data:`CLIENT_GROUPS`): by default one client per **race**
(White, Asian-Pac-Islander, Amer-Indian-Eskimo, Other, Black: 5 clients of very
different size and base rate), with **sex** protected (Female). Alternatives:
``split_by="workclass"`` (Private, Self-employed, Government, Other-or-unknown: 4
clients) or ``split_by="sex"`` with ``protected="race"`` (non-White protected).
Each client trains on its rows of ``adult.data`` and evaluates also on its rows of
``adult.test`` (the UCI split). Every client of every allowed split contains both
protected groups; a client that did not would raise ``ValueError``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from hetfed.problems.adult import CATEGORIES, NUM_FEATURES, AdultTable, encode_features, read_adult
from hetfed.problems.constrained import check_batch_size, check_partition, parse_params, require, seeded_model

# split_by -> client name -> raw values of that column belonging to the client.
CLIENT_GROUPS: dict[str, dict[str, tuple[str, ...]]] = {
    "race": {value: (value,) for value in CATEGORIES["race"]},
    "workclass": {
        "Private": ("Private",),
        "Self-employed": ("Self-emp-not-inc", "Self-emp-inc"),
        "Government": ("Federal-gov", "Local-gov", "State-gov"),
        "Other-or-unknown": ("Without-pay", "Never-worked", "?"),
    },
    "sex": {value: (value,) for value in CATEGORIES["sex"]},
}
# protected attribute -> (column, values that make a row protected).
PROTECTED: dict[str, tuple[str, tuple[str, ...]]] = {
    "sex": ("sex", ("Female",)),
    "race": ("race", tuple(value for value in CATEGORIES["race"] if value != "White")),
}


@dataclass(frozen=True)
class FairConfig:
    """Parameters of the fair-classification task (see the module docstring)."""

    delta: float = 0.05
    hidden: int = 32
    split_by: str = "race"
    protected: str = "sex"
    data_dir: str | None = None  # folder with adult.data(.gz)/adult.test(.gz); None: the fetched cache

    def __post_init__(self) -> None:
        require(self.delta >= 0, "delta", f"must be >= 0, got {self.delta!r}")
        require(
            isinstance(self.hidden, int) and self.hidden >= 1,
            "hidden",
            f"must be a positive integer, got {self.hidden!r}",
        )
        require(
            self.split_by in CLIENT_GROUPS,
            "split_by",
            f"must be one of {sorted(CLIENT_GROUPS)}, got {self.split_by!r}",
        )
        require(
            self.protected in PROTECTED,
            "protected",
            f"must be one of {sorted(PROTECTED)}, got {self.protected!r}",
        )
        require(
            self.protected != self.split_by,
            "protected",
            f"cannot equal split_by ({self.split_by!r}): each client needs both groups",
        )


@dataclass(frozen=True)
class FairBatch:
    """Encoded features ``x`` [n, NUM_FEATURES], labels ``y`` (float 0/1), protected flags ``s`` (bool)."""

    x: torch.Tensor
    y: torch.Tensor
    s: torch.Tensor


def make_model(seed: int, **params: Any) -> torch.nn.Module:
    """MLP ``NUM_FEATURES -> hidden (ReLU) -> 1`` logit (PyTorch default init)."""
    config = parse_params(FairConfig, params)
    return seeded_model(
        lambda: torch.nn.Sequential(
            torch.nn.Linear(NUM_FEATURES, config.hidden), torch.nn.ReLU(), torch.nn.Linear(config.hidden, 1)
        ),
        seed,
    )


def bce(model: torch.nn.Module, batch: FairBatch) -> torch.Tensor:
    """mean BCE(z(x), y) over the batch."""
    return F.binary_cross_entropy_with_logits(model(batch.x).squeeze(-1), batch.y)


def parity_gap(model: torch.nn.Module, batch: FairBatch) -> torch.Tensor:
    """|mean pi(x) on protected rows - mean pi(x) on unprotected rows|."""
    prob = torch.sigmoid(model(batch.x).squeeze(-1))
    return (prob[batch.s].mean() - prob[~batch.s].mean()).abs()


@dataclass
class FairClassificationTask:
    """One client's fair-classification task; holds only this client's rows."""

    name: str
    partition_id: int
    seed: int
    config: FairConfig
    train: FairBatch
    test: FairBatch

    def make_model(self) -> torch.nn.Module:
        return make_model(self.seed, hidden=self.config.hidden)

    def sample_batch(
        self, rng: np.random.Generator, size: int, model: torch.nn.Module | None = None
    ) -> FairBatch:
        """``size`` rows without replacement, stratified by the protected flag.

        Each group gets its proportional share (rounded), at least one row, so the
        parity gap is always defined; ``size`` must be >= 2 and is capped at the data size.
        """
        total = min(check_batch_size(size, minimum=2), len(self.train.y))  # one row per group at least
        groups = [torch.nonzero(self.train.s).squeeze(-1), torch.nonzero(~self.train.s).squeeze(-1)]
        n_protected = min(
            max(round(total * len(groups[0]) / len(self.train.y)), 1), total - 1, len(groups[0])
        )
        counts = (n_protected, min(total - n_protected, len(groups[1])))
        rows = torch.cat(
            [
                grp[torch.from_numpy(rng.choice(len(grp), size=k, replace=False))]
                for grp, k in zip(groups, counts, strict=True)
            ]
        )
        return FairBatch(self.train.x[rows], self.train.y[rows], self.train.s[rows])

    def f(self, model: torch.nn.Module, batch: FairBatch) -> torch.Tensor:
        return bce(model, batch)

    def g(self, model: torch.nn.Module, batch: FairBatch) -> torch.Tensor:
        return parity_gap(model, batch) - self.config.delta

    def evaluate(self, model: torch.nn.Module) -> dict[str, float]:
        """f, g, accuracy and parity gap on the training rows; ``test_``-prefixed on its test rows."""
        out: dict[str, float] = {}
        with torch.no_grad():
            for prefix, split in (("", self.train), ("test_", self.test)):
                gap = float(parity_gap(model, split))
                out[f"{prefix}f"] = float(bce(model, split))
                out[f"{prefix}g"] = gap - self.config.delta
                out[f"{prefix}dp_gap"] = gap
                out[f"{prefix}accuracy"] = float(
                    ((model(split.x).squeeze(-1) > 0).float() == split.y).float().mean()
                )
        return out


def client_batch(table: AdultTable, config: FairConfig, client: str) -> FairBatch:
    """Encode only ``client``'s rows of ``table`` (other rows are dropped before encoding)."""
    own = table.select(np.isin(table.columns[config.split_by], CLIENT_GROUPS[config.split_by][client]))
    column, protected_values = PROTECTED[config.protected]
    s = np.isin(own.columns[column], protected_values)
    require(
        bool(s.any()) and bool((~s).any()),
        "split_by",
        f"client {config.split_by}={client} lacks a protected or an unprotected row ({config.protected})",
    )
    return FairBatch(
        torch.from_numpy(encode_features(own)), torch.from_numpy(own.label).float(), torch.from_numpy(s)
    )


def load_client(partition_id: int, num_partitions: int, seed: int, **params: Any) -> FairClassificationTask:
    """Client ``partition_id``; ``num_partitions`` must equal the number of groups of ``split_by``."""
    config = parse_params(FairConfig, params)
    groups = list(CLIENT_GROUPS[config.split_by])
    require(
        num_partitions == len(groups),
        "num_partitions",
        f"split_by={config.split_by!r} defines {len(groups)} clients {groups}, got {num_partitions}",
    )
    check_partition(partition_id, num_partitions)
    client = groups[partition_id]
    train, test = (
        client_batch(read_adult(split, config.data_dir), config, client) for split in ("train", "test")
    )
    return FairClassificationTask(f"{config.split_by}={client}", partition_id, seed, config, train, test)
