"""``hetfed run``: one experiment on any engine, the same ServerApp and ClientApp code on each.

- ``inline``: :mod:`hetfed.engines.inline`, one process, no transport;
- ``simulation``: a private simulation SuperLink (Flower's simulation runtime,
  Ray) started for this run and stopped after it;
- ``deployment``: submitted with ``flwr run`` to the local federation started by
  ``hetfed federation up``.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hetfed.config import validate
from hetfed.engines.flower import FlowerProcessError, LocalFlower
from hetfed.federation import DEFAULT_DIR, FederationInfo

APP_DIR = Path(__file__).resolve().parents[2]  # the folder with pyproject.toml (the Flower app)


class RunFailed(RuntimeError):
    """The run finished but did not complete."""


def prepare(overrides: Mapping[str, Any], engine: str, results_dir: Path) -> dict[str, Any]:
    """Validate the overrides and add what every engine needs (run name, results dir, engine)."""
    from server.app import default_run_name

    cfg = validate({**overrides, "engine": engine})
    return {
        **overrides,
        "engine": engine,
        "run-name": cfg["run-name"] or default_run_name(cfg),
        "results-dir": str(Path(results_dir).resolve()),
    }


def run_experiment(
    engine: str,
    overrides: Mapping[str, Any],
    *,
    nodes: int,
    results_dir: Path = Path("results"),
    federation_dir: Path = DEFAULT_DIR,
    timeout: float = 3600,
    echo: Any = print,
) -> dict[str, Any]:
    """Run one experiment; returns its summary (summary.json). Raises RunFailed if it failed."""
    run_config = prepare(overrides, engine, results_dir)
    run_dir = Path(run_config["results-dir"]) / run_config["run-name"]
    if engine == "inline":
        from hetfed.engines.inline import node_configs, run_inline

        return run_inline(run_config, node_configs(nodes))
    if engine == "simulation":
        with tempfile.TemporaryDirectory(prefix="hetfed-sim-") as tmp:
            flower = LocalFlower(Path(tmp), simulation=True)
            try:
                flower.start_superlink(cwd=APP_DIR)
                return _submit_and_wait(flower, run_config, run_dir, nodes, timeout, echo)
            finally:
                flower.stop()
    if engine == "deployment":
        info = FederationInfo.load(federation_dir)
        if nodes and nodes != info.nodes:
            echo(f"note: the running federation has {info.nodes} SuperNodes (not {nodes})")
        return _submit_and_wait(info.flower(), run_config, run_dir, info.nodes, timeout, echo)
    raise ValueError(f"unknown engine {engine!r}; choose inline, simulation or deployment")


def _submit_and_wait(
    flower: LocalFlower, run_config: dict[str, Any], run_dir: Path, nodes: int, timeout: float, echo: Any
) -> dict[str, Any]:
    run_id = flower.submit(APP_DIR, run_config, num_supernodes=nodes)
    echo(f"submitted run {run_id} ({run_config['run-name']}); results in {run_dir}")
    last = [-1]

    def progress() -> None:
        path = run_dir / "progress.json"
        try:
            p = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            return
        if p["round"] != last[0]:
            last[0] = p["round"]
            agg = " ".join(f"{k}={v:.4g}" for k, v in p.get("aggregate", {}).items() if isinstance(v, float))
            echo(f"  round {p['round']}/{p['total']} ({p['elapsed-s']:.0f} s) {agg}")

    status = flower.wait_run(run_id, timeout, tick=progress)
    summary_path = run_dir / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
    if status != "finished:completed":
        log = flower.run_log(run_id)
        reason = summary.get("error") or _last_error(log)
        raise RunFailed(f"run {run_id} ended as {status}: {reason}")
    if not summary:
        raise FlowerProcessError(f"run {run_id} completed but wrote no {summary_path}")
    return summary


def _last_error(log: str) -> str:
    lines = [ln for ln in log.splitlines() if "Error" in ln or "error" in ln]
    return lines[-1].strip() if lines else log.strip()[-500:]
