"""FedRSPO+'s per-client calibration (docs/algorithms.md 1.3): from its own training data a client
computes ``R_j = max_{w in S_j} ||w||``, ``lam0_j = mean_i ||c_i|| / R_j`` and ``lr0_j = alpha lam0_j / 4``,
which stay on the client; the step sizes it trains each loss with; and the check, before round 1, that
its polytope can project as the run's losses need. Every decision client uses them (client/
decision_client.py, local_only.py, pooled.py).
"""

from __future__ import annotations

import math

import torch

from hetfed.methods.decision import LOSSES, DecisionParams
from hetfed.problems.base import DecisionClientData


class CalibrationError(ValueError):
    """The client's data cannot calibrate lam0 (zero costs or a zero-radius feasible set)."""


def calibrate(
    data: DecisionClientData, alpha: float, norm: str = "mean", fixed: float = 0.0
) -> dict[str, float]:
    """``lam0 = s_i(||c_i||_2) / R``, ``lr0 = alpha lam0 / 4`` from the client's training costs, with
    ``s`` the mean (the paper) or the median (``norm``: a few extreme days cannot inflate it); a
    ``fixed`` lam0 > 0 (the paper's shortest-path setting: 2) replaces the data's scale."""
    radius = data.polytope.radius()
    if not radius > 0:
        raise CalibrationError(
            f"{data.name}: its feasible set has radius {radius:g} (a single point), so lam0 = mean||c|| / R "
            "is undefined; this client cannot take part in FedRSPO+"
        )
    if fixed > 0:
        return {"lam0": fixed, "lr0": alpha * fixed / 4, "radius": radius}
    norms = data.train.c.norm(dim=1)
    lam0 = float(norms.mean() if norm == "mean" else norms.quantile(0.5)) / radius
    if not (math.isfinite(lam0) and lam0 > 0):
        raise CalibrationError(f"{data.name}: lam0 = {lam0:g} (its training costs are all zero)")
    return {"lam0": lam0, "lr0": alpha * lam0 / 4, "radius": radius}


def own_calibration(data: DecisionClientData, params: DecisionParams) -> dict[str, float]:
    """:func:`calibrate` with the method's settings (``rspo-alpha``, ``calibration-norm``, ``fixed-lam0``):
    this client's ``lam0_j``, ``lr0_j`` and radius (docs/algorithms.md 1.3)."""
    return calibrate(data, params.rspo_alpha, params.calibration_norm, params.fixed_lam0)


def step_sizes(
    data: DecisionClientData, params: DecisionParams, loss: str, shared: tuple[float, float] | None = None
) -> tuple[float, float]:
    """(lam, lr) a client trains ``loss`` with: the ``shared`` (lam, lr) when the message carries a
    shared calibration, else the client's own ``lam0_j`` (for a loss that projects; 1 otherwise) and
    ``lr0_j``; the run's ``lr`` for a loss whose step is not calibrated (docs/algorithms.md 1.3)."""
    needs = LOSSES[loss]
    own = own_calibration(data, params) if shared is None and needs.needs_calibration else {}
    lam = shared[0] if shared is not None else own.get("lam0", 1.0)
    if not needs.calibrated_lr:
        return lam, params.lr
    return lam, shared[1] if shared is not None else own["lr0"]


def check_projection(data: DecisionClientData, params: DecisionParams) -> None:
    """Fail before round 1, naming the client, if its polytope cannot project as the loss needs."""
    losses = {params.phase_loss("warm"), params.phase_loss("personal")}
    backend = params.optnet_backend if "optnet" in losses else "auto"
    if any(LOSSES[name].projects for name in losses):
        try:
            data.polytope.project(torch.zeros(1, data.num_costs, dtype=torch.float64), backend=backend)
        except (ValueError, ImportError, NotImplementedError) as exc:
            hint = "; set optnet-backend = 'qpth' (a QP layer for any polytope)" if backend == "exact" else ""
            raise ValueError(
                f"{data.name}: loss {params.loss!r} needs projections onto its "
                f"{type(data.polytope).__name__}, which backend {backend!r} cannot do: {exc}{hint}"
            ) from None
