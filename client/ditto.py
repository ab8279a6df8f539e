"""Ditto (Li et al., 2021) on a decision client (``ditto-mu`` > 0, docs/algorithms.md 1.4): besides the
federated model it trains each round, the client keeps a personal model v in its state (group
``personal``) and pulls it towards the round's global model. Called from the decision client's
training round (client/decision_client.py ``DecisionClient.train_round``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from flwr.app import ArrayRecord

from hetfed.client.adam import Adam
from hetfed.client.decision import BatchLoss, proximal_term
from hetfed.client.state import ClientState

if TYPE_CHECKING:
    from hetfed.client.decision_client import DecisionClient


def ditto_step(
    client: DecisionClient,
    state: ClientState,
    global_arrays: ArrayRecord,
    loss: BatchLoss,
    lr: float,
    epochs: int,
    rnd: int,
) -> None:
    """Ditto: E epochs on ``loss(v) + (mu/2)||v - w_global||^2`` for the persistent personal model v."""
    kept = state.round_arrays("personal", rnd)
    personal = client.model_of(kept) if kept is not None else client.model(global_arrays)
    penalty = proximal_term(personal, client.model(global_arrays), client.params.ditto_mu)
    client.fit(personal, Adam(personal.parameters(), lr=lr), loss, epochs, rnd, penalty)
    state.set_round_arrays("personal", personal.state_dict(), rnd)
