"""A TRPO-style local step: the natural gradient of a loss under a KL trust region.

With g the gradient of the loss h and F the Fisher matrix of the policy (the Hessian of the
mean KL divergence from the current policy, at the current parameters), the step is

    w <- w - frac sqrt(2 delta / (s' F s)) s,   s = (F + damping I)^{-1} g  (conjugate gradient),

with ``frac`` the largest of 1, 1/2, 1/4, ... whose new policy keeps the mean KL <= delta
(Schulman et al. 2015, TRPO, without the surrogate-improvement test: the clients' losses are
score-function estimates whose value does not move with w). No step if none does.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch


def conjugate_gradient(
    matvec: Callable[[torch.Tensor], torch.Tensor], b: torch.Tensor, iterations: int = 10, tol: float = 1e-10
) -> torch.Tensor:
    """Approximately ``A^{-1} b`` for symmetric positive definite A given as ``matvec``."""
    x = torch.zeros_like(b)
    r = b.clone()
    p = r.clone()
    rr = r @ r
    for _ in range(iterations):
        if rr <= tol:
            break
        ap = matvec(p)
        alpha = rr / (p @ ap)
        x += alpha * p
        r -= alpha * ap
        rr_new = r @ r
        p = r + (rr_new / rr) * p
        rr = rr_new
    return x


def _flat(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    return torch.cat([t.reshape(-1) for t in tensors])


def _assign(params: Sequence[torch.nn.Parameter], start: Sequence[torch.Tensor], step: torch.Tensor) -> None:
    """``params <- start - step``, ``step`` flat over the parameters in order."""
    with torch.no_grad():
        offset = 0
        for p, p0 in zip(params, start, strict=True):
            p.copy_(p0 - step[offset : offset + p.numel()].view_as(p))
            offset += p.numel()


def natural_step(
    params: Sequence[torch.nn.Parameter],
    loss: torch.Tensor,
    kl: Callable[[], torch.Tensor],
    radius: float,
    damping: float = 1e-2,
    backtracks: int = 10,
) -> float:
    """One step of the module docs on ``params`` (in place); returns the mean KL it moved by."""
    grad = _flat(torch.autograd.grad(loss, params)).detach()
    # d KL / d w with its graph, once: each Fisher-vector product differentiates it again.
    kl_grad = _flat(torch.autograd.grad(kl(), params, create_graph=True))

    def fisher(v: torch.Tensor) -> torch.Tensor:
        return _flat(torch.autograd.grad(kl_grad @ v, params, retain_graph=True)).detach() + damping * v

    direction = conjugate_gradient(fisher, grad)
    curvature = float(direction @ fisher(direction))
    if not curvature > 0:
        return 0.0
    full = (2.0 * radius / curvature) ** 0.5 * direction
    start = [p.detach().clone() for p in params]
    for k in range(backtracks):
        _assign(params, start, 0.5**k * full)
        with torch.no_grad():
            moved = float(kl())
        if moved <= radius:
            return moved
    _assign(params, start, torch.zeros_like(full))
    return 0.0
