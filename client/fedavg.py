"""Client side of FedAvg on a decision problem: local epochs from the global model."""

from __future__ import annotations

from typing import ClassVar

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, MetricRecord, RecordDict

from client.decision import batch_generator, decision_metrics, train_epochs
from client.losses import mse_loss
from client.models import load_record, make_mlp, model_record
from client.session import ClientSession


class DecisionClient:
    """Handlers of one client holding a decision problem (features -> LP costs)."""

    handles: ClassVar[tuple[str, ...]] = ("query.info", "train", "evaluate")

    def __init__(self, session: ClientSession, context: Context) -> None:
        self.session = session
        self.cfg = session.cfg
        self.data = session.data()
        self.context = context

    def query_info(self, content: RecordDict) -> RecordDict:
        """Who this client is: its partition and sample count (scalars only)."""
        return RecordDict(
            {
                "info": ConfigRecord(
                    {
                        "name": self.data.name,
                        "partition-id": self.session.partition_id,
                        "num-partitions": self.session.num_partitions,
                    }
                ),
                "metrics": MetricRecord({"num-examples": len(self.data.train)}),
            }
        )

    def model(self, arrays: ArrayRecord) -> torch.nn.Module:
        """A model with the received weights."""
        model = make_mlp(self.data.num_features, self.cfg["hidden"], self.data.num_costs, seed=0)
        return load_record(model, arrays)

    def train(self, content: RecordDict) -> RecordDict:
        """Validate the received model, then E local epochs with a fresh Adam; reply with weights."""
        model = self.model(content["arrays"])
        config = content["config"]
        server_round = int(config["server-round"])
        val = decision_metrics(model, self.data.val, self.data.polytope)
        optimizer = torch.optim.Adam(model.parameters(), lr=float(config["lr"]))
        gen = batch_generator(self.cfg["seed"], 2, self.session.partition_id, server_round)
        loss = train_epochs(
            model,
            self.data.train,
            lambda c_hat, c, _: mse_loss(c_hat, c),
            optimizer,
            epochs=int(config["local-epochs"]),
            batch_size=self.cfg["batch-size"],
            generator=gen,
            clip_norm=self.cfg["clip-norm"],
        )
        return RecordDict(
            {
                "arrays": model_record(model),
                "metrics": MetricRecord(
                    {
                        "num-examples": len(self.data.train),
                        "train-loss": loss,
                        "val-relative-regret": val["relative-regret"],
                    }
                ),
            }
        )

    def evaluate(self, content: RecordDict) -> RecordDict:
        """Test-set decision quality of the received model (LP oracle)."""
        model = self.model(content["arrays"])
        return RecordDict(
            {"metrics": MetricRecord(decision_metrics(model, self.data.test, self.data.polytope))}
        )
