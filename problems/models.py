"""The decision problems' model (features -> costs MLP), and its conversion to and from Flower records."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

import numpy as np
import torch
from flwr.app import ArrayRecord
from torch import nn

from hetfed.records import to_numpy, to_record


def make_mlp(in_dim: int, hidden: int, out_dim: int, seed: int) -> nn.Sequential:
    """``in_dim -> hidden (ReLU) -> out_dim`` in float64, Glorot-uniform weights, zero biases;
    ``hidden = 0``: the linear predictor ``c_hat = W x`` (no hidden layer, no bias).

    The reference code's initialisation (docs/algorithms.md section 1): PyTorch's default init
    changes the baselines' results by several points.
    """
    gen = torch.Generator().manual_seed(seed)
    if hidden == 0:
        linear = nn.Linear(in_dim, out_dim, bias=False)
        with torch.no_grad():
            nn.init.xavier_uniform_(linear.weight, generator=gen)
        return nn.Sequential(linear).double()
    first, last = nn.Linear(in_dim, hidden), nn.Linear(hidden, out_dim)
    model = nn.Sequential(first, nn.ReLU(), last).double()  # in place: first and last are its layers
    with torch.no_grad():
        for layer in (first, last):
            nn.init.xavier_uniform_(layer.weight, generator=gen)
            layer.bias.zero_()
    return model


def model_record(model: nn.Module) -> ArrayRecord:
    """The model's parameters as an ArrayRecord (what crosses the wire)."""
    return to_record(model.state_dict())


ModelT = TypeVar("ModelT", bound=nn.Module)


def load_record(model: ModelT, record: ArrayRecord) -> ModelT:
    """Copy ``record`` into ``model``; a missing or misshaped array is an error."""
    state = {k: torch.from_numpy(np.array(v)) for k, v in to_numpy(record).items()}
    model.load_state_dict(state, strict=True)
    return model


def mlp_from_arrays(arrays: dict[str, np.ndarray]) -> nn.Sequential:
    """The MLP of :func:`make_mlp` holding ``arrays`` (its state dict as NumPy, e.g. a run's final
    model from hetfed.server.store.read_models); the sizes are read from the arrays' shapes."""
    if "2.weight" not in arrays:  # the linear predictor
        out_dim, in_dim = arrays["0.weight"].shape
        return load_record(make_mlp(in_dim, 0, out_dim, seed=0), to_record(arrays))
    hidden, in_dim = arrays["0.weight"].shape
    out_dim = arrays["2.weight"].shape[0]
    return load_record(make_mlp(in_dim, hidden, out_dim, seed=0), to_record(arrays))


def hetfed_version() -> str:
    """The installed hetfed version ("unknown" outside an installed checkout)."""
    from importlib import metadata

    try:
        return metadata.version("hetfed")
    except metadata.PackageNotFoundError:
        return "unknown"


def model_manifest(arrays: Mapping[str, np.ndarray], **about: Any) -> dict[str, Any]:
    """What a saved model of :func:`make_mlp` takes and returns, beside its ``.npz``: the hetfed
    version, the layers (``name:shape``), the activation, and ``about`` (run, method, loss, feature
    and variable names, ...). Plain JSON values only (no pickle anywhere)."""
    return {
        "hetfed-version": hetfed_version(),
        "layers": [f"{name}:{'x'.join(map(str, a.shape))}" for name, a in arrays.items()],
        "activation": "relu" if "2.weight" in arrays else "none (linear)",
        **about,
    }
