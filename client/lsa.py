"""Client side of the LSA strategies (docs/algorithms.md 3): one agent's own parameter and TD(0) oracle.

Agent ``c`` holds its Garnet MDP (``session.data()``, a :class:`hetfed.problems.garnet.GarnetAgent`)
and never sends it anywhere. At iteration ``t`` (1-based, counted over all local steps) it
evaluates its residual at its current parameter,

    g_c^t(theta) = A_c(Z_c^t) theta - b_c(Z_c^t)    (mean over ``lsa-batch`` fresh samples),
    or, with ``lsa-exact``, A_bar_c theta - b_bar_c (noise-free),

where ``Z_c^t`` is drawn from :func:`sample_rng` ``(seed, c, t)``: seeded per client and
iteration, so every engine, a repeated round and a resumed run draw the same samples.

A client's state after each round (its parameter, last residual, control variate) lives in
:class:`RoundLog`, in the node's ``ClientState`` (on disk with a node ``state-dir``).

An agent that missed rounds (the server's message then carries ``last-round = k``) sat them
out: it continues from its state after round k, as the server continued with its reply of
round k (strategies/lsa.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np
from flwr.app import ConfigRecord, Context, MetricRecord, RecordDict

from hetfed.client.session import ClientSession
from hetfed.client.state import ClientState
from hetfed.methods.lsa import LSAParams
from hetfed.records import scalar, to_numpy, to_record

SAMPLE_STREAM = 11  # stream id of the TD(0) samples (other seeded streams use other ids)


def sample_rng(seed: int, partition_id: int, iteration: int) -> np.random.Generator:
    """The generator of agent ``partition_id``'s samples at iteration ``iteration`` (1-based)."""
    return np.random.default_rng(np.random.SeedSequence([seed, SAMPLE_STREAM, partition_id, iteration]))


class RoundLog:
    """A client's LSA state after recent rounds, so every round starts from the one before it.

    Round ``r`` starts from the state after round ``r - 1``. Kept: the last two rounds (a
    repeated round after a lost reply) and, at each of the last two multiples of
    ``checkpoint-every``, the latest round kept then (the server resumes from its last
    checkpoint, which may be one cadence back if it died while writing it; an agent that
    missed rounds continues from an earlier one). Round 0 is the initial state and never stored.

    Stored as one ``ClientState`` value group (``rounds`` and, per field, the rows of all kept
    rounds as one flat list of floats): a float64 survives the round trip through Python
    floats and JSON exactly, and the group costs ~20 us to write where an ArrayRecord, which
    serialises every array through ``np.save``, costs ~10x more; PF-LSA writes it every
    iteration.
    """

    GROUP = "lsa-log"

    def __init__(self, state: ClientState, checkpoint_every: int) -> None:
        self.state = state
        self.every = checkpoint_every
        stored = state.values(self.GROUP) or {"rounds": []}
        rounds = list(stored.pop("rounds"))
        rows = {name: np.array(flat, dtype=float).reshape(len(rounds), -1) for name, flat in stored.items()}
        self.entries: dict[int, dict[str, np.ndarray]] = {
            int(r): {name: rows[name][i] for name in rows} for i, r in enumerate(rounds)
        }

    def after(self, server_round: int) -> dict[str, np.ndarray] | None:
        """The state after ``server_round`` (None for round 0: the caller's initial state)."""
        if server_round == 0:
            return None
        if server_round not in self.entries:
            have = sorted(self.entries)
            raise ValueError(
                f"client state: round {server_round + 1} needs the state after round {server_round}, "
                f"but this client holds rounds {have or 'none'} (its state was lost or belongs to a "
                "later checkpoint; give the node a state-dir to survive restarts)"
            )
        return self.entries[server_round]

    def record(self, server_round: int, fields: dict[str, np.ndarray], start: int | None = None) -> None:
        """Store the state after ``server_round`` (continued from round ``start``, default the one before).

        Forgets what no repeat or resume can need.
        """
        self.entries[server_round] = fields
        # At each of the last two checkpoints, the latest state kept (an agent behind at a
        # checkpoint continues from an earlier round); the round this one continued from.
        last = server_round // self.every * self.every if self.every else 0
        marks = {max((r for r in self.entries if r <= m), default=0) for m in (last - self.every, last) if m}
        keep = marks | {server_round - 1 if start is None else start}
        self.entries = {r: f for r, f in sorted(self.entries.items()) if r >= server_round - 1 or r in keep}
        self.state.set_values(
            self.GROUP,
            {
                "rounds": list(self.entries),
                **{
                    # a field older rounds lack (state of an older hetfed) is NaN there
                    name: np.concatenate(
                        [f.get(name, np.full_like(fields[name], np.nan)) for f in self.entries.values()]
                    ).tolist()
                    for name in fields
                },
            },
        )


class LSAClient:
    """What every LSA client shares: identity, the residual oracle, the error metric, the log."""

    def __init__(self, session: ClientSession, context: Context, settings: Mapping[str, Any]) -> None:
        self.session = session
        self.cfg = session.cfg  # the problem's keys only (seed, data)
        self.settings = settings  # the message's ConfigRecord (strategy's client_settings)
        self.params = LSAParams.from_config(settings)  # the method's parameters, typed
        self.agent = session.data()
        self.context = context

    def query_info(self, content: RecordDict) -> RecordDict:
        """Who this client is; ``num-examples`` is the samples it draws per iteration."""
        return RecordDict(
            {
                "info": ConfigRecord(
                    {
                        "name": f"client-{self.session.partition_id:02d}",
                        "partition-id": self.session.partition_id,
                        "num-partitions": self.session.num_partitions,
                    }
                ),
                "metrics": MetricRecord({"num-examples": self.params.batch}),
            }
        )

    def residual(self, theta: np.ndarray, iteration: int) -> np.ndarray:
        """``g_c^t(theta) = A_c theta - b_c`` on iteration ``t``'s samples (or the exact means)."""
        if self.params.exact:
            return self.agent.A_bar @ theta - self.agent.b_bar
        rng = sample_rng(self.cfg["seed"], self.session.partition_id, iteration)
        return self.agent.g(theta, rng, self.params.batch)

    def log(self, config: ConfigRecord) -> RoundLog:
        state = self.session.state(self.context, config)
        return RoundLog(state, int(scalar(self.settings["checkpoint-every"])))

    @staticmethod
    def last_round(config: ConfigRecord, default: int) -> int:
        """The round whose state this message continues from: ``last-round`` if the agent missed rounds."""
        return int(scalar(config["last-round"])) if "last-round" in config else default

    def received(self, content: RecordDict, key: str) -> np.ndarray:
        """The server's array ``key``, checked: shape (d,) and finite."""
        arrays = to_numpy(content.array_records["arrays"]) if "arrays" in content else {}
        if key not in arrays:
            raise ValueError(f"the server's message has no array {key!r}")
        value = arrays[key]
        if value.shape != (self.agent.dim,) or not np.all(np.isfinite(value)):
            raise ValueError(
                f"array {key!r} from the server must hold {self.agent.dim} finite numbers; "
                f"got shape {value.shape}"
            )
        return value

    def metrics(self, theta: np.ndarray, report: bool) -> MetricRecord:
        """``sq-error = ||theta - theta_c*||^2`` when the server asks for it."""
        return MetricRecord({"sq-error": self.agent.error(theta)} if report else {})

    def keep_final(self, config: ConfigRecord, theta: np.ndarray) -> None:
        """Keep the final parameter: for PF-LSA and single-agent LSA, the agent's personal model."""
        self.session.state(self.context, config).set_arrays("final", {"theta": theta})


class PFLSAClient(LSAClient):
    """PF-LSA, pipelined: the message of iteration t carries ``g_bar^{t-1}``.

    train (iteration t = server round):
        theta_c <- theta_c - eta beta g_c^{t-1} - eta (1 - beta) g_bar^{t-1}    (t > 1)
        reply g_c^t = g_c^t(theta_c)
    evaluate (after the last iteration T): apply the update with ``g_bar^T`` and report the error.
    """

    def step(self, content: RecordDict, prev: dict[str, np.ndarray] | None) -> np.ndarray:
        """The parameter after applying the update the message completes."""
        if prev is None:
            return np.zeros(self.agent.dim)
        config = content.config_records["config"]
        eta, beta = float(scalar(config["eta"])), float(scalar(config["beta"]))
        g_bar = self.received(content, "g-bar")
        return prev["theta"] - eta * beta * prev["g"] - eta * (1.0 - beta) * g_bar

    def train(self, content: RecordDict) -> RecordDict:
        config = content.config_records["config"]
        t = int(scalar(config["server-round"]))
        log = self.log(config)
        done = self.last_round(config, t - 1)
        theta = self.step(content, log.after(done))
        g = self.residual(theta, t)
        log.record(t, {"theta": theta, "g": g}, start=done)
        metrics = self.metrics(theta, bool(config["report"]))
        return RecordDict({"arrays": to_record({"g": g}), "metrics": metrics})

    def evaluate(self, content: RecordDict) -> RecordDict:
        config = content.config_records["config"]
        done = self.last_round(config, int(scalar(config["server-round"])))
        theta = self.step(content, self.log(config).after(done))
        self.keep_final(config, theta)
        return RecordDict({"metrics": self.metrics(theta, True)})


class LocalStepsClient(LSAClient):
    """H local LSA steps per round: FedLSA, SCAFFLSA and single-agent LSA.

    Round r runs iterations ``(r - 1) H + 1 .. r H`` from its start ``theta``:

        theta <- theta - eta (g_c^t(theta) - xi_c)

    FedLSA / SCAFFLSA start from the shared parameter the server sends and reply with the
    local one; single-agent LSA starts from its own stored parameter and sends nothing.
    SCAFFLSA's control variate (xi_c = 0 in round 1) is first updated with the new shared
    parameter: ``xi_c <- xi_c + (theta_shared - theta_c^{local}) / (eta H)``. After m missed
    rounds, in each of which the server repeated its last local step
    ``delta_c = theta_c^{local} - theta_c^{start}``, it is
    ``xi_c + (theta_shared - theta_c^{local} - m delta_c) / (eta H)``: the sum of the updates of
    the rounds it missed, so that sum_c xi_c stays 0.
    """

    shared: ClassVar[bool] = True
    control_variates: ClassVar[bool] = False

    def start(self, content: RecordDict, prev: dict[str, np.ndarray] | None) -> np.ndarray:
        if self.shared:
            return self.received(content, "theta")
        return np.zeros(self.agent.dim) if prev is None else prev["theta"]

    def train(self, content: RecordDict) -> RecordDict:
        config = content.config_records["config"]
        r, eta = int(scalar(config["server-round"])), float(scalar(config["eta"]))
        steps = int(scalar(config["local-steps"]))
        stateful = self.control_variates or not self.shared
        log = self.log(config) if stateful else None
        done = self.last_round(config, r - 1)
        prev = log.after(done) if log is not None else None
        theta = start = self.start(content, prev)
        xi = np.zeros(self.agent.dim)
        if self.control_variates and prev is not None:
            xi = prev["xi"] + (start - prev["theta"]) / (eta * steps)
            if done < r - 1:  # the rounds it missed, each with its last local step repeated
                if not np.all(np.isfinite(prev.get("start", np.nan))):
                    raise ValueError(
                        f"client state: round {r} continues from round {done}, whose start parameter "
                        "this client did not keep (state written by an older hetfed)"
                    )
                xi = xi - (r - 1 - done) * (prev["theta"] - prev["start"]) / (eta * steps)
        for h in range(1, steps + 1):
            theta = theta - eta * (self.residual(theta, (r - 1) * steps + h) - xi)
        if log is not None:
            fields = {"theta": theta, "xi": xi, "start": start} if self.control_variates else {"theta": theta}
            log.record(r, fields, start=done)
        reply: dict[str, Any] = {"metrics": self.metrics(start, bool(config["report"]))}
        if self.shared:
            reply["arrays"] = to_record({"theta": theta})
        return RecordDict(reply)

    def evaluate(self, content: RecordDict) -> RecordDict:
        config = content.config_records["config"]
        if self.shared:
            theta = self.received(content, "theta")
        else:
            done = self.last_round(config, int(scalar(config["server-round"])))
            theta = self.start(content, self.log(config).after(done))
            self.keep_final(config, theta)
        return RecordDict({"metrics": self.metrics(theta, True)})


class FedLSAClient(LocalStepsClient):
    """FedLSA: local steps from the shared parameter; the server averages the parameters."""


class SCAFFLSAClient(LocalStepsClient):
    """SCAFFLSA: FedLSA's local steps corrected by the agent's control variate xi_c."""

    control_variates = True


class SingleLSAClient(LocalStepsClient):
    """Single-agent LSA: the agent alone, no communication (replies carry the error metric only)."""

    shared = False
