"""Baselines of the softmax switching method, on its harness (docs/algorithms.md section 2).

Every baseline runs the same two exchanges, local steps, gradient-evaluation count and
evaluation as :class:`~hetfed.strategies.softmax_switching.SoftmaxSwitching`; only the round's
decision differs. All weight the sampled clients uniformly, ``w_{k+1} = w_k - eta mean_i u_i``,
so they target the *average* of the clients' objectives:

- :class:`FederatedPenalty`: local steps on ``f_i + rho max(g_i, 0)``;
- :class:`FederatedPrimalDual`: local steps on ``f_i + lambda_k g_i``, then dual ascent
  ``lambda_{k+1} = max(0, lambda_k + eta_dual s_k)`` with ``s_k = mean_{I_k} g_i`` (enforces
  the average constraint) or ``s_k = max_{I_k} g_i`` (the worst sampled constraint),
  both on the queried ``g_i(w_k)``;
- :class:`UnconstrainedFedAvg`: local steps on ``f_i``, the constraint ignored;
- :class:`ParallelCRPO`: average-constraint switching (CRPO run in parallel): steps on
  ``f_i`` if ``mean_{I_k} g_i <= threshold``, else on ``g_i``.

The output average is over all rounds, except for CRPO, which averages the rounds that
stepped on the objective (as the switching method does).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from flwr.app import ArrayRecord

from hetfed.methods.constrained import PenaltyParams, PrimalDualParams
from hetfed.strategies.softmax_switching import ConstrainedRounds, RoundPlan


def uniform(f: Mapping[int, float]) -> dict[int, float]:
    """Weight ``1 / |I_k|`` for every sampled client."""
    return {pid: 1.0 / len(f) for pid in f}


class FederatedPenalty(ConstrainedRounds):
    """Federated penalty method: FedAvg-style steps on ``f_i + rho max(g_i, 0)``."""

    params_type = PenaltyParams
    params: PenaltyParams

    def settings(self) -> dict[str, float]:
        return {**super().settings(), "rho": self.params.rho}

    def decide(self, server_round: int, f: Mapping[int, float], g: Mapping[int, float]) -> RoundPlan:
        return RoundPlan("penalty", uniform(f), multiplier=self.params.rho)


class FederatedPrimalDual(ConstrainedRounds):
    """Federated primal-dual: Lagrangian steps, dual ascent on the mean or the max of the sampled g_i."""

    params_type = PrimalDualParams
    params: PrimalDualParams

    def __init__(
        self,
        *,
        initial_arrays: ArrayRecord,
        num_rounds: int = 10,
        seed: int = 42,
        params: PrimalDualParams | None = None,
    ) -> None:
        """As :class:`ConstrainedRounds`; ``params.dual_lr`` is the dual step size, ``params.dual_step``
        ascent on the ``mean`` or the ``max`` of the g_i."""
        super().__init__(initial_arrays=initial_arrays, num_rounds=num_rounds, seed=seed, params=params)
        self.multiplier = 0.0  # lambda_k

    def settings(self) -> dict[str, float]:
        return {
            **super().settings(),
            "dual-lr": self.params.dual_lr,
            "dual-step-max": float(self.params.dual_step == "max"),
        }

    def decide(self, server_round: int, f: Mapping[int, float], g: Mapping[int, float]) -> RoundPlan:
        values = np.array(list(g.values()))
        signal = float(values.max() if self.params.dual_step == "max" else values.mean())
        used = self.multiplier
        return RoundPlan(
            "lagrangian",
            uniform(f),
            multiplier=used,
            metrics={"multiplier": used},
            state={"multiplier": max(0.0, used + self.params.dual_lr * signal)},
        )

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "multiplier": self.multiplier}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        super().load_state_dict(state)
        self.multiplier = float(state["multiplier"])


class UnconstrainedFedAvg(ConstrainedRounds):
    """FedAvg on the objectives alone (a reference for what the constraint costs)."""

    def decide(self, server_round: int, f: Mapping[int, float], g: Mapping[int, float]) -> RoundPlan:
        return RoundPlan("f", uniform(f))


class ParallelCRPO(ConstrainedRounds):
    """Average-constraint switching: objective if ``mean_{I_k} g_i <= threshold``, else constraint."""

    def settings(self) -> dict[str, float]:
        return {**super().settings(), "threshold": self.steps.threshold}

    def decide(self, server_round: int, f: Mapping[int, float], g: Mapping[int, float]) -> RoundPlan:
        mean_g = float(np.mean(list(g.values())))
        indicator = mean_g <= self.steps.threshold
        return RoundPlan(
            "f" if indicator else "g",
            uniform(f),
            averaged=indicator,
            metrics={"indicator": float(indicator), "mean-g-sampled": mean_g},
        )
