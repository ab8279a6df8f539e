"""The local-only baseline's client (strategy ``local-only``, docs/algorithms.md 1.4)."""

from __future__ import annotations

import torch
from flwr.app import MetricRecord, RecordDict

from hetfed.client.adam import Adam
from hetfed.client.decision import BatchLoss, decision_metrics
from hetfed.client.decision_client import DecisionClient
from hetfed.client.state import ClientState


class LocalOnlyClient(DecisionClient):
    """The local-only baseline's client: its own model, trained on its own data every round and
    never shared; the same calibration, schedules and evaluation as FedRSPO+'s (docs/algorithms.md 1)."""

    def train_round(
        self, content: RecordDict, loss: BatchLoss, lr: float, epochs: int, rnd: int
    ) -> RecordDict:
        """Local-only baseline: the client's own model, never shared; replies with scalars only."""
        state = self.state(content)
        kept = state.round_arrays("local", rnd)
        model = self.model_of(kept) if kept is not None else self.new_model()
        val = decision_metrics(model, self.data.val, self.data.polytope)
        train_loss = self.fit(model, Adam(model.parameters(), lr=lr), loss, epochs, rnd)
        state.set_round_arrays("local", model.state_dict(), rnd)
        return RecordDict(
            {
                "metrics": MetricRecord(
                    {
                        "num-examples": len(self.data.train),
                        "train-loss": train_loss,
                        "val-relative-regret": val["relative-regret"],
                    }
                )
            }
        )

    def personal_start(self, state: ClientState, content: RecordDict) -> torch.nn.Module:
        """Personalization continues this client's own model."""
        return self.stored_model(state, "local") or self.model(content.array_records["arrays"])

    def evaluated_models(self, state: ClientState, content: RecordDict) -> dict[str, torch.nn.Module | None]:
        """Its personal model, or its own model when it did not personalize (no federated one)."""
        return {"per": self.stored_model(state, "personal") or self.stored_model(state, "local")}
