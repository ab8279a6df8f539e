"""FedRSPO+ and its baselines: one protocol for every loss (docs/algorithms.md 1.3-1.6).

Its phases (strategies/base.py): round 0 ``calibrate`` (and ``masked-calibration``), rounds
1..R_fed ``train`` (summed), round R_fed + 1 ``personalize`` then ``evaluate``.

1. **Calibration** (round 0): a ``query.calibrate`` exchange; client j computes from its
   private data ``lam0_j = mean_i ||c_i|| / R_j`` and ``lr0_j = alpha lam0_j / 4`` and keeps
   them: the reply says only that it can take part (and n_j). Without per-client calibration
   (an ablation) a second exchange, ``query.masked_calibration``, gives the server the mean of
   ``(lam0_j, lr0_j)`` over the calibrated clients and nothing else: a secure-mean phase, which the
   round loop always runs on SecAgg+ (server/aggregation.py ``Summation.secure_mean``: signed keys
   on silos with a roster, the mean over the survivors when a client drops out).
2. **Federated warm start** (rounds 1..R_fed): FedAvg of deltas weighted by n_j over
   ``ceil(fraction n)`` seeded samples; each sampled client trains with its own ``lam0_j``,
   ``lr0_j`` (the message carries the shared mean instead, or the run's ``lr`` for a loss without
   a calibrated step) and a fresh Adam (gradient clip 1.0 per array).
3. **Personalization** (round R_fed + 1): ONE ``train.personalize`` instruction per client; the
   client runs all R_per local rounds itself (Adam state kept, inverse-time schedules
   ``lam_t = lam0 / (1 + kappa_lam (t-1))``, ``lr_t = lr0 / (1 + kappa_lr (t-1))``, the freeze
   statistic U_t, stop 3 rounds after freezing) and returns per-round scalars.
4. **Evaluation** (same round): every client evaluates the federated model and its personal
   model on its own test set with the LP oracle.

Options composing with it: FedProx (``proximal-mu``, a client-side term) and Ditto
(``ditto-mu``, a persistent personal model pulled towards each round's global model).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, RecordDict

from hetfed import secagg
from hetfed.methods.decision import CalibratedParams
from hetfed.params import ConfigError
from hetfed.strategies.base import FederationError, Folded, Phase, WeightedSum, reply_metrics
from hetfed.strategies.fedavg import FedAvg

# What a client's reply to query.masked_calibration sums (before masking): its (lam0_j, lr0_j).
CALIBRATION_LAYOUT = {"calibration": (2,)}


class FedRSPO(FedAvg):
    """Calibration, federated warm start, personalization and evaluation, for any decision loss."""

    params_type = CalibratedParams
    params: CalibratedParams

    def check_params(self) -> None:
        """Ditto keeps its own personal model: no personalization rounds on top of it."""
        if self.params.ditto_mu > 0 and self.params.personal_rounds > 0:
            raise ConfigError(
                "run config 'ditto-mu': Ditto keeps its own personal model; set personal-rounds=0"
            )

    def __init__(
        self,
        *,
        initial_arrays: ArrayRecord,
        num_rounds: int = 10,
        seed: int = 42,
        params: CalibratedParams | None = None,
    ) -> None:
        """``num_rounds`` warm-start rounds of FedAvg, then one personalization round of
        ``params.personal_rounds`` local rounds on every client (none if 0)."""
        super().__init__(initial_arrays=initial_arrays, num_rounds=num_rounds, seed=seed, params=params)
        self.calibrated: list[int] = []  # the partitions that can take part
        self.shared: tuple[float, float] | None = None  # mean (lam0, lr0) without per-client calibration
        self.personal: dict[int, dict[str, float]] = {}

    @property
    def warm_rounds(self) -> int:
        return self.rounds

    @property
    def num_rounds(self) -> int:
        return self.warm_rounds + (1 if self.params.personal_rounds > 0 else 0)

    def summary(self) -> None:
        self.log(
            f"FedRSPO+ protocol, loss {self.params.loss}: {self.warm_rounds} warm-start rounds, "
            f"{self.params.personal_rounds} personalization rounds"
        )

    def phases(self, server_round: int) -> list[Phase]:
        """Round 0: calibration (and the masked mean without per-client calibration); the warm
        start's rounds are FedAvg's; the last: personalization, then evaluation."""
        if server_round == 0:
            calibrate = Phase("calibrate", self.calibrate_messages, self.aggregate_calibration)
            if self.params.per_client_calibration:
                return [calibrate]
            shared = Phase(
                "masked-calibration",
                self.shared_calibration_messages,
                fold_sum=self.shared_calibration,
                secure_mean=CALIBRATION_LAYOUT,
            )
            return [calibrate, shared]
        if server_round <= self.warm_rounds:
            return super().phases(server_round)
        return [
            Phase("personalize", self.personalize_messages, self.aggregate_personal),
            Phase("evaluate", self.evaluate_messages, self.aggregate_evaluate),
        ]

    # --- 1. calibration ------------------------------------------------------------------------
    def calibrate_messages(self, server_round: int) -> list[Message]:
        """Ask every client whether it can calibrate (its lam0_j, lr0_j stay on it)."""
        config = ConfigRecord({"run-name": self.pool.run_name})
        content = RecordDict({"config": config})
        return [
            self.pool.message(pid, "query.calibrate", content, server_round) for pid in self.pool.partitions
        ]

    def aggregate_calibration(self, server_round: int, replies: list[Message]) -> Folded:
        """The calibrated clients; a client that failed is left out."""
        calibrated = sorted(self.pool.partition_of(reply) for reply in replies)
        for pid, reason in self.pool.failed.items():
            self.log(f"{self.pool.name(pid)} is left out: calibration failed: {reason}")
        if not calibrated:
            raise FederationError("every client failed calibration; see rounds.csv for the reasons")
        return Folded(state={"calibrated": calibrated})

    def shared_calibration_messages(self, server_round: int) -> list[Message]:
        """To every calibrated client: reply with your (lam0_j, lr0_j), which the round loop sums on
        SecAgg+ (``secure_mean``: the client masks them)."""
        content = RecordDict({"config": ConfigRecord({"run-name": self.pool.run_name})})
        return [
            self.pool.message(pid, "query.masked_calibration", content, server_round)
            for pid in self.calibrated
        ]

    def shared_calibration(
        self, server_round: int, replies: list[Message], summed: WeightedSum | None
    ) -> Folded:
        """``shared``: the mean (lam0, lr0) = sum_j (lam0_j, lr0_j) / |S| over the clients S whose
        masked values the secure sum holds (|S| is its weight slot: a client that dropped out before
        its input is left out, one lost after it is in). Without a sum (fewer clients than the
        threshold), or with a value the code clipped, the run fails in one line."""
        if summed is None:
            raise FederationError(
                "shared calibration: the secure mean of (lam0_j, lr0_j) has no sum (fewer clients than "
                "secagg-threshold; see rounds.csv for why); rerun with those clients up, or with "
                "per-client-calibration = true"
            )
        clipped = [
            self.pool.name(self.pool.partition_of(r))
            for r in replies
            if "metrics" in r.content.metric_records and reply_metrics(r.content).get("secagg-clipped", 0)
        ]
        if clipped:
            raise FederationError(
                f"shared calibration: {', '.join(clipped)}'s lam0_j or lr0_j lies beyond the secure mean's "
                f"range (+-{secagg.mean_code(len(self.calibrated))[1]:g} at {len(self.calibrated)} clients: "
                "hetfed/secagg.py mean_code); rerun with per-client-calibration = true"
            )
        left_out = sorted(set(self.calibrated) - set(summed.contributors))
        if left_out:
            names = ", ".join(self.pool.name(p) for p in left_out)
            self.log(f"shared calibration: the mean over {len(summed.contributors)} clients, without {names}")
        mean = summed.mean()["calibration"]
        return Folded(state={"shared": (float(mean[0]), float(mean[1]))})

    def step_sizes(self) -> dict[str, float]:
        """What a training message carries of (lam0, lr0): nothing with per-client calibration (each
        client uses its own lam0_j, lr0_j, or the run's ``lr`` for a loss whose step is not
        calibrated); their mean over the clients without it (``shared-lam``, ``shared-lr``)."""
        return {} if self.shared is None else {"shared-lam": self.shared[0], "shared-lr": self.shared[1]}

    # --- 2. warm start ---------------------------------------------------------------------------
    def participants(self) -> list[int]:
        """The calibrated clients (a client whose calibration failed is left out)."""
        return self.calibrated

    def client_config(self, config: ConfigRecord, partition_id: int) -> ConfigRecord:
        return ConfigRecord({**config, **self.step_sizes(), "phase": "warm"})

    # --- 3. personalization ----------------------------------------------------------------------
    def personalize_messages(self, server_round: int) -> list[Message]:
        """ONE ``train.personalize`` instruction per client: it runs all R_per local rounds itself."""
        assert self.arrays is not None
        config = self.round_config(server_round)
        msgs = []
        for pid in self.participants():
            cfg = ConfigRecord({**config, **self.step_sizes(), "phase": "personal"})
            msgs.append(
                self.pool.message(
                    pid,
                    "train.personalize",
                    RecordDict({**self.model_content(self.arrays), "config": cfg}),
                    server_round,
                )
            )
        self.log(f"round {server_round}: personalization on {len(msgs)} clients")
        return msgs

    def sums(self, server_round: int) -> bool:
        """The warm start's rounds only (personal models never leave the clients)."""
        return server_round <= self.warm_rounds and super().sums(server_round)

    def aggregate_personal(self, server_round: int, replies: list[Message]) -> Folded:
        """Each client's personalization scalars (personal models stay on the clients)."""
        personal = {**self.personal, **{self.pool.partition_of(r): reply_metrics(r.content) for r in replies}}
        frozen = [m.get("frozen-at", 0) for m in personal.values()]
        metrics = {"clients-personalized": len(personal), "clients-frozen": sum(1 for f in frozen if f > 0)}
        return Folded(metrics, {"personal": personal})

    def state_dict(self) -> dict[str, Any]:
        return {
            **super().state_dict(),
            "calibrated": self.calibrated,
            "shared": self.shared,
            "personal": self.personal,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        super().load_state_dict(state)
        if "calibration" in state:  # a checkpoint from before calibration stayed on the clients
            old = {int(k): v for k, v in state["calibration"].items()}
            self.calibrated = sorted(old)
            n = len(old)
            mean = (sum(c["lam0"] for c in old.values()) / n, sum(c["lr0"] for c in old.values()) / n)
            self.shared = None if self.params.per_client_calibration else mean
        else:
            self.calibrated = [int(p) for p in state["calibrated"]]
            shared = state["shared"]
            self.shared = None if shared is None else (float(shared[0]), float(shared[1]))
        self.personal = {int(k): v for k, v in state["personal"].items()}


class LocalOnly(FedRSPO):
    """Local-only baseline: the same calibration, rounds and schedules, but every client trains
    its own model on its own data every round and nothing is averaged (no model crosses the wire)."""

    own_model = True
    client_handler = "decision-local"
    robust_refusal = "every client trains its own model; nothing is averaged"

    def sample(self, rng: np.random.Generator) -> list[int]:
        return self.participants()  # every client, every round

    def model_content(self, arrays: ArrayRecord) -> dict[str, ArrayRecord]:
        return {}  # nothing to share: each client keeps its own model

    def train_phase(self, server_round: int) -> Phase:
        """Every client trains its own model; only the mean training loss comes back."""
        return Phase("train", self.train_messages, self.aggregate_local, draw=self.draw_sample)

    def aggregate_local(self, server_round: int, replies: list[Message]) -> Folded:
        losses = [float(reply_metrics(r.content)["train-loss"]) for r in replies]
        return Folded({"clients-used": len(losses), "train-loss": sum(losses) / max(len(losses), 1)})
