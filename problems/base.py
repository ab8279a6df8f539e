"""Data containers shared by every decision-focused problem.

A decision problem gives each client features ``x`` and the true cost vectors
``c`` of its own linear program ``min_{w in S_j} c'w`` (always a minimisation;
maximisation tasks store negated costs), plus the client's feasible set ``S_j``.
Each client builds only its own :class:`DecisionClientData`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

if TYPE_CHECKING:  # the polytope module imports torch/solvers; keep this light
    from hetfed.problems.polytope import Polytope


@dataclass(frozen=True)
class DecisionSplit:
    """One split of one client: features ``x`` [n, p] and true costs ``c`` [n, d]."""

    x: torch.Tensor
    c: torch.Tensor

    def __post_init__(self) -> None:
        if self.x.ndim != 2 or self.c.ndim != 2 or self.x.shape[0] != self.c.shape[0]:
            raise ValueError(
                f"DecisionSplit needs x [n, p] and c [n, d] with the same n; got {tuple(self.x.shape)} "
                f"and {tuple(self.c.shape)}"
            )

    def __len__(self) -> int:
        return int(self.x.shape[0])


@dataclass(frozen=True)
class Standardization:
    """``x_std = (x - mean) / std`` per feature, with a client's training statistics (std 0 -> 1).

    Kept with the client's data and in its state, so its model applies to new raw features.
    """

    mean: torch.Tensor  # [1, p]
    std: torch.Tensor  # [1, p], > 0

    @classmethod
    def fit(cls, train: torch.Tensor | np.ndarray) -> Standardization:
        """The statistics of the training rows ``[n, p]`` (population std, as the z-score uses)."""
        x = torch.as_tensor(train)
        std = x.std(dim=0, unbiased=False, keepdim=True)
        return cls(mean=x.mean(dim=0, keepdim=True), std=torch.where(std > 0, std, torch.ones_like(std)))

    def apply(self, x: torch.Tensor | np.ndarray) -> torch.Tensor:
        """``(x - mean) / std`` in the statistics' dtype."""
        return (torch.as_tensor(x, dtype=self.mean.dtype) - self.mean) / self.std

    def arrays(self) -> dict[str, np.ndarray]:
        """``{"mean": [p], "std": [p]}`` in float64 (what a silo's state keeps)."""
        return {
            k: v.reshape(-1).to(torch.float64).numpy() for k, v in (("mean", self.mean), ("std", self.std))
        }


@dataclass(frozen=True)
class DecisionClientData:
    """Everything one client holds privately: its splits and its feasible set.

    ``scaling`` is how the raw features were standardised; ``feature_names`` / ``variable_names``
    name the model's inputs and outputs, and ``source`` says what the problem was read from (a
    user's LP file and its sha256): with them a silo's model applies to new data (``hetfed decide``).
    """

    name: str
    partition_id: int
    train: DecisionSplit
    val: DecisionSplit
    test: DecisionSplit
    polytope: Polytope
    scaling: Standardization | None = None
    feature_names: tuple[str, ...] = ()
    variable_names: tuple[str, ...] = ()
    source: Mapping[str, Any] = field(default_factory=dict)

    @property
    def num_features(self) -> int:
        return int(self.train.x.shape[1])

    @property
    def num_costs(self) -> int:
        return int(self.train.c.shape[1])


def generated_client(
    partition_id: int, draws: Sequence[tuple[np.ndarray, np.ndarray]], polytope: Polytope
) -> DecisionClientData:
    """Client ``partition_id`` of a generated task from its (features, costs) train, validation and
    test draws: features z-scored with its own training statistics, costs as drawn."""
    scaling = Standardization.fit(torch.from_numpy(draws[0][0]))
    train, val, test = (DecisionSplit(scaling.apply(x), torch.from_numpy(c)) for x, c in draws)
    return DecisionClientData(f"client-{partition_id:02d}", partition_id, train, val, test, polytope, scaling)


def chronological_split_sizes(n: int, train: float, val: float) -> tuple[int, int, int]:
    """Split sizes of ``n`` rows in order: floor(train n), floor(val n), the rest test; each >= 1."""
    n_train, n_val = int(train * n), int(val * n)
    if min(n_train, n_val, n - n_train - n_val) < 1:
        raise ValueError(
            f"{n} rows are too few for a {train:g}/{val:g}/{1 - train - val:g} train/validation/test split "
            "(each part needs at least one row)"
        )
    return n_train, n_val, n - n_train - n_val


def standardized_splits(
    x_parts: Sequence[np.ndarray], c_parts: Sequence[np.ndarray], dtype: torch.dtype = torch.float64
) -> tuple[tuple[DecisionSplit, DecisionSplit, DecisionSplit], Standardization]:
    """Train, validation and test splits of raw rows, x z-scored with the training rows' statistics."""
    xs = [torch.as_tensor(x, dtype=dtype) for x in x_parts]
    scaling = Standardization.fit(xs[0])
    train, val, test = (
        DecisionSplit(scaling.apply(x), torch.as_tensor(c, dtype=dtype))
        for x, c in zip(xs, c_parts, strict=True)
    )
    return (train, val, test), scaling
