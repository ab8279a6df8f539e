"""The round loop every hetfed strategy shares: Flower's hooks over partitions, with checkpoints.

A strategy is a Flower :class:`~flwr.serverapp.strategy.Strategy`: per round,
``configure_train`` builds the instructions (it may run a first exchange itself,
e.g. a query for scalars), ``aggregate_train`` folds the replies into the server
state, then ``configure_evaluate`` / ``aggregate_evaluate`` likewise. What Flower's
own ``start()`` lacks, :meth:`FederatedStrategy.run` adds: clients addressed by
partition (``self.pool``), a ``setup`` exchange before round 1 and a ``finish``
step after the last, a results row per client and exchange, and a checkpoint of
the complete server state after every round, from which a run resumes.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any, ClassVar

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result, Strategy

from hetfed.records import to_numpy, to_record
from server.interrupts import deferred
from server.pool import ClientPool
from server.store import RunStore


class FederatedStrategy(Strategy):
    """Base class: subclasses implement the four Flower hooks, ``setup``/``finish`` and state.

    The message contract: every instruction's ConfigRecord carries :meth:`client_settings`, the
    name of the client handler that serves the strategy (``client``) and the run-config values
    its handlers read (``client_keys``), so a client takes the method from the message and
    its run config only for its problem and data.
    """

    client_handler: ClassVar[str] = ""  # the client class that serves this strategy (client/app.py)
    client_keys: ClassVar[tuple[str, ...]] = ()  # run-config keys its handlers read

    def __init__(self, cfg: Mapping[str, Any], initial_arrays: ArrayRecord | None = None) -> None:
        self.cfg = dict(cfg)
        self.arrays = initial_arrays
        self.pool: ClientPool | None = None
        self.history: dict[int, dict[str, float]] = {}  # round -> aggregate metrics

    # --- what subclasses provide ---------------------------------------------------------
    def client_settings(self) -> dict[str, Any]:
        """What every message to a client carries besides the exchange's own values."""
        return {"client": self.client_handler, **{key: self.cfg[key] for key in self.client_keys}}

    @property
    def num_rounds(self) -> int:
        return int(self.cfg["num-rounds"])

    def setup(self) -> None:
        """Exchanges before round 1 (e.g. calibration). Default: none."""

    def finish(self) -> dict[str, Any]:
        """Final evaluation after the last round; returns ``{"clients": ..., "aggregate": ...}``."""
        return {"clients": {}, "aggregate": {}}

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue after the current round (arrays as NumPy)."""
        return {"arrays": _arrays_to_numpy(self.arrays), "history": self.history}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.arrays = to_record(state["arrays"]) if state["arrays"] is not None else None
        self.history = dict(state["history"])

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Default: no evaluate exchange."""
        return []

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        return None

    def summary(self) -> None:
        """Log the strategy's settings (Flower calls this at start)."""
        self.log(f"{type(self).__name__}: {self.num_rounds} rounds")

    # --- the loop ----------------------------------------------------------------------------
    def run(self, pool: ClientPool, store: RunStore) -> dict[str, Any]:
        """Setup (or restore the checkpoint), the rounds, then ``finish``; returns the summary."""
        self.pool = pool
        checkpoint = store.load_checkpoint()
        if checkpoint is not None:
            self.load_state_dict(checkpoint["strategy"])
            first = int(checkpoint["round"]) + 1
            store.drop_rows_after(first - 1)
            self.log(f"resuming after round {first - 1} of {self.num_rounds}")
        else:
            self.summary()
            self.setup()
            with deferred():  # an interrupt never splits rounds.csv from the checkpoint
                store.commit(0, self.num_rounds)
                store.save_checkpoint({"round": 0, "strategy": self.state_dict()})
            first = 1
        for server_round in range(first, self.num_rounds + 1):
            pool.refresh()  # a restarted SuperNode is back under a new node id
            metrics: dict[str, float] = {}
            config = ConfigRecord({"server-round": server_round, "run-name": store.run_name})
            train = list(self.configure_train(server_round, self.arrays, config, pool.grid))
            if train:
                arrays, agg = self.aggregate_train(server_round, pool.send(train, server_round))
                self.arrays = arrays if arrays is not None else self.arrays
                metrics.update(dict(agg or {}))
            evaluate = list(self.configure_evaluate(server_round, self.arrays, config, pool.grid))
            if evaluate:
                metrics.update(
                    dict(self.aggregate_evaluate(server_round, pool.send(evaluate, server_round)) or {})
                )
            self.history[server_round] = metrics
            store.add_row(
                round=server_round, exchange="round", client="server", status="ok", error="", **metrics
            )
            every = int(self.cfg.get("checkpoint-every", 1))
            if server_round == self.num_rounds or (every and server_round % every == 0):
                with deferred():
                    store.commit(server_round, self.num_rounds, metrics)
                    store.save_checkpoint({"round": server_round, "strategy": self.state_dict()})
                self.log(f"round {server_round}/{self.num_rounds} " + _fmt(metrics))
        summary = self.finish()
        if pool.left_out:  # clients left out at discovery (bad data): failed from the start
            summary = {**summary, "failed": {**pool.left_out, **summary.get("failed", {})}}
        return summary

    def start(  # Flower's entry point, for users who drive a strategy themselves
        self, grid: Grid, initial_arrays: ArrayRecord, num_rounds: int = 3, timeout: float = 3600, **_: Any
    ) -> Result:
        raise NotImplementedError(
            "hetfed strategies run through FederatedStrategy.run(pool, store) (see server/app.py)"
        )

    def log(self, text: str) -> None:
        (self.pool.log if self.pool is not None else print)(text)


def _fmt(metrics: Mapping[str, float]) -> str:
    return " ".join(f"{k}={v:.4g}" for k, v in metrics.items() if isinstance(v, int | float))


def _arrays_to_numpy(arrays: ArrayRecord | None) -> dict[str, np.ndarray] | None:
    return None if arrays is None else to_numpy(arrays)


def ceil_fraction(fraction: float, n: int) -> int:
    """``ceil(fraction * n)`` clipped to [1, n] (rounded first: 0.4 * 20 is 8.000000000000002)."""
    return max(1, min(n, math.ceil(round(fraction * n, 9))))


def checked_arrays(
    received: ArrayRecord, model: Mapping[str, np.ndarray]
) -> tuple[dict[str, np.ndarray] | None, str | None]:
    """``received`` as NumPy arrays if it can be aggregated against ``model``, else (None, why not).

    Catches unreadable records, missing or extra arrays, wrong shapes and NaN/Inf values.
    """
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


def weighted_mean(values: Mapping[int, float], weights: Mapping[int, float]) -> float:
    """``sum_j w_j v_j / sum_j w_j`` over the keys of ``values``."""
    total = sum(weights[k] for k in values)
    return sum(weights[k] * v for k, v in values.items()) / total
