"""The results store: one folder per run, written as the run goes, never half-written.

``results/<run-name>/`` holds

- ``config.json``: the full resolved run config, seeds, engine, package versions;
- ``rounds.csv``: one row per round, exchange and client (plus ``server`` rows for
  round-level quantities), rewritten atomically after every round;
- ``local-rounds.csv``: one row per local round t of a reply that covers several (FedRSPO+'s
  personalization reports its rounds' values as ``r{t}-<metric>``; here ``local-round`` = t);
- ``progress.json``: rounds done / total and the last aggregate metrics;
- ``summary.json`` and ``report.md``: per-client and aggregate final metrics;
- ``checkpoint.pt``: the server's state after the last completed round (resume);
- ``segments.jsonl``: one line when a segment (the first run or a resume) starts, one with the
  first round it runs, one when it ends;
- ``summary.segment-<k>.json``, ``report.segment-<k>.md``: the summary and report segment k wrote,
  kept when a later segment resumes the run;
- ``traffic.jsonl`` (with ``audit-traffic``): the shape of every reply;
- ``.writer.lock``: empty; the process writing a segment holds an exclusive ``flock`` on it,
  so a second ServerApp (a resume while an orphaned earlier one still runs) is refused
  instead of writing the same files; the kernel releases it when the writer dies.

Every file is written to a temporary name and renamed, so a crash leaves the
previous complete version in place. :class:`RunResult` reads a run folder back: everything that
reads runs (reports, reproductions, tools) goes through it, so the files' layout is known here only.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import platform
import re
import sys
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hetfed import versions
from hetfed.paths import exclusive_lock, flock_holder

PACKAGES = ("hetfed", "flwr", "torch", "numpy", "scipy", "highspy", "osqp", "daqp", "qpth", "ray")
FIRST_COLUMNS = ("round", "exchange", "partition-id", "client", "status", "error")
LOCAL_COLUMNS = ("round", "exchange", "partition-id", "client", "local-round")
LOCAL_ROUND = re.compile(r"^r(\d+)-(.+)$")  # a reply's value of one local round t: r{t}-{metric}


def split_local_rounds(metrics: Mapping[str, Any]) -> tuple[dict[str, Any], dict[int, dict[str, Any]]]:
    """A reply's metrics without the values of its local rounds (``r{t}-<metric>``), and those by t."""
    plain: dict[str, Any] = {}
    local: dict[int, dict[str, Any]] = {}
    for key, value in metrics.items():
        match = LOCAL_ROUND.match(key)
        if match:
            local.setdefault(int(match.group(1)), {})[match.group(2)] = value
        else:
            plain[key] = value
    return plain, local


class StoreError(ValueError):
    """A results folder or file that cannot be used (a damaged checkpoint, a missing run); names the file."""


def run_path(root: str | os.PathLike, run_name: str) -> Path:
    """``root/run_name``, resolved; the run name must be a plain folder name."""
    if not run_name or "/" in run_name or run_name.startswith("."):
        raise ValueError(f"results store: invalid run name {run_name!r}")
    return Path(root).resolve() / run_name


def package_versions(names: Iterable[str] = PACKAGES) -> dict[str, str]:
    """Installed versions of the packages a result depends on."""
    out = {"python": platform.python_version()}
    for name in names:
        try:
            out[name] = versions.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "not installed"
    return out


def cpu_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The CPU's model name (Linux ``/proc/cpuinfo``; else Python's ``platform.processor()``)."""
    try:
        lines = cpuinfo.read_text(errors="replace").splitlines()
    except OSError:
        lines = []
    names = [ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("model name") and ":" in ln]
    return names[0] if names else platform.processor() or "unknown"


def machine_record() -> dict[str, Any]:
    """Where a result was computed (config.json ``platform``, and every benchmark). The CPU decides
    speed and also the last bits of a float: torch picks its kernels by the CPU's vector units
    (``cpu-capability``), and an AVX2 and an AVX-512 kernel may round a sum differently."""
    return {
        "machine": platform.machine(),
        "system": platform.system(),
        "cpu": cpu_model(),
        "cpu-capability": torch.backends.cpu.get_cpu_capability(),
        "cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1,
        "python": sys.version.split()[0],
        "torch-threads": torch.get_num_threads(),
    }


class RunStore:
    """Writes the files of one run under ``root/run_name``."""

    def __init__(self, root: str | os.PathLike, run_name: str) -> None:
        self.run_name = run_name
        self.path = run_path(root, run_name)
        self.path.mkdir(parents=True, exist_ok=True)
        self.segment = 0  # the segment this process writes (begin_segment); 0 = none
        self._lock: int | None = None  # fd holding .writer.lock while a segment is written
        self.rows: list[dict[str, Any]] = list(_read_rows(self.path))
        self._columns: list[str] = list(FIRST_COLUMNS)  # the columns of rounds.csv on disk
        self._written = 0  # how many of self.rows rounds.csv holds
        self.local_rows: list[dict[str, Any]] = list(_read_rows(self.path, "local-rounds.csv"))
        self._local_written = len(self.local_rows)  # -1: local-rounds.csv must be rewritten
        self.started = time.time()
        self.checkpoint_round: int | None = None  # the round of the last checkpoint saved or loaded
        # Told the rows a resume keeps after each checkpoint (server/tracking.py sends them to MLflow).
        self.on_checkpoint: Callable[[Sequence[Mapping[str, Any]]], None] | None = None

    # --- config ---------------------------------------------------------------
    def write_config(
        self, config: Mapping[str, Any], *, engine: str, extra: Mapping[str, Any] | None = None
    ) -> None:
        """Record the full resolved config, the seed, the engine and package versions."""
        self._write_json(
            "config.json",
            {
                "run-name": self.run_name,
                # Made once per run, kept across resumes: the clients key their state by it
                # (client/state.py run_key), so a later run reusing the name starts fresh.
                "run-id": uuid.uuid4().hex[:12],
                "config": dict(config),
                "seed": config.get("seed"),
                "engine": engine,
                "versions": package_versions(),
                "platform": machine_record(),
                "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                **dict(extra or {}),
            },
        )

    def read_config(self) -> dict[str, Any]:
        return json.loads((self.path / "config.json").read_text())

    @property
    def run_id(self) -> str:
        """The run's id from config.json ('' for a run recorded before runs had ids, or none yet)."""
        try:
            return str(self.read_config().get("run-id", ""))
        except (OSError, ValueError):
            return ""

    # --- rows -----------------------------------------------------------------
    def add_row(self, **row: Any) -> dict[str, Any]:
        """Add one row (a round, an exchange, a client); written at the next ``commit``.

        Returns the stored row: what is added to it before that commit (a rejection, a weight
        the strategy computed from all replies) is written with it.
        """
        self.rows.append(row)
        return row

    def add_local_rounds(self, row: Mapping[str, Any], by_round: Mapping[int, Mapping[str, Any]]) -> None:
        """One row per local round t of the reply recorded in ``row`` (local-rounds.csv), written
        at the next ``commit``."""
        for t, values in sorted(by_round.items()):
            self.local_rows.append({**{k: row[k] for k in LOCAL_COLUMNS[:4]}, "local-round": t, **values})

    def commit(
        self, server_round: int, total_rounds: int, aggregate: Mapping[str, float] | None = None
    ) -> None:
        """Write rounds.csv and progress.json for everything up to ``server_round``.

        New rows are appended while the columns stay the same (a long run would otherwise
        rewrite its whole history every round); a new column rewrites the file atomically.
        """
        columns = list(self._columns)
        new = self.rows[self._written :]
        for row in new:
            columns += [k for k in row if k not in columns]
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=columns, restval="", lineterminator="\n")
        path = self.path / "rounds.csv"
        if columns == self._columns and path.exists():
            writer.writerows(new)
            with open(path, "a", newline="") as f:
                f.write(buf.getvalue())
        else:
            writer.writeheader()
            writer.writerows(self.rows)
            self._write_text("rounds.csv", buf.getvalue())
        self._columns, self._written = columns, len(self.rows)
        if self._local_written != len(self.local_rows):  # rare (a personalization round): rewrite it
            local_columns = list(LOCAL_COLUMNS)
            for row in self.local_rows:
                local_columns += [k for k in row if k not in local_columns]
            buf = io.StringIO()
            writer = csv.DictWriter(buf, fieldnames=local_columns, restval="", lineterminator="\n")
            writer.writeheader()
            writer.writerows(self.local_rows)
            self._write_text("local-rounds.csv", buf.getvalue())
            self._local_written = len(self.local_rows)
        self._write_json(
            "progress.json",
            {
                "round": server_round,
                "total": total_rounds,
                "elapsed-s": round(time.time() - self.started, 3),
                "segment": self.segment,
                "aggregate": _finite(dict(aggregate or {})),
            },
        )

    def drop_rows_after(self, server_round: int) -> None:
        """Forget rows of rounds after ``server_round`` (a resumed run redoes them)."""
        self.rows = [r for r in self.rows if int(r["round"]) <= server_round]
        self._columns, self._written = list(FIRST_COLUMNS), 0  # the next commit rewrites the file
        self.local_rows = [r for r in self.local_rows if int(r["round"]) <= server_round]
        self._local_written = -1

    # --- checkpoint -----------------------------------------------------------
    def save_checkpoint(self, state: Mapping[str, Any]) -> None:
        """The server's complete state after a round (model, strategy state, RNG, round)."""
        tmp = self.path / ".checkpoint.pt.tmp"
        torch.save(dict(state), tmp)
        os.replace(tmp, self.path / "checkpoint.pt")
        self.checkpoint_round = int(state["round"])
        if self.on_checkpoint is not None:
            self.on_checkpoint(self.checkpointed_rows())

    def load_checkpoint(self) -> dict[str, Any] | None:
        """The last checkpoint, None if there is none; StoreError naming the file if it is damaged."""
        state = load_checkpoint_file(self.path / "checkpoint.pt")
        if state is not None:
            self.checkpoint_round = int(state["round"])
        return state

    def checkpointed_rows(self) -> list[dict[str, Any]]:
        """The rows a resume keeps: those of the rounds up to the last checkpoint's. rounds.csv may
        hold one round more (a process killed between its commit and its checkpoint)."""
        if self.checkpoint_round is None:
            self.load_checkpoint()  # a store opened on a stopped run's folder (record_interrupted)
        last = -1 if self.checkpoint_round is None else self.checkpoint_round
        end = len(self.rows)
        while end and int(self.rows[end - 1]["round"]) > last:  # rows are in round order
            end -= 1
        return self.rows[:end]

    # --- segments -------------------------------------------------------------
    def begin_segment(self, engine: str, *, resumed: bool) -> int:
        """Start a segment (the first run or a resume); returns its number (1, 2, ...).

        A previous segment that never recorded its end (its process was killed) is closed as
        ``killed`` with the time its last progress.json reported. The summary and report of the
        previous segment are kept as ``summary.segment-<k>.json`` / ``report.segment-<k>.md``.
        """
        self._take_writer_lock()
        segments = self.segments()
        if segments and "status" not in segments[-1]:
            last = segments[-1]
            progress = self.read_json("progress.json") or {}
            wall = progress.get("elapsed-s") if progress.get("segment") == last["segment"] else None
            self._append_segment({"segment": last["segment"], "status": "killed", "wall-time-s": wall})
        elif not segments and resumed:
            self._append_legacy_segment()
        segments = self.segments()
        for name, ext in (("summary", "json"), ("report", "md")):
            src = self.path / f"{name}.{ext}"
            if src.exists() and segments:
                dst = self.path / f"{name}.segment-{segments[-1]['segment']}.{ext}"
                n = 1
                while dst.exists():
                    n += 1
                    dst = self.path / f"{name}.segment-{segments[-1]['segment']}-{n}.{ext}"
                os.replace(src, dst)
        self.segment = len(segments) + 1
        self.started = time.time()
        self._append_segment(
            {
                "segment": self.segment,
                "engine": engine,
                "started": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(self.started)),
                "started-unix": round(self.started, 3),
            }
        )
        return self.segment

    def segment_starts_at(self, server_round: int) -> None:
        """Record the first round this segment runs (1, or the round after a resumed checkpoint)."""
        self._append_segment({"segment": self.segment, "first-round": server_round})

    def end_segment(self, status: str, segment: int = 0) -> float:
        """Record how segment ``segment`` (default: this process's) ended; returns its wall time."""
        segment = segment or self.segment
        start = next((s for s in self.segments() if s["segment"] == segment), {})
        wall = round(time.time() - float(start.get("started-unix", self.started)), 3)
        self._append_segment({"segment": segment, "status": status, "wall-time-s": wall})
        if self._lock is not None:
            os.close(self._lock)  # releases the flock
            self._lock = None
        return wall

    def _take_writer_lock(self) -> None:
        """Hold ``.writer.lock`` exclusively; StoreError when another live process holds it."""
        path = self.path / ".writer.lock"
        fd = exclusive_lock(path)
        if fd is None:
            holder = flock_holder(path)
            raise StoreError(
                f"results/{self.run_name}: another process{holder} is still writing this run (an "
                "earlier ServerApp, e.g. one orphaned when its SuperLink died); end it (`flwr stop "
                "<run-id>`, `hetfed federation down`, or kill it), then resume"
            )
        self._lock = fd

    def segments(self) -> list[dict[str, Any]]:
        """Every segment so far: number, engine, started, first-round; status, wall-time-s once ended."""
        return _read_segments(self.path)

    def _append_segment(self, entry: Mapping[str, Any]) -> None:
        with open(self.path / "segments.jsonl", "a") as f:
            f.write(json.dumps(dict(entry)) + "\n")

    def _append_legacy_segment(self) -> None:
        """A run written before segments were recorded: its first segment from its summary/config."""
        config, summary = self.read_json("config.json") or {}, self.read_json("summary.json") or {}
        progress = self.read_json("progress.json") or {}
        self._append_segment(
            {
                "segment": 1,
                "engine": summary.get("engine") or config.get("engine", ""),
                "started": config.get("created", ""),
                "status": summary.get("status", "killed"),
                "wall-time-s": summary.get("wall-time-s", progress.get("elapsed-s")),
            }
        )

    # --- summary --------------------------------------------------------------
    def write_summary(self, summary: Mapping[str, Any], report: str) -> None:
        """Final per-client and aggregate metrics as JSON, and a readable report."""
        self._write_json("summary.json", _finite(dict(summary)))
        self._write_text("report.md", report)

    def audit(self, record: Mapping[str, Any]) -> None:
        """Append one line to traffic.jsonl (what a reply carried)."""
        with open(self.path / "traffic.jsonl", "a") as f:
            f.write(json.dumps(record) + "\n")

    # --- helpers --------------------------------------------------------------
    def read_json(self, name: str) -> Any:
        """A JSON file of the run folder; None if missing or unreadable."""
        return _json_or_none(self.path / name)

    def write_json(self, name: str, obj: Any) -> None:
        """Write ``name`` (JSON) into the run folder atomically."""
        self._write_json(name, obj)

    def _write_json(self, name: str, obj: Any) -> None:
        self._write_text(name, json.dumps(obj, indent=2, sort_keys=False) + "\n")

    def _write_text(self, name: str, text: str) -> None:
        tmp = self.path / f".{name}.tmp"
        tmp.write_text(text)
        os.replace(tmp, self.path / name)


def existing_run(run_dir: Path) -> str:
    """The line refusing a new run whose results folder ``run_dir`` holds a run already."""
    return (
        f"run config 'run-name': {run_dir} holds a run already; choose another run-name, or continue it "
        f"with `hetfed run --resume {run_dir.name} --results-dir {run_dir.parent}` (under flwr run: "
        "resume=true)"
    )


def run_completed(path: Path, checkpoint: Mapping[str, Any], num_rounds: int) -> bool:
    """Whether the run in ``path`` completed (nothing to resume): its summary.json says so and its
    checkpoint holds its last round."""
    try:
        status = json.loads((path / "summary.json").read_text()).get("status")
    except (OSError, ValueError, AttributeError):
        status = None
    return status == "completed" and int(checkpoint["round"]) >= num_rounds


def load_checkpoint_file(path: Path) -> dict[str, Any] | None:
    """A checkpoint written by :meth:`RunStore.save_checkpoint`; None if absent, StoreError if damaged."""
    if not path.exists():
        return None
    try:
        state = torch.load(path, weights_only=False)
    except Exception as exc:  # torch raises many kinds (EOFError, UnpicklingError, RuntimeError)
        why = (str(exc).strip().splitlines() or ["unreadable"])[0][:120]
        raise StoreError(
            f"checkpoint {path} is damaged ({type(exc).__name__}: {why}); "
            "it cannot be resumed (restore it from a backup or start a new run)"
        ) from None
    if not isinstance(state, dict) or "round" not in state or "strategy" not in state:
        raise StoreError(f"checkpoint {path} is not a hetfed checkpoint (no round and strategy state)")
    return state


def read_models(run_dir: Path) -> dict[str, dict[str, np.ndarray]]:
    """A finished run's final models (its ``models.npz``), by name: ``{"global": arrays}`` for the
    decision strategies, ``{"last": ..., "average": ...}`` for the constrained ones; each
    ``arrays`` maps array names to NumPy arrays. StoreError if the folder has none."""
    path = Path(run_dir) / "models.npz"
    if not path.exists():
        raise StoreError(f"{run_dir} has no models.npz: the run did not finish, or its method keeps no model")
    models: dict[str, dict[str, np.ndarray]] = {}
    with np.load(path) as stored:
        for key in stored.files:
            name, _, array = key.partition("/")
            models.setdefault(name, {})[array] = stored[key]
    return models


# --- reading a run back -----------------------------------------------------------------------


@dataclass(frozen=True)
class RunResult:
    """A run folder read back: its summary, config, rounds.csv rows, per-client series and final
    models. Reports, reproductions and tools read runs through this, never the files themselves."""

    path: Path
    summary: dict[str, Any]  # summary.json ({} while the run has none)
    config: dict[str, Any]  # config.json's resolved run config
    rows: list[dict[str, str]]  # rounds.csv, one dict per row, blank cells left out
    local: list[dict[str, str]]  # local-rounds.csv, likewise
    progress: dict[str, Any]  # progress.json: rounds done / total, elapsed ({} before the first commit)
    segments: list[dict[str, Any]]  # segments.jsonl merged per segment (RunStore.segments)

    @classmethod
    def read(cls, run_dir: str | os.PathLike) -> RunResult:
        """The run in ``run_dir`` (whatever it has written so far); StoreError if it has nothing."""
        path = Path(run_dir)
        config, summary = _json_or_none(path / "config.json"), _json_or_none(path / "summary.json")
        rows = _read_rows(path)
        if not rows and config is None:
            raise StoreError(f"{path}: no run there (neither config.json nor rounds.csv)")
        local = _read_rows(path, "local-rounds.csv")
        progress = _json_or_none(path / "progress.json") or {}
        return cls(
            path, summary or {}, (config or {}).get("config", {}), rows, local, progress, _read_segments(path)
        )

    @property
    def completed(self) -> bool:
        return self.summary.get("status") == "completed"

    def rows_of(
        self, exchange: str | None = None, *, ok: bool = False, client: str | None = None
    ) -> list[dict[str, str]]:
        """The rows of one ``exchange`` (every exchange if None); ``client``: only one client's rows,
        or the server's (``"server"``); ``ok``: only the replies that were used."""
        return [
            r
            for r in self.rows
            if (exchange is None or r["exchange"] == exchange)
            and (client is None or r["client"] == client)
            and (not ok or r.get("status") == "ok")
        ]

    def values(
        self, metric: str, exchange: str | None = None, *, client: str | None = None
    ) -> list[tuple[int, str, float]]:
        """``(round, client, value)`` of every row of ``exchange`` that has ``metric``."""
        return [
            (int(r["round"]), r["client"], float(r[metric]))
            for r in self.rows_of(exchange, client=client)
            if metric in r
        ]

    def series(self, metric: str, exchange: str = "train") -> tuple[np.ndarray, list[str], np.ndarray]:
        """Rounds [R], clients [N] and ``metric`` per round and client [R, N] (NaN where a client
        has no value: not sampled, failed)."""
        found = [(t, c, v) for t, c, v in self.values(metric, exchange) if c != "server"]
        rounds = sorted({t for t, _, _ in found})
        clients = sorted({c for _, c, _ in found})
        table = np.full((len(rounds), len(clients)), np.nan)
        for t, c, v in found:
            table[rounds.index(t), clients.index(c)] = v
        return np.array(rounds, dtype=int), clients, table

    def local_rounds(self, metric: str, exchange: str = "train.personalize") -> dict[str, dict[int, float]]:
        """Per client: ``metric`` of each local round t that one reply covers (FedRSPO+'s
        personalization reports its rounds as ``r{t}-<metric>``)."""
        out: dict[str, dict[int, float]] = {}
        for row in self.local:
            if row["exchange"] == exchange and metric in row:
                out.setdefault(row["client"], {})[int(row["local-round"])] = float(row[metric])
        if not self.local:  # a run written before local-rounds.csv: the values are r{t}- columns
            for row in self.rows_of(exchange, ok=True):
                for t, values in split_local_rounds(row)[1].items():
                    if metric in values:
                        out.setdefault(row["client"], {})[t] = float(values[metric])
        return {c: dict(sorted(v.items())) for c, v in out.items()}

    def by_client(self, metric: str, exchange: str, default: float = math.nan) -> dict[str, float]:
        """Per client with a used reply to ``exchange``: its ``metric`` (``default`` where the reply
        has none; the last reply of a client that sent several)."""
        return {r["client"]: float(r.get(metric, default)) for r in self.rows_of(exchange, ok=True)}

    def models(self) -> dict[str, dict[str, np.ndarray]]:
        """The final models (``models.npz``): see :func:`read_models`."""
        return read_models(self.path)


def _read_rows(run_dir: Path, name: str = "rounds.csv") -> list[dict[str, str]]:
    """A table's rows, blank cells left out ([] before the first commit)."""
    path = run_dir / name
    if not path.exists():
        return []
    with open(path, newline="", encoding="utf-8") as f:
        return [{k: v for k, v in row.items() if v != ""} for row in csv.DictReader(f)]


def _read_segments(run_dir: Path) -> list[dict[str, Any]]:
    """segments.jsonl's entries merged per segment number, in order (a line cut short by a kill is
    skipped)."""
    merged: dict[int, dict[str, Any]] = {}
    path = run_dir / "segments.jsonl"
    for line in path.read_text().splitlines() if path.exists() else []:
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            continue
        merged.setdefault(int(entry["segment"]), {}).update(entry)
    return [merged[k] for k in sorted(merged)]


def _json_or_none(path: Path) -> Any:
    """A JSON file's content; None if it is missing or unreadable (a run still being written)."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _finite(obj: Any) -> Any:
    """JSON has no NaN/Inf: write them as null."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, Mapping):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_finite(v) for v in obj]
    return obj
