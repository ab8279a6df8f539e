"""`hetfed run` under faults, as a user meets them: bad arguments, Ctrl-C / SIGTERM, resume, bad checkpoints.

Every test drives the CLI in its own process (``python -m hetfed.cli``) and asserts exit codes,
the one-line errors and the files of the run folder.
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _pytest.capture import CaptureResult

from tests.conftest import REPO, cannot_run, hetfed_cli, wait_for_round
from tests.test_tracking import assert_tracked, only_run

# Long enough to be interrupted mid-run (about 0.3 s a round), short enough to finish quickly.
SETS = {
    "num-rounds": 12,
    "n-train": 40,
    "n-test": 30,
    "num-items": 10,
    "local-epochs": 1,
    "fraction": 0.5,
    "seed": 5,
}


def sets(values: dict) -> list[str]:
    return [a for k, v in values.items() for a in ("--set", f"{k}={v}")]


def start_cli(*args: str) -> subprocess.Popen:
    """``hetfed <args>`` in its own process, to be signalled."""
    return subprocess.Popen(
        [sys.executable, "-m", "hetfed.cli", *args],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def one_line(
    out: subprocess.CompletedProcess | CaptureResult[str] | tuple[str, str], rc: int, code: int = 2
) -> str:
    """The single stderr line of a refused / stopped command (no traceback)."""
    stderr = out[1] if isinstance(out, tuple) else out.stderr
    lines = [ln for ln in stderr.strip().splitlines() if ln.startswith("hetfed:") or "Traceback" in ln]
    assert rc == code, stderr[-3000:]
    assert len(lines) == 1 and "Traceback" not in stderr, stderr[-3000:]
    return lines[0]


def read_json(path: Path) -> dict:
    return json.loads(path.read_text())


def rows(run_dir: Path) -> list[dict]:
    with open(run_dir / "rounds.csv", newline="") as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The same 5-node run, never interrupted: the metrics every resumed run must reach."""
    results = tmp_path_factory.mktemp("whole")
    out = hetfed_cli(
        "run", "--nodes", "5", "--results-dir", str(results), *sets({**SETS, "run-name": "whole"})
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return read_json(results / "whole" / "summary.json")


def interrupt(tmp_path: Path, name: str, sig: int, *extra: str) -> tuple[subprocess.Popen, str, str]:
    """Start a 5-node inline run and send ``sig`` once round 2 is done."""
    proc = start_cli(
        "run", "--nodes", "5", "--results-dir", str(tmp_path), *sets({**SETS, "run-name": name}), *extra
    )
    wait_for_round(tmp_path / name, 2, proc)
    proc.send_signal(sig)
    stdout, stderr = proc.communicate(timeout=120)
    return proc, stdout, stderr


@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_stops_an_inline_run_cleanly_and_resume_reaches_the_uninterrupted_metrics(
    tmp_path: Path, uninterrupted: dict, sig: int, code: int
) -> None:
    proc, stdout, stderr = interrupt(tmp_path, "stopped", sig)
    name = signal.Signals(sig).name
    line = one_line((stdout, stderr), proc.returncode, code)
    assert f"interrupted by {name} after round" in line and "hetfed run --resume stopped" in line
    run_dir = tmp_path / "stopped"
    summary = read_json(run_dir / "summary.json")
    assert summary["status"] == "interrupted" and summary["error"] == f"stopped by {name}"
    progress = read_json(run_dir / "progress.json")
    import torch

    checkpoint = torch.load(run_dir / "checkpoint.pt", weights_only=False)
    assert 2 <= progress["round"] == checkpoint["round"] < SETS["num-rounds"]
    server_rounds = [r["round"] for r in rows(run_dir) if r["client"] == "server"]
    assert server_rounds == [str(r) for r in range(1, progress["round"] + 1)]  # rounds.csv = checkpoint
    before = rows(run_dir)

    out = hetfed_cli("run", "--resume", "stopped", "--results-dir", str(tmp_path))  # no other flag
    assert out.returncode == 0, out.stderr[-3000:]
    resumed = read_json(run_dir / "summary.json")
    assert resumed["status"] == "completed" and resumed["engine"] == "inline"
    assert resumed["clients"] == uninterrupted["clients"]  # 5 clients, bit for bit
    after = rows(run_dir)
    assert [{k: r[k] for k in before[0]} for r in after[: len(before)]] == before  # nothing lost
    assert {r["client"] for r in after if r["exchange"] == "train"} >= {"client-04"}


def test_resume_continues_with_the_recorded_settings_and_keeps_every_segment(
    tmp_path: Path, uninterrupted: dict
) -> None:
    """A 5-node run resumed without flags stays a 5-node run; the summary spans both segments."""
    interrupt(tmp_path, "two", signal.SIGTERM)
    run_dir = tmp_path / "two"
    first = read_json(run_dir / "summary.json")

    for flags, culprit in [
        (["--nodes", "4"], "--nodes 4 conflicts with the 5"),
        (["--engine", "simulation"], "--engine simulation conflicts with the inline"),
        (["--set", "num-rounds=20"], "--set num-rounds=20 conflicts with num-rounds = 12"),
        (["--set", "lr=0.5"], "--set lr=0.5 conflicts with lr = 0.001"),
    ]:
        out = hetfed_cli("run", "--resume", "two", "--results-dir", str(tmp_path), *flags)
        assert culprit in one_line(out, out.returncode), flags
    assert read_json(run_dir / "summary.json") == first  # the refusals touched nothing

    out = hetfed_cli("run", "--resume", "two", "--results-dir", str(tmp_path), "--nodes", "5")  # same: fine
    assert out.returncode == 0, out.stderr[-3000:]
    summary = read_json(run_dir / "summary.json")
    assert summary["clients"] == uninterrupted["clients"]
    assert sorted(summary["clients"]) == [f"client-0{i}" for i in range(5)]
    segments = summary["segments"]
    assert [(s["segment"], s["engine"], s["status"]) for s in segments] == [
        (1, "inline", "interrupted"),
        (2, "inline", "completed"),
    ]
    assert all(s["started"] and s["wall-time-s"] > 0 for s in segments)
    assert segments[0]["wall-time-s"] == first["wall-time-s"]
    assert summary["wall-time-s"] == pytest.approx(sum(s["wall-time-s"] for s in segments), abs=1e-3)
    # The first segment's summary and report are kept, not replaced.
    assert read_json(run_dir / "summary.segment-1.json") == first
    assert "(interrupted)" in (run_dir / "report.segment-1.md").read_text()
    assert "Segments (the run was resumed)" in (run_dir / "report.md").read_text()
    config = read_json(run_dir / "config.json")
    assert json.loads(config["config"]["launch"])["nodes"] == 5

    # A completed run is not resumed again (that would rewrite its summary).
    out = hetfed_cli("run", "--resume", "two", "--results-dir", str(tmp_path))
    assert "already completed" in one_line(out, out.returncode)
    assert read_json(run_dir / "summary.json") == summary


BAD_ARGS = [
    (["--nodes", "0"], "--nodes 0: must be >= 1"),
    (["--nodes", "-3"], "--nodes -3: must be >= 1"),
    (["--engine", "simulation", "--nodes", "0"], "--nodes 0: must be >= 1"),
    (["--timeout", "0"], "--timeout 0.0: must be > 0"),
    (["--timeout", "-5"], "--timeout -5.0: must be > 0"),
    (["--set", "num-clients=6"], "more than the 4 clients"),
    (["--data-path", "/no/such/silo-{partition}.csv"], "/no/such/silo-0.csv does not exist"),
    (["--engine", "simulation", "--data-path", "/no/such/{partition}"], "/no/such/0 does not exist"),
    (["--engine", "deployment", "--data-path", "x"], "--data-path: only for --engine inline or simulation"),
    (["--engine", "deployment", "--state-dir", "s"], "--state-dir: only for --engine inline or simulation"),
    (["--state-dir", "/tmp/{node}"], "--state-dir /tmp/{node}: only {partition} may appear in braces"),
    (["--state-dir", "/dev/null/{partition}"], "/dev/null is a file, not a folder"),
    (["--set", "run-name=" + "a" * 256], "256 bytes (at most 200: it is part of file names)"),
    (["--set", "run-name=' padded'"], "run config 'run-name': ' padded': a blank at either end"),
    (["--set", "run-name='  '"], "run config 'run-name': '  ': empty or blank"),
    (["--set", "run-name=x\ny"], "characters '\\n' not allowed"),
    (["--set", "seed=18446744073709551616"], "run config 'seed': 18446744073709551616 does not fit a signed"),
    (["--results-dir", ""], "--results-dir '': empty; give a folder"),
    (["--results-dir", "/proc/x"], "--results-dir /proc/x: /proc is not a writable folder (No such file"),
    (["--nodes", "100000"], "--nodes 100000: the inline engine holds every client on this machine"),
    (["--resume", "../up"], "--resume: '../up': characters '/' not allowed"),
    (
        ["--set", "problem=energy-pjm"],
        "4 of 4 silos cannot load their data and the run needs 4: partition 0 of",
    ),
    (["--set", "problem=energy-pjm", "--data-path", "/tmp"], "partition 3 of 4: [Errno 21] Is a directory"),
    (["--federation-dir", "/tmp"], "--federation-dir /tmp: only for --engine deployment"),
    (["--set", "resume=true"], "--set resume: set by `hetfed run`; use --resume"),
    (["--resume", "ghost"], "--resume ghost: no run folder"),
    (["--set", "problem=lp", "--set", "lp-variables=x"], "'lp-features': needs comma-separated names"),
    (
        ["--set", "problem=lp", "--set", "lp-features=a,a", "--set", "lp-variables=x"],
        "run config 'lp-features': 'a' appears twice",
    ),
    (
        ["--set", "problem=lp", "--set", "lp-features=a b", "--set", "lp-variables=x y"],
        "run config 'lp-variables': 'x y' is not a variable name of an LP file",
    ),
]


def test_every_argument_is_checked_before_anything_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """One line naming the argument, exit code 2, at once, and no results folder blocking the name
    (the CLI's entry point in this process; the last case as a user types it, in a fresh process)."""
    from hetfed.cli import main

    results = tmp_path / "results"
    for args, message in BAD_ARGS:
        started = time.time()
        code = main(["run", "--results-dir", str(results), "--set", "run-name=x", *args])
        assert message in one_line(capsys.readouterr(), code), (args, message)
        assert time.time() - started < 30, args  # refused at once, not after a node-wait timeout
    assert not results.exists()
    (tmp_path / "file").write_text("")
    out = hetfed_cli("run", "--results-dir", str(tmp_path / "file"))
    assert "exists and is not a folder" in one_line(out, out.returncode)


def test_a_refused_run_leaves_the_name_free(tmp_path: Path) -> None:
    out = hetfed_cli("run", "--results-dir", str(tmp_path), "--nodes", "0", "--set", "run-name=n")
    one_line(out, out.returncode)
    out = hetfed_cli(
        "run",
        "--results-dir",
        str(tmp_path),
        "--nodes",
        "2",
        *sets({**SETS, "num-rounds": 1, "run-name": "n"}),
    )
    assert out.returncode == 0, out.stderr[-3000:]


def test_damaged_checkpoints_and_missing_runs_are_one_line_naming_the_file(tmp_path: Path) -> None:
    interrupt(tmp_path, "dmg", signal.SIGINT)
    run_dir = tmp_path / "dmg"
    checkpoint = run_dir / "checkpoint.pt"
    good = checkpoint.read_bytes()
    kept = {p.name: p.read_bytes() for p in run_dir.iterdir() if p.name != "checkpoint.pt"}
    for damage in (b"", os.urandom(4096), good[: len(good) // 2]):
        checkpoint.write_bytes(damage)
        out = hetfed_cli("run", "--resume", "dmg", "--results-dir", str(tmp_path))
        line = one_line(out, out.returncode)
        assert f"checkpoint {checkpoint} is damaged" in line, line
    # Nothing of the run was touched by the refused resumes.
    assert {p.name: p.read_bytes() for p in run_dir.iterdir() if p.name != "checkpoint.pt"} == kept

    # The ServerApp itself (every engine) names the file too.
    from hetfed.engines.inline import node_configs, run_inline
    from hetfed.server.store import StoreError

    with pytest.raises(StoreError, match=f"checkpoint {checkpoint} is damaged"):
        run_inline({**SETS, "results-dir": str(tmp_path), "run-name": "dmg", "resume": True}, node_configs(5))

    checkpoint.unlink()
    out = hetfed_cli("run", "--resume", "dmg", "--results-dir", str(tmp_path))
    assert f"{run_dir} has no checkpoint.pt" in one_line(out, out.returncode)

    out = hetfed_cli("run", "--resume", "nosuch", "--results-dir", str(tmp_path))
    line = one_line(out, out.returncode)
    assert f"no run folder {tmp_path / 'nosuch'}" in line and "dmg" in line  # lists the runs there
    assert not (tmp_path / "nosuch").exists()
    (tmp_path / "empty").mkdir()
    out = hetfed_cli("run", "--resume", "empty", "--results-dir", str(tmp_path))
    assert f"{tmp_path / 'empty' / 'config.json'} is missing" in one_line(out, out.returncode)
    (tmp_path / "empty" / "config.json").write_text("{not json")
    out = hetfed_cli("run", "--resume", "empty", "--results-dir", str(tmp_path))
    assert "config.json is damaged" in one_line(out, out.returncode)


def test_run_help_documents_resume_and_signals() -> None:
    out = hetfed_cli("run", "--help", timeout=60)
    text = " ".join(out.stdout.split())
    assert out.returncode == 0
    for phrase in (
        "recorded in its config.json",
        "is refused",
        "summary.segment-<k>.json",
        "wall-time-s = the sum of its segments",
        "exit code is 130 / 143",
        "leaves no results folder",
    ):
        assert phrase in text, phrase


@pytest.mark.simulation
def test_sigint_stops_a_simulation_run_cleanly_and_resume_reaches_the_uninterrupted_metrics(
    tmp_path: Path, uninterrupted: dict
) -> None:
    """Also tracked in MLflow: the ServerApp killed, `hetfed run` closes its MLflow run as KILLED
    (server/app.py record_interrupted), and the resume continues it."""
    store = tmp_path / "mlruns"
    proc = start_cli(
        "run", "--engine", "simulation", "--nodes", "5", "--results-dir", str(tmp_path),
        *sets({**SETS, "run-name": "sim", "num-rounds": 12, "mlflow-tracking-uri": str(store)}),
    )  # fmt: skip
    run_dir = tmp_path / "sim"
    wait_for_round(run_dir, 1, proc)
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=120)
    assert "interrupted by SIGINT" in one_line((stdout, stderr), proc.returncode, 130)
    summary = read_json(run_dir / "summary.json")
    assert summary["status"] == "interrupted" and summary["engine"] == "simulation"
    assert only_run(store)[1].info.status == "KILLED"
    stopped_at = read_json(run_dir / "progress.json")["round"]
    time.sleep(2)  # no Flower process is left writing into the run folder
    assert read_json(run_dir / "progress.json")["round"] == stopped_at
    assert read_json(run_dir / "summary.json") == summary

    out = hetfed_cli("run", "--resume", "sim", "--results-dir", str(tmp_path), timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    resumed = read_json(run_dir / "summary.json")
    assert [s["engine"] for s in resumed["segments"]] == ["simulation", "simulation"]
    assert resumed["clients"].keys() == uninterrupted["clients"].keys()
    for client, metrics in uninterrupted["clients"].items():
        for key, value in metrics.items():
            assert resumed["clients"][client][key] == pytest.approx(value, rel=1e-6), (client, key)
    assert_tracked(store, run_dir, "FINISHED")  # one MLflow run; each row of rounds.csv once


def test_a_signal_that_arrives_as_the_run_completes_does_not_offer_a_resume(tmp_path: Path) -> None:
    """The race of SIGINT with the last round: the run's summary decides what the one line says."""
    from hetfed.engines.runner import RunInterrupted

    run_dir = tmp_path / "r"
    run_dir.mkdir()
    stop = RunInterrupted(signal.SIGINT)
    assert stop.describe(run_dir) == "interrupted by SIGINT before round 1 of r; nothing to resume"
    assert not stop.completed(run_dir)
    (run_dir / "progress.json").write_text(json.dumps({"round": 3, "total": 5}))
    (run_dir / "summary.json").write_text(json.dumps({"status": "interrupted"}))
    line = stop.describe(run_dir)
    assert "after round 3/5 of r" in line and "hetfed run --resume r" in line
    (run_dir / "summary.json").write_text(json.dumps({"status": "completed"}))
    assert stop.describe(run_dir) == f"SIGINT arrived as r completed; its results are final, in {run_dir}"
    assert stop.completed(run_dir)  # and `hetfed run` exits 0 (hetfed/cli.py)


BAD_UP = [
    (
        ["--data-path", "/srv/pjm-{x}.csv"],
        "--data-path /srv/pjm-{x}.csv: only {partition} may appear in braces",
    ),
    (["--port", "99999"], "--port 99999: must be in 0-65535 (0: a free port)"),
    (["--port", "-5"], "--port -5: must be in 0-65535"),
    (["--nodes", "0"], "--nodes 0: must be >= 1"),
    (["--state-dir", "/dev/null"], "--state-dir /dev/null: /dev/null exists and is not a folder"),
    (["--state-dir", "/dev/null/{partition}"], "/dev/null is a file, not a folder"),
    (["--timeout", "0"], "--timeout 0: must be > 0 seconds"),
    (["--timeout", "nan"], "--timeout nan: must be > 0 seconds"),
]


def test_federation_status_checks_its_numbers(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from hetfed.cli import main

    for args in (["--wait", "-1"], ["--timeout", "0"], ["--timeout", "nan"]):
        assert main(["federation", "status", "--dir", str(tmp_path), *args]) == 2
        assert "need --wait >= 0 and --timeout > 0" in one_line(capsys.readouterr(), 2)


def test_federation_up_checks_every_argument_before_starting_anything(tmp_path: Path) -> None:
    """One line, exit 2, nothing started (no federation.json), for each of the issue's inputs."""
    for args, message in BAD_UP:
        out = hetfed_cli(
            "federation", "up", "--nodes", "2", "--dir", str(tmp_path / "fed"), *args, timeout=60
        )
        assert message in one_line(out, out.returncode), (args, out.stderr)
        assert not (tmp_path / "fed" / "federation.json").exists()


def test_two_federation_ups_on_one_folder_cannot_both_start(tmp_path: Path) -> None:
    """The second `up` finds the first one's lock (held here, as a starting `up` holds it)."""
    from hetfed.federation import UP_LOCK
    from hetfed.paths import exclusive_lock

    fd = exclusive_lock(tmp_path / UP_LOCK)
    assert fd is not None
    try:
        out = hetfed_cli("federation", "up", "--nodes", "1", "--dir", str(tmp_path), timeout=60)
        line = one_line(out, out.returncode)
        assert (
            f"another `hetfed federation up` (pid {os.getpid()}) is starting a federation in {tmp_path}"
            in line
        )
    finally:
        os.close(fd)
    assert not (tmp_path / "federation.json").exists()


def test_a_state_dir_on_a_read_only_file_system_is_refused(tmp_path: Path) -> None:
    """As root every permission check passes; a read-only mount (in a mount namespace of this test's
    own) is what still refuses writes, and `run` and `federation up` both say so at once."""
    if shutil.which("unshare") is None or os.geteuid() != 0:
        cannot_run("needs root and unshare(1)")
    ro = tmp_path / "ro"
    ro.mkdir()
    command = " ".join(
        [
            f"mount -t tmpfs -o ro,size=1m tmpfs {ro} &&",
            f"{sys.executable} -m hetfed.cli run --results-dir {tmp_path / 'results'}",
            f"--state-dir {ro}/{{partition}}; echo rc=$?;",
            f"{sys.executable} -m hetfed.cli federation up --dir {tmp_path / 'fed'} --state-dir {ro}/s;",
            "echo rc=$?",
        ]
    )
    out = subprocess.run(
        ["unshare", "-m", "sh", "-c", command], capture_output=True, text=True, cwd=REPO, timeout=120
    )
    lines = [ln for ln in out.stderr.splitlines() if ln.startswith("hetfed:")]
    assert out.stdout.split() == ["rc=2", "rc=2"] and "Traceback" not in out.stderr, out.stderr[-2000:]
    refused = f"{ro} is not a writable folder (Read-only file system)"
    assert lines == [
        f"hetfed: error: --state-dir {ro}/{{partition}}: {refused}",
        f"hetfed: error: --state-dir {ro}/s: {refused}",
    ]
    assert not (tmp_path / "results").exists() and not (tmp_path / "fed" / "federation.json").exists()


def test_more_nodes_than_silos_in_a_csv_is_refused_before_a_results_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--nodes 5` against a 4-zone PJM CSV: no partition can load (the file holds 4 clients), so
    the run is refused in one line naming each (this once left a failed results folder)."""
    from hetfed.cli import main
    from hetfed.problems.energy import generate_pjm_like_csv

    csv_path = generate_pjm_like_csv(tmp_path / "pjm.csv", n_zones=4, n_days=40, seed=2)
    base = ["run", "--results-dir", str(tmp_path / "results"), "--data-path", str(csv_path), "--nodes", "5"]
    assert main([*base, "--set", "problem=energy-pjm", "--set", "run-name=five"]) == 2
    line = one_line(capsys.readouterr(), 2)
    assert line.startswith("hetfed: error: 5 of 5 silos cannot load their data and the run needs 5: ")
    assert f"partition 4 of 5: num_partitions must be in 1..4 (clients in {csv_path}); got 5" in line
    assert not (tmp_path / "results").exists()


BAD_HOST = [
    (["superlink", "--port", "99999", "--insecure", "--host", "127.0.0.1"], "--port 99999: must be in 1-"),
    (["silo", "--superlink", "127.0.0.1:9", "--insecure", "--partition-id", "0", "--num-partitions", "2",
      "--port", "0"], "--port 0: must be in 1-65535"),
    (["silo", "--superlink", "127.0.0.1:9", "--insecure", "--partition-id", "0", "--num-partitions", "2",
      "--state-dir", "/dev/null"], "--state-dir /dev/null: /dev/null exists and is not a folder"),
]  # fmt: skip


def test_the_hosts_commands_check_ports_and_folders(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`federation superlink` and `silo` (with --print: nothing would start) refuse in one line."""
    from hetfed.cli import main

    for args, message in BAD_HOST:
        folder = ["--dir", str(tmp_path / "link")] if args[0] == "superlink" else []
        assert main(["federation", *args, *folder, "--print"]) == 2, args
        assert message in one_line(capsys.readouterr(), 2), args
    assert not (tmp_path / "link").exists()
