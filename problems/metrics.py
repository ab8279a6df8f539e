"""Decision-quality metrics (docs/algorithms.md 1.5 and 1.6), pure functions of tensors and a polytope.

Per client, with the LP oracle ``w*``:

* regret per sample ``c'w*(c_hat) - z*(c)`` with ``z*(c) = c'w*(c)`` (>= 0);
* absolute regret = mean regret; relative regret = mean regret / mean |z*|
  (:class:`RegretSummary`), so a client's relative regret is a ratio of its own means. The
  client reports the totals too, so that the run's summary (strategies/result_summary.py) forms, next
  to the mean over clients of every metric, the pooled ratio ``sum of regrets / sum of |z*|``
  over all clients' samples.

With the regularized minimiser ``w_lam``, the QP-LP gap
``U = mean_i(c_i'w_lam(c_i) - z*_i) / (mean_i |z*_i| + 1e-8)`` (the freeze statistic).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from hetfed.problems.polytope import Polytope

U_EPS = 1e-8  # keeps U finite when every z* is 0


def _pair(c_hat: Any, c: Any, polytope: Polytope) -> tuple[torch.Tensor, torch.Tensor]:
    """``c_hat`` and ``c`` as detached float64 batches of the same shape ``[B, d]``."""
    c_hat_t = polytope.validate(c_hat, "c_hat").detach()
    c_t = polytope.validate(c, "c").detach()
    if c_hat_t.shape != c_t.shape:
        raise ValueError(
            f"c_hat and c must have the same shape; got {tuple(c_hat_t.shape)} and {tuple(c_t.shape)}"
        )
    return c_hat_t.reshape(-1, polytope.dim), c_t.reshape(-1, polytope.dim)


def optimal_values(c: Any, polytope: Polytope) -> torch.Tensor:
    """``z*(c) = min_{w in S} c'w`` per sample, ``[B]``."""
    c_t = polytope.validate(c, "c").detach().reshape(-1, polytope.dim)
    return (c_t * polytope.solve_lp(c_t)).sum(-1)


def regret(c_hat: Any, c: Any, polytope: Polytope, z_star: torch.Tensor | None = None) -> torch.Tensor:
    """``c'w*(c_hat) - z*(c)`` per sample, ``[B]`` (``z_star`` = cached ``z*(c)``)."""
    c_hat_t, c_t = _pair(c_hat, c, polytope)
    z = optimal_values(c_t, polytope) if z_star is None else torch.as_tensor(z_star, dtype=torch.float64)
    if z.shape != (c_t.shape[0],):
        raise ValueError(f"z_star must have shape [{c_t.shape[0]}]; got {tuple(z.shape)}")
    return (c_t * polytope.solve_lp(c_hat_t)).sum(-1) - z


@dataclass(frozen=True)
class RegretSummary:
    """One client's regret totals; the means and ratios derive from them."""

    n: int
    total_regret: float
    total_abs_optimal: float
    mse: float

    @property
    def absolute(self) -> float:
        """Mean regret."""
        return self.total_regret / self.n

    @property
    def relative(self) -> float:
        """Mean regret / mean |z*| (NaN when every z* is 0, as in the reference code)."""
        return self.total_regret / self.total_abs_optimal if self.total_abs_optimal > 0 else math.nan


def summarize_regret(c_hat: Any, c: Any, polytope: Polytope) -> RegretSummary:
    """Regret totals, and the cost MSE ``mean (c_hat - c)^2``, of one client's test set."""
    c_hat_t, c_t = _pair(c_hat, c, polytope)
    z = optimal_values(c_t, polytope)
    return RegretSummary(
        n=int(c_t.shape[0]),
        total_regret=float(regret(c_hat_t, c_t, polytope, z_star=z).sum()),
        total_abs_optimal=float(z.abs().sum()),
        mse=float(((c_hat_t - c_t) ** 2).mean()),
    )


def qp_lp_gap(c: Any, polytope: Polytope, lam: float, z_star: torch.Tensor | None = None) -> float:
    """``U = mean_i(c_i'w_lam(c_i) - z*_i) / (mean_i |z*_i| + 1e-8)`` (docs/algorithms.md 1.5)."""
    c_t = polytope.validate(c, "c").detach().reshape(-1, polytope.dim)
    z = optimal_values(c_t, polytope) if z_star is None else torch.as_tensor(z_star, dtype=torch.float64)
    if z.shape != (c_t.shape[0],):
        raise ValueError(f"z_star must have shape [{c_t.shape[0]}]; got {tuple(z.shape)}")
    qp_values = (c_t * polytope.regularized_argmin(c_t, lam)).sum(-1)
    return float((qp_values - z).mean() / (z.abs().mean() + U_EPS))
