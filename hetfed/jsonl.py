"""Append-only JSON-lines logs (the federation's audit.jsonl, a silo's ledger.jsonl): one entry per
line, appended whole under an exclusive lock, read back in order."""

from __future__ import annotations

import fcntl
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any


def append_entry(path: Path, entry: Mapping[str, Any]) -> None:
    """Append ``entry`` as one line of ``path``; the lock keeps lines whole when several processes
    append (two commands on one federation, the inline engine's nodes). OSError if it cannot."""
    line = json.dumps(entry) + "\n"
    with open(path, "a", encoding="utf-8") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        f.write(line)


def read_entries(path: Path, why: str = "") -> list[dict[str, Any]]:
    """The entries of ``path`` in order; ValueError naming the first line that is not JSON (and
    ``why`` that matters)."""
    entries = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        try:
            entries.append(json.loads(line))
        except json.JSONDecodeError:
            raise ValueError(f"{path} line {number} is not JSON{why}") from None
    return entries
