"""The round loop every LSA strategy shares (docs/algorithms.md section 3), and single-agent LSA.

Every client takes part in every round (full participation: the iteration of one agent
needs the others'). A round's phases (strategies/base.py): ``train`` (summed when the method
sends an array back), then, after the last round, ``evaluate``. Round ``r`` covers iterations
``(r - 1) H + 1 .. r H`` (H = 1 for PF-LSA). The server broadcasts one array
(``broadcast_key``: PF-LSA's averaged update, FedLSA's shared parameter, nothing for
single-agent LSA) and, from the replies' arrays ``reply_key``, sets

    broadcast = (1/N) sum_c reply_c,

an unweighted mean over the N agents, in partition order. Every ``lsa-report-every`` rounds
the clients report ``sq-error = ||theta_c - theta_c*||^2`` of the parameter the round starts
from (iteration ``(r - 1) H``); the server row gets ``iteration`` and ``mean-sq-error`` (the
mean over clients). After the last round an ``evaluate`` exchange reports the error at
iteration ``T H``, which ``finish`` returns per client.

A missing agent (no reply, an error, a rejected reply) is our extension, not the papers':
its last usable reply stands in for it (:meth:`LSAStrategy.stand_in`: PF-LSA's g_c^{k},
FedLSA/SCAFFLSA's last local step theta_c^{k,H} - theta^{k-1} added to the current
theta), its results row gets ``stale-round = k`` and the server row ``stale-clients``.
The agent sits out the rounds it missed: its next message carries ``last-round = k`` and
it continues from its state after round k. With no earlier reply (round 1), or no
usable reply at all in a round, the run stops with one line.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, RecordDict
from flwr.app.typing import MetricRecordValues

from hetfed.methods.lsa import LSAParams
from hetfed.params import ConfigError
from hetfed.problems.registry import get_problem
from hetfed.records import to_numpy, to_record
from hetfed.strategies.base import (
    FederatedStrategy,
    FederationError,
    Folded,
    Phase,
    WeightedSum,
    reply_arrays,
    reply_metrics,
)
from hetfed.strategies.result_summary import summarize


def check_lsa_config(cfg: Mapping[str, Any]) -> None:
    """Cross-key checks of an LSA run: the problem must be an LSA task, and a valid Garnet."""
    family = get_problem(cfg["problem"]).family
    if family != "lsa":
        raise ConfigError(
            f"run config 'problem': strategy {cfg['strategy']!r} solves linear systems from samples; "
            f"problem {cfg['problem']!r} is a {family!r} task (use problem = 'garnet')"
        )
    if cfg["problem"] == "garnet":
        if cfg["garnet-gamma"] >= 1.0:
            raise ConfigError(f"run config 'garnet-gamma': must be < 1, got {cfg['garnet-gamma']!r}")
        for key in ("garnet-branching", "garnet-dim"):
            if cfg[key] > cfg["garnet-states"]:
                raise ConfigError(
                    f"run config '{key}': must be at most garnet-states = {cfg['garnet-states']}, "
                    f"got {cfg[key]}"
                )


class LSAStrategy(FederatedStrategy):
    """Full-participation rounds with an unweighted mean of one reply array (see the module docs)."""

    broadcast_key: ClassVar[str | None] = None
    reply_key: ClassVar[str | None] = None
    family = "lsa"
    robust_refusal: ClassVar[str] = "the LSA methods' fixed points need the mean of the agents' updates"
    params_type: ClassVar[type[LSAParams]] = LSAParams
    params: LSAParams

    def __init__(
        self,
        *,
        dim: int,
        num_rounds: int = 10,
        params: LSAParams | None = None,
        checkpoint_every: int = 1,
        initial_arrays: ArrayRecord | None = None,
    ) -> None:
        """Parameters of size ``dim``; ``params``: H local steps of size eta per round, the clients'
        oracle, and their error report every ``report_every`` rounds; the clients keep their log
        on disk every ``checkpoint_every`` rounds (the run's checkpoints)."""
        initial_arrays = initial_arrays or self.default_arrays(dim)
        super().__init__(num_rounds=num_rounds, params=params, initial_arrays=initial_arrays)
        self.dim, self.checkpoint_every = dim, checkpoint_every
        self.behind: dict[int, int] = {}  # partition that missed rounds -> the last round it completed
        self.last_value: dict[int, np.ndarray] = {}  # partition -> what stands in for it (stand_in)

    @classmethod
    def default_arrays(cls, dim: int) -> ArrayRecord | None:
        """What the server holds at the start when not given (default: nothing; the agents hold theta)."""
        return None

    @classmethod
    def build(cls, cfg: Mapping[str, Any]) -> FederatedStrategy:
        """The strategy for an LSA task's run config (checked), with the task's dimension."""
        check_lsa_config(cfg)
        dims = get_problem(cfg["problem"]).model_dims
        assert dims is not None  # an LSA task: check_lsa_config checked the family
        return cls(
            dim=dims(cfg)[0],
            num_rounds=cfg["num-rounds"],
            params=cls.params_type.from_config(cfg),
            checkpoint_every=cfg["checkpoint-every"],
        )

    def client_settings(self) -> dict[str, Any]:
        return {**super().client_settings(), "checkpoint-every": self.checkpoint_every}

    def iteration(self, server_round: int) -> int:
        """The iteration round ``server_round`` starts from."""
        return (server_round - 1) * self.params.local_steps

    def client_config(self, config: ConfigRecord, server_round: int, report: bool) -> ConfigRecord:
        """What every client needs for this round's step."""
        return ConfigRecord(
            {
                **config,
                "eta": float(self.params.eta),
                "local-steps": self.params.local_steps,
                "report": report,
            }
        )

    def broadcast(
        self, server_round: int, kind: str, arrays: ArrayRecord | None, config: ConfigRecord
    ) -> list[Message]:
        """The same content for every partition (the arrays object is shared, not copied).

        An agent that missed rounds also gets ``last-round``: the round whose state it continues from.
        """
        messages = []
        for pid in self.pool.partitions:
            cfg = config
            if pid in self.behind:
                cfg = ConfigRecord({**config, "last-round": self.behind[pid]})
            content = RecordDict({"config": cfg})
            if arrays is not None:
                content["arrays"] = arrays
            messages.append(self.pool.message(pid, kind, content, server_round))
        return messages

    def phases(self, server_round: int) -> list[Phase]:
        """Round r: ``train`` (summed when the method sends an array back), then ``evaluate`` after
        the last round."""
        if server_round == 0:
            return []
        # In clear a missing agent's stand-in enters the mean (aggregate_train); a sum has none.
        summed = self.aggregate_sum if self.sums(server_round) else None
        return [
            Phase("train", self.train_messages, self.aggregate_train, summed, self.unusable),
            Phase("evaluate", self.evaluate_messages, self.aggregate_evaluate),
        ]

    def train_messages(self, server_round: int) -> list[Message]:
        """The broadcast to every agent; the clients report their error every ``report_every`` rounds."""
        report = (server_round - 1) % self.params.report_every == 0
        config = self.client_config(self.round_config(server_round), server_round, report)
        return self.broadcast(server_round, "train", self.arrays, config)

    def aggregate_train(self, server_round: int, replies: list[Message]) -> Folded:
        """broadcast = (1/N) sum_c reply_c over the agents, a missing one's stand-in in its place."""
        usable: dict[int, RecordDict] = {}
        values: dict[int, np.ndarray | None] = {}
        for reply in replies:  # usable: the round loop rejected the others (``unusable``)
            pid = self.pool.partition_of(reply)
            usable[pid], values[pid] = reply.content, self.reply_array(reply.content)[0]
        self.require_some(server_round, "train", usable)
        key = self.broadcast_key
        start = to_numpy(self.arrays)[key] if self.arrays is not None and key is not None else None
        behind, notes = self.mark_stale(server_round, usable, stands_in=self.reply_key is not None)
        stale = list(notes)
        for pid in stale:
            values[pid] = self.stand_in(server_round, pid, start)
        last_value = dict(self.last_value)
        for pid in usable:
            value = values[pid]
            if value is not None:  # None: the method sends nothing back (single-agent LSA)
                last_value[pid] = self.remember(value, start)
        state: dict[str, Any] = {"behind": behind, "last_value": last_value}
        received = [v for _, v in sorted(values.items()) if v is not None]
        if key is not None and received:
            state["arrays"] = to_record({key: np.mean(received, axis=0)})
        return Folded(self.round_metrics(server_round, usable, stale), state, notes)

    def mark_stale(
        self, server_round: int, usable: Mapping[int, RecordDict], stands_in: bool
    ) -> tuple[dict[int, int], dict[int, dict[str, int]]]:
        """The agents missing from ``usable``, marked as continuing from the last round they completed
        (``stands_in``: their last reply stands in for them): the new ``behind`` and, per missing
        agent, its row's ``stale-round``."""
        behind = {pid: r for pid, r in self.behind.items() if pid not in usable}
        notes: dict[int, dict[str, int]] = {}
        for pid in self.pool.partitions:
            if pid in usable:
                continue
            behind.setdefault(pid, server_round - 1)
            notes[pid] = {"stale-round": behind[pid]}
            self.log(
                f"round {server_round}: {self.pool.name(pid)} is missing; it continues from round "
                f"{behind[pid]}" + (", whose reply stands in for it" if stands_in else "")
            )
        return behind, notes

    def round_metrics(
        self, server_round: int, usable: Mapping[int, RecordDict], stale: list[int]
    ) -> dict[str, MetricRecordValues]:
        """The server row: ``iteration``, ``mean-sq-error`` (when the clients reported), ``stale-clients``."""
        metrics: dict[str, MetricRecordValues] = {}
        reported = [reply_metrics(c) for c in usable.values()]
        errors = [float(m["sq-error"]) for m in reported if "sq-error" in m]
        if errors:
            metrics = {"iteration": self.iteration(server_round), "mean-sq-error": float(np.mean(errors))}
        if stale:
            metrics["stale-clients"] = len(stale)
        return metrics

    # --- the summed round (secure aggregation, DP): the mean over the agents that replied ---------
    def sums(self, server_round: int) -> bool:
        return self.reply_key is not None

    def sum_reference(self) -> dict[str, np.ndarray]:
        return to_numpy(self.arrays) if self.arrays is not None else {}

    def sum_layout(self) -> dict[str, tuple[int, ...]]:
        assert self.reply_key is not None
        return {self.reply_key: (self.dim,)}

    def contribution(self, reply: Message) -> tuple[dict[str, np.ndarray] | None, str | None]:
        value, problem = self.reply_array(reply.content)
        return (None, problem) if value is None or self.reply_key is None else ({self.reply_key: value}, None)

    def aggregate_sum(self, server_round: int, replies: list[Message], summed: WeightedSum | None) -> Folded:
        """broadcast = (reference +) (1/|U|) sum_{c in U} x_c over the agents U that replied: a missing
        agent has no stand-in, as the server never holds its reply."""
        if summed is None:
            raise FederationError(
                f"{type(self).__name__}: round {server_round} train has no sum: fewer clients than secure "
                f"aggregation's threshold took part to the end ({self.failures('replied')}). Fix the "
                "client(s) and rerun with resume = true: the run continues from its last checkpoint"
            )
        usable = {p: r.content for r in replies if (p := self.pool.partition_of(r)) in summed.contributors}
        assert self.broadcast_key is not None and self.reply_key is not None
        behind, notes = self.mark_stale(server_round, usable, stands_in=False)
        mean = summed.mean()[self.reply_key]
        reference = self.sum_reference().get(self.reply_key)
        value = mean if reference is None or self.reply_key != self.broadcast_key else reference + mean
        state = {"behind": behind, "arrays": to_record({self.broadcast_key: value})}
        return Folded(self.round_metrics(server_round, usable, list(notes)), state, notes)

    def remember(self, value: np.ndarray, start: np.ndarray | None) -> np.ndarray:
        """What to keep of an agent's reply for the rounds it may miss (default: the reply itself)."""
        return value

    def stand_in(self, server_round: int, pid: int, start: np.ndarray | None) -> np.ndarray | None:
        """The reply that stands in for a missing agent: its last one (PF-LSA's g_c^{k}).

        Stops the run (FederationError) when the agent has sent nothing usable yet.
        """
        if self.reply_key is None:
            return None
        if pid not in self.last_value:
            raise FederationError(
                f"{type(self).__name__}: round {server_round} train lost {self.pool.name(pid)} "
                f"({self.pool.failed.get(pid, 'no reply')}), which has no earlier update to continue "
                "with. Fix the client and rerun with resume = true: the run continues from its last "
                "checkpoint"
            )
        return self.last_value[pid]

    def reply_array(self, content: RecordDict) -> tuple[np.ndarray | None, str | None]:
        """The reply's array ``reply_key`` (deserialised once), or why it cannot be used."""
        if self.reply_key is None:
            return None, None
        key = self.reply_key
        try:
            record = reply_arrays(content)
            arrays = to_numpy(record) if record is not None else {}
        except (ValueError, TypeError) as exc:
            return None, f"arrays cannot be read ({exc})"
        if list(arrays) != [key]:
            return None, f"the reply must carry exactly one array, {key!r}"
        value = arrays[key]
        if value.shape != (self.dim,):
            return None, f"array {key!r} has shape {value.shape}, expected ({self.dim},)"
        if not np.all(np.isfinite(value)):
            return None, f"array {key!r} contains NaN or Inf"
        return value, None

    def evaluate_messages(self, server_round: int) -> list[Message]:
        """After the last round: the broadcast that completes iteration T H, with the error report."""
        if server_round != self.num_rounds:
            return []
        config = self.client_config(self.round_config(server_round), server_round, True)
        return self.broadcast(server_round, "evaluate", self.arrays, config)

    def aggregate_evaluate(self, server_round: int, replies: list[Message]) -> Folded:
        """Each agent's final error (``evaluation``) and their mean."""
        usable = {self.pool.partition_of(reply): reply.content for reply in replies}
        self.require_some(server_round, "evaluate", usable)
        per_client = {
            self.pool.name(pid): {"sq-error": float(reply_metrics(c)["sq-error"])}
            for pid, c in usable.items()
        }
        failed = {
            self.pool.name(pid): self.pool.failed.get(pid, "no reply")
            for pid in self.pool.partitions
            if pid not in usable
        }
        evaluation = summarize(per_client, failed)
        evaluation["aggregate"]["iteration"] = self.iteration(server_round + 1)
        metrics = {
            "final-iteration": self.iteration(server_round + 1),
            "final-mean-sq-error": evaluation["aggregate"]["sq-error"],
        }
        return Folded(metrics, {"evaluation": evaluation})

    def require_some(self, server_round: int, kind: str, usable: Mapping[int, RecordDict]) -> None:
        """Stop the run (FederationError) when no client's reply in ``usable`` can be used."""
        if usable:
            return
        raise FederationError(
            f"{type(self).__name__}: round {server_round} {kind} has no usable reply ({self.failures()}). "
            "Fix the client(s) and rerun with resume = true: the run continues from its last checkpoint"
        )

    def failures(self, otherwise: str = "no reply") -> str:
        """Why each client failed the last exchange (``otherwise`` for those that did not fail)."""
        return "; ".join(
            f"{self.pool.name(p)}: {self.pool.failed.get(p, otherwise)}" for p in self.pool.partitions
        )

    def state_dict(self) -> dict[str, Any]:
        return {
            **super().state_dict(),
            "behind": dict(self.behind),
            "last-value": {pid: v.copy() for pid, v in self.last_value.items()},
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        super().load_state_dict(state)
        self.behind = {int(k): int(v) for k, v in state.get("behind", {}).items()}
        self.last_value = {int(k): np.asarray(v) for k, v in state.get("last-value", {}).items()}

    def summary(self) -> None:
        self.log(
            f"{type(self).__name__}: {self.num_rounds} rounds x {self.params.local_steps} steps, "
            f"eta = {self.params.eta:g}, batch = {self.params.batch}"
        )


class SingleLSA(LSAStrategy):
    """Single-agent LSA: every agent runs ``theta_c <- theta_c - eta g_c`` alone.

    No arrays cross the wire; rounds exist only to drive the clients and collect the error.
    """

    client_handler = "lsa-alone"
