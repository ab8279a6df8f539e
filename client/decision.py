"""Local training and evaluation of a decision-focused model on one client's data.

The model maps features to a predicted cost vector ``c_hat``; decisions are the LP
minimisers ``w*(c_hat)`` over the client's own polytope, judged on the true costs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import cast

import numpy as np
import torch
from torch import nn

from hetfed.client.adam import Adam
from hetfed.problems.base import DecisionSplit
from hetfed.problems.metrics import summarize_regret
from hetfed.problems.polytope import Polytope

# loss(c_hat, c, index) -> scalar; ``index`` selects the batch rows of the split, so
# losses can reuse per-sample caches (e.g. w*(c)).
BatchLoss = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]

# Random streams of a client (separate ones for batches, noise and the monitor, as the specification asks).
BATCHES, NOISE, MONITOR = 2, 3, 4


def batch_generator(seed: int, *stream: int) -> torch.Generator:
    """A torch generator for one named random stream (e.g. batch order of a client in a round)."""
    entropy = np.random.SeedSequence([seed, *stream]).generate_state(2)
    return torch.Generator().manual_seed(int(entropy[0]) << 32 | int(entropy[1]))


@torch.no_grad()
def clip_per_array(model: nn.Module, max_norm: float) -> None:
    """Clip the gradient of every parameter array to norm ``max_norm`` (the reference code's rule):
    ``g <- g min(1, max_norm / ||g||)`` (written out: torch's clip_grad_norm_ costs ~10x more per call)."""
    if max_norm > 0:
        for p in model.parameters():
            if p.grad is not None:
                coef = max_norm / (float(p.grad.norm()) + 1e-6)
                if coef < 1.0:
                    p.grad.mul_(coef)


def train_epochs(
    model: nn.Module,
    sources: Sequence[tuple[DecisionSplit, BatchLoss]],
    optimizer: Adam,
    *,
    epochs: int,
    batch_size: int,
    generator: torch.Generator,
    clip_norm: float,
    penalty: Callable[[], torch.Tensor] | None = None,
) -> float:
    """``epochs`` passes of mini-batch training over one or more ``(split, loss)`` sources; returns
    the mean batch loss of the last epoch.

    Per epoch every source's samples are shuffled and cut into batches of ``batch_size``; with
    several sources (pooled, centralized training) the batches are visited in a random order and
    each is judged by its own source's loss. Each step minimises ``loss(c_hat, c) + penalty()``
    (``penalty``: e.g. a FedProx term), clipped per array.
    """
    last = 0.0
    for _ in range(epochs):
        batches = [
            (split, loss, idx)
            for split, loss in sources
            for idx in torch.randperm(len(split), generator=generator).split(batch_size)
        ]
        if len(sources) > 1:  # one source keeps its own order (and the generator's stream)
            batches = [batches[k] for k in torch.randperm(len(batches), generator=generator).tolist()]
        total = 0.0
        for split, loss, idx in batches:
            optimizer.zero_grad()
            value = loss(model(split.x[idx]), split.c[idx], idx)
            if penalty is not None:
                value = value + penalty()
            value.backward()
            clip_per_array(model, clip_norm)
            optimizer.step()
            total += float(value.detach())
        last = total / len(batches)
    return last


@torch.no_grad()
def decision_metrics(model: nn.Module, split: DecisionSplit, polytope: Polytope) -> dict[str, float]:
    """Regret of the model's decisions on ``split``, judged with the exact LP oracle.

    ``regret_i = c_i' w*(c_hat_i) - z*(c_i)``; relative regret = mean regret / mean |z*|.
    The sums are reported too so that a pooled ratio over clients can be formed.
    """
    s = summarize_regret(model(split.x), split.c, polytope)
    return {
        "regret-sum": s.total_regret,
        "abs-opt-sum": s.total_abs_optimal,
        "absolute-regret": s.absolute,
        "relative-regret": s.relative,
        "mse": s.mse,
        "num-examples": s.n,
    }


def proximal_term(model: torch.nn.Module, anchor: torch.nn.Module, mu: float) -> Callable[[], torch.Tensor]:
    """``() -> (mu/2) ||theta - theta_anchor||^2`` with the anchor's current weights frozen
    (FedProx: the round's global model; Ditto: the global model for the personal one)."""
    fixed = [p.detach().clone() for p in anchor.parameters()]

    def term() -> torch.Tensor:
        # sum() starts from the int 0: a Tensor for every model with parameters
        squares = sum(((p - a) ** 2).sum() for p, a in zip(model.parameters(), fixed, strict=True))
        return 0.5 * mu * cast(torch.Tensor, squares)

    return term
