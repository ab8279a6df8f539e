"""What every hetfed strategy is: a round as explicit phases over the strategy's state.

A strategy is hetfed's own (it does not subclass Flower's ``Strategy``): its attributes are
the server's state of the method (model, RNG, calibration, round plan, last evaluation; all
of it in :meth:`FederatedStrategy.state_dict`, which is the checkpoint), and
:meth:`FederatedStrategy.phases` says what round ``t`` exchanges, in order: a list of
:class:`Phase` (round 0: the setup exchanges, e.g. FedRSPO+'s calibration; then e.g. query,
train, personalize, evaluate). A phase builds its messages from the state (a phase that samples
clients first draws the sample: its ``draw`` returns the sample and the sampling stream's new
state, which the round loop applies like a fold's), and its fold
computes from the replies and the state a :class:`Folded`: the new values of the state it
changes, the server row's metrics and columns for the clients' rows. A fold changes nothing
itself; the round loop applies what it returns (:meth:`FederatedStrategy.apply`), so a fold
that fails leaves the state as it was, and a later phase of the round builds its messages from
what the earlier folds changed (softmax switching's ``plan``). A strategy never sends: the round loop
(server/rounds.py ``run_rounds``) alone sends each phase's messages (through the Summation of
server/aggregation.py for a summed phase under secure aggregation or DP, and for a phase whose
values are private whatever the run: its ``secure_mean``), its pool records
every client's failure, and it checkpoints the state after the round. A phase's ``check`` gives
the verdict on each reply (why it cannot be used: NaN, wrong shape); the round loop records the
rejected ones and folds the rest. Its clients are :class:`Clients`, which can neither send nor
reject. docs/algorithms.md "The round loop".
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, RecordDict
from flwr.app.typing import MetricRecordValues

from hetfed.params import Params
from hetfed.records import to_numpy, to_record
from hetfed.secagg import contribution
from hetfed.strategies.robust import RobustAggregation


class FederationError(RuntimeError):
    """The federation cannot run (missing clients, inconsistent partitions, failed discovery,
    every client lost); the message says which and why."""


class Clients(Protocol):
    """What a strategy uses of its clients (hetfed.server.pool.ClientPool): partitions, names and
    messages; no ``send``, ``reject`` or ``note``: only the round loop sends and records (rejections
    from a phase's ``check``, columns from a fold's :class:`Folded`)."""

    failed: dict[int, str]  # partition -> why, for the last exchange
    log: Callable[[str], None]
    run_name: str  # the results folder's name, which clients key their per-run state by

    @property
    def partitions(self) -> list[int]: ...  # the connected partitions, sorted

    def name(self, partition_id: int) -> str: ...

    def message(
        self, partition_id: int, message_type: str, content: RecordDict, server_round: int
    ) -> Message: ...

    def partition_of(self, reply: Message) -> int: ...


@dataclass(frozen=True)
class WeightedSum:
    """What a summed round gives its strategy (docs/algorithms.md "Summed rounds"): ``total`` =
    sum_j a_j x_j over the ``contributors`` j, x_j = the reply minus what was sent
    (hetfed.secagg.contribution), and ``weight`` = sum_j a_j; with secure aggregation the server
    learns only these, with DP ``total`` carries the Gaussian noise. A robust aggregation
    (strategies/robust.py) gives its estimate as ``total`` with ``weight`` 1."""

    total: dict[str, np.ndarray]
    weight: float
    contributors: list[int]

    def mean(self) -> dict[str, np.ndarray]:
        """sum_j a_j x_j / sum_j a_j."""
        return {k: v / self.weight for k, v in self.total.items()}


@dataclass(frozen=True)
class Folded:
    """What a fold returns, changing nothing itself: the server row's ``metrics``, the new values of
    the strategy ``state`` it changes (attribute -> value; :meth:`FederatedStrategy.apply`) and
    columns for clients' rows of the exchange (``notes``: partition -> columns)."""

    metrics: Mapping[str, MetricRecordValues] = field(default_factory=dict)
    state: Mapping[str, Any] = field(default_factory=dict)
    notes: Mapping[int, Mapping[str, Any]] = field(default_factory=dict)


@dataclass(frozen=True)
class Phase:
    """One exchange of a round (see the module docs): ``messages(t)`` builds its messages from the
    state (none: the phase is skipped), ``fold(t, replies)`` computes from the replies and the
    state what the round loop applies (:class:`Folded`). A summed phase also has
    ``fold_sum(t, replies, summed)``: the fold the round loop uses instead when secure aggregation
    or DP give only the weighted sum (server/aggregation.py). ``check(reply)``: why a reply cannot
    be used (None: it can); the round loop rejects those, so a fold sees only usable replies.
    ``draw(t)``: the new values of the state drawn before the messages are built (the round's
    sample and the sampling stream after it, :func:`drawn`); the round loop applies them first.
    ``secure_mean``: the names and shapes of a phase's values that the server may learn only as
    their sum over the clients, whatever the run's secure-aggregation (FedRSPO+'s shared
    calibration): such a phase has no fold in clear, only ``fold_sum``, and the round loop always
    runs it on SecAgg+ with weight 1 per client and x_j = the reply's arrays, so the sum's weight is
    the number of clients in it (server/aggregation.py ``Summation.secure_mean``)."""

    name: str
    messages: Callable[[int], list[Message]]
    fold: Callable[[int, list[Message]], Folded] | None = None
    fold_sum: Callable[[int, list[Message], WeightedSum | None], Folded] | None = None
    check: Callable[[Message], str | None] | None = None
    draw: Callable[[int], Mapping[str, Any]] | None = None
    secure_mean: Mapping[str, tuple[int, ...]] | None = None


def drawn(
    rng: np.random.Generator, sample: Callable[[np.random.Generator], list[int]], secret: bool = False
) -> dict[str, Any]:
    """A phase's ``draw``: ``sample`` drawn from a copy of the sampling stream ``rng``, returned as
    the state's new ``rng`` (the copy, advanced past the draw) and ``sampled``; ``rng`` is untouched,
    so the draw is the stream's next one whether or not the round loop applies it. ``secret``
    (``dp-sampling = secret``): drawn from OS entropy instead, and the stream stays where it was, so
    neither the seed nor the checkpoint's stream tells the sample."""
    if secret:
        return {"sampled": sample(np.random.default_rng())}
    stream = copy.deepcopy(rng)
    return {"rng": stream, "sampled": sample(stream)}


class FederatedStrategy:
    """Base class: subclasses implement :meth:`phases` (and their folds), ``finish`` and state.

    The message contract: every instruction's ConfigRecord carries :meth:`client_settings`, the
    name of the client handler that serves the strategy (``client``) and the method's typed
    parameters (``params``, hetfed/methods; the client rebuilds them from the message), so a
    client takes the method from the message and its run config only for its problem and data.
    """

    family: ClassVar[str] = ""  # the kind of problem it solves: decision, constrained or lsa
    client_handler: ClassVar[str] = ""  # the client class that serves this strategy (client/app.py)
    params_type: ClassVar[type[Params]] = Params  # its parameters (hetfed/methods: the registry's)
    method: str = ""  # the run-config strategy name it was built for (strategies/registry.py: build_strategy)
    # Why a robust aggregation cannot replace its summed round's mean (empty: it can; strategies/robust.py).
    robust_refusal: ClassVar[str] = "its rounds are not a model average"
    # Whether its sample is drawn for the summed phase alone, so that no other exchange names the
    # sampled clients: then ``dp-sampling = secret`` can keep it (server/aggregation.py).
    samples_in_sum: ClassVar[bool] = False
    secret_sample: bool = (
        False  # dp-sampling = secret: draws from OS entropy (:func:`drawn`), set by build_strategy
    )

    def __init__(
        self,
        *,
        num_rounds: int,
        params: Params | None = None,
        initial_arrays: ArrayRecord | None = None,
    ) -> None:
        """``num_rounds`` federated rounds of the method with ``params`` (default: the defaults of
        its ``params_type``), from ``initial_arrays``."""
        self.rounds = num_rounds
        self.params = params or self.params_type()
        self.check_params()
        self.arrays = initial_arrays
        self.aggregation = RobustAggregation()  # the run's, set by build_strategy (strategies/registry.py)
        self._pool: Clients | None = None  # set by the round loop
        self.history: dict[int, dict[str, float]] = {}  # round -> aggregate metrics
        # The last evaluate phase's summary (clients, aggregate, failed), which ``finish`` returns.
        self.evaluation: dict[str, Any] = {}

    @property
    def pool(self) -> Clients:
        """The clients this strategy runs with (set by the round loop before ``setup``)."""
        if self._pool is None:
            raise RuntimeError(f"{type(self).__name__} has no clients yet: run_rounds (server) sets them")
        return self._pool

    @pool.setter
    def pool(self, clients: Clients) -> None:
        self._pool = clients

    @classmethod
    def build(cls, cfg: Mapping[str, Any]) -> FederatedStrategy:
        """The strategy for run config ``cfg`` (validated), with its initial model."""
        return cls(num_rounds=cfg["num-rounds"], params=cls.params_type.from_config(cfg))

    # --- what subclasses provide ---------------------------------------------------------
    def check_params(self) -> None:
        """Cross-key checks of ``params`` the schema cannot express (ConfigError naming the key),
        at construction. Default: none."""

    def client_settings(self) -> dict[str, Any]:
        """What every message to a client carries besides the exchange's own values."""
        return {"client": self.client_handler, "method": self.method, **self.params.to_config()}

    @property
    def num_rounds(self) -> int:
        """Rounds the round loop runs (a strategy may add its own, e.g. FedRSPO+'s personalization)."""
        return self.rounds

    def setup(self) -> None:
        """What the state needs from the connected clients before round 0's phases (no exchange;
        e.g. the constrained step sizes, which depend on their number). Default: nothing."""

    def phases(self, server_round: int) -> list[Phase]:
        """The exchanges of round ``server_round`` in order (round 0: those before round 1, e.g. the
        calibration); the round loop runs them (see the module docs)."""
        raise NotImplementedError

    def round_config(self, server_round: int) -> ConfigRecord:
        """What every message of the round carries besides the settings: the round and the run's name
        (a client keeps its per-run state under it)."""
        return ConfigRecord({"server-round": server_round, "run-name": self.pool.run_name})

    def summed_phase(
        self,
        name: str,
        server_round: int,
        messages: Callable[[int], list[Message]],
        fold_sum: Callable[[int, list[Message], WeightedSum | None], Folded],
        draw: Callable[[int], Mapping[str, Any]] | None = None,
    ) -> Phase:
        """A phase whose replies may enter only a weighted sum (when :meth:`sums` says so for the
        round): in clear it folds :meth:`plain_aggregate` of the usable replies with ``fold_sum``."""

        def in_clear(t: int, replies: list[Message]) -> Folded:
            return fold_sum(t, replies, self.plain_aggregate(t, replies))

        summed = fold_sum if self.sums(server_round) else None
        return Phase(name, messages, in_clear, summed, self.unusable, draw)

    def finish(self) -> dict[str, Any]:
        """The run's result after the last round: ``{"clients": ..., "aggregate": ..., "failed": ...}``
        (default: the last evaluate phase's)."""
        return self.evaluation

    def final_models(self) -> dict[str, np.ndarray]:
        """Models to keep beside the results after ``finish`` (``models.npz``). Default: none."""
        return {}

    # --- summed phases: what secure aggregation and DP need (server/aggregation.py) -----------
    def sums(self, server_round: int) -> bool:
        """Whether round ``server_round``'s train replies enter only a weighted sum. Default: no."""
        return False

    def planned_sample(self, population: int) -> int:
        """Clients per summed round, for the DP accountant's plan before round 1. Default: all."""
        return population

    def sum_weight(self, partition_id: int) -> float | str:
        """a_j: a number, or the name of the reply metric that is the weight (``num-examples``)."""
        return 1.0

    def max_sum_weight(self, sizes: Mapping[int, int]) -> float:
        """The largest a_j a summed round can give, from the clients' training-set sizes by partition
        (secure aggregation bounds its code's weight slot by it). Default: 1 (numeric weights in [0, 1])."""
        return 1.0

    def sum_reference(self) -> dict[str, np.ndarray]:
        """What the round's train messages sent of the arrays a reply returns (x_j = reply - this)."""
        return {}

    def sum_layout(self) -> dict[str, tuple[int, ...]]:
        """The names and shapes of a reply's arrays (of x_j)."""
        raise NotImplementedError(f"{type(self).__name__} sums no round")

    def contribution(self, reply: Message) -> tuple[dict[str, np.ndarray] | None, str | None]:
        """A reply's arrays if they can enter the sum, else (None, why not)."""
        return checked_arrays(
            reply_arrays(reply.content), {k: np.zeros(s) for k, s in self.sum_layout().items()}
        )

    def unusable(self, reply: Message) -> str | None:
        """Why a reply's arrays cannot enter the sum (None: they can): a summed phase's ``check``;
        with ``aggregation-max-norm``, also an update x_j above it."""
        arrays, problem = self.contribution(reply)
        if arrays is None or not self.aggregation.max_norm:
            return problem
        return self.aggregation.norm_violation(contribution(self.sum_reference(), arrays))

    def aggregate_sum(self, server_round: int, replies: list[Message], summed: WeightedSum | None) -> Folded:
        """Fold the round's weighted sum (None: no usable reply, or secure aggregation failed);
        ``replies`` carry the clients' metrics."""
        raise NotImplementedError(f"{type(self).__name__} sums no round")

    def plain_sum(
        self, replies: Iterable[Message], weights: Mapping[int, float | str] | None = None
    ) -> WeightedSum | None:
        """The weighted sum of ``replies`` in clear, which the round loop has checked
        (:meth:`unusable`); weights by partition, or from :meth:`sum_weight`. None without replies."""
        total: dict[str, np.ndarray] = {}
        weight, used = 0.0, []
        for reply, pid, update in self._updates(replies):
            a = weights[pid] if weights is not None else self.sum_weight(pid)
            if isinstance(a, str):
                a = float(reply_metrics(reply.content)[a])
            for key, x in update.items():
                total[key] = total.get(key, 0.0) + a * x
            weight += a
            used.append(pid)
        return WeightedSum(total, weight, used) if used else None

    def plain_aggregate(self, server_round: int, replies: Iterable[Message]) -> WeightedSum | None:
        """A summed round in clear: :meth:`plain_sum`, or with a robust ``aggregation`` its estimate
        of the updates (strategies/robust.py) as a sum of weight 1, weighted by :meth:`sum_weight`
        where that is the strategy's number and equally where it is a client's claim (a reply
        metric). None without replies, or with too few for the rule (logged)."""
        if not self.aggregation.robust:
            return self.plain_sum(replies)
        found = self._updates(replies)
        if not found:
            return None
        weights = [1.0 if isinstance(a := self.sum_weight(pid), str) else float(a) for _, pid, _ in found]
        estimate, why = self.aggregation.estimate([update for _, _, update in found], weights)
        if estimate is None:
            self.log(f"round {server_round}: {why}")
            return None
        return WeightedSum(estimate, 1.0, [pid for _, pid, _ in found])

    def _updates(self, replies: Iterable[Message]) -> list[tuple[Message, int, dict[str, np.ndarray]]]:
        """Each reply with its partition and its update x_j (the round loop has checked them)."""
        reference = self.sum_reference()
        out = []
        for reply in replies:
            arrays, problem = self.contribution(reply)
            if arrays is None:  # a reply no check screened: a bug of the caller, not of the client
                raise ValueError(f"an unusable reply reached the sum ({problem})")
            out.append((reply, self.pool.partition_of(reply), contribution(reference, arrays)))
        return out

    def apply(self, state: Mapping[str, Any]) -> None:
        """Take the new values of the state a fold returned (the round loop, after the fold)."""
        for name, value in state.items():
            if name not in vars(self):
                raise AttributeError(f"{type(self).__name__} has no state {name!r} (a fold's Folded.state)")
            setattr(self, name, value)

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue after the current round (arrays as NumPy): the checkpoint."""
        return {"arrays": _arrays_to_numpy(self.arrays), "history": self.history, "final": self.evaluation}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.arrays = to_record(state["arrays"]) if state["arrays"] is not None else None
        self.history = dict(state["history"])
        self.evaluation = dict(state.get("final", {}))

    def summary(self) -> None:
        """Log the strategy's settings (the round loop calls this before round 0)."""
        self.log(f"{type(self).__name__}: {self.num_rounds} rounds")

    def log(self, text: str) -> None:
        (self._pool.log if self._pool is not None else print)(text)


def _arrays_to_numpy(arrays: ArrayRecord | None) -> dict[str, np.ndarray] | None:
    return None if arrays is None else to_numpy(arrays)


def ceil_fraction(fraction: float, n: int) -> int:
    """``ceil(fraction * n)`` clipped to [1, n] (rounded first: 0.4 * 20 is 8.000000000000002)."""
    return max(1, min(n, math.ceil(round(fraction * n, 9))))


def checked_arrays(
    received: ArrayRecord | None, model: Mapping[str, np.ndarray]
) -> tuple[dict[str, np.ndarray] | None, str | None]:
    """``received`` as NumPy arrays if it can be aggregated against ``model``, else (None, why not).

    Catches a reply without arrays, unreadable records, missing or extra arrays, wrong shapes and
    NaN/Inf values.
    """
    if received is None:
        return None, "the reply carries no arrays"
    try:
        got = to_numpy(received)
    except (ValueError, TypeError) as exc:  # a malformed packed layout from a broken client
        return None, f"arrays cannot be read ({exc})"
    keys, expected = set(got), set(model)
    if keys != expected:
        return None, (
            f"arrays do not match the model (missing {sorted(expected - keys)[:3]}, "
            f"unexpected {sorted(keys - expected)[:3]})"
        )
    for key, value in model.items():
        if got[key].shape != value.shape:
            return None, f"array {key!r} has shape {got[key].shape}, expected {value.shape}"
        if not np.all(np.isfinite(got[key])):
            return None, f"array {key!r} contains NaN or Inf"
    return got, None


def reply_metrics(content: RecordDict) -> dict[str, float]:
    """The scalar metrics a reply carries (its ``metrics`` MetricRecord; ints stay ints).

    KeyError when the reply has none; TypeError for a list where a number belongs.
    """
    out: dict[str, float] = {}
    for key, value in content.metric_records["metrics"].items():
        if isinstance(value, list):
            raise TypeError(f"metric {key!r}: expected a number, got a list")
        out[key] = value
    return out


def reply_arrays(content: RecordDict) -> ArrayRecord | None:
    """The reply's ``arrays`` ArrayRecord (None when it carries none)."""
    return content.array_records.get("arrays")
