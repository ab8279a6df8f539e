"""Common interface of the constrained worst-case tasks (docs/algorithms.md section 2).

The softmax-weighted switching gradient method solves

    min_w max_i f_i(w)   subject to   max_i g_i(w) <= 0,

where client i only ever evaluates its own ``f_i`` and ``g_i`` (and their
gradients) on fresh batches of its private data. Every task module
(:mod:`hetfed.problems.np_classification`, :mod:`hetfed.problems.fair_classification`,
:mod:`hetfed.problems.safe_rl`) exposes the same two functions:

* ``load_client(partition_id, num_partitions, seed, **params) -> ConstrainedClientTask``:
  builds client ``partition_id``'s task from its own data only;
* ``make_model(seed, **params) -> torch.nn.Module``: the shared model, identical on
  the server and on every client for a given run seed (no data needed).

``params`` use the same keys on both (a Flower run config may spell them with
hyphens, e.g. ``x-safe`` for ``x_safe``); unknown keys and invalid values raise
``ValueError`` naming the key.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import fields
from typing import Any, Protocol, TypeVar, runtime_checkable

import numpy as np
import torch


@runtime_checkable
class ConstrainedClientTask(Protocol):
    """One client's ``f_i`` (objective) and ``g_i`` (constraint, ``<= 0`` is feasible)."""

    name: str  # human-readable client name, e.g. "client-3" or "race=Black"

    def make_model(self) -> torch.nn.Module:
        """The shared architecture and initialisation (same as the task module's ``make_model(seed)``)."""
        ...

    def sample_batch(self, rng: np.random.Generator, size: int, model: torch.nn.Module) -> Any:
        """A fresh batch xi of about ``size`` examples (RL: episodes) drawn with ``rng``.

        ``model`` is used only by on-policy tasks (safe RL rolls the policy out);
        supervised tasks ignore it. Sample a new batch at every model you differentiate at.
        """
        ...

    def f(self, model: torch.nn.Module, batch: Any) -> torch.Tensor:
        """Scalar objective estimate f_i(w, xi), differentiable in the model's parameters."""
        ...

    def g(self, model: torch.nn.Module, batch: Any) -> torch.Tensor:
        """Scalar constraint estimate g_i(w, xi), differentiable; ``<= 0`` means feasible."""
        ...

    def evaluate(self, model: torch.nn.Module) -> dict[str, float]:
        """Keys ``"f"`` and ``"g"`` on the client's whole training data, plus task-specific metrics."""
        ...


ConfigT = TypeVar("ConfigT")


def parse_params(config_cls: type[ConfigT], params: Mapping[str, Any]) -> ConfigT:
    """Build the task's frozen config dataclass from keyword ``params``.

    Hyphens in keys become underscores (Flower run-config style). Unknown keys raise
    ``ValueError`` listing the known ones; value checks live in the dataclass.
    """
    normalised = {key.replace("-", "_"): value for key, value in params.items()}
    known = {field.name for field in fields(config_cls)}  # type: ignore[arg-type]
    unknown = sorted(set(normalised) - known)
    if unknown:
        raise ValueError(f"unknown parameter(s) {unknown} for {config_cls.__name__}; known: {sorted(known)}")
    return config_cls(**normalised)


def require(condition: bool, key: str, problem: str) -> None:
    """Raise ``ValueError("<key>: <problem>")`` unless ``condition`` holds."""
    if not condition:
        raise ValueError(f"{key}: {problem}")


def check_partition(partition_id: int, num_partitions: int) -> None:
    """Validate a Flower partition id against the number of partitions."""
    require(
        isinstance(num_partitions, int) and num_partitions >= 1,
        "num_partitions",
        f"must be a positive integer, got {num_partitions!r}",
    )
    require(
        isinstance(partition_id, int) and 0 <= partition_id < num_partitions,
        "partition_id",
        f"must be an integer in [0, {num_partitions}), got {partition_id!r}",
    )


def check_batch_size(size: int, minimum: int = 1) -> int:
    """``size`` as an int, or ``ValueError`` naming ``size`` if it is not an integer >= ``minimum``."""
    require(
        isinstance(size, int | np.integer) and size >= minimum,
        "size",
        f"must be an integer >= {minimum}, got {size!r}",
    )
    return int(size)


def seeded_model(build: Callable[[], torch.nn.Module], seed: int) -> torch.nn.Module:
    """Run ``build()`` under ``torch.manual_seed(seed)`` without disturbing the global torch RNG.

    PyTorch's default initialisation then gives the same weights on the server and
    on every client for the same run seed.
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return build()
