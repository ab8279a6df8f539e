"""A silo's own ledger: every reply that left it, in ``<state-dir>/ledger.jsonl`` on the silo.

:func:`ledger_mod` is a Flower ClientApp mod (``ClientApp(mods=[ledger_mod])``, client/app.py):
it sees each reply as the ClientApp hands it back to the SuperNode and appends one JSON line
before it leaves: the time (UTC), the Flower run id, the hetfed run (``run-name``, ``run-id``
of the message's config), the round (the message's group id), the message type, the partition,
each array (``<record>/<name>``, as server/pool.py's traffic audit names them) with its shape,
dtype and the SHA-256 of its bytes (C order, so a silo can recompute it from the values), the
metric and config names, and for a ClientApp that raised, the error its reply carries.

The ledger is the silo's, not the server's: the server's traffic audit (``audit-traffic``) is
kept by the operator; this one by the silo admin, and the two can be compared reply by reply
(tests/test_ledger.py). A reply that cannot be recorded does not leave: the ClientApp fails
instead, with the reason. A node without a state dir keeps no ledger (it has no place on disk).
"""

from __future__ import annotations

import hashlib
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import Context, Message, RecordDict

from hetfed.client.session import node_path
from hetfed.client.silo_budget import DEFAULT_DELTA, RELEASE, epsilon, release_of, releases
from hetfed.jsonl import append_entry, read_entries
from hetfed.records import to_numpy

LEDGER_FILE = "ledger.jsonl"


class LedgerError(OSError):
    """The node's ledger cannot be written: the reply does not leave."""


def ledger_mod(
    message: Message, context: Context, call_next: Callable[[Message, Context], Message]
) -> Message:
    """Record the reply to ``message`` in the node's ledger, then let it go (a raise is recorded
    as the error reply Flower makes of it, and raised on)."""
    try:
        reply = call_next(message, context)
    except Exception as exc:
        _append(context, _entry(message, context, None, f"{type(exc).__name__}: {exc}"))
        raise
    _append(
        context, _entry(message, context, reply, str(reply.error.reason or "") if reply.has_error() else "")
    )
    return reply


def ledger_path(context: Context) -> Path | None:
    """``<state-dir>/ledger.jsonl`` of this node (None without a state dir)."""
    try:
        partition = int(context.node_config.get("partition-id", 0))
    except (TypeError, ValueError):  # the ClientApp itself refuses such a node (client/session.py)
        partition = 0
    value = context.node_config.get("state-dir") or context.run_config.get("node-state-dir", "")
    state_dir = node_path(value, partition)
    return state_dir / LEDGER_FILE if state_dir else None


def describe_reply(content: RecordDict) -> dict[str, Any]:
    """A reply's arrays (shape, dtype, SHA-256 of the C-order bytes), metric and config names."""
    arrays = {}
    for record_name, record in content.array_records.items():
        for name, value in to_numpy(record).items():
            arrays[f"{record_name}/{name}"] = {
                "shape": list(value.shape),
                "dtype": str(value.dtype),
                "sha256": hashlib.sha256(value.tobytes(order="C")).hexdigest(),
            }
    return {
        "arrays": arrays,
        "metrics": [f"{r}/{k}" for r, record in content.metric_records.items() for k in record],
        "configs": [f"{r}/{k}" for r, record in content.config_records.items() for k in record],
    }


def read(state_dir: str | Path) -> list[dict[str, Any]]:
    """The entries of ``state_dir/ledger.jsonl`` in order; ValueError naming a line that is not JSON."""
    path = Path(state_dir) / LEDGER_FILE
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist: this state dir's node recorded no reply")
    return read_entries(path)


def summary_lines(entries: Sequence[Mapping[str, Any]], delta: float = DEFAULT_DELTA) -> list[str]:
    """Per run: how many replies of each message type left, in which rounds, how many array bytes,
    which metric names, how many errors, and the local-DP releases with their epsilon at ``delta``;
    then (several runs) the total over every run, the silo's lifetime epsilon."""
    runs: dict[tuple[str, str], list[Mapping[str, Any]]] = defaultdict(list)
    for e in entries:
        runs[(str(e.get("run-name", "")), str(e.get("flower-run-id", "")))].append(e)
    lines = []
    for (name, flower_id), replies in runs.items():
        kinds = Counter(str(e["message-type"]) for e in replies)
        rounds = sorted({int(e["round"]) for e in replies if str(e["round"]).isdigit()})
        size = sum(_nbytes(a) for e in replies for a in e["arrays"].values())
        metrics = sorted({m for e in replies for m in e["metrics"]})
        errors = sum(bool(e.get("error")) for e in replies)
        span = f"rounds {rounds[0]}-{rounds[-1]}" if rounds else "no round"
        lines.append(
            f"run {name or '?'} (Flower run {flower_id}): {len(replies)} replies, {span}, "
            f"{replies[0]['time']} to {replies[-1]['time']}; "
            + ", ".join(f"{k} {n}" for k, n in sorted(kinds.items()))
            + f"; {size / 1024:.1f} KiB of arrays; {errors} errors; metrics: {', '.join(metrics) or 'none'}"
            + _budget(releases(replies), delta)
        )
    if len(runs) > 1 or not lines:
        lines.append(f"all runs: {sum(map(len, runs.values()))} replies" + _budget(releases(entries), delta))
    return lines


def _budget(multipliers: list[float], delta: float) -> str:
    """What a summary line says of this silo's local-DP releases (client/silo_budget.py)."""
    if not multipliers:
        return "; no local-DP release"
    spent = epsilon(multipliers, delta)
    return f"; {len(multipliers)} local-DP releases, epsilon {spent:.4g} at delta {delta:g}"


def _entry(message: Message, context: Context, reply: Message | None, error: str) -> dict[str, Any]:
    records = message.content.config_records
    config = records["config"] if "config" in records else {}
    group = message.metadata.group_id
    entry: dict[str, Any] = {
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "flower-run-id": str(context.run_id),
        "run-name": str(config.get("run-name", "")),
        "run-id": str(config.get("run-id", "")),
        "round": int(group) if group.isdigit() else group,
        "message-type": message.metadata.message_type,
        "partition-id": context.node_config.get("partition-id"),
    }
    content = reply.content if reply is not None and not reply.has_error() else RecordDict()
    entry |= describe_reply(content)
    if error:
        entry["error"] = error
    elif content.array_records and (z := release_of(config)) is not None:
        entry[RELEASE] = z  # a local-DP release of this silo's data (client/silo_budget.py counts them)
    return entry


def _append(context: Context, entry: Mapping[str, Any]) -> None:
    """Append ``entry`` to the node's ledger (nothing without a state dir); LedgerError if it cannot."""
    path = ledger_path(context)
    if path is None:
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        append_entry(path, entry)
    except OSError as exc:
        raise LedgerError(
            f"this silo's ledger {path} cannot be written ({exc}); the reply was not sent"
        ) from None


def _nbytes(array: Mapping[str, Any]) -> int:
    return int(np.prod(array["shape"], dtype=np.int64)) * np.dtype(array["dtype"]).itemsize
