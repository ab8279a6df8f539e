"""The centralized yardstick (the paper's Table 14): ONE model trained on every client's pooled
training data, which a federation never does; a method of the inline engine only (hetfed/methods
``engines``: the run config is refused on another) (docs/algorithms.md 1.7).

Its phases (strategies/base.py): round 1 ``train``, one message, to the first client, which pools
the generated data of every partition (client/pooled.py ``PooledClient``) and trains
the run's whole budget of epochs, ``R_fed E + R_per E_per``; then ``evaluate``: every client
tests the pooled model on its own test set and polytope, as after FedAvg.
"""

from __future__ import annotations

import numpy as np
from flwr.app import ConfigRecord, Message

from hetfed.methods.decision import CalibratedParams
from hetfed.strategies.base import FederationError, Folded, Phase, reply_arrays, reply_metrics
from hetfed.strategies.fedavg import FedAvg


class Centralized(FedAvg):
    """One model on the pooled data, with FedRSPO+'s settings and epoch budget; evaluated per client."""

    client_handler = "decision-pooled"
    robust_refusal = "one model trains on the pooled data; nothing is averaged"
    params_type = CalibratedParams
    params: CalibratedParams

    def check_params(self) -> None:
        """Every loss: the pooling client calibrates each partition's loss itself."""

    @property
    def num_rounds(self) -> int:
        return 1

    @property
    def epochs(self) -> int:
        """The federated run's whole budget: ``R_fed E + R_per E_per``."""
        p = self.params
        return self.rounds * p.local_epochs + p.personal_rounds * p.personal_epochs

    def summary(self) -> None:
        self.log(f"Centralized yardstick, loss {self.params.loss}: {self.epochs} epochs on the pooled data")

    def sample(self, rng: np.random.Generator) -> list[int]:
        return self.participants()[:1]  # the client that pools every partition

    def client_config(self, config: ConfigRecord, partition_id: int) -> ConfigRecord:
        return ConfigRecord({**config, "epochs": self.epochs})

    def sums(self, server_round: int) -> bool:
        return False  # one model, not a sum of updates

    def train_phase(self, server_round: int) -> Phase:
        return Phase("train", self.train_messages, self.adopt, check=self.unusable, draw=self.draw_sample)

    def adopt(self, server_round: int, replies: list[Message]) -> Folded:
        """The pooled model becomes the model every client evaluates; without it there is no result
        (evaluating the untrained model would pass for one)."""
        for reply in replies:  # usable: the round loop rejected the others (``unusable``)
            metrics = {"clients-used": 1, "train-loss": reply_metrics(reply.content)["train-loss"]}
            return Folded(metrics, {"arrays": reply_arrays(reply.content)})
        why = "; ".join(self.pool.failed.values()) or "no reply"
        raise FederationError(f"the centralized yardstick's pooling client gave no model: {why}")
