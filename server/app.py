"""The hetfed ServerApp: validate the run config, connect the clients, run the strategy, write results."""

from __future__ import annotations

import time
import traceback
from logging import INFO
from typing import Any

from flwr.app import Context
from flwr.common import log
from flwr.serverapp import Grid, ServerApp

from hetfed.config import ConfigError, validate
from server.pool import ClientPool
from server.store import RunStore
from server.summary import report_markdown

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    run_server(grid, context.run_config)


def default_run_name(cfg: dict[str, Any]) -> str:
    return f"{cfg['problem']}-{cfg['strategy']}-s{cfg['seed']}-{time.strftime('%Y%m%d-%H%M%S')}"


def run_server(grid: Grid, run_config: dict[str, Any]) -> dict[str, Any]:
    """One complete run on ``grid``; returns the summary written to summary.json.

    The config is validated before anything is sent; an existing results folder is
    only reused with ``resume = true`` (and then continues from its checkpoint).
    """
    from strategies.registry import build_strategy  # imports torch; after validation

    cfg = validate(run_config)
    run_name = cfg["run-name"] or default_run_name(cfg)
    cfg["run-name"] = run_name
    store = RunStore(cfg["results-dir"], run_name)
    has_config = (store.path / "config.json").exists()
    if has_config and not cfg["resume"]:
        raise ConfigError(
            f"run config 'run-name': results/{run_name} already exists; "
            "choose another run-name or set resume=true to continue it"
        )
    if cfg["resume"] and store.load_checkpoint() is None:
        raise ConfigError(f"run config 'resume': {store.path} has no checkpoint to resume from")
    engine = cfg["engine"] or type(grid).__name__
    if not has_config:
        store.write_config(cfg, engine=engine)
    strategy = build_strategy(cfg)

    def say(text: str) -> None:
        log(INFO, "[%s] %s", run_name, text)

    pool = ClientPool(
        grid,
        store,
        required=cfg["num-clients"],
        wait_timeout=cfg["node-wait-timeout"],
        round_timeout=cfg["round-timeout"],
        audit=cfg["audit-traffic"],
        log=say,
    )
    started = time.time()
    try:
        pool.connect(run_name)
        summary = strategy.run(pool, store)
        status, error = "completed", ""
    except Exception as exc:  # record what failed next to the results so far, then fail the run
        summary, status, error = {}, "failed", f"{type(exc).__name__}: {exc}"
        say("run failed: " + error + "\n" + traceback.format_exc())
        raise
    finally:
        full = {
            "run-name": run_name,
            "status": status,
            "error": error,
            "strategy": cfg["strategy"],
            "problem": cfg["problem"],
            "engine": engine,
            "seed": cfg["seed"],
            "wall-time-s": round(time.time() - started, 3),
            **summary,
        }
        store.write_summary(full, report_markdown(f"{run_name} ({status})", full))
    say(f"done in {full['wall-time-s']:.1f} s; results in {store.path}")
    return full
