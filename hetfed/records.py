"""Conversions between NumPy/torch arrays and Flower's ArrayRecord (what crosses the wire).

torch is never imported here: a tensor can only exist once something else imported torch,
so a NumPy-only client (the LSA strategies) runs without it.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np
from flwr.app import Array, ArrayRecord

if TYPE_CHECKING:
    import torch


def to_record(arrays: Mapping[str, np.ndarray | torch.Tensor]) -> ArrayRecord:
    """Named arrays (NumPy or torch, copied) as an ArrayRecord."""
    return ArrayRecord({k: Array(_numpy(v)) for k, v in arrays.items()})


def to_numpy(record: ArrayRecord) -> dict[str, np.ndarray]:
    """An ArrayRecord as named NumPy arrays (fresh copies)."""
    return {k: record[k].numpy() for k in record}


def _numpy(value: np.ndarray | torch.Tensor) -> np.ndarray:
    torch_module = sys.modules.get("torch")
    if torch_module is not None and isinstance(value, torch_module.Tensor):
        return value.detach().cpu().numpy().copy()
    return np.array(value)
