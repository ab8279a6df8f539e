"""Experiment tracking in MLflow: a run's config, its rounds.csv rows and its files, as an MLflow run.

Optional (run-config key ``mlflow-tracking-uri``, extra ``hetfed[mlflow]``). The run folder stays
the record; MLflow gets a copy for the tools an operator already runs:

- params: the run's resolved config (once, when the MLflow run is created);
- metrics, step = the round: each row of rounds.csv once its round is checkpointed (the rows a
  resume keeps; a round after the checkpoint is redone). The server's row gives the aggregate
  (``regret``), a client's row gives ``<client>/<exchange>/<metric>`` (``client-0/train/regret``);
  text cells (status, error) are not metrics;
- artifacts, at the end of each segment: report.md, summary.json, config.json, rounds.csv,
  local-rounds.csv, rounds.png and the final models (models.npz, models.json).

A resumed run continues the same MLflow run (its id is in the run folder's ``mlflow.json``, with
how many rows MLflow has and how many a send under way was to bring it to), so MLflow holds each
kept row once, also when a process was killed in the middle of a send: the next send first asks
MLflow which of those metrics it already has. Tracking that cannot start is a one-line error
before round 1; a tracking server lost later costs a warning line, and the rows it missed are sent
with the next checkpoint or at the end.
"""

from __future__ import annotations

import os
import re
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

from hetfed.config import ConfigError

if TYPE_CHECKING:
    from hetfed.server.store import RunStore

LINK = "mlflow.json"  # in the run folder: which MLflow run this is, how many rows it has
ARTIFACTS = (
    "report.md",
    "summary.json",
    "config.json",
    "rounds.csv",
    "local-rounds.csv",
    "rounds.png",
    "models.npz",
    "models.json",
)
ROW_KEYS = ("round", "exchange", "partition-id", "client", "status", "error")  # coordinates, not metrics
STATUS = {"completed": "FINISHED", "failed": "FAILED", "interrupted": "KILLED"}
MAX_METRICS, MAX_PARAMS = 1000, 100  # MLflow's limits per log_batch call


def metric_key(row: Mapping[str, Any], metric: str) -> str:
    """The MLflow key of ``metric`` in a rounds.csv row: the aggregate's own name for the server's
    round row, else ``<client>/<exchange>/<metric>``; characters MLflow refuses become ``_``."""
    if row["client"] == "server":
        key = metric if row["exchange"] == "round" else f"{row['exchange']}/{metric}"
    else:
        key = f"{row['client']}/{row['exchange']}/{metric}"
    return re.sub(r"[^\w\-. :/]", "_", key).replace("..", "__").lstrip("/")


def row_metrics(row: Mapping[str, Any]) -> dict[str, float]:
    """The numeric cells of a row by MLflow key (numbers as the row holds them, or as rounds.csv
    wrote them when read back)."""
    out: dict[str, float] = {}
    for name, value in row.items():
        if name in ROW_KEYS or isinstance(value, bool) or value is None or value == "":
            continue
        try:
            number = float(value)
        except (TypeError, ValueError):
            continue  # a text cell
        out[metric_key(row, name)] = number
    return out


class MlflowTracker:
    """The MLflow run of one hetfed run; :meth:`start` creates or continues it."""

    def __init__(
        self,
        client: Any,
        uri: str,
        run_id: str,
        store: RunStore,
        say: Callable[[str], None],
        logged: int = 0,
        sending: int = 0,
    ) -> None:
        self.client, self.uri, self.run_id, self.store = client, uri, run_id, store
        self.logged = logged  # rows of rounds.csv MLflow has
        self.sending = max(sending, logged)  # rows MLflow may have: a send up to here began
        self.say = say
        self._warned = False

    @classmethod
    def start(
        cls, cfg: Mapping[str, Any], store: RunStore, say: Callable[[str], None]
    ) -> MlflowTracker | None:
        """The tracker of the run ``store`` writes (None when ``mlflow-tracking-uri`` is empty), told
        of every commit of its rows from now on.

        A new hetfed run creates an MLflow run in experiment ``mlflow-experiment`` with the config
        as params; a resumed one reopens the MLflow run its ``mlflow.json`` names. ConfigError (one
        line) when MLflow is not installed or the store cannot be reached.
        """
        uri = str(cfg.get("mlflow-tracking-uri", ""))
        if not uri:
            return None
        where = f"run config 'mlflow-tracking-uri' = {uri!r}"
        try:
            from mlflow.tracking import MlflowClient
        except ImportError:
            raise ConfigError(
                f"{where}: MLflow is not installed here (pip install 'hetfed[mlflow]')"
            ) from None
        if _is_file_store(uri):
            # MLflow 3 keeps its file store in maintenance mode behind this opt-in; naming a file
            # store in the run config is that opt-in.
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        run_dir = store.path
        try:
            client = MlflowClient(tracking_uri=uri)
            linked = store.read_json(LINK) if (run_dir / LINK).exists() else None
            if linked is not None and linked.get("tracking-uri") == uri:
                client.update_run(linked["run-id"], status="RUNNING")
                logged, sending = (int(linked.get(key, 0)) for key in ("rows-logged", "rows-sending"))
                tracker = cls(client, uri, linked["run-id"], store, say, logged, sending)
                store.on_checkpoint = tracker.log_rows
                return tracker
            name = str(cfg.get("mlflow-experiment") or "hetfed")
            experiment = client.get_experiment_by_name(name)
            experiment_id = experiment.experiment_id if experiment else client.create_experiment(name)
            tags = {"hetfed.run-name": run_dir.name, "hetfed.results": str(run_dir.resolve())}
            run = client.create_run(experiment_id, run_name=run_dir.name, tags=tags)
            tracker = cls(client, uri, run.info.run_id, store, say)
            tracker._log_params(cfg)
        except ConfigError:
            raise
        except Exception as exc:  # the store's own errors: unreachable server, refused path, ...
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            raise ConfigError(
                f"{where}: MLflow cannot track this run: {type(exc).__name__}: {first}"
            ) from None
        tracker._save_link()
        store.on_checkpoint = tracker.log_rows
        return tracker

    def log_rows(self, rows: Sequence[Mapping[str, Any]]) -> None:
        """Send the rows MLflow does not have yet (``rows``: the rows a resume keeps, in order; they
        only grow). A failure is one warning line; the rows go with the next call."""
        new = rows[self.logged :]
        if not new:
            return
        from mlflow.entities import Metric

        stamp = int(time.time() * 1000)
        metrics = [
            Metric(key, value, stamp, int(row["round"]))
            for row in new
            for key, value in row_metrics(row).items()
        ]
        try:
            if self.sending > self.logged:  # a send began and did not finish: MLflow may hold part of it
                metrics = self._not_in_mlflow(metrics)
            self.sending = len(rows)
            self._save_link()
            for i in range(0, len(metrics), MAX_METRICS):
                self.client.log_batch(self.run_id, metrics=metrics[i : i + MAX_METRICS])
        except Exception as exc:
            self._warn(f"rows of rounds.csv not sent yet: {type(exc).__name__}: {exc}")
            return
        self.logged = len(rows)
        self._save_link()

    def _not_in_mlflow(self, metrics: list[Any]) -> list[Any]:
        """``metrics`` without those MLflow already holds (same key and round): each (key, round) is
        one cell of the rows being sent, so one found in MLflow came from the unfinished send."""
        held = Counter(
            (key, point.step)
            for key in {m.key for m in metrics}
            for point in self.client.get_metric_history(self.run_id, key)
        )
        missing = []
        for metric in metrics:
            if held[metric.key, metric.step]:
                held[metric.key, metric.step] -= 1
            else:
                missing.append(metric)
        return missing

    def finish(self, status: str) -> None:
        """At the end of a segment: the rows not sent yet, the run's files as artifacts, the MLflow
        run's status (completed: FINISHED, failed: FAILED, interrupted: KILLED)."""
        self.log_rows(self.store.checkpointed_rows())
        run_dir = self.store.path
        try:
            for name in ARTIFACTS:
                if (run_dir / name).exists():
                    self.client.log_artifact(self.run_id, str(run_dir / name))
            self.client.set_tag(self.run_id, "hetfed.status", status)
            self.client.set_terminated(self.run_id, status=STATUS.get(status, "FAILED"))
        except Exception as exc:
            self._warn(f"artifacts or status not sent: {type(exc).__name__}: {exc}")

    def _log_params(self, cfg: Mapping[str, Any]) -> None:
        from mlflow.entities import Param

        params = [Param(key, str(value)) for key, value in cfg.items()]
        for i in range(0, len(params), MAX_PARAMS):
            self.client.log_batch(self.run_id, params=params[i : i + MAX_PARAMS])

    def _save_link(self) -> None:
        link = {"tracking-uri": self.uri, "run-id": self.run_id, "rows-logged": self.logged}
        self.store.write_json(LINK, {**link, "rows-sending": self.sending})

    def _warn(self, text: str) -> None:
        if not self._warned:  # once per segment: a tracking server down would warn every round
            self.say(f"MLflow: {text}")
            self._warned = True


def _is_file_store(uri: str) -> bool:
    """A ``file:`` URI or a plain path (MLflow's reading of a URI without a scheme)."""
    return urlparse(uri).scheme in ("", "file") and uri != "databricks"
