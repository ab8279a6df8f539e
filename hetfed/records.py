"""Conversions between NumPy/torch arrays and Flower's ArrayRecord (what crosses the wire)."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch
from flwr.app import Array, ArrayRecord


def to_record(arrays: Mapping[str, np.ndarray | torch.Tensor]) -> ArrayRecord:
    """Named arrays (NumPy or torch, copied) as an ArrayRecord."""
    return ArrayRecord({k: Array(_numpy(v)) for k, v in arrays.items()})


def to_numpy(record: ArrayRecord) -> dict[str, np.ndarray]:
    """An ArrayRecord as named NumPy arrays (fresh copies)."""
    return {k: record[k].numpy() for k in record}


def _numpy(value: np.ndarray | torch.Tensor) -> np.ndarray:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().numpy().copy()
    return np.array(value)
