"""Data containers shared by every decision-focused problem.

A decision problem gives each client features ``x`` and the true cost vectors
``c`` of its own linear program ``min_{w in S_j} c'w`` (always a minimisation;
maximisation tasks store negated costs), plus the client's feasible set ``S_j``.
Each client builds only its own :class:`DecisionClientData`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

if TYPE_CHECKING:  # the polytope module imports torch/solvers; keep this light
    from problems.polytope import Polytope


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
class DecisionClientData:
    """Everything one client holds privately: its splits and its feasible set."""

    name: str
    partition_id: int
    train: DecisionSplit
    val: DecisionSplit
    test: DecisionSplit
    polytope: Polytope

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
    xs = standardize(*(torch.from_numpy(x) for x, _ in draws))
    train, val, test = (DecisionSplit(x, torch.from_numpy(c)) for x, (_, c) in zip(xs, draws, strict=True))
    return DecisionClientData(f"client-{partition_id:02d}", partition_id, train, val, test, polytope)


def standardize(train: torch.Tensor, *others: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """z-score every tensor with the mean/std of ``train`` (per column; std 0 -> 1).

    Used per client, with that client's own training statistics only.
    """
    mean = train.mean(dim=0, keepdim=True)
    std = train.std(dim=0, unbiased=False, keepdim=True)
    std = torch.where(std > 0, std, torch.ones_like(std))
    return tuple((t - mean) / std for t in (train, *others))
