"""``hetfed run``: one experiment on any engine, the same ServerApp and ClientApp code on each.

- ``inline``: :mod:`hetfed.engines.inline`, one process, no transport;
- ``simulation``: a private simulation SuperLink (Flower's simulation runtime,
  Ray) started for this run and stopped after it;
- ``deployment``: submitted with ``flwr run`` to the local federation started by
  ``hetfed federation up``; its start, resume and stop go into the federation's audit trail
  (:mod:`hetfed.audit`).
"""

from __future__ import annotations

import json
import signal
import tempfile
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from hetfed import audit
from hetfed.config import ConfigError, validate
from hetfed.engines.errors import FlowerProcessError, SuperLinkUnreachable
from hetfed.engines.federation_info import DEFAULT_DIR, FederationInfo
from hetfed.engines.flower import LocalFlower, end_processes_of
from hetfed.server.interrupts import raise_or_defer

APP_DIR = Path(__file__).resolve().parents[2]  # the folder with pyproject.toml (the Flower app)


class RunFailed(RuntimeError):
    """The run finished but did not complete."""


class RunLost(RunFailed):
    """The SuperLink died under a deployment run; the run is recorded interrupted and resumable."""


class RunInterrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM arrived during a run (raised by :func:`signals_raise`'s handler)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @staticmethod
    def completed(run_dir: Path) -> bool:
        """Did the run complete anyway (the signal arrived as its last round finished)?"""
        return _read_json(run_dir / "summary.json").get("status") == "completed"

    def describe(self, run_dir: Path) -> str:
        """One line: what stopped, where the run got to, how to continue it (a run whose last round
        finished as the signal arrived says so: its summary is final, nothing to resume)."""
        name = signal.Signals(self.signum).name
        if self.completed(run_dir):
            return f"{name} arrived as {run_dir.name} completed; its results are final, in {run_dir}"
        progress = _read_json(run_dir / "progress.json")
        if not progress:
            return f"interrupted by {name} before round 1 of {run_dir.name}; nothing to resume"
        return (
            f"interrupted by {name} after round {progress['round']}/{progress['total']} of "
            f"{run_dir.name} (summary, checkpoint and progress in {run_dir}); "
            f"continue it with `hetfed run --resume {run_dir.name}`"
        )


@contextmanager
def signals_raise() -> Iterator[None]:
    """SIGINT and SIGTERM raise :class:`RunInterrupted` (once; later ones wait for the cleanup)."""
    fired: list[int] = []

    def handler(signum: int, _frame: Any) -> None:
        if not fired:
            fired.append(signum)
            raise_or_defer(RunInterrupted(signum))  # not while a round's files are being written

    saved = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, old in saved.items():
            signal.signal(sig, old)


def prepare(overrides: Mapping[str, Any], engine: str, results_dir: Path) -> dict[str, Any]:
    """Validate the overrides and add what every engine needs (run name, results dir, engine)."""
    from hetfed.server.app import default_run_name

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
    data_path: str | None = None,
    state_dir: str | None = None,
) -> dict[str, Any]:
    """Run one experiment; returns its summary (summary.json). Raises RunFailed if it failed.

    ``data_path`` / ``state_dir`` (inline, simulation): each node's data and client state, with
    ``{partition}`` replaced by its partition id (a deployment's nodes have their own node config).
    How the run was launched (nodes, data path, state dir, federation dir, timeout) is recorded in its
    config (key ``launch``, kept in config.json), from which ``hetfed run --resume`` continues it.
    A resumed run (``resume = true``) passes the ``launch`` it recorded.
    """
    overrides = dict(overrides)
    if engine == "deployment":
        info = FederationInfo.load(federation_dir)
        if overrides.get("resume") and nodes and nodes != info.nodes:
            raise ConfigError(
                f"the federation in {federation_dir} has {info.nodes} SuperNodes; "
                f"run {overrides.get('run-name')} was recorded with {nodes}"
            )
        if nodes and nodes != info.nodes:
            echo(f"note: the running federation has {info.nodes} SuperNodes (not {nodes})")
        nodes = info.nodes
    data_path, state_dir = (str(Path(p).resolve()) if p else "" for p in (data_path, state_dir))
    launch = {"nodes": nodes, "data-path": data_path, "state-dir": state_dir, "timeout": timeout}
    if engine == "deployment":
        launch["federation-dir"] = str(Path(federation_dir).resolve())
    overrides.setdefault("launch", json.dumps(launch))
    run_config = prepare(overrides, engine, results_dir)
    run_dir = Path(run_config["results-dir"]) / run_config["run-name"]
    if not run_config.get("resume") and (run_dir / "config.json").exists():  # before anything starts
        from hetfed.server.store import existing_run

        raise ConfigError(existing_run(run_dir))
    if engine == "inline":
        from hetfed.engines.inline import node_configs, run_inline

        configs = node_configs(nodes)
        for key, pattern in (("data-path", data_path), ("state-dir", state_dir)):
            for c in configs:
                if pattern:
                    c[key] = pattern.replace("{partition}", str(c["partition-id"]))
        return run_inline(run_config, configs)
    if engine == "simulation":
        # Flower's simulated nodes have no node config beyond their partition: the run config carries it.
        run_config.update({"node-data-path": data_path, "node-state-dir": state_dir})
        with tempfile.TemporaryDirectory(prefix="hetfed-sim-") as tmp:
            flower = LocalFlower(Path(tmp), simulation=True)
            try:
                flower.start_superlink(cwd=APP_DIR)
                return _submit_and_wait(flower, run_config, run_dir, nodes, timeout, echo)
            except KeyboardInterrupt as exc:  # the ServerApp runs in Flower's process: stop it, then record
                from hetfed.server.app import interrupt_reason, record_interrupted

                # The ServerApp goes first, at once: stopped after its ClientApps (Ray actors), it
                # would see them fail and record the round in progress as done from the clients
                # left (seen in CI: round 10 aggregated from 1 of 3), and a resume would continue
                # from that round. Killed, it leaves the last completed round, which resume redoes
                # from; record_interrupted closes its segment.
                end_processes_of(flower.home, program="flwr-simulation", force=True)
                flower.stop()
                end_processes_of(flower.home)
                record_interrupted(run_config["results-dir"], run_config["run-name"], interrupt_reason(exc))
                raise
            finally:
                flower.stop()
                end_processes_of(flower.home)
    if engine == "deployment":
        flower = info.flower()
        if not flower.healthy():  # `flwr run` would wait minutes for a dead SuperLink
            raise FlowerProcessError(
                f"no SuperLink answers {flower.health_url} (federation {info.root}); restart it with "
                "`hetfed federation down` and `hetfed federation up`"
            )
        return _submit_and_wait(flower, run_config, run_dir, nodes, timeout, echo, on_federation=True)
    raise ValueError(f"unknown engine {engine!r}; choose inline, simulation or deployment")


def _submit_and_wait(
    flower: LocalFlower,
    run_config: dict[str, Any],
    run_dir: Path,
    nodes: int,
    timeout: float,
    echo: Any,
    on_federation: bool = False,
) -> dict[str, Any]:
    """Submit the run and follow it to its end.

    ``on_federation`` (deployment): the start (or resume) and a stop go into the federation's
    ``audit.jsonl``; SIGINT/SIGTERM stop the run on the SuperLink (``flwr stop``)
    before it is recorded interrupted; a SuperLink that stops answering ends the run's ServerApp
    processes on this machine and raises :class:`RunLost`, the run recorded interrupted.
    """
    run_id = flower.submit(APP_DIR, run_config, num_supernodes=nodes)
    try:  # a signal from here on stops the submitted run
        if on_federation:
            audit.record(flower, "resume" if run_config.get("resume") else "start", run_id, run_config)
        echo(f"submitted run {run_id} ({run_config['run-name']}); results in {run_dir}")
        return _follow(flower, run_id, run_dir, timeout, echo)
    except SuperLinkUnreachable as exc:
        from hetfed.server.app import record_interrupted

        end_processes_of(flower.home, program="flwr-serverapp")  # orphaned: they would write on
        reason = f"the SuperLink stopped answering: {exc}"
        record_interrupted(run_config["results-dir"], run_config["run-name"], reason)
        raise RunLost(f"{exc}; {_where(run_dir)}") from None
    except KeyboardInterrupt as exc:
        if not on_federation:
            raise
        from hetfed.server.app import interrupt_reason, record_interrupted

        stopped = flower.stop_run(run_id)  # the ServerApp sees it and closes its segment, interrupted
        asked = "flwr stop accepted" if stopped else "flwr stop not accepted"
        audit.record(flower, "stop", run_id, run_config, detail=f"{interrupt_reason(exc)}; {asked}")
        if not (stopped and _segment_ended(run_dir, timeout=30)) and not flower.healthy():
            end_processes_of(flower.home, program="flwr-serverapp")
        record_interrupted(run_config["results-dir"], run_config["run-name"], interrupt_reason(exc))
        raise


def _where(run_dir: Path) -> str:
    """Where a stopped run got to and how to continue it."""
    progress = _read_json(run_dir / "progress.json")
    if not progress:
        return f"run {run_dir.name} stopped before round 1; start it again"
    return (
        f"run {run_dir.name} stopped after round {progress['round']}/{progress['total']}; continue it, "
        f"once the SuperLink is back, with `hetfed run --resume {run_dir.name}`"
    )


def _read_json(path: Path) -> dict[str, Any]:
    """A small JSON file of the run's folder ({} when it is missing or half written)."""
    try:
        return dict(json.loads(path.read_text()))
    except (OSError, ValueError, TypeError):
        return {}


def _segment_ended(run_dir: Path, timeout: float) -> bool:
    """Wait until the ServerApp closed its segment (segments.jsonl's last line has a status)."""
    end = time.time() + timeout
    while time.time() < end:
        try:
            last = json.loads((run_dir / "segments.jsonl").read_text().splitlines()[-1])
        except (OSError, ValueError, IndexError):
            last = {}
        if "status" in last:
            return True
        time.sleep(0.3)
    return False


def _follow(flower: LocalFlower, run_id: str, run_dir: Path, timeout: float, echo: Any) -> dict[str, Any]:
    """Print progress until the run finishes; its summary, RunFailed if it did not complete."""
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
