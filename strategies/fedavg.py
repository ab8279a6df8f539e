"""FedAvg over partitions with seeded sampling, and per-client evaluation after the last round.

Round t's phases (strategies/base.py): ``train`` (summed) on the sampled clients, then, after
the last round, ``evaluate`` on every client.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, RecordDict
from flwr.app.typing import MetricRecordValues

from hetfed.methods.decision import LOSSES, DecisionParams
from hetfed.params import ConfigError
from hetfed.problems.models import make_mlp, model_record
from hetfed.problems.registry import get_problem
from hetfed.records import to_numpy, to_record
from hetfed.strategies.base import (
    FederatedStrategy,
    Folded,
    Phase,
    WeightedSum,
    ceil_fraction,
    drawn,
    reply_metrics,
)
from hetfed.strategies.result_summary import summarize


class FedAvg(FederatedStrategy):
    """Federated averaging of model deltas.

    Round t samples ``S_t``, ``|S_t| = ceil(fraction * n)`` clients uniformly without
    replacement (seeded, over partition ids), sends them ``w_t``, and sets

        w_{t+1} = w_t + sum_{j in S_t} n_j (w_j - w_t) / sum_{j in S_t} n_j

    over the replies it can use (NaN/Inf or misshaped replies are rejected and logged).
    After the last round every client evaluates ``w_T`` on its own test set.
    """

    family = "decision"
    client_handler = "decision"
    params_type = DecisionParams
    params: DecisionParams
    own_model: ClassVar[bool] = False  # local-only: each client trains and evaluates its own model (no sum)
    robust_refusal: ClassVar[str] = ""  # its summed round is a model average
    samples_in_sum = True  # S_t is drawn for the train phase, which is summed

    def __init__(
        self,
        *,
        initial_arrays: ArrayRecord,
        num_rounds: int = 10,
        seed: int = 42,
        params: DecisionParams | None = None,
    ) -> None:
        """``num_rounds`` rounds from ``initial_arrays``; ``params``: sampling, local training and
        what the decision client reads (default: every default); ``seed``: the sampling stream."""
        super().__init__(num_rounds=num_rounds, params=params, initial_arrays=initial_arrays)
        # A stream of its own, so sampling is the same whatever the loss or batch order.
        self.rng = np.random.default_rng(np.random.SeedSequence([int(seed), 7]))
        self.sampled: list[int] = []  # the round's S_t (its train phase's draw)

    @classmethod
    def build(cls, cfg: Mapping[str, Any]) -> FederatedStrategy:
        """The strategy with the seeded MLP of the problem's feature and cost dimensions."""
        params = cls.params_type.from_config(cfg)
        dims = get_problem(cfg["problem"]).model_dims
        assert dims is not None  # a decision problem: build_strategy checked the family
        in_dim, out_dim = dims(cfg)
        model = model_record(make_mlp(in_dim, params.hidden, out_dim, seed=cfg["seed"]))
        return cls(initial_arrays=model, num_rounds=cfg["num-rounds"], seed=cfg["seed"], params=params)

    def check_params(self) -> None:
        """RSPO+ and OptNet need a calibration."""
        if LOSSES[self.params.loss].needs_calibration:
            raise ConfigError(
                f"run config 'loss': {self.params.loss!r} needs the per-client calibration of "
                "strategy 'fedrspo' (or 'local-only')"
            )

    def participants(self) -> list[int]:
        """The partitions taking part in the run (every connected client)."""
        return self.pool.partitions

    def model_content(self, arrays: ArrayRecord) -> dict[str, ArrayRecord]:
        """What of the global model an instruction carries (here: all of it)."""
        return {"arrays": arrays}

    def sample(self, rng: np.random.Generator) -> list[int]:
        """The partitions trained this round, drawn from the sampling stream ``rng``."""
        parts = self.participants()
        k = ceil_fraction(self.params.fraction, len(parts))
        return sorted(int(p) for p in rng.choice(parts, size=k, replace=False))

    def draw_sample(self, server_round: int) -> dict[str, Any]:
        """The train phase's draw: S_t and the sampling stream after it."""
        return drawn(self.rng, self.sample, self.secret_sample)

    def planned_sample(self, population: int) -> int:
        """Clients per round (for the DP accountant's plan)."""
        return ceil_fraction(self.params.fraction, population)

    def client_config(self, config: ConfigRecord, partition_id: int) -> ConfigRecord:
        """The training message's config for one client (beyond the settings: none for FedAvg)."""
        return config

    def phases(self, server_round: int) -> list[Phase]:
        """Round t: ``train`` (summed), then ``evaluate`` (which sends only after the last round)."""
        if server_round == 0:
            return []
        return [
            self.train_phase(server_round),
            Phase("evaluate", self.evaluate_messages, self.aggregate_evaluate),
        ]

    def train_phase(self, server_round: int) -> Phase:
        """The round's training: summed, w_{t+1} from the weighted mean of the deltas."""
        return self.summed_phase(
            "train", server_round, self.train_messages, self.aggregate_sum, self.draw_sample
        )

    def train_messages(self, server_round: int) -> list[Message]:
        """w_t to the round's sample S_t (the phase's draw)."""
        assert self.arrays is not None  # FedAvg always holds its model
        sampled = self.sampled
        named = f"{len(sampled)} clients" if self.secret_sample else ", ".join(map(self.pool.name, sampled))
        self.log(f"round {server_round}: sampled {named}")
        config = self.round_config(server_round)
        return [
            self.pool.message(
                pid,
                "train",
                RecordDict({**self.model_content(self.arrays), "config": self.client_config(config, pid)}),
                server_round,
            )
            for pid in sampled
        ]

    # --- the summed round: w_{t+1} = w_t + sum_j n_j (w_j - w_t) / sum_j n_j ----------------------
    def sums(self, server_round: int) -> bool:
        return not self.own_model

    def sum_weight(self, partition_id: int) -> float | str:
        return "num-examples"

    def max_sum_weight(self, sizes: Mapping[int, int]) -> float:
        return float(max(sizes.values(), default=1))

    def sum_reference(self) -> dict[str, np.ndarray]:
        assert self.arrays is not None  # FedAvg always holds its model
        return to_numpy(self.arrays)

    def sum_layout(self) -> dict[str, tuple[int, ...]]:
        return {k: v.shape for k, v in self.sum_reference().items()}

    def aggregate_sum(self, server_round: int, replies: list[Message], summed: WeightedSum | None) -> Folded:
        """w_{t+1} = w_t + the weighted mean of the deltas (unchanged when no reply is usable)."""
        if summed is None:
            self.log(f"round {server_round}: no usable replies; the model is unchanged")
            return Folded({"clients-used": 0})
        w = self.sum_reference()
        step = summed.mean()
        new = {key: (value.astype(np.float64) + step[key]).astype(value.dtype) for key, value in w.items()}
        used = [r for r in replies if self.pool.partition_of(r) in summed.contributors]
        n = [float(reply_metrics(r.content)["num-examples"]) for r in used]
        losses = [float(reply_metrics(r.content)["train-loss"]) for r in used]
        metrics: dict[str, MetricRecordValues] = {"clients-used": len(summed.contributors)}
        if used:
            metrics["train-loss"] = sum(a * b for a, b in zip(n, losses, strict=True)) / sum(n)
        return Folded(metrics, {"arrays": to_record(new)})

    def evaluate_messages(self, server_round: int) -> list[Message]:
        """After the last round: the model to every participant, which evaluates it on its test set."""
        if server_round != self.num_rounds:
            return []
        assert self.arrays is not None
        config = self.round_config(server_round)
        return [
            self.pool.message(
                pid,
                "evaluate",
                RecordDict({**self.model_content(self.arrays), "config": config}),
                server_round,
            )
            for pid in self.participants()
        ]

    def aggregate_evaluate(self, server_round: int, replies: list[Message]) -> Folded:
        """The per-client results and their aggregate (``evaluation``; failed clients by name)."""
        per_client = {self.pool.name(self.pool.partition_of(r)): reply_metrics(r.content) for r in replies}
        failed = {self.pool.name(p): e for p, e in self.pool.failed.items()}
        evaluation = summarize(per_client, failed=failed)
        aggregate = {k: v for k, v in evaluation["aggregate"].items() if isinstance(v, int | float)}
        return Folded(aggregate, {"evaluation": evaluation})

    def final_models(self) -> dict[str, np.ndarray]:
        """The federated model (``global/...``); none for local-only, whose models stay on the clients."""
        if self.own_model or self.arrays is None:
            return {}
        return {f"global/{k}": v for k, v in to_numpy(self.arrays).items()}

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "rng": self.rng.bit_generator.state}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        super().load_state_dict(state)
        self.rng.bit_generator.state = state["rng"]
