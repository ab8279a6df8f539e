"""Decision-focused losses on predicted costs ``c_hat`` and true costs ``c`` (docs/algorithms.md 1.1).

Every loss works on a batch ``[B, d]`` (or one sample ``[d]``) and a client's
:class:`~hetfed.problems.polytope.Polytope` S, returns the batch mean (``reduction="mean"``) or the
per-sample values (``reduction="none"``), and sends gradients to ``c_hat`` only (``c`` is data).

* :func:`mse_loss`: ``mean_k (c_hat_k - c_k)^2``.
* :func:`spo_plus_loss`: ``-z*(2c_hat - c) + 2 c_hat'w*(c) - z*(c)``, gradient ``2(w*(c) - w*(2c_hat - c))``.
* :func:`rspo_plus_loss`: the Bregman divergence of the Moreau-smoothed support function,
  gradient ``2(w_lam(c) - w_lam(2c_hat - c))``; needs projections only.
* :func:`pfyl_loss`: perturbed Fenchel-Young, gradient ``w*(c) - mean_m w*(c_hat + eps Z_m)``.
* :func:`dpo_loss`: ``mean_k (y_hat_k - w*(c)_k)^2`` with ``y_hat = mean_m w*(c_hat + eps Z_m)``,
  backward through the score-function estimator with a leave-one-out baseline.
* :func:`optnet_loss`: ``c'w_eps(c_hat)``, differentiating through the QP layer
  ``w_eps(c_hat) = argmin_{w in S} c_hat'w + (eps/2)||w||^2``.

The closed-form gradients are exact (Danskin / envelope theorem), so those losses are custom
autograd functions that never differentiate through a solver. The optional caches
(``w_star`` = w*(c), ``w_lam_c`` = w_lam(c)) let a trainer compute the true-cost solutions once
and reuse them across epochs.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from hetfed.problems.polytope import Polytope

REDUCTIONS = ("mean", "none")


class _ClosedFormGradient(torch.autograd.Function):
    """Per-sample loss values ``[B]`` whose gradient w.r.t. ``c_hat`` is the given ``grad`` ``[B, d]``."""

    @staticmethod
    def forward(ctx: Any, c_hat: torch.Tensor, value: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(grad)
        return value.clone()

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        (grad,) = ctx.saved_tensors
        return grad_output.unsqueeze(-1) * grad, None, None


class _PerturbedOptimizer(torch.autograd.Function):
    """``y_hat = mean_m w*(c_hat + eps Z_m)`` from precomputed solutions ``[M, B, d]`` and noise ``Z``.

    Backward (score function, leave-one-out baseline): with ``r_m = w_m' g`` for the incoming
    gradient g, ``r_m <- (r_m - mean r) M/(M-1)`` and ``grad = sum_m Z_m r_m / (M eps)``.
    """

    @staticmethod
    def forward(
        ctx: Any, c_hat: torch.Tensor, solutions: torch.Tensor, noise: torch.Tensor, eps: float
    ) -> torch.Tensor:
        ctx.save_for_backward(solutions, noise)
        ctx.eps = eps
        return solutions.mean(0)

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        solutions, noise = ctx.saved_tensors
        m = solutions.shape[0]
        r = (solutions * grad_output).sum(-1)  # [M, B]
        r = (r - r.mean(0)) * (m / (m - 1))
        return (noise * r.unsqueeze(-1)).sum(0) / (m * ctx.eps), None, None, None


# ---------------------------------------------------------------------- argument checks
def _pair(c_hat: Any, c: Any, polytope: Polytope) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """``c_hat`` and ``c`` as float64 batches ``[B, d]`` of the same shape; flag if they were ``[d]``."""
    c_hat_t = polytope.validate(c_hat, "c_hat")
    c_t = polytope.validate(c, "c").detach()
    if c_hat_t.shape != c_t.shape:
        raise ValueError(
            f"c_hat and c must have the same shape; got {tuple(c_hat_t.shape)} and {tuple(c_t.shape)}"
        )
    single = c_hat_t.ndim == 1
    return (c_hat_t.unsqueeze(0), c_t.unsqueeze(0), True) if single else (c_hat_t, c_t, False)


def _cache(
    value: torch.Tensor | None, like: torch.Tensor, name: str, polytope: Polytope
) -> torch.Tensor | None:
    """A cached solution, checked to match ``c``'s shape."""
    if value is None:
        return None
    t = polytope.validate(value, name).detach()
    t = t.unsqueeze(0) if t.ndim == 1 else t
    if t.shape != like.shape:
        raise ValueError(
            f"{name} must have the same shape as c; got {tuple(t.shape)} and {tuple(like.shape)}"
        )
    return t


def _positive(value: float, name: str) -> float:
    out = float(value)
    if not math.isfinite(out) or out <= 0:
        raise ValueError(f"{name} must be finite and > 0; got {value!r}")
    return out


def _reduce(per_sample: torch.Tensor, reduction: str, single: bool) -> torch.Tensor:
    if reduction == "mean":
        return per_sample.mean()
    return per_sample[0] if single else per_sample


def _check_reduction(reduction: str) -> None:
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be one of {REDUCTIONS}; got {reduction!r}")


def _noise(
    shape: tuple[int, ...], n_samples: int, generator: torch.Generator | None, minimum: int = 1
) -> torch.Tensor:
    """``Z [n_samples, B, d]`` standard normal, drawn in that order from ``generator``."""
    if isinstance(n_samples, bool) or not isinstance(n_samples, int) or n_samples < minimum:
        raise ValueError(f"n_samples must be an integer >= {minimum}; got {n_samples!r}")
    return torch.randn((n_samples, *shape), generator=generator, dtype=torch.float64)


def _perturbed_solutions(
    c_hat: torch.Tensor, noise: torch.Tensor, eps: float, polytope: Polytope
) -> torch.Tensor:
    """``w*(c_hat + eps Z_m)`` for every sample m, as ``[M, B, d]`` (one batched oracle call)."""
    perturbed = (c_hat.detach().unsqueeze(0) + eps * noise).reshape(-1, c_hat.shape[-1])
    return polytope.solve_lp(perturbed).reshape(noise.shape)


# ---------------------------------------------------------------------- losses
def mse_loss(c_hat: Any, c: Any, reduction: str = "mean") -> torch.Tensor:
    """Per sample ``mean_k (c_hat_k - c_k)^2`` (reduction ``mean``: the mean over all entries)."""
    _check_reduction(reduction)
    c_hat_t, c_t = torch.as_tensor(c_hat), torch.as_tensor(c)
    if c_hat_t.shape != c_t.shape or c_hat_t.ndim not in (1, 2):
        raise ValueError(
            "c_hat and c must have the same shape [d] or [B, d]; "
            f"got {tuple(c_hat_t.shape)} and {tuple(c_t.shape)}"
        )
    if not (torch.isfinite(c_hat_t.detach()).all() and torch.isfinite(c_t).all()):
        raise ValueError("c_hat and c must be finite (no NaN/Inf)")
    per_sample = ((c_hat_t - c_t) ** 2).mean(-1)
    return per_sample.mean() if reduction == "mean" else per_sample


def spo_plus_loss(
    c_hat: Any, c: Any, polytope: Polytope, w_star: torch.Tensor | None = None, reduction: str = "mean"
) -> torch.Tensor:
    """SPO+: ``l = -z*(u) + 2 c_hat'w*(c) - z*(c)`` with ``u = 2c_hat - c``; grad ``2(w*(c) - w*(u))``."""
    _check_reduction(reduction)
    c_hat_t, c_t, single = _pair(c_hat, c, polytope)
    w_c = _cache(w_star, c_t, "w_star", polytope)
    w_c = polytope.solve_lp(c_t) if w_c is None else w_c
    with torch.no_grad():
        u = 2 * c_hat_t - c_t
        w_u = polytope.solve_lp(u)
        value = -(u * w_u).sum(-1) + 2 * (c_hat_t * w_c).sum(-1) - (c_t * w_c).sum(-1)
    return _reduce(_ClosedFormGradient.apply(c_hat_t, value, 2 * (w_c - w_u)), reduction, single)


def rspo_plus_loss(
    c_hat: Any,
    c: Any,
    polytope: Polytope,
    lam: float,
    w_lam_c: torch.Tensor | None = None,
    reduction: str = "mean",
    backend: str = "auto",
) -> torch.Tensor:
    """RSPO+: with ``u = 2c_hat - c`` and ``p = -u/lam``,
    ``l = (lam/2)(||p - w_lam(c)||^2 - ||p - w_lam(u)||^2)``, gradient ``2(w_lam(c) - w_lam(u))``.

    Evaluated as ``(lam/2)||w_lam(u) - w_lam(c)||^2 + lam (p - w_lam(u))'(w_lam(u) - w_lam(c))``,
    the same number written as two non-negative terms (the second by the projection's optimality),
    which avoids the cancellation of the difference of squares when ``||p||`` is large.
    ``w_lam(u) = Proj_S(p)`` uses the projection ``backend``.
    """
    _check_reduction(reduction)
    lam = _positive(lam, "lam")
    c_hat_t, c_t, single = _pair(c_hat, c, polytope)
    w_c = _cache(w_lam_c, c_t, "w_lam_c", polytope)
    with torch.no_grad():
        w_c = polytope.regularized_argmin(c_t, lam, backend=backend) if w_c is None else w_c
        u = 2 * c_hat_t - c_t
        w_u = polytope.regularized_argmin(u, lam, backend=backend)
        p = -u / lam
        diff = w_u - w_c
        value = 0.5 * lam * (diff * diff).sum(-1) + lam * ((p - w_u) * diff).sum(-1)
    return _reduce(_ClosedFormGradient.apply(c_hat_t, value, -2 * diff), reduction, single)


def pfyl_loss(
    c_hat: Any,
    c: Any,
    polytope: Polytope,
    eps: float = 1.0,
    n_samples: int = 10,
    generator: torch.Generator | None = None,
    w_star: torch.Tensor | None = None,
    reduction: str = "mean",
) -> torch.Tensor:
    """Perturbed Fenchel-Young (additive Gaussian): with ``w_m = w*(c_hat + eps Z_m)``,
    ``l = c_hat'w*(c) - mean_m (c_hat + eps Z_m)'w_m`` (>= 0 in expectation),
    gradient ``w*(c) - mean_m w_m``. ``Z [n_samples, B, d]`` is drawn from ``generator``."""
    _check_reduction(reduction)
    eps = _positive(eps, "eps")
    c_hat_t, c_t, single = _pair(c_hat, c, polytope)
    w_c = _cache(w_star, c_t, "w_star", polytope)
    w_c = polytope.solve_lp(c_t) if w_c is None else w_c
    with torch.no_grad():
        noise = _noise(tuple(c_hat_t.shape), n_samples, generator)
        solutions = _perturbed_solutions(c_hat_t, noise, eps, polytope)
        perturbed_value = ((c_hat_t.unsqueeze(0) + eps * noise) * solutions).sum(-1).mean(0)
        value = (c_hat_t * w_c).sum(-1) - perturbed_value
    return _reduce(_ClosedFormGradient.apply(c_hat_t, value, w_c - solutions.mean(0)), reduction, single)


def dpo_loss(
    c_hat: Any,
    c: Any,
    polytope: Polytope,
    eps: float = 1.0,
    n_samples: int = 10,
    generator: torch.Generator | None = None,
    w_star: torch.Tensor | None = None,
    reduction: str = "mean",
) -> torch.Tensor:
    """Differentiable perturbed optimizer: ``y_hat = mean_m w*(c_hat + eps Z_m)``,
    ``l = mean_k (y_hat_k - w*(c)_k)^2``; backward by the score-function estimator with a
    leave-one-out baseline (needs ``n_samples >= 2``). ``Z [n_samples, B, d]`` from ``generator``."""
    _check_reduction(reduction)
    eps = _positive(eps, "eps")
    c_hat_t, c_t, single = _pair(c_hat, c, polytope)
    w_c = _cache(w_star, c_t, "w_star", polytope)
    w_c = polytope.solve_lp(c_t) if w_c is None else w_c
    noise = _noise(tuple(c_hat_t.shape), n_samples, generator, minimum=2)  # leave-one-out needs 2
    solutions = _perturbed_solutions(c_hat_t, noise, eps, polytope)
    y_hat = _PerturbedOptimizer.apply(c_hat_t, solutions, noise, eps)
    return _reduce(((y_hat - w_c) ** 2).mean(-1), reduction, single)


def optnet_loss(
    c_hat: Any, c: Any, polytope: Polytope, eps: float, reduction: str = "mean", backend: str = "qpth"
) -> torch.Tensor:
    """OptNet-style: ``l = c'w_eps(c_hat)`` with ``w_eps(c_hat) = Proj_S(-c_hat/eps)``, differentiated
    through the QP layer (``backend`` ``qpth``, or ``exact`` for the structured sets)."""
    _check_reduction(reduction)
    eps = _positive(eps, "eps")
    if backend not in ("qpth", "exact"):
        raise ValueError(f"backend must be a differentiable projection, 'qpth' or 'exact'; got {backend!r}")
    c_hat_t, c_t, single = _pair(c_hat, c, polytope)
    w = polytope.project(-c_hat_t / eps, backend=backend)
    return _reduce((c_t * w).sum(-1), reduction, single)
