"""The centralized yardstick's client (strategy ``centralized``, docs/algorithms.md 1.4): one process
pools every partition's data (the inline engine's)."""

from __future__ import annotations

from dataclasses import replace

from flwr.app import MetricRecord, MetricRecordValues, RecordDict

from hetfed.client.adam import Adam
from hetfed.client.batch_losses import make_loss
from hetfed.client.calibration import step_sizes
from hetfed.client.decision import batch_generator, train_epochs
from hetfed.client.decision_client import DecisionClient
from hetfed.client.session import NodeConfigError
from hetfed.methods.decision import LOSSES
from hetfed.problems.models import model_record
from hetfed.records import scalar

POOLED = 99  # the yardstick's one random stream (batches and noise of the pooled training)


class PooledClient(DecisionClient):
    """The centralized yardstick's client (strategies/centralized.py): its ``train`` pools every
    partition's generated data, each sample judged by its own partition's loss, polytope and
    ``lam0_j``, and trains ONE model for the message's ``epochs`` with the mean of the partitions'
    ``lr0_j`` (a shared calibration's; the run's ``lr`` for a loss without a calibrated step)."""

    def train(self, content: RecordDict) -> RecordDict:
        if self.session.data_path is not None:
            raise NodeConfigError(
                f"partition {self.pid} of {self.session.num_partitions}: the centralized yardstick pools "
                "the generated data of a built-in problem; it does not read other silos' files"
            )
        n, loss = self.session.num_partitions, self.params.loss
        data = [replace(self.session, partition_id=j, opened={}).data() for j in range(n)]
        cal = [step_sizes(d, self.params, loss) for d in data]  # (lam0_j, lr0_j), as each client trains
        lr = sum(lr_j for _, lr_j in cal) / n if LOSSES[loss].calibrated_lr else self.params.lr
        model = self.model(content.array_records["arrays"])
        optimizer = Adam(model.parameters(), lr=lr)
        gen = batch_generator(self.cfg["seed"], POOLED)
        splits = [
            (d.train, make_loss(loss, d.train, d.polytope, self.params, lam, gen))
            for d, (lam, _) in zip(data, cal, strict=True)
        ]
        epochs = int(scalar(content.config_records["config"]["epochs"]))
        train_loss = train_epochs(
            model,
            splits,
            optimizer,
            epochs=epochs,
            batch_size=self.params.batch_size,
            generator=gen,
            clip_norm=self.params.clip_norm,
        )
        metrics: dict[str, MetricRecordValues] = {
            "num-examples": sum(len(d.train) for d in data),
            "train-loss": train_loss,
        }
        return RecordDict({"arrays": model_record(model), "metrics": MetricRecord(metrics)})
