"""The decision losses as the client trains with them: ``loss(c_hat, c, index)`` over a training
split (docs/algorithms.md 1.1).

Each loss of :data:`hetfed.methods.decision.LOSSES` names its builder here (``batch_loss``,
``module:function``, imported on first use): a function of :class:`LossInputs` returning the
batch loss. The optimal solutions a loss needs (``w*(c)``, ``w_lam(c)``) are computed once per
split and reused across epochs and rounds (:class:`SolutionCache`).
"""

from __future__ import annotations

import functools
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pkgutil import resolve_name
from typing import Any

import torch

from hetfed.client.decision import BatchLoss
from hetfed.client.losses import dpo_loss, mse_loss, optnet_loss, pfyl_loss, rspo_plus_loss, spo_plus_loss
from hetfed.methods.decision import LOSSES, DecisionParams
from hetfed.problems.base import DecisionSplit


class SolutionCache:
    """``w*(c)`` and ``w_lam(c)`` of a split, computed once and reused across epochs and rounds."""

    def __init__(self, split: DecisionSplit, polytope: Any) -> None:
        self.split, self.polytope = split, polytope
        self._w_star: torch.Tensor | None = None
        self._w_lam: dict[float, torch.Tensor] = {}

    def w_star(self) -> torch.Tensor:
        if self._w_star is None:
            self._w_star = self.polytope.solve_lp(self.split.c)
        return self._w_star

    def w_lam(self, lam: float) -> torch.Tensor:
        if lam not in self._w_lam:
            self._w_lam = {lam: self.polytope.regularized_argmin(self.split.c, lam)}  # keep only the latest
        return self._w_lam[lam]


_CACHES: OrderedDict[int, tuple[DecisionSplit, SolutionCache]] = OrderedDict()


def solution_cache(split: DecisionSplit, polytope: Any) -> SolutionCache:
    """The per-process cache of a split's LP/QP solutions (the last few splits seen)."""
    key = id(split)
    if key not in _CACHES:
        _CACHES[key] = (split, SolutionCache(split, polytope))  # holding the split keeps its id unique
        if len(_CACHES) > 16:
            _CACHES.popitem(last=False)
    return _CACHES[key][1]


@dataclass(frozen=True)
class LossInputs:
    """What a loss's builder gets: the training split, its polytope, the method's parameters, this
    phase's lam, the noise generator of the perturbed losses and the split's solution cache."""

    split: DecisionSplit
    polytope: Any
    params: DecisionParams
    lam: float
    generator: torch.Generator
    cache: SolutionCache


def mse(inputs: LossInputs) -> BatchLoss:
    return lambda c_hat, c, idx: mse_loss(c_hat, c)


def spo_plus(inputs: LossInputs) -> BatchLoss:
    poly, cache = inputs.polytope, inputs.cache
    return lambda c_hat, c, idx: spo_plus_loss(c_hat, c, poly, w_star=cache.w_star()[idx])


def rspo_plus(inputs: LossInputs) -> BatchLoss:
    poly, cache, lam = inputs.polytope, inputs.cache, inputs.lam
    return lambda c_hat, c, idx: rspo_plus_loss(c_hat, c, poly, lam, w_lam_c=cache.w_lam(lam)[idx])


def pfyl(inputs: LossInputs) -> BatchLoss:
    poly, cache, gen, p = inputs.polytope, inputs.cache, inputs.generator, inputs.params
    return lambda c_hat, c, idx: pfyl_loss(
        c_hat, c, poly, p.perturb_eps, p.perturb_samples, gen, w_star=cache.w_star()[idx]
    )


def dpo(inputs: LossInputs) -> BatchLoss:
    poly, cache, gen, p = inputs.polytope, inputs.cache, inputs.generator, inputs.params
    return lambda c_hat, c, idx: dpo_loss(
        c_hat, c, poly, p.perturb_eps, p.perturb_samples, gen, w_star=cache.w_star()[idx]
    )


def optnet(inputs: LossInputs) -> BatchLoss:
    poly, p, lam = inputs.polytope, inputs.params, inputs.lam
    return lambda c_hat, c, idx: optnet_loss(c_hat, c, poly, p.optnet_mult * lam, backend=p.optnet_backend)


@functools.cache
def builder(name: str) -> Callable[[LossInputs], BatchLoss]:
    """The builder of loss ``name`` (imported on first use)."""
    if name not in LOSSES or not LOSSES[name].batch_loss:
        raise ValueError(f"run config 'loss': {name!r} is not a loss a client can train with")
    built: Callable[[LossInputs], BatchLoss] = resolve_name(LOSSES[name].batch_loss)
    return built


def make_loss(
    name: str, split: DecisionSplit, poly: Any, params: DecisionParams, lam: float, generator: torch.Generator
) -> BatchLoss:
    """The batch loss ``loss(c_hat, c, index)`` of ``name`` on a training split over ``poly``."""
    inputs = LossInputs(split, poly, params, lam, generator, solution_cache(split, poly))
    return builder(name)(inputs)
