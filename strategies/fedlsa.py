"""FedLSA and SCAFFLSA: the FedAvg-style baselines of PF-LSA (ALGORITHMS.md 3).

Round r: every agent runs H = ``lsa-local-steps`` local LSA steps from the shared
parameter theta^{r-1} and returns its local parameter; the server sets

    theta^r = (1/N) sum_c theta_c^{r, H}        (averaging parameters, starting from theta^0 = 0).

FedLSA converges to one shared point (``(sum_c A_bar_c)^{-1} sum_c b_bar_c`` for H = 1), so
it is biased when the agents' solutions theta_c* differ. SCAFFLSA corrects the local steps by
control variates kept on the clients (:class:`client.lsa.LocalStepsClient`); its server is
FedLSA's.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from hetfed.records import to_record
from problems.registry import get_problem
from strategies.lsa import LSAStrategy


class FedLSA(LSAStrategy):
    """Averages the agents' local parameters after H local steps each."""

    broadcast_key = "theta"
    reply_key = "theta"

    def __init__(self, cfg: Mapping[str, Any]) -> None:
        dim = get_problem(cfg["problem"]).model_dims(cfg)[0]
        super().__init__(cfg, to_record({"theta": np.zeros(dim)}))


class SCAFFLSA(FedLSA):
    """FedLSA whose clients correct their local steps with control variates (server unchanged)."""
