"""Experiment tracking in MLflow (server/tracking.py) against a real local MLflow file store.

The MLflow run's metrics must be rounds.csv's numeric cells, each once, at its round; its params
the run's config; its artifacts the run's files, byte for byte; a resumed run continues the same
MLflow run without logging a row twice; a store that cannot be used is one line before round 1.
"""

from __future__ import annotations

import csv
import json
import os
import signal
import sqlite3
import subprocess
from collections import defaultdict
from pathlib import Path

import pytest
import torch
from flwr.common.constant import SUPERLINK_NODE_ID
from flwr.supercore.task_identity import TaskIdentity
from mlflow.tracking import MlflowClient

from hetfed.client.app import app as client_app
from hetfed.config import ConfigError, validate
from hetfed.engines.inline import node_configs, run_inline
from hetfed.engines.runner import prepare
from hetfed.server.app import record_interrupted, run_server
from tests.conftest import (
    REPO,
    hetfed_cli,
    kill_at_a_checkpoint,
    kill_when_blocked,
    start_inline_run,
    wait_for_round,
    wait_until,
)
from tests.test_resume import DyingGrid

FAST = {"num-rounds": 3, "n-train": 40, "n-test": 30, "local-epochs": 1, "num-items": 10, "seed": 5}
COORDINATES = ("round", "exchange", "partition-id", "client", "status", "error")


def expected_metrics(run_dir: Path, through: int | None = None) -> dict[str, list[tuple[int, float]]]:
    """Independently of server/tracking.py: every numeric cell of rounds.csv (of the rounds up to
    ``through``) under the key the docs name (server row of a round: the metric; a client's:
    client/exchange/metric)."""
    out: dict[str, list[tuple[int, float]]] = defaultdict(list)
    with open(run_dir / "rounds.csv", newline="") as f:
        for row in csv.DictReader(f):
            if through is not None and int(row["round"]) > through:
                continue
            for name, cell in row.items():
                if name in COORDINATES or cell == "":
                    continue
                try:
                    value = float(cell)
                except ValueError:
                    continue
                key = name if row["client"] == "server" else f"{row['client']}/{row['exchange']}/{name}"
                out[key].append((int(row["round"]), value))
    return {k: sorted(v) for k, v in out.items()}


def only_run(store: Path | str, experiment: str = "hetfed"):
    os.environ["MLFLOW_ALLOW_FILE_STORE"] = "true"  # MLflow 3's opt-in to read a file store
    client = MlflowClient(tracking_uri=str(store))
    found = client.search_runs([client.get_experiment_by_name(experiment).experiment_id])
    assert len(found) == 1, [r.info.run_name for r in found]
    return client, found[0]


def logged_metrics(client: MlflowClient, run) -> dict[str, list[tuple[int, float]]]:
    return {
        key: sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, key))
        for key in run.data.metrics
    }


def assert_tracked(store: Path | str, run_dir: Path, status: str, experiment: str = "hetfed") -> None:
    client, run = only_run(store, experiment)
    assert run.info.status == status and run.info.run_name == run_dir.name
    expected = expected_metrics(run_dir)
    assert any("/train/" in k for k in expected) and any("/" not in k for k in expected)
    assert logged_metrics(client, run) == expected
    config = json.loads((run_dir / "config.json").read_text())["config"]
    assert run.data.params == {k: str(v) for k, v in config.items()}
    names = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"report.md", "summary.json", "rounds.csv", "rounds.png", "models.npz", "models.json"} <= names
    for name in ("rounds.csv", "models.npz", "summary.json"):
        copy = client.download_artifacts(run.info.run_id, name, str(run_dir.parent / "downloaded"))
        assert Path(copy).read_bytes() == (run_dir / name).read_bytes(), name


def test_a_run_is_tracked_with_its_rows_config_and_files(tmp_path: Path) -> None:
    store = tmp_path / "mlruns"
    cfg = {**FAST, "results-dir": str(tmp_path / "results"), "run-name": "tracked", "fraction": 1.0}
    cfg |= {"mlflow-tracking-uri": str(store), "mlflow-experiment": "pilot"}
    configs = node_configs(4)
    configs[2].update({"fail-round": 2, "drill-exchange": "train"})  # a failed reply: a row with no metrics
    summary = run_inline(cfg, configs)
    assert summary["status"] == "completed" and summary["failed-rounds"] == {"client-02": [2]}
    assert_tracked(store, tmp_path / "results" / "tracked", "FINISHED", "pilot")
    link = json.loads((tmp_path / "results" / "tracked" / "mlflow.json").read_text())
    assert link["tracking-uri"] == str(store) and link["rows-logged"] > 0


def test_a_resumed_run_continues_its_mlflow_run_without_logging_a_row_twice(tmp_path: Path) -> None:
    store = tmp_path / "mlruns"
    cfg = validate(
        {**FAST, "results-dir": str(tmp_path), "run-name": "crash", "mlflow-tracking-uri": f"file:{store}"}
    )
    # Pushes: discovery, rounds 1 and 2, then it dies in round 3 (fedavg logs nothing in round 0).
    grid = DyingGrid(client_app, node_configs(3), cfg, die_at=4)
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, SUPERLINK_NODE_ID, 1
    with pytest.raises(ConnectionError):
        run_server(grid, cfg)
    client, run = only_run(store)
    assert run.info.status == "FAILED"
    assert {step for history in logged_metrics(client, run).values() for step, _ in history} == {1, 2}

    resumed = run_inline({**cfg, "resume": True}, node_configs(3))
    assert resumed["status"] == "completed"
    assert_tracked(store, tmp_path / "crash", "FINISHED")  # still one MLflow run; each row once


def start_run(results: Path, sets: dict) -> subprocess.Popen:
    """`hetfed run --engine inline` of 3 silos (every one in every round) in its own process group."""
    return start_inline_run(results, {**FAST, "fraction": 1.0, **sets})


@pytest.mark.parametrize("trap", ["mlflow-metric", "checkpoint"])
def test_a_serverapp_killed_mid_send_or_before_its_checkpoint_logs_each_kept_row_once(
    tmp_path: Path, trap: str
) -> None:
    """The ServerApp is SIGKILLed (as `hetfed run` ends a simulation's on Ctrl-C) where CI once
    caught it: MLflow holding part of a round's metrics (a metric file of MLflow's file store is a
    FIFO, so the send stops there) or rounds.csv holding a round its checkpoint does not (the
    checkpoint's file is the FIFO). Closing the segment sends what the checkpoint covers, once; the
    resume redoes the rest and MLflow holds each row of rounds.csv once."""
    store, results = tmp_path / "mlruns", tmp_path / "results"
    run_dir = results / "killed"
    proc = start_run(results, {"num-rounds": 4, "run-name": "killed", "mlflow-tracking-uri": str(store)})
    if trap == "mlflow-metric":  # the server's first evaluation metric: sent with the last round
        link = wait_until(lambda: json.loads((run_dir / "mlflow.json").read_text()), "mlflow.json", proc)
        (folder,) = store.glob(f"*/{link['run-id']}")
        fifo = folder / "metrics" / "fed-mse"
        fifo.parent.mkdir(parents=True, exist_ok=True)
        os.mkfifo(fifo)
        kill_when_blocked(proc, fifo)
    else:
        kill_at_a_checkpoint(proc, run_dir)
    checkpointed = int(torch.load(run_dir / "checkpoint.pt", weights_only=False)["round"])
    done = max(int(r["round"]) for r in csv.DictReader(open(run_dir / "rounds.csv", newline="")))
    assert done == checkpointed + (trap == "checkpoint")  # rounds.csv is a round ahead of the checkpoint

    summary = record_interrupted(str(results), "killed", "stopped by SIGKILL")
    assert summary is not None and summary["status"] == "interrupted"
    client, run = only_run(store)
    assert run.info.status == "KILLED"
    assert logged_metrics(client, run) == expected_metrics(run_dir, through=checkpointed)

    out = hetfed_cli("run", "--resume", "killed", "--results-dir", str(results))
    assert out.returncode == 0, out.stderr[-3000:]
    assert_tracked(store, run_dir, "FINISHED")  # still one MLflow run; each row of rounds.csv once


def test_a_store_lost_for_some_rounds_costs_one_warning_and_gets_every_row_once(tmp_path: Path) -> None:
    """An SQLite store locked by another process (this test) from round 1 to round 3: the sends in
    between fail (one warning line, the run goes on), the next send brings what they missed."""
    db, results = tmp_path / "mlflow.db", tmp_path / "results"
    uri = f"sqlite:///{db}"
    # The experiment made first, to keep its artifacts in tmp_path (SQLite stores default to ./mlruns).
    MlflowClient(uri).create_experiment("hetfed", artifact_location=str(tmp_path / "artifacts"))
    proc = start_run(results, {"num-rounds": 6, "run-name": "lost", "mlflow-tracking-uri": uri})
    try:
        wait_for_round(results / "lost", 1, proc)
        lock = sqlite3.connect(db, timeout=60, isolation_level=None)
        lock.execute("BEGIN EXCLUSIVE")  # every other connection's read or write now fails
        wait_for_round(results / "lost", 3, proc)
        lock.execute("COMMIT")
        lock.close()
        _, stderr = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, stderr[-3000:]
    warnings = [line for line in stderr.splitlines() if "MLflow: rows of rounds.csv not sent yet" in line]
    assert len(warnings) == 1 and "database is locked" in warnings[0], stderr[-3000:]
    assert_tracked(uri, results / "lost", "FINISHED")


def test_a_store_that_cannot_be_used_is_one_line_before_round_1(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder\n")
    cfg = {
        **FAST,
        "results-dir": str(tmp_path),
        "run-name": "r",
        "mlflow-tracking-uri": str(blocker / "mlruns"),
    }
    with pytest.raises(ConfigError) as caught:
        run_inline(cfg, node_configs(2))
    message = str(caught.value)
    assert message.startswith(
        f"run config 'mlflow-tracking-uri' = '{blocker / 'mlruns'}': MLflow cannot track"
    )
    assert "\n" not in message
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["status"] == "failed" and not (tmp_path / "r" / "rounds.csv").exists()


@pytest.mark.deployment
def test_a_deployment_run_is_tracked_by_its_serverapp(deployment, tmp_path: Path) -> None:
    store = tmp_path / "mlruns"
    cfg = prepare({**FAST, "run-name": "tracked", "mlflow-tracking-uri": str(store)}, "deployment", tmp_path)
    run_id = deployment.submit(REPO, cfg)
    assert deployment.wait_run(run_id, timeout=900) == "finished:completed", deployment.run_log(run_id)[
        -3000:
    ]
    assert_tracked(store, tmp_path / "tracked", "FINISHED")
