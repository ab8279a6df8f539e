"""Federated linear stochastic approximation's parameters (docs/algorithms.md section 3): pflsa,
fedlsa, scafflsa and single-lsa share :class:`LSAParams`; PF-LSA adds its weight beta."""

from __future__ import annotations

from dataclasses import dataclass

from hetfed.params import Params, param


@dataclass(frozen=True)
class LSAParams(Params):
    """Step size, local steps, the clients' oracle (batch, exact) and how often they report."""

    eta: float = param(0.2, "Step size eta of the LSA strategies", low=0.0, low_open=True, key="lsa-eta")
    batch: int = param(
        1, "LSA: samples per agent and iteration (their mean is one step's sample)", low=1, key="lsa-batch"
    )
    local_steps: int = param(
        1,
        "LSA: local steps H per round (fedlsa, scafflsa, single-lsa; pflsa: 1)",
        low=1,
        key="lsa-local-steps",
    )
    exact: bool = param(False, "LSA: noise-free steps with the exact means A_bar_c, b_bar_c", key="lsa-exact")
    report_every: int = param(
        1,
        "LSA: clients report ||theta_c - theta_c*||^2 every k rounds (and after the last)",
        low=1,
        key="lsa-report-every",
    )


@dataclass(frozen=True)
class PFLSAParams(LSAParams):
    """PF-LSA's weight of an agent's own update."""

    beta: float = param(
        0.0,
        "PF-LSA weight beta of the agent's own update; 0 = 1/N (recommended)",
        low=0.0,
        high=1.0,
        key="pflsa-beta",
    )
