"""A tiny convex constrained task with deterministic gradients, for checking the switching method.

Client i holds a target ``a_i`` in R^d and a half-space ``<b_i, w> <= c_i`` with

    f_i(w) = 1/2 ||w - a_i||^2        g_i(w) = <b_i, w> - c_i

drawn from ``default_rng([instance_seed, partition_id])``: ``b_i ~ N(0, I)``,
``a_i = 2 b_i + N(0, I) / 2``, ``c_i ~ U(0.1, 0.5)``, so ``w = 0`` is strictly feasible
for every client while the targets lie beyond the half-spaces (the constraints bind,
and the method switches between objective and constraint steps). The "batch" is empty: f_i, g_i and
their gradients are exact, so a NumPy transcription of the method must reproduce the
federated iterates to rounding. The model is one float64 parameter vector ``w``
initialised from ``N(0, I)`` with the run seed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from hetfed.problems.constrained import check_partition, parse_params, require


@dataclass(frozen=True)
class QuadraticConfig:
    """``dim``: the dimension d of w; ``instance_seed``: seed of the client data (default: run seed)."""

    dim: int = 3
    instance_seed: int | None = None

    def __post_init__(self) -> None:
        require(
            isinstance(self.dim, int) and self.dim >= 1,
            "dim",
            f"must be a positive integer, got {self.dim!r}",
        )


class QuadraticModel(torch.nn.Module):
    """The decision vector ``w`` (float64) as the model's only parameter."""

    def __init__(self, w: np.ndarray) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.from_numpy(np.asarray(w, dtype=np.float64).copy()))


def decision(model: torch.nn.Module) -> torch.Tensor:
    """The decision vector ``w`` of a :class:`QuadraticModel` (the task protocol passes any nn.Module)."""
    if not isinstance(model, QuadraticModel):
        raise TypeError(f"the quadratic task's model is a QuadraticModel, got {type(model).__name__}")
    return model.w


def make_model(seed: int, **params: Any) -> QuadraticModel:
    """``w_0 ~ N(0, I_d)`` from ``default_rng(seed)``."""
    config = parse_params(QuadraticConfig, params)
    return QuadraticModel(np.random.default_rng(seed).standard_normal(config.dim))


def client_data(partition_id: int, dim: int, instance_seed: int) -> tuple[np.ndarray, np.ndarray, float]:
    """``(a_i, b_i, c_i)`` of client ``partition_id`` (see the module docstring)."""
    rng = np.random.default_rng([instance_seed, partition_id])
    b = rng.standard_normal(dim)
    a = 2.0 * b + 0.5 * rng.standard_normal(dim)
    return a, b, float(rng.uniform(0.1, 0.5))


@dataclass
class QuadraticTask:
    """One client's exact ``f_i`` and ``g_i``."""

    name: str
    seed: int
    config: QuadraticConfig
    a: torch.Tensor
    b: torch.Tensor
    c: float

    def make_model(self) -> QuadraticModel:
        return make_model(self.seed, dim=self.config.dim)

    def sample_batch(self, rng: np.random.Generator, size: int, model: torch.nn.Module | None = None) -> None:
        """No data: the values and gradients are exact."""
        return None

    def f(self, model: torch.nn.Module, batch: None) -> torch.Tensor:
        return 0.5 * ((decision(model) - self.a) ** 2).sum()

    def g(self, model: torch.nn.Module, batch: None) -> torch.Tensor:
        return (self.b * decision(model)).sum() - self.c

    def evaluate(self, model: torch.nn.Module) -> dict[str, float]:
        with torch.no_grad():
            return {"f": float(self.f(model, None)), "g": float(self.g(model, None))}


def load_client(partition_id: int, num_partitions: int, seed: int, **params: Any) -> QuadraticTask:
    """Client ``partition_id`` of ``num_partitions``."""
    check_partition(partition_id, num_partitions)
    config = parse_params(QuadraticConfig, params)
    instance_seed = seed if config.instance_seed is None else config.instance_seed
    a, b, c = client_data(partition_id, config.dim, instance_seed)
    return QuadraticTask(f"client-{partition_id}", seed, config, torch.from_numpy(a), torch.from_numpy(b), c)
