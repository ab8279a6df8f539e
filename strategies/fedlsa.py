"""FedLSA and SCAFFLSA: the FedAvg-style baselines of PF-LSA (docs/algorithms.md section 3).

Round r: every agent runs H = ``lsa-local-steps`` local LSA steps from the shared
parameter theta^{r-1} and returns its local parameter; the server sets

    theta^r = (1/N) sum_c theta_c^{r, H}        (averaging parameters, starting from theta^0 = 0).

FedLSA converges to one shared point (``(sum_c A_bar_c)^{-1} sum_c b_bar_c`` for H = 1), so
it is biased when the agents' solutions theta_c* differ. SCAFFLSA corrects the local steps by
control variates kept on the clients (:class:`hetfed.client.lsa.LocalStepsClient`); its server is
FedLSA's.

A missing agent (our extension, see :mod:`hetfed.strategies.lsa`) repeats its last local step: its
stand-in is ``theta^{r-1} + (theta_c^{k,H} - theta^{k-1})`` from the last round k it completed
(the rule of MIFA, Gu et al. 2021, for unavailable devices). A SCAFFLSA agent then updates its
control variate as if it had sent that stand-in in every round it missed
(:class:`hetfed.client.lsa.LocalStepsClient`), so the control variates still sum to zero.
"""

from __future__ import annotations

import numpy as np
from flwr.app import ArrayRecord

from hetfed.records import to_record
from hetfed.strategies.lsa import LSAStrategy


class FedLSA(LSAStrategy):
    """Averages the agents' local parameters after H local steps each."""

    broadcast_key = "theta"
    reply_key = "theta"
    client_handler = "lsa-local-steps"

    @classmethod
    def default_arrays(cls, dim: int) -> ArrayRecord | None:
        """The shared parameter starts at theta^0 = 0 (of size ``dim``)."""
        return to_record({"theta": np.zeros(dim)})

    def remember(self, value: np.ndarray, start: np.ndarray | None) -> np.ndarray:
        """The agent's local step of this round, ``theta_c^{r,H} - theta^{r-1}``."""
        assert start is not None
        return value - start

    def stand_in(self, server_round: int, pid: int, start: np.ndarray | None) -> np.ndarray | None:
        """The agent's last local step, repeated from this round's shared parameter."""
        step = super().stand_in(server_round, pid, start)
        assert start is not None and step is not None
        return start + step


class SCAFFLSA(FedLSA):
    """FedLSA whose clients correct their local steps with control variates (server unchanged)."""

    client_handler = "lsa-control-variates"
