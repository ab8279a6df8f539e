"""Experiment tracking in MLflow (server/tracking.py) against a real local MLflow file store.

The MLflow run's metrics must be rounds.csv's numeric cells, each once, at its round; its params
the run's config; its artifacts the run's files, byte for byte; a resumed run continues the same
MLflow run without logging a row twice; a store that cannot be used is one line before round 1.
"""

from __future__ import annotations

import csv
import json
import os
from collections import defaultdict
from pathlib import Path

import pytest
from flwr.common.constant import SUPERLINK_NODE_ID
from flwr.supercore.task_identity import TaskIdentity
from mlflow.tracking import MlflowClient

from hetfed.client.app import app as client_app
from hetfed.config import ConfigError, validate
from hetfed.engines.inline import node_configs, run_inline
from hetfed.engines.runner import prepare
from hetfed.server.app import run_server
from tests.conftest import REPO
from tests.test_resume import DyingGrid

FAST = {"num-rounds": 3, "n-train": 40, "n-test": 30, "local-epochs": 1, "num-items": 10, "seed": 5}
COORDINATES = ("round", "exchange", "partition-id", "client", "status", "error")


def expected_metrics(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """Independently of server/tracking.py: every numeric cell of rounds.csv under the key the
    docs name (server row of a round: the metric; a client's: client/exchange/metric)."""
    out: dict[str, list[tuple[int, float]]] = defaultdict(list)
    with open(run_dir / "rounds.csv", newline="") as f:
        for row in csv.DictReader(f):
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


def only_run(store: Path, experiment: str = "hetfed"):
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


def assert_tracked(store: Path, run_dir: Path, status: str, experiment: str = "hetfed") -> None:
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
