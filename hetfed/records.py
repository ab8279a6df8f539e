"""Conversions between NumPy/torch arrays and Flower's ArrayRecord (what crosses the wire).

Named arrays travel **packed**: all arrays of one dtype are concatenated into one Flower
``Array``, whose key in the ArrayRecord lists the names and shapes
(``packed:[["0.weight",[64,8]],["0.bias",[64]],...]``). Why: Flower 1.42 moves every
``Array`` as two objects (the Array and its ArrayChunk), each its own HTTP request at every
hop (ServerApp push, SuperNode pull, SuperNode push, ServerApp pull), and the SuperLink's
CPU per request is what bounds a deployment round (docs/benchmarks.md). A 2-layer MLP
(4 arrays) thus needs 2 array objects per message instead of 8. The bytes are the same
values, bit for bit; only model weights and updates are in them.

:func:`to_numpy` reads packed and plain (one Array per name) records alike, so records
written by other code or older hetfed versions stay readable.

torch is never imported here: a tensor can only exist once something else imported torch,
so a NumPy-only client (the LSA strategies) runs without it.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecordValues, ConfigScalar

if TYPE_CHECKING:
    import torch

PACKED_PREFIX = "packed:"


def to_record(arrays: Mapping[str, np.ndarray | torch.Tensor]) -> ArrayRecord:
    """Named arrays (NumPy or torch, copied) as an ArrayRecord: one packed Array per dtype."""
    groups: dict[str, list[tuple[str, np.ndarray]]] = {}
    for name, value in arrays.items():
        array = _numpy(value)
        groups.setdefault(array.dtype.str, []).append((name, array))
    packed = {}
    for members in groups.values():
        layout = [[name, list(a.shape)] for name, a in members]
        key = PACKED_PREFIX + json.dumps(layout, separators=(",", ":"))
        packed[key] = Array(np.concatenate([a.ravel() for _, a in members]))
    return ArrayRecord(packed)


def to_numpy(record: ArrayRecord) -> dict[str, np.ndarray]:
    """An ArrayRecord (packed or plain) as named NumPy arrays (fresh copies), in the order packed."""
    out: dict[str, np.ndarray] = {}
    for key in record:
        flat = record[key].numpy()
        if not key.startswith(PACKED_PREFIX):
            out[key] = flat
            continue
        offset = 0
        for name, shape in json.loads(key[len(PACKED_PREFIX) :]):
            size = int(np.prod(shape, dtype=np.int64))
            out[name] = flat[offset : offset + size].reshape(shape).copy()
            offset += size
        if offset != flat.size:
            raise ValueError(f"packed array holds {flat.size} values, its layout names {offset}")
    return out


def scalar(value: ConfigRecordValues) -> ConfigScalar:
    """A ConfigRecord or MetricRecord value that must be one number or string, for ``int()``/``float()``.

    Record values are typed as scalars or lists; a list where a scalar belongs raises TypeError,
    as ``int()`` or ``float()`` of it would.
    """
    if isinstance(value, list):
        raise TypeError(f"expected a single value, got a list: {value!r}")
    return value


def _numpy(value: np.ndarray | torch.Tensor) -> np.ndarray:
    torch_module = sys.modules.get("torch")
    if torch_module is not None and isinstance(value, torch_module.Tensor):
        return value.detach().cpu().numpy().copy()
    return np.array(value)
