"""Decision-focused training's parameters and losses (docs/algorithms.md section 1).

:class:`DecisionParams` are those of fedavg (with FedProx and Ditto), and with
:class:`CalibratedParams` of fedrspo and local-only: the MLP, the loss, the local schedule and
the personalization schedule of the decision client. :data:`LOSSES` says what each loss needs, so
the strategy, the client and the schedule ask the loss instead of testing its name.
"""

from __future__ import annotations

from dataclasses import dataclass

from hetfed.params import Params, param

BATCH_SIZE_HELP = "Mini-batch size (a client with fewer samples trains on one full batch)"


@dataclass(frozen=True)
class Loss:
    """What a decision loss needs (docs/algorithms.md 1.1): ``lam`` (it projects onto the feasible
    set, so lam0 comes from the client's calibration, 1.3), a calibrated step ``lr0 = alpha lam0 /
    4``, the annealed and frozen personalization (1.5), and the loss it personalizes with."""

    batch_loss: str = ""  # its builder, "module:function" (client/batch_losses.py), imported on use
    projects: bool = False
    calibrated_lr: bool = False
    anneals: bool = False
    personalizes_with: str | None = None  # a two-phase loss: warm start with this one's name, then that

    @property
    def needs_calibration(self) -> bool:
        """Whether only a calibrating strategy (fedrspo, local-only) can train with it."""
        return self.projects or self.calibrated_lr


BUILT_IN = "hetfed.client.batch_losses"
LOSSES: dict[str, Loss] = {
    "mse": Loss(f"{BUILT_IN}:mse"),
    "spo+": Loss(f"{BUILT_IN}:spo_plus"),
    "rspo+": Loss(f"{BUILT_IN}:rspo_plus", projects=True, calibrated_lr=True, anneals=True),
    "pfyl": Loss(f"{BUILT_IN}:pfyl"),
    "dpo": Loss(f"{BUILT_IN}:dpo"),
    "mse->spo+": Loss(personalizes_with="spo+"),  # no builder: its phases train with mse, then spo+
    "optnet": Loss(f"{BUILT_IN}:optnet", projects=True),
}


def register_loss(name: str, loss: Loss) -> None:
    """Make ``loss`` a choice of the run-config key ``loss`` (docs/algorithms.md "How to add a loss");
    every process that trains or builds a strategy with it must have registered it."""
    if name in LOSSES:
        raise ValueError(f"loss {name!r} is registered already")
    LOSSES[name] = loss


def phase_loss(loss: str, phase: str) -> str:
    """The loss of a phase (``warm`` or ``personal``): ``mse->spo+`` warms up with MSE and
    personalizes with SPO+."""
    then = LOSSES[loss].personalizes_with
    if then is None:
        return loss
    return loss.split("->")[0] if phase == "warm" else then


@dataclass(frozen=True)
class DecisionParams(Params):
    """fedavg's parameters: sampling, the local training and the model, the losses' own settings,
    FedProx / Ditto / Interp-DFFL, and the personalization schedule (docs/algorithms.md 1.4-1.5)."""

    fraction: float = param(
        0.4, "Fraction of clients sampled per round (ceil(fraction * n))", low=0.0, high=1.0, low_open=True
    )
    local_epochs: int = param(3, "Local epochs per round", low=1)
    batch_size: int = param(64, BATCH_SIZE_HELP, low=1)
    lr: float = param(1e-3, "Client learning rate (Adam)", low=0.0, low_open=True)
    clip_norm: float = param(1.0, "Gradient-norm clip per parameter array; 0 = off", low=0.0)
    loss: str = param("mse", "Training loss of the decision-focused model", choices=LOSSES.keys())
    hidden: int = param(
        64, "Hidden units of the MLP; 0 = the linear predictor (no hidden layer, no bias)", low=0
    )
    personal_rounds: int = param(10, "Personalization rounds after the warm start (0 = none)", low=0)
    personal_epochs: int = param(1, "Local epochs per personalization round", low=1)
    rspo_alpha: float = param(
        0.01, "RSPO+ lr scale in the warm start: lr0_j = alpha lam0_j / 4", low=0.0, low_open=True
    )
    rspo_alpha_personal: float = param(
        0.01, "RSPO+ lr scale in personalization (energy: 0.001)", low=0.0, low_open=True
    )
    calibration_norm: str = param(
        "mean",
        "Scale of lam0_j = s(||c_i||) / R_j: mean (the paper) or median (robust to price spikes)",
        choices=("mean", "median"),
    )
    fixed_lam0: float = param(
        0.0,
        "lam0 for every client instead of its calibration (0 = calibrate; paper's shortest path: 2)",
        low=0.0,
    )
    anneal: bool = param(True, "RSPO+ personalization: inverse-time schedules and freezing")
    kappa_lam: float = param(1.0, "lam_t = lam0 / (1 + kappa_lam (t - 1))", low=0.0)
    kappa_lr: float = param(0.1, "lr_t = lr0 / (1 + kappa_lr (t - 1))", low=0.0)
    coupled_lr: bool = param(False, "The paper's coupled schedule lr_t = alpha lam_t / 4 instead of kappa-lr")
    freeze_tau: float = param(0.01, "Freeze lam and lr once U_t <= tau (energy: 0.03)", low=0.0)
    freeze_extra_rounds: int = param(3, "Rounds a frozen client still trains before it stops", low=0)
    personal_trace: bool = param(
        False, "Diagnosis: each personalization round also reports the personal model's test regret"
    )
    monitor_size: int = param(8, "Validation samples of the freeze statistic U_t", low=1)
    proximal_mu: float = param(
        0.0, "FedProx: (mu/2)||theta - theta_global||^2 added to every batch loss", low=0.0
    )
    ditto_mu: float = param(
        0.0, "Ditto: personal model trained with (mu/2)||v - theta_global||^2 (0 = off)", low=0.0
    )
    perturb_eps: float = param(1.0, "PFYL/DPO: Gaussian perturbation scale", low=0.0, low_open=True)
    perturb_samples: int = param(10, "PFYL/DPO: perturbation samples", low=2)
    optnet_mult: float = param(
        0.1, "OptNet-style: QP regularisation eps = mult * lam0_j", low=0.0, low_open=True
    )
    optnet_backend: str = param(
        "exact", "OptNet-style QP layer: exact (structured sets) or qpth", choices=("exact", "qpth")
    )
    interp_dffl: bool = param(False, "Also evaluate Interp-DFFL: blend a local model with the federated one")
    interp_split: float = param(
        0.2, "Interp-DFFL: calibration share of the training data", low=0.0, high=1.0, low_open=True
    )
    interp_local_epochs: int = param(
        100, "Interp-DFFL: epochs of the local SPO+ model (trained to convergence)", low=1
    )

    def phase_loss(self, phase: str) -> str:
        """This run's loss in ``phase`` (warm or personal)."""
        return phase_loss(self.loss, phase)


@dataclass(frozen=True)
class CalibratedParams(DecisionParams):
    """fedrspo's and local-only's: FedRSPO+'s per-client calibration (docs/algorithms.md 1.3)."""

    per_client_calibration: bool = param(
        True, "Per-client lam0_j, lr0_j (false: their mean for every client)"
    )
