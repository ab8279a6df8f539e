"""FedRSPO+'s personalization schedule (docs/algorithms.md 1.5) as a unit of its own: no model, no data.

A client runs personalization rounds t = 1..R with its own calibrated ``lam0``, ``lr0``.
With RSPO+ and annealing on, until the client freezes:

    lam_t = lam0 / (1 + kappa_lam (t - 1))
    lr_t  = alpha_per lam_t / 4              (coupled-lr)
    lr_t  = lr0 / (1 + kappa_lr (t - 1))     (otherwise)

After training round t, the freeze statistic U_t (the QP-LP gap on the monitor set,
hetfed.problems.metrics.qp_lp_gap) freezes lam and lr at their round-t values the first time
``U_t <= tau``; a frozen client trains ``extra`` more rounds at those values and stops.
Any other loss (or annealing off) keeps ``lam0``, ``lr0`` and never freezes. RSPO+'s
personalization has its own lr scale: ``lr0 = lr0_warm alpha_per / alpha``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from hetfed.methods.decision import LOSSES, DecisionParams


@dataclass
class PersonalSchedule:
    """The schedule's parameters and where a client is in it (``round`` done, ``frozen_at``, lam, lr)."""

    lam0: float
    lr0: float
    annealed: bool
    kappa_lam: float
    kappa_lr: float
    coupled_alpha: float | None  # alpha_per for the coupled lr, None for the kappa_lr schedule
    tau: float
    extra_rounds: int
    round: int = field(default=0, init=False)  # the last round trained
    frozen_at: int = field(default=0, init=False)  # 0 while not frozen
    lam: float = field(init=False)
    lr: float = field(init=False)

    def __post_init__(self) -> None:
        self.lam, self.lr = self.lam0, self.lr0  # round 1's values until annealed (or resumed)

    @classmethod
    def from_params(cls, params: DecisionParams, loss: str, lam0: float, lr0: float) -> PersonalSchedule:
        """The schedule of ``loss`` from the method's parameters and the client's warm-start lam0,
        lr0: annealed (and with RSPO+'s own lr scale) for a loss that anneals, else fixed."""
        anneals = LOSSES[loss].anneals
        return cls(
            lam0=lam0,
            lr0=lr0 * params.rspo_alpha_personal / params.rspo_alpha if anneals else lr0,
            annealed=anneals and params.anneal,
            kappa_lam=params.kappa_lam,
            kappa_lr=params.kappa_lr,
            coupled_alpha=params.rspo_alpha_personal if params.coupled_lr else None,
            tau=params.freeze_tau,
            extra_rounds=params.freeze_extra_rounds,
        )

    def trains(self, t: int) -> bool:
        """Whether round t is trained: not once ``extra`` rounds have followed the freeze."""
        return not (self.frozen_at and t > self.frozen_at + self.extra_rounds)

    def begin(self, t: int) -> None:
        """lam and lr for round t (annealed unless frozen; otherwise kept)."""
        if self.annealed and not self.frozen_at:
            self.lam = self.lam0 / (1 + self.kappa_lam * (t - 1))
            self.lr = (
                self.coupled_alpha * self.lam / 4
                if self.coupled_alpha is not None
                else self.lr0 / (1 + self.kappa_lr * (t - 1))
            )

    def end(self, t: int, freeze_stat: float) -> None:
        """Round t trained with statistic U_t: freeze at the first ``U_t <= tau`` (annealed only)."""
        if self.annealed and not self.frozen_at and freeze_stat <= self.tau:
            self.frozen_at = t
        self.round = t

    def position(self) -> dict[str, float]:
        """Where the client is (kept in its state after every round)."""
        return {"round": self.round, "frozen-at": self.frozen_at, "lam": self.lam, "lr": self.lr}

    def resume(self, position: Mapping[str, float]) -> None:
        """Continue from a kept :meth:`position` (a restarted node)."""
        self.round, self.frozen_at = int(position["round"]), int(position["frozen-at"])
        self.lam, self.lr = float(position["lam"]), float(position["lr"])

    def replay(self, freeze_stats: Mapping[int, float]) -> dict[int, tuple[float, float]]:
        """``{t: (lam_t, lr_t)}`` of a fresh schedule given the rounds' statistics U_t: the path a
        client took, rebuilt from its lam0, lr0 and what its rounds reported."""
        path = {}
        for t in sorted(freeze_stats):
            if not self.trains(t):
                break
            self.begin(t)
            path[t] = (self.lam, self.lr)
            self.end(t, freeze_stats[t])
        return path
