"""``audit.jsonl``: every run started, stopped or resumed on a federation, kept beside its state.

One JSON line per event, appended (never rewritten) to ``<federation dir>/audit.jsonl`` on the
SuperLink host by the command that caused it: ``hetfed run --engine deployment`` (``start``, or
``resume`` for ``--resume``) and its SIGINT / SIGTERM, which stops the run on the SuperLink
(``stop``); ``hetfed federation down`` (a ``stop`` for each run it ends). Each line holds when
(UTC), the event, the run's id and name, the command line with its user, host and pid, the run
config, the FAB hash, id and version the SuperLink holds for the run, and the nodes the SuperLink
admits at that moment with their public keys (both read from Flower's Control API: ``ListRuns``,
``ListNodes``). What could not be asked (a SuperLink
that stopped answering) is written as ``unanswered`` with the reason, never left out silently.

Flower's open-source SuperLink keeps no such log, and runs submitted with a bare ``flwr run`` do
not pass through hetfed: ``hetfed federation audit`` lists them as runs no entry names.
"""

from __future__ import annotations

import getpass
import hashlib
import os
import shlex
import socket
import sys
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from hetfed.engines.flower import LocalFlower
from hetfed.jsonl import append_entry, read_entries

AUDIT_FILE = "audit.jsonl"
EVENTS = ("start", "resume", "stop")
GONE = ("unregistered", "deleted")  # node states that are no longer admitted


def record(
    flower: LocalFlower, event: str, run_id: str, run_config: Mapping[str, Any], detail: str = ""
) -> dict[str, Any]:
    """Append one ``event`` of run ``run_id`` ("": not known) to ``flower.root/audit.jsonl``; returns
    the entry."""
    if event not in EVENTS:
        raise ValueError(f"audit event {event!r}: one of {', '.join(EVENTS)}")
    entry: dict[str, Any] = {
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "event": event,
        "run-id": str(run_id),
        "run-name": str(run_config.get("run-name", "")),
        "command": shlex.join(sys.argv),
        "user": getpass.getuser(),
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "superlink": flower.address,
    }
    if detail:
        entry["detail"] = detail
    entry["run-config"] = dict(run_config)
    try:
        entry |= superlink_view(flower, int(run_id) if run_id else None)
    except Exception as exc:  # the event happened all the same: record it, and why the rest is missing
        entry["unanswered"] = f"{type(exc).__name__}: {exc}"
    append_entry(flower.root / AUDIT_FILE, entry)
    return entry


def superlink_view(flower: LocalFlower, run_id: int | None = None) -> dict[str, Any]:
    """What the SuperLink says now: the run's FAB (hash, id, version) when ``run_id`` is given, and
    the admitted nodes (``node-id``, ``status``, ``name``, ``public-key`` PEM, ``key-sha256``)."""
    if not flower.healthy():
        raise ConnectionError(f"the SuperLink does not answer {flower.health_url}")
    with flower.control() as control:
        out: dict[str, Any] = {}
        if run_id is not None:
            run = control.runs(run_id)[run_id]
            out |= {"fab-hash": run.fab_hash, "fab-id": run.fab_id, "fab-version": run.fab_version}
        nodes = control.nodes()
    out["nodes"] = [
        {
            "node-id": str(n.node_id),
            "status": n.status,
            "name": n.name,
            "public-key": n.public_key.decode("ascii", errors="replace"),
            "key-sha256": hashlib.sha256(n.public_key).hexdigest(),
        }
        for n in nodes
        if n.status not in GONE
    ]
    return out


def superlink_runs(flower: LocalFlower) -> dict[str, tuple[str, dict[str, Any]]]:
    """Every run the SuperLink knows: run id -> its status (``finished:completed``, ...) and the run
    config it was submitted with."""
    from flwr.common.serde import user_config_from_proto

    from hetfed.engines.control_api import run_status_text

    with flower.control() as control:
        runs = control.runs()
    return {
        str(k): (
            run_status_text(r),
            dict(user_config_from_proto(r.override_config)),
        )
        for k, r in runs.items()
    }


def record_down(flower: LocalFlower) -> list[dict[str, Any]]:
    """A ``stop`` for each run the SuperLink has not finished: ``hetfed federation down`` ends them
    all. None when the SuperLink does not answer (no run goes on without it); a dead one refuses at
    once, a busy one may take seconds (a loaded machine: the entry must not be lost)."""
    if not flower.healthy(timeout=20.0):
        return []
    try:
        runs = superlink_runs(flower)
    except Exception as exc:  # `down` goes on all the same: one entry says which runs are unknown
        why = f"the SuperLink did not say which ({type(exc).__name__}: {exc})"
        return [record(flower, "stop", "", {}, detail=f"ended by hetfed federation down; {why}")]
    return [
        record(flower, "stop", run_id, config, detail="ended by hetfed federation down")
        for run_id, (status, config) in runs.items()
        if not status.startswith("finished")
    ]


def read(root: Path) -> list[dict[str, Any]]:
    """The entries of ``root/audit.jsonl`` in order ([] when there is none yet)."""
    path = Path(root) / AUDIT_FILE
    if not path.exists():
        return []
    return read_entries(path, ": the audit file was altered")


def describe(entry: Mapping[str, Any]) -> str:
    """One line: when, what, which run, which build, which nodes, by whom and which command."""
    fab = entry.get("fab-hash")
    build = f"FAB {fab[:12]}" if fab else f"FAB unknown ({entry.get('unanswered', 'not recorded')})"
    nodes = entry.get("nodes")
    keys = (
        f"{len(nodes)} nodes admitted (keys {', '.join(n['key-sha256'][:8] for n in nodes)})"
        if nodes is not None
        else "nodes unknown"
    )
    detail = f" [{entry['detail']}]" if entry.get("detail") else ""
    return (
        f"{entry['time']}  {entry['event']:<6}  run {entry['run-id']} ({entry['run-name']})  {build}  "
        f"{keys}  by {entry['user']}@{entry['host']}: {entry['command']}{detail}"
    )


def unaudited(entries: Iterable[Mapping[str, Any]], runs: Mapping[str, tuple[str, Any]]) -> list[str]:
    """The SuperLink's runs that no entry names (submitted without hetfed, e.g. a bare ``flwr run``)."""
    named = {str(e["run-id"]) for e in entries}
    return [f"run {run_id} ({status})" for run_id, (status, _) in sorted(runs.items()) if run_id not in named]
