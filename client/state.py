"""Per-client state that survives across rounds, and across a SuperNode restart.

Flower keeps ``context.state`` (a RecordDict) per run and node in the SuperNode's
memory; every message in a deployment runs in a fresh ClientApp process, so
module globals do not persist, and a restarted SuperNode starts with an empty
``context.state``. :class:`ClientState` therefore stores named groups of arrays
and scalar values in ``context.state`` and, when the node config sets
``state-dir``, mirrors every group to ``<state-dir>/<run-key>/<group>.npz|.json``
and restores from there when ``context.state`` is empty. Arrays are stored as NumPy
(``.npz``), values as JSON, so a NumPy-only client never imports torch; only the optimizer
helpers import it.

The run key is ``<run-name>.<run-id>-p<partition>`` (:func:`run_key`): the run id is made once by
the server when a run starts (config.json ``run-id``) and kept across resumes, so a new run that
reuses a name never reads an earlier run's state. Each folder holds ``run.json`` (run name, id,
partition, when it was made), which :func:`list_states` reads for ``hetfed federation state``
and ``hetfed decide``.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from flwr.app import ConfigRecord, Context

from hetfed.records import to_numpy, to_record

if TYPE_CHECKING:
    import torch

    from hetfed.client.adam import Adam

_ARRAYS = "arrays:"
_VALUES = "values:"
RUN_FILE = "run.json"
ROUND_KEY = "@round"  # in arrays kept per round (set_round_arrays): the round they are the state after
PREVIOUS = "@previous"  # the version before the current one


def run_key(run_name: str, run_id: str, partition_id: int) -> str:
    """The key of one partition's state for one run: ``<run-name>.<run-id>-p<partition>``
    (``<run-name>-p<partition>`` for a run recorded before runs had ids)."""
    return f"{run_name}.{run_id}-p{partition_id}" if run_id else f"{run_name}-p{partition_id}"


class ClientState:
    """Named groups of arrays (``ArrayRecord``) and values (``ConfigRecord``) of one client."""

    def __init__(
        self,
        context: Context,
        run_key: str,
        state_dir: str | os.PathLike | None,
        about: Mapping[str, Any] | None = None,
    ) -> None:
        """``about`` (run name, id, partition) is written to the folder's ``run.json`` with its
        first group."""
        if not run_key or "/" in run_key or run_key.startswith("."):
            raise ValueError(f"client state: invalid run key {run_key!r}")
        self._state = context.state
        self._run_key = run_key
        self._dir = Path(state_dir) / run_key if state_dir else None
        self._about = dict(about or {})
        if self._dir is not None and self._dir.is_dir() and not self._groups():
            self._restore()
        self.found = bool(self._groups())  # whether this client held state for the run when opened
        self.note = ""  # why state it holds cannot be used (round_arrays); the server is told

    @property
    def directory(self) -> Path | None:
        """Where the state is mirrored on disk (None: memory only)."""
        return self._dir

    def arrays(self, name: str) -> dict[str, np.ndarray] | None:
        """The arrays stored under ``name``, or None."""
        key = f"{_ARRAYS}{self._run_key}:{name}"
        if key not in self._state:
            return None
        return to_numpy(self._state.array_records[key])

    def set_arrays(self, name: str, arrays: Mapping[str, np.ndarray | torch.Tensor]) -> None:
        """Store ``arrays`` under ``name`` (replacing what was there) and mirror to disk."""
        record = to_record(arrays)
        self._state[f"{_ARRAYS}{self._run_key}:{name}"] = record
        plain = to_numpy(record)
        if self._dir is not None:
            self._describe()
            _atomic_write(self._dir / f"{name}.npz", lambda f: np.savez(f, **plain))  # type: ignore[arg-type]  # numpy's stub: **kwds may be allow_pickle

    def values(self, name: str) -> dict[str, Any] | None:
        """The scalar values stored under ``name``, or None."""
        key = f"{_VALUES}{self._run_key}:{name}"
        return dict(self._state[key]) if key in self._state else None

    def set_values(self, name: str, values: Mapping[str, Any]) -> None:
        """Store scalar/str/list ``values`` under ``name`` and mirror to disk."""
        plain = dict(values)
        self._state[f"{_VALUES}{self._run_key}:{name}"] = ConfigRecord(plain)
        if self._dir is not None:
            self._describe()
            _atomic_write(self._dir / f"{name}.json", lambda f: f.write(json.dumps(plain).encode()))

    def round_arrays(self, name: str, server_round: int) -> dict[str, np.ndarray] | None:
        """The arrays :meth:`set_round_arrays` kept under ``name``, as they were before
        ``server_round``: a round the server redoes after a resume (its checkpoint is a round
        behind what the client wrote) starts from the state it started from the first time. Two
        versions are kept; state newer than both is unusable, and :attr:`note` says why."""
        newer = False
        for slot in (name, f"{name}{PREVIOUS}"):
            arrays = self.arrays(slot)
            if arrays is None:
                continue
            if int(arrays.pop(ROUND_KEY, -1)) < server_round:
                return arrays
            newer = True
        if newer:
            self.note = (
                f"its {name} state was written after round {server_round - 1}, where the server "
                "resumed, and the version before it is gone"
            )
        return None

    def set_round_arrays(
        self, name: str, arrays: Mapping[str, np.ndarray | torch.Tensor], server_round: int
    ) -> None:
        """Keep ``arrays`` as ``name``'s state after ``server_round``, and the version this round
        started from (each version is one atomic file that records its round)."""
        current = self.arrays(name)
        if current is not None and int(current.get(ROUND_KEY, -1)) < server_round:
            self.set_arrays(f"{name}{PREVIOUS}", current)
        self.set_arrays(name, {**arrays, ROUND_KEY: np.array(server_round)})

    @property
    def kept(self) -> bool:
        """Whether this client now holds state for the run."""
        return bool(self._groups())

    def _describe(self) -> None:
        """Write ``run.json`` (which run this folder belongs to) once, before the first group."""
        assert self._dir is not None
        if not (self._dir / RUN_FILE).exists():
            about = {**self._about, "created": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
            _atomic_write(self._dir / RUN_FILE, lambda f: f.write(json.dumps(about).encode()))

    def _groups(self) -> list[str]:
        marks = (f"{_ARRAYS}{self._run_key}:", f"{_VALUES}{self._run_key}:")
        return [k for k in self._state if k.startswith(marks)]

    def _restore(self) -> None:
        assert self._dir is not None
        for path in sorted(self._dir.glob("*.npz")):
            with np.load(path) as data:
                self._state[f"{_ARRAYS}{self._run_key}:{path.stem}"] = to_record(
                    {k: data[k] for k in data.files}
                )
        for path in sorted(p for p in self._dir.glob("*.json") if p.name != RUN_FILE):
            self._state[f"{_VALUES}{self._run_key}:{path.stem}"] = ConfigRecord(json.loads(path.read_text()))


@dataclass(frozen=True)
class StateFolder:
    """One run's state of one partition in a silo's state dir."""

    path: Path
    run_name: str
    run_id: str
    partition_id: int | None
    created: str
    size: int  # bytes

    @property
    def key(self) -> str:
        """``<run-name>.<run-id>``: names this run's state even when another run reused its name."""
        return f"{self.run_name}.{self.run_id}" if self.run_id else self.run_name


def list_states(state_dir: Path) -> list[StateFolder]:
    """Every run state in ``state_dir`` (sorted by folder name), from each folder's ``run.json``;
    a folder without one (kept before runs had ids) is named by its folder, ``<run>-p<i>``."""
    out = []
    for path in sorted(p for p in state_dir.iterdir() if p.is_dir()) if state_dir.is_dir() else []:
        try:
            about = json.loads((path / RUN_FILE).read_text())
        except (OSError, ValueError):
            about = {}
        name, _, part = path.name.rpartition("-p")
        partition = about.get("partition-id", int(part) if part.isdigit() else None)
        size = sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
        modified = time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(path.stat().st_mtime))
        run_name, run_id = str(about.get("run-name", name)), str(about.get("run-id", ""))
        out.append(StateFolder(path, run_name, run_id, partition, str(about.get("created", modified)), size))
    return out


def optimizer_to_state(optimizer: Adam) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Split an optimizer's state_dict into arrays (moments, steps) and JSON values (groups)."""
    import torch  # only clients with torch models call this; the LSA clients never import torch

    sd = optimizer.state_dict()
    arrays = {
        f"{idx}.{name}": value.detach().cpu().numpy().copy() if isinstance(value, torch.Tensor) else value
        for idx, slot in sd["state"].items()
        for name, value in slot.items()
    }
    return arrays, {"param_groups": json.dumps(sd["param_groups"])}


def optimizer_from_state(
    optimizer: Adam, arrays: Mapping[str, np.ndarray], values: Mapping[str, Any]
) -> None:
    """Inverse of :func:`optimizer_to_state`: load the saved state into ``optimizer``."""
    import torch

    state: dict[int, dict[str, torch.Tensor]] = {}
    for key, value in arrays.items():
        idx, name = key.split(".", 1)
        state.setdefault(int(idx), {})[name] = torch.from_numpy(np.array(value))
    optimizer.load_state_dict({"state": state, "param_groups": json.loads(values["param_groups"])})


def _atomic_write(path: Path, write: Any) -> None:
    """Write through a temporary file and rename, so a crash never leaves half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as f:
        write(f)
    os.replace(tmp, path)
