"""The results store: rounds.csv always equals the rows so far, whether appended or rewritten."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from hetfed.server.store import RunStore


def read(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_rounds_csv_is_appended_while_columns_hold_and_rewritten_when_they_grow(tmp_path: Path) -> None:
    store = RunStore(tmp_path, "r")
    expected = []
    for rnd in range(1, 6):
        for client in ("a", "b"):
            row = {
                "round": rnd,
                "exchange": "train",
                "partition-id": 0,
                "client": client,
                "status": "ok",
                "error": "",
                "loss": rnd / 10,
            }
            if rnd >= 4:
                row["extra"] = rnd  # a column that appears mid-run
            store.add_row(**row)
            expected.append({k: str(v) for k, v in row.items() if v != ""})
        store.commit(rnd, 5, {"loss": rnd / 10})
        on_disk = read(tmp_path / "r" / "rounds.csv")
        assert [{k: v for k, v in r.items() if v != ""} for r in on_disk] == expected
    assert json.loads((tmp_path / "r" / "progress.json").read_text())["round"] == 5


def test_a_reopened_store_drops_redone_rounds_and_rewrites(tmp_path: Path) -> None:
    store = RunStore(tmp_path, "r")
    for rnd in (1, 2, 3):
        store.add_row(round=rnd, exchange="train", client="a", status="ok", error="", loss=float(rnd))
        store.commit(rnd, 3)
    again = RunStore(tmp_path, "r")  # a resumed run after round 2's checkpoint
    again.drop_rows_after(2)
    again.add_row(round=3, exchange="train", client="a", status="ok", error="", loss=30.0)
    again.commit(3, 3)
    assert [r["loss"] for r in read(tmp_path / "r" / "rounds.csv")] == ["1.0", "2.0", "30.0"]


@pytest.mark.parametrize("bad", ["", "../x", "a/b", ".hidden"])
def test_invalid_run_names_are_refused(tmp_path: Path, bad: str) -> None:
    with pytest.raises(ValueError, match="invalid run name"):
        RunStore(tmp_path, bad)


def test_a_second_live_writer_of_a_run_is_refused_and_a_dead_ones_lock_is_free(tmp_path: Path) -> None:
    import subprocess
    import sys
    import textwrap

    from hetfed.server.store import StoreError

    # Another process (an orphaned ServerApp) holds the run: segment 1 begun, never ended.
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(
                f"""
                import sys, time
                sys.path.insert(0, {str(Path(__file__).parents[1])!r})
                from hetfed.server.store import RunStore
                RunStore({str(tmp_path)!r}, "r").begin_segment("deployment", resumed=False)
                print("holding", flush=True)
                time.sleep(120)
                """
            ),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "holding"
        before = (tmp_path / "r" / "segments.jsonl").read_bytes()
        with pytest.raises(StoreError, match=rf"another process \(pid {holder.pid}\) is still writing"):
            RunStore(tmp_path, "r").begin_segment("deployment", resumed=True)
        assert (tmp_path / "r" / "segments.jsonl").read_bytes() == before  # the refusal wrote nothing
    finally:
        holder.kill()
        holder.wait()
    # Its process is gone: the kernel released the lock; the resume closes segment 1 as killed.
    store = RunStore(tmp_path, "r")
    assert store.begin_segment("deployment", resumed=True) == 2
    assert [s.get("status") for s in store.segments()] == ["killed", None]
    store.end_segment("completed")
    # One process may write segment after segment (the lock is released at each end).
    again = RunStore(tmp_path, "r")
    assert again.begin_segment("inline", resumed=True) == 3
    again.end_segment("completed")
