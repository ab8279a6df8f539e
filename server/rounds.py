"""The round loop of every hetfed strategy: setup (or the checkpoint), Flower's hooks per round, finish.

What Flower's own ``Strategy.start()`` lacks, and a hetfed run needs: clients addressed by
partition (the :class:`~hetfed.server.pool.ClientPool`), a ``setup`` exchange before round 1 and
a ``finish`` step after the last, a results row per client and exchange, and a checkpoint
of the strategy's complete state after every round (``checkpoint-every``), from which a
run resumes. The strategy computes; this loop writes (rounds.csv, the checkpoint,
models.npz), and an interrupt never splits rounds.csv from the checkpoint.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from logging import INFO
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, MetricRecord, MetricRecordValues
from flwr.common import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result

from hetfed.server.aggregation import Summation
from hetfed.server.interrupts import deferred
from hetfed.server.pool import ClientPool
from hetfed.server.report import report_markdown
from hetfed.server.store import RunStore
from hetfed.strategies.base import FederatedStrategy, FederationError


def run_rounds(
    strategy: FederatedStrategy,
    pool: ClientPool,
    store: RunStore,
    *,
    checkpoint_every: int = 1,
    summation: Summation | None = None,
) -> dict[str, Any]:
    """Setup (or restore the checkpoint), the rounds, then ``finish``; returns the summary.

    rounds.csv and the checkpoint are written every ``checkpoint_every`` rounds (0: after the
    last only) and after the last round. With ``summation`` active (secure aggregation, DP), the
    rounds the strategy sums run through it (server/aggregation.py).
    """
    strategy.pool = pool
    summing = summation is not None and summation.active
    if summation is not None and summing:
        summation.start(strategy)  # the DP budget is refused here, before anything is sent
    checkpoint = store.load_checkpoint()
    if checkpoint is not None:
        strategy.load_state_dict(checkpoint["strategy"])
        pool.load_state_dict(checkpoint.get("pool", {}))
        if summation is not None:
            summation.load_state_dict(checkpoint.get("privacy", {}))
        first = int(checkpoint["round"]) + 1
        store.drop_rows_after(first - 1)
        strategy.log(f"resuming after round {first - 1} of {strategy.num_rounds}")
    else:
        strategy.summary()
        try:
            strategy.setup()
        except Exception:
            with deferred():  # a setup that fails still leaves its rows (each client's reason) on disk
                store.commit(0, strategy.num_rounds)
            raise
        if 0 in strategy.history:  # metrics of the initial model (e.g. switching's F(w_0), G(w_0))
            _server_row(store, 0, strategy.history[0])
        with deferred():
            store.commit(0, strategy.num_rounds)
            store.save_checkpoint(_checkpoint(0, strategy, pool, summation))
        first = 1
    store.segment_starts_at(first)
    for server_round in range(first, strategy.num_rounds + 1):
        pool.refresh()  # a restarted SuperNode is back under a new node id
        metrics: dict[str, Any] = {}  # the aggregates' MetricRecord values (numbers)
        config = ConfigRecord({"server-round": server_round, "run-name": store.run_name})
        # strategy.arrays is None for the strategies without a shared model (PF-LSA, single-agent
        # LSA), which accept it; FederatedStrategy declares Flower's ArrayRecord-only signature.
        train = list(
            strategy.configure_train(server_round, strategy.arrays, config, pool.grid)  # type: ignore[arg-type]
        )
        if train and summation is not None and summing and strategy.sums(server_round):
            replies, summed, privacy = summation.run(strategy, train, server_round)
            arrays, agg = strategy.aggregate_sum(server_round, replies, summed)
            strategy.arrays = arrays if arrays is not None else strategy.arrays
            metrics.update({**dict(agg or {}), **privacy})
        elif train:
            arrays, agg = strategy.aggregate_train(server_round, pool.send(train, server_round))
            strategy.arrays = arrays if arrays is not None else strategy.arrays
            metrics.update(dict(agg or {}))
        evaluate = list(
            strategy.configure_evaluate(server_round, strategy.arrays, config, pool.grid)  # type: ignore[arg-type]
        )
        if evaluate:
            replies = pool.send(evaluate, server_round)
            metrics.update(dict(strategy.aggregate_evaluate(server_round, replies) or {}))
        strategy.history[server_round] = metrics
        _server_row(store, server_round, metrics)
        if server_round == strategy.num_rounds or (checkpoint_every and server_round % checkpoint_every == 0):
            with deferred():
                store.commit(server_round, strategy.num_rounds, metrics)
                store.save_checkpoint(_checkpoint(server_round, strategy, pool, summation))
            strategy.log(f"round {server_round}/{strategy.num_rounds} " + _fmt(metrics))
    summary = strategy.finish()
    if pool.left_out:  # clients left out at discovery (bad data): failed from the start
        summary = {**summary, "failed": {**pool.left_out, **summary.get("failed", {})}}
    summary = {**summary, **client_incidents(store.rows)}
    if summation is not None and summing:
        summary["privacy"] = summation.report()
    if "clients" in summary and not summary["clients"]:
        reasons = "; ".join(f"{name}: {why}" for name, why in sorted(summary.get("failed", {}).items()))
        raise NoUsableClient(
            f"no client reported in the final evaluation ({reasons or 'no client took part'})", summary
        )
    models = strategy.final_models()
    if models:
        np.savez(store.path / "models.npz", **models)  # type: ignore[arg-type]  # numpy's stub: **kwds may be allow_pickle
        store.write_json("models.json", models_manifest(models, strategy.method, store))
    return summary


def _checkpoint(
    server_round: int, strategy: FederatedStrategy, pool: ClientPool, summation: Summation | None
) -> dict[str, Any]:
    """The checkpoint after ``server_round``: the strategy's, the pool's and the DP state."""
    out = {"round": server_round, "strategy": strategy.state_dict(), "pool": pool.state_dict()}
    return out | ({"privacy": summation.state_dict()} if summation is not None else {})


class NoUsableClient(FederationError):
    """A run whose final evaluation had no client: it failed, whatever its rounds did. Holds the
    summary so far (``summary``: who failed and why, in which rounds)."""

    def __init__(self, message: str, summary: dict[str, Any]) -> None:
        super().__init__(message)
        self.summary = summary


def client_incidents(rows: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, list[int]]]:
    """From the results rows: ``failed-rounds`` (client -> rounds in which it failed or its reply
    was rejected, also when it recovered) and ``state-lost`` (client -> rounds in which it had
    lost the state it kept; server/pool.py ``_client_state``); only those that occurred."""
    out: dict[str, dict[str, set[int]]] = {"failed-rounds": {}, "state-lost": {}}
    for row in rows:
        if row.get("client") == "server" or not str(row.get("round", "")).strip().lstrip("-").isdigit():
            continue
        if row.get("status") in ("failed", "rejected"):
            out["failed-rounds"].setdefault(str(row["client"]), set()).add(int(row["round"]))
        elif str(row.get("error", "")).startswith("client state lost"):
            out["state-lost"].setdefault(str(row["client"]), set()).add(int(row["round"]))
    return {key: {c: sorted(r) for c, r in sorted(found.items())} for key, found in out.items() if found}


def models_manifest(models: Mapping[str, np.ndarray], method: str, store: RunStore) -> dict[str, Any]:
    """``models.json``: each final model's manifest (hetfed.problems.models.model_manifest), as a silo's
    state has it: the run, method, loss, and the feature and variable names the run config gives."""
    from hetfed.problems.models import model_manifest
    from hetfed.problems.registry import model_io_names

    cfg = store.read_config()["config"]
    features, variables = model_io_names(cfg)
    by_model: dict[str, dict[str, np.ndarray]] = {}
    for key, array in models.items():
        name, _, part = key.partition("/")
        by_model.setdefault(name, {})[part] = array
    about = {"run": store.run_name, "method": method, "loss": cfg.get("loss", "")}
    about["problem"] = cfg.get("problem", "")
    return {
        name: model_manifest(arrays, **about, features=list(features), variables=list(variables))
        for name, arrays in by_model.items()
    }


def _server_row(store: RunStore, server_round: int, metrics: Mapping[str, float]) -> None:
    """The round's aggregate metrics as the server's row of rounds.csv."""
    store.add_row(round=server_round, exchange="round", client="server", status="ok", error="", **metrics)


def _fmt(metrics: Mapping[str, float]) -> str:
    return " ".join(f"{k}={v:.4g}" for k, v in metrics.items() if isinstance(v, int | float))


def start_on_grid(
    strategy: FederatedStrategy,
    grid: Grid,
    initial_arrays: ArrayRecord | None,
    *,
    timeout: float,
    results_dir: str,
    run_name: str,
) -> Result:
    """A run of ``strategy`` from plain Flower code (``strategy.start(grid, ...)``), as Flower's own
    ``Strategy.start`` runs, with hetfed's clients, results folder and checkpoints.

    The nodes are hetfed ClientApps (each with its ``partition-id``); all that connect within
    ``timeout`` seconds take part, and every exchange waits at most ``timeout`` seconds.
    Results go to ``results_dir/run_name`` (rounds.csv, checkpoint, summary.json, report.md).
    The Result holds the final arrays and, per round, the round's aggregate metrics; the last
    round's evaluate metrics are the summary's aggregate.
    """
    if initial_arrays is not None:
        strategy.arrays = initial_arrays
    name = run_name or f"{type(strategy).__name__.lower()}-{time.strftime('%Y%m%d-%H%M%S')}"
    store = RunStore(results_dir, name)
    settings = {"strategy-class": type(strategy).__name__, "num-rounds": strategy.rounds}
    store.write_config({**settings, "client": strategy.client_settings()}, engine=type(grid).__name__)
    store.begin_segment(type(grid).__name__, resumed=False)
    status = "failed"
    summary: dict[str, Any] = {}
    try:
        pool = ClientPool(
            grid, store, required=0, wait_timeout=timeout, round_timeout=timeout,
            log=lambda text: log(INFO, "[%s] %s", name, text), settings=strategy.client_settings(),
        )
        pool.connect(name)
        summary = run_rounds(strategy, pool, store)
        status = "completed"
    finally:
        store.end_segment(status)
        full = {"run-name": name, "status": status, **summary}
        store.write_summary(full, report_markdown(f"{name} ({status})", full))
    numeric = {r: MetricRecord(_numbers(m)) for r, m in strategy.history.items() if r > 0}
    final = _numbers(summary.get("aggregate", {}))
    return Result(
        arrays=strategy.arrays if strategy.arrays is not None else ArrayRecord(),
        train_metrics_clientapp=numeric,
        evaluate_metrics_clientapp={strategy.num_rounds: MetricRecord(final)} if final else {},
    )


def _numbers(metrics: Mapping[str, Any]) -> dict[str, MetricRecordValues]:
    return {k: v for k, v in metrics.items() if isinstance(v, int | float) and not isinstance(v, bool)}
