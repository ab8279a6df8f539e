"""The constrained harness's parameters (docs/algorithms.md section 2): softmax switching and its
baselines share :class:`ConstrainedParams`; each adds its own."""

from __future__ import annotations

from dataclasses import dataclass

from hetfed.methods.decision import BATCH_SIZE_HELP
from hetfed.params import Params, param


@dataclass(frozen=True)
class ConstrainedParams(Params):
    """The two-exchange round: tolerance, steps, sampling, evaluation and the clients' batches."""

    eps: float = param(
        0.05, "Constraint tolerance eps (max_i g_i <= eps)", low=0.0, low_open=True, key="switching-eps"
    )
    threshold: float = param(
        0.025, "Switch to the objectives when <q, g> <= threshold", key="switching-threshold"
    )
    eta: float = param(0.1, "Server step eta", low=0.0, low_open=True, key="switching-eta")
    gamma: float = param(0.1, "Local step gamma", low=0.0, low_open=True, key="switching-gamma")
    local_steps: int = param(1, "Local steps E per round", low=1, key="switching-local-steps")
    clients_per_round: int = param(0, "Clients sampled per round m; 0 = all", low=0, key="switching-m")
    theory_d: float = param(
        0.0,
        "Diameter D; with switching-theory-l > 0 sets eta, gamma, threshold by theory",
        low=0.0,
        key="switching-theory-d",
    )
    theory_l: float = param(
        0.0,
        "Lipschitz constant L of the f_i, g_i (see switching-theory-d)",
        low=0.0,
        key="switching-theory-l",
    )
    eval_every: int = param(
        10,
        "Evaluate F = max f_i, G = max g_i on all clients every k rounds (0 = at the end)",
        low=0,
        key="switching-eval-every",
    )
    batch_zeta: int = param(32, "Batch size of the f_i, g_i query", low=1)
    batch_size: int = param(64, BATCH_SIZE_HELP, low=1)


@dataclass(frozen=True)
class SwitchingParams(ConstrainedParams):
    """Softmax switching's temperature."""

    alpha: float = param(
        10.0, "Softmax temperature alpha of p, q", low=0.0, low_open=True, key="switching-alpha"
    )


@dataclass(frozen=True)
class PenaltyParams(ConstrainedParams):
    """The penalty baseline's weight."""

    rho: float = param(10.0, "Penalty weight rho of f + rho max(g, 0)", low=0.0, key="penalty-rho")


@dataclass(frozen=True)
class PrimalDualParams(ConstrainedParams):
    """The primal-dual baseline's dual step."""

    dual_lr: float = param(0.1, "Dual step of the primal-dual baseline", low=0.0, key="pd-dual-lr")
    dual_step: str = param(
        "mean",
        "Dual ascent on the mean or the max of the sampled g_i",
        choices=("mean", "max"),
        key="pd-dual-step",
    )
