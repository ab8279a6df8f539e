"""The hetfed ServerApp: validate the run config, connect the clients, run the strategy, write results."""

from __future__ import annotations

import json
import signal
import time
import traceback
from logging import INFO, WARNING
from pathlib import Path
from typing import Any

from flwr.app import Context
from flwr.common import log
from flwr.serverapp import Grid, ServerApp
from flwr.supercore.inflatable.inflatable_utils import ObjectPushError
from flwr.supercore.run import RunNotRunningException

from hetfed.config import PROBLEM_KEYS, SCHEMA, ConfigError, validate
from hetfed.runtime.seam import serverapp_grid
from hetfed.server.aggregation import Summation
from hetfed.server.plots import draw_or_say
from hetfed.server.pool import ClientPool, FederationError
from hetfed.server.report import report_markdown
from hetfed.server.rounds import run_rounds
from hetfed.server.store import (
    RunStore,
    StoreError,
    existing_run,
    load_checkpoint_file,
    run_completed,
    run_path,
)
from hetfed.server.tracking import LINK as TRACKING_LINK
from hetfed.server.tracking import MlflowTracker

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    # The short object-pull backoff, and a message's objects in one Runtime API request each way
    # (hetfed-superlink's routes), where this Flower's internals are those read; else Flower's own.
    batched = serverapp_grid(grid)
    try:
        run_server(grid, context.run_config)
    finally:
        if batched is not None:
            log(
                INFO,
                "hetfed ServerApp: objects in one request each way: %d pulled, %d pushed; "
                "%d replies confirmed with their objects",
                *batched.moved,
                batched.confirms,
            )


def default_run_name(cfg: dict[str, Any]) -> str:
    return f"{cfg['problem']}-{cfg['strategy']}-s{cfg['seed']}-{time.strftime('%Y%m%d-%H%M%S')}"


def run_server(grid: Grid, run_config: dict[str, Any]) -> dict[str, Any]:
    """One complete run (or one more segment of a resumed run) on ``grid``; returns its summary.

    The config is validated before anything is sent; an existing results folder is
    only reused with ``resume = true`` (and then continues from its checkpoint). A
    run stopped by SIGINT/SIGTERM (KeyboardInterrupt, SystemExit) ends with status
    ``interrupted``; its checkpoint and progress are those of its last completed round.
    """
    from hetfed.strategies.registry import build_strategy  # imports torch; after validation

    # Checked against SCHEMA: each key holds its default's type (run-name a str, num-clients an int...).
    cfg: dict[str, Any] = validate(run_config)
    run_name = cfg["run-name"] or default_run_name(cfg)
    cfg["run-name"] = run_name
    path = run_path(cfg["results-dir"], run_name)
    has_config = (path / "config.json").exists()
    if has_config and not cfg["resume"]:
        raise ConfigError(existing_run(path))
    recorded_engine = ""
    if cfg["resume"]:  # checked before anything is created: a refused resume leaves no folder
        cfg, recorded_engine = resumed_config(cfg, path)
    store = RunStore(cfg["results-dir"], run_name)
    engine = cfg["engine"] or recorded_engine or type(grid).__name__
    if not has_config:
        store.write_config(cfg, engine=engine)
    store.begin_segment(engine, resumed=cfg["resume"])
    summary: dict[str, Any] = {}
    status, error = "failed", "the run stopped before it started"
    tracker: MlflowTracker | None = None

    def say(text: str) -> None:
        log(INFO, "[%s] %s", run_name, text)

    try:
        tracker = MlflowTracker.start(cfg, store, lambda text: log(WARNING, "[%s] %s", run_name, text))
        strategy = build_strategy(cfg)
        pool = ClientPool(
            grid,
            store,
            required=cfg["num-clients"],
            wait_timeout=cfg["node-wait-timeout"],
            round_timeout=cfg["round-timeout"],
            audit=cfg["audit-traffic"],
            log=say,
            settings=strategy.client_settings(),
        )
        pool.connect(run_name)
        summation = Summation(cfg, pool)
        summary = run_rounds(
            strategy, pool, store, checkpoint_every=cfg["checkpoint-every"], summation=summation
        )
        status, error = "completed", ""
    # Signals and `flwr stop` (also when the stop refuses a push in flight: ObjectPushError): resumable.
    except (KeyboardInterrupt, SystemExit, RunNotRunningException, ObjectPushError) as exc:
        status, error = "interrupted", interrupt_reason(exc)
        say(f"run interrupted ({error}); continue it with resume=true")
        raise
    except Exception as exc:  # record what failed next to the results so far, then fail the run
        status, error = "failed", f"{type(exc).__name__}: {exc}"
        summary = getattr(exc, "summary", summary)  # NoUsableClient: who failed, in which rounds
        explained = isinstance(exc, ConfigError | FederationError | StoreError)  # one line says it all
        say("run failed: " + error + ("" if explained else "\n" + traceback.format_exc()))
        raise
    finally:
        full = finish_segment(store, cfg, engine, status, error, summary)
        if tracker is not None:
            tracker.finish(status)
    say(f"done in {full['wall-time-s']:.1f} s; results in {store.path}")
    return full


# Keys a resume may give differently from what the run recorded: they name the run and this segment.
RESUME_FREE = ("resume", "engine", "results-dir", "run-name")


def resumed_config(cfg: dict[str, Any], path: Path) -> tuple[dict[str, Any], str]:
    """The config a resume continues with: the one the run recorded, and its engine.

    Both routes (``hetfed run --resume``, ``flwr run ... resume=true``) come here. A method key whose
    value differs from the recorded one is refused, unless it is the key's default: ``flwr run``
    fills every key the user did not give with its default, so a default stands for "not given".
    A problem key must equal the recorded one: the silos read those from the run config itself.
    """
    if not path.is_dir():
        raise ConfigError(f"run config 'resume': no run folder {path}; no checkpoint to resume from")
    checkpoint = load_checkpoint_file(path / "checkpoint.pt")
    if checkpoint is None:
        raise ConfigError(f"run config 'resume': {path} has no checkpoint to resume from")
    try:
        recorded_file = json.loads((path / "config.json").read_text())
        recorded = validate(recorded_file["config"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        where = path / "config.json"
        raise ConfigError(f"run config 'resume': {where} is missing or damaged: {exc}") from None
    for key, value in cfg.items():
        if key in RESUME_FREE or value == recorded[key]:
            continue
        if key in PROBLEM_KEYS:  # the clients read these from the run config itself (hetfed.client.session)
            raise ConfigError(
                f"run config '{key}' = {value!r} differs from {recorded[key]!r} recorded by run "
                f"{path.name} ({path / 'config.json'}): the silos read the problem's keys from the run "
                "config, so a resume must give them as recorded (hetfed run --resume does)"
            )
        if value != SCHEMA[key].default:
            raise ConfigError(
                f"run config '{key}' = {value!r} conflicts with {recorded[key]!r} recorded by run "
                f"{path.name} ({path / 'config.json'}); a resumed run keeps its config"
            )
    if run_completed(path, checkpoint, int(recorded["num-rounds"])):
        raise ConfigError(f"run config 'resume': run {path.name} already completed ({path / 'summary.json'})")
    free = {k: cfg[k] for k in RESUME_FREE}
    return {**recorded, **free}, str(recorded_file.get("engine", "") or recorded.get("engine", ""))


def interrupt_reason(exc: BaseException) -> str:
    """``stopped by SIGTERM`` for an exception raised by a signal handler, else its type."""
    signum = getattr(exc, "signum", None)
    if signum is not None:
        return f"stopped by {signal.Signals(signum).name}"
    if isinstance(exc, RunNotRunningException):
        return "stopped on the SuperLink (flwr stop)"
    if isinstance(exc, ObjectPushError):  # the SuperLink refuses the objects of a run it stopped
        return "stopped on the SuperLink: it refused a message in flight (flwr stop)"
    if isinstance(exc, SystemExit):  # Flower's handler in a ServerApp process: a signal or `flwr stop`
        return "stopped: the ServerApp process was told to exit (a signal, flwr stop, or its SuperLink died)"
    return "stopped by SIGINT" if isinstance(exc, KeyboardInterrupt) else f"stopped ({type(exc).__name__})"


def finish_segment(
    store: RunStore,
    cfg: dict[str, Any],
    engine: str,
    status: str,
    error: str,
    summary: dict[str, Any],
) -> dict[str, Any]:
    """Close this segment; write summary.json, report.md and rounds.png over the whole run (every segment)."""
    store.end_segment(status)
    segments = [
        {k: s.get(k) for k in ("segment", "engine", "started", "first-round", "status", "wall-time-s")}
        for s in store.segments()
    ]
    full = {
        "run-name": store.run_name,
        "status": status,
        "error": error,
        "strategy": cfg["strategy"],
        "problem": cfg["problem"],
        "engine": engine,
        "seed": cfg["seed"],
        "wall-time-s": round(sum(float(s["wall-time-s"] or 0.0) for s in segments), 3),
        "segment": store.segment,
        "segments": segments,
        **summary,
    }
    store.write_summary(full, report_markdown(f"{store.run_name} ({status})", full))
    draw_or_say(store.path, lambda text: log(WARNING, "[%s] %s", store.run_name, text))
    return full


def record_interrupted(results_dir: str, run_name: str, reason: str) -> dict[str, Any] | None:
    """After a ServerApp process was stopped by force: end its open segment as ``interrupted``.

    Returns the run's summary; None when the run had not started a segment. A segment that
    ended by itself (completed, failed) keeps what it wrote.
    """
    path = run_path(results_dir, run_name)
    if not (path / "segments.jsonl").exists() or not (path / "config.json").exists():
        return None
    store = RunStore(results_dir, run_name)
    segments = store.segments()
    if "status" in segments[-1]:
        return store.read_json("summary.json")
    store.segment = int(segments[-1]["segment"])
    cfg = validate(store.read_config()["config"])
    full = finish_segment(store, cfg, str(segments[-1].get("engine", "")), "interrupted", reason, {})
    if (store.path / TRACKING_LINK).exists():  # its MLflow run ends as KILLED too, with the files
        try:
            tracker = MlflowTracker.start(cfg, store, lambda text: log(WARNING, "%s", text))
        except ConfigError as exc:
            log(WARNING, "[%s] MLflow run not closed: %s", run_name, exc)
        else:
            if tracker is not None:
                tracker.finish("interrupted")
    return full
