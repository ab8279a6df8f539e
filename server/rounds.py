"""The round loop of every hetfed strategy: round 0 (or the checkpoint), the rounds' phases, finish.

A round is the strategy's list of phases (strategies/base.py ``Phase``): for each, this loop
builds its messages from the strategy's state, sends them (``ClientPool.send``, or the
:class:`~hetfed.server.aggregation.Summation` for a summed phase under secure aggregation or
DP), which records every client's failure in rounds.csv, and hands the replies to the phase's
fold; round 0 runs the setup phases (e.g. calibration). The strategy computes and never sends;
this loop sends and writes (rounds.csv, the checkpoint, models.npz). The checkpoint after a
round is the state (``state_dict``) of the strategy, the pool and the DP accountant, from which
a run resumes; an interrupt never splits rounds.csv from the checkpoint. The run's lifecycle
around it (config, results folder, summary) is server/app.py ``run_server``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from hetfed.server.aggregation import Summation
from hetfed.server.interrupts import deferred
from hetfed.server.pool import ClientPool
from hetfed.server.store import RunStore
from hetfed.strategies.base import FederatedStrategy, FederationError


def run_rounds(
    strategy: FederatedStrategy,
    pool: ClientPool,
    store: RunStore,
    *,
    checkpoint_every: int = 1,
    summation: Summation,
) -> dict[str, Any]:
    """Round 0 (or restore the checkpoint), the rounds, then ``finish``; returns the summary.

    rounds.csv and the checkpoint are written every ``checkpoint_every`` rounds (0: after the
    last only) and after the last round. With ``summation`` active (secure aggregation, DP), the
    rounds the strategy sums run through it (server/aggregation.py), as a phase's secure mean
    always does.
    """
    strategy.pool = pool
    # Krum's n >= 2f + 3, a trim of at least one client: against the plan, before anything is sent.
    strategy.aggregation.check_round_clients(strategy.planned_sample(len(pool.partitions)))
    if summation.active:
        summation.start(strategy)  # the DP budget is refused here, before anything is sent
    checkpoint = store.load_checkpoint()
    if checkpoint is not None:
        strategy.load_state_dict(checkpoint["strategy"])
        pool.load_state_dict(checkpoint.get("pool", {}))
        summation.load_state_dict(checkpoint.get("privacy", {}))
        first = int(checkpoint["round"]) + 1
        store.drop_rows_after(first - 1)
        strategy.log(f"resuming after round {first - 1} of {strategy.num_rounds}")
    else:
        strategy.summary()
        try:
            strategy.setup()
            metrics = run_phases(strategy, pool, 0, summation)
        except Exception:
            with deferred():  # a setup that fails still leaves its rows (each client's reason) on disk
                store.commit(0, strategy.num_rounds)
            raise
        if metrics:  # metrics of the initial model (e.g. switching's F(w_0), G(w_0))
            strategy.history[0] = metrics
            _server_row(store, 0, metrics)
        with deferred():
            store.commit(0, strategy.num_rounds)
            store.save_checkpoint(_checkpoint(0, strategy, pool, summation))
        first = 1
    store.segment_starts_at(first)
    for server_round in range(first, strategy.num_rounds + 1):
        pool.refresh()  # a restarted SuperNode is back under a new node id
        metrics = run_phases(strategy, pool, server_round, summation)
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
    if summation.active:
        summary["privacy"] = summation.report()
    if "clients" in summary and not summary["clients"]:
        reasons = "; ".join(f"{name}: {why}" for name, why in sorted(summary.get("failed", {}).items()))
        raise NoUsableClient(
            f"no client reported in the final evaluation ({reasons or 'no client took part'})", summary
        )
    models = strategy.final_models()
    if models:
        arrays: dict[str, Any] = dict(models)  # numpy's stub would take an ndarray for allow_pickle
        np.savez(store.path / "models.npz", **arrays)
        store.write_json("models.json", models_manifest(models, strategy.method, store))
    return summary


def run_phases(
    strategy: FederatedStrategy, pool: ClientPool, server_round: int, summation: Summation
) -> dict[str, Any]:
    """Round ``server_round``'s phases in order: apply each phase's draw (its sample), build its
    messages from the state, send them, reject the replies its ``check`` refuses (recorded in
    rounds.csv), fold the rest and apply the fold's :class:`~hetfed.strategies.base.Folded` (state,
    clients' columns); returns the server row's metrics (the folds', then the DP columns). A summed
    phase goes through ``summation`` when it is active (secure aggregation, DP), a phase's secure
    mean always (SecAgg+ whatever the run's settings)."""
    metrics: dict[str, Any] = {}
    for phase in strategy.phases(server_round):
        privacy: dict[str, float] = {}  # a summed phase's DP columns
        if phase.draw is not None:
            strategy.apply(phase.draw(server_round))
        messages = phase.messages(server_round)
        if not messages:
            continue
        if phase.fold_sum is not None and phase.secure_mean is not None:
            replies, summed = summation.secure_mean(messages, server_round, phase.secure_mean)
            folded = phase.fold_sum(server_round, replies, summed)
        elif phase.fold_sum is not None and summation.active:
            replies, summed, privacy = summation.run(strategy, messages, server_round, phase.check)
            folded = phase.fold_sum(server_round, replies, summed)
        elif phase.fold is not None:
            replies = pool.screen(pool.send(messages, server_round), phase.check)
            folded = phase.fold(server_round, replies)
        else:
            raise ValueError(f"phase {phase.name!r} has no fold in clear and no secure mean with fold_sum")
        strategy.apply(folded.state)
        for pid, columns in folded.notes.items():
            pool.note(pid, **columns)
        metrics.update({**folded.metrics, **privacy})
    return metrics


def _checkpoint(
    server_round: int, strategy: FederatedStrategy, pool: ClientPool, summation: Summation
) -> dict[str, Any]:
    """The checkpoint after ``server_round``: the strategy's, the pool's and the DP state."""
    out = {"round": server_round, "strategy": strategy.state_dict(), "pool": pool.state_dict()}
    return out | {"privacy": summation.state_dict()}


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
    """The round's aggregate metrics as the server's row of rounds.csv: status ``ok``, or ``no-update``
    when no client's reply could be used (``clients-used`` 0: each client's row says why)."""
    status, error = "ok", ""
    if metrics.get("clients-used") == 0:
        status, error = "no-update", "no client's reply could be used this round (see its rows)"
    store.add_row(
        round=server_round, exchange="round", client="server", status=status, error=error, **metrics
    )


def _fmt(metrics: Mapping[str, float]) -> str:
    return " ".join(f"{k}={v:.4g}" for k, v in metrics.items() if isinstance(v, int | float))
