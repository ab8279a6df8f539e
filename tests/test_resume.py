"""Checkpoints and resume: a crashed run continues from its last round and ends as if it never died."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from flwr.common.constant import SUPERLINK_NODE_ID
from flwr.supercore.task_identity import TaskIdentity

from hetfed.client.app import app as client_app
from hetfed.config import ConfigError
from hetfed.engines.inline import InlineGrid, node_configs, run_inline
from hetfed.server.app import run_server

CFG = {
    "num-rounds": 4,
    "n-train": 40,
    "n-test": 30,
    "local-epochs": 2,
    "num-items": 10,
    "seed": 8,
    "fraction": 0.5,
}


def faulted(grid: InlineGrid, cfg: dict, fault: type[BaseException]) -> Path:
    """Run the server on ``grid`` until it raises ``fault``; the run's folder."""
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, SUPERLINK_NODE_ID, 1
    with pytest.raises(fault):
        run_server(grid, cfg)
    return Path(cfg["results-dir"]) / cfg["run-name"]


class DyingGrid(InlineGrid):
    """An inline grid whose link dies at the ``die_at``-th push (a SuperLink crash)."""

    def __init__(self, *args, die_at: int, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.pushes, self.die_at = 0, die_at

    def push_messages(self, messages):
        self.pushes += 1
        if self.pushes == self.die_at:
            raise ConnectionError("SuperLink unavailable")
        return super().push_messages(messages)


def test_a_resumed_run_ends_exactly_like_an_uninterrupted_one(tmp_path: Path) -> None:
    whole = run_inline({**CFG, "results-dir": str(tmp_path), "run-name": "whole"}, node_configs(4))

    cfg = {**CFG, "results-dir": str(tmp_path), "run-name": "crash"}
    # discovery, round 1, round 2, dies in round 3
    folder = faulted(DyingGrid(client_app, node_configs(4), cfg, die_at=4), cfg, ConnectionError)
    assert json.loads((folder / "summary.json").read_text())["status"] == "failed"
    assert json.loads((folder / "progress.json").read_text())["round"] == 2
    with open(folder / "rounds.csv", newline="") as f:
        before = list(csv.DictReader(f))
    assert {r["round"] for r in before} == {"1", "2"}

    resumed = run_inline({**cfg, "resume": True}, node_configs(4))  # fresh nodes, new node ids
    assert resumed["status"] == "completed"
    assert resumed["clients"] == whole["clients"]  # bit for bit
    assert [(s["status"], s["first-round"]) for s in resumed["segments"]] == [("failed", 1), ("completed", 3)]
    with open(folder / "rounds.csv", newline="") as f:
        after = list(csv.DictReader(f))
    # What was written before the crash is intact (later rounds may add columns).
    assert [{k: r[k] for k in before[0]} for r in after[: len(before)]] == before
    assert [r["round"] for r in after if r["client"] == "server"] == ["1", "2", "3", "4"]


def test_resume_needs_a_checkpoint_and_a_new_run_needs_a_new_name(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no checkpoint"):
        run_inline({**CFG, "results-dir": str(tmp_path), "run-name": "x", "resume": True}, node_configs(2))


def test_a_fault_drill_node_fails_its_round_and_the_run_goes_on(tmp_path: Path) -> None:
    configs = node_configs(3)
    configs[2]["fail-round"] = 2
    summary = run_inline({**CFG, "fraction": 1.0, "results-dir": str(tmp_path), "run-name": "d"}, configs)
    assert summary["status"] == "completed"
    with open(tmp_path / "d" / "rounds.csv", newline="") as f:
        failed = [r for r in csv.DictReader(f) if r["status"] == "failed"]
    assert [(r["round"], r["client"]) for r in failed] == [("2", "client-02")]
    assert "fault drill" in failed[0]["error"]
    # it recovered, so it is not among the clients missing at the end, but the summary lists its round
    assert summary["failed"] == {} and summary["failed-rounds"] == {"client-02": [2]}


class RestartingGrid(InlineGrid):
    """After round ``after``, SuperNode 1 restarts: a new node id and an empty context.state."""

    def __init__(self, *args, after: int, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.after, self.restarted = after, False

    def push_messages(self, messages):
        messages = list(messages)
        ids = super().push_messages(messages)
        if messages and messages[0].metadata.group_id == str(self.after) and not self.restarted:
            self.restarted = True
            old = next(n for n, c in self.contexts.items() if c.node_config["partition-id"] == 1)
            ctx = self.contexts.pop(old)
            from flwr.app import Context, RecordDict

            self.contexts[old + 1] = Context(
                run_id=1,
                node_id=old + 1,
                node_config=ctx.node_config,
                state=RecordDict(),
                run_config=ctx.run_config,
            )
        return ids


def test_a_restarted_supernode_rejoins_and_restores_its_state(tmp_path: Path) -> None:
    """Ditto's personal model lives on the client; after a restart it comes back from state-dir."""
    cfg = {
        **CFG,
        "strategy": "fedrspo",
        "loss": "spo+",
        "personal-rounds": 0,
        "ditto-mu": 0.3,
        "fraction": 1.0,
        "results-dir": str(tmp_path),
    }

    def configs(name: str) -> list[dict]:
        return [{**c, "state-dir": str(tmp_path / name / f"node-{i}")} for i, c in enumerate(node_configs(3))]

    whole = run_inline({**cfg, "run-name": "whole"}, configs("whole-state"))
    run_cfg = {**cfg, "run-name": "restart"}
    grid = RestartingGrid(client_app, configs("restart-state"), run_cfg, after=2)
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, SUPERLINK_NODE_ID, 1
    restarted = run_server(grid, run_cfg)
    assert grid.restarted
    assert restarted["clients"] == whole["clients"]
    with open(tmp_path / "restart" / "rounds.csv", newline="") as f:
        assert all(r["status"] == "ok" for r in csv.DictReader(f))  # the new node id was picked up

    # Without a state dir the restarted client starts its personal model over: results differ.
    lost = RestartingGrid(client_app, node_configs(3), {**cfg, "run-name": "lost"}, after=2)
    forgotten = run_server(lost, {**cfg, "run-name": "lost"})
    nodir = run_inline({**cfg, "run-name": "nodir"}, node_configs(3))
    assert forgotten["clients"]["client-01"] != nodir["clients"]["client-01"]
    assert forgotten["clients"]["client-00"] == nodir["clients"]["client-00"]


def test_a_resume_through_the_run_config_keeps_the_recorded_config(tmp_path: Path) -> None:
    """The ``flwr run ... resume=true`` route (run config only, every key not given at its default):
    a changed key is refused in one line before anything is written; with run-name, resume and the
    problem's keys the run continues with what it recorded and ends like the uninterrupted run."""
    whole = run_inline({**CFG, "results-dir": str(tmp_path), "run-name": "whole"}, node_configs(4))
    cfg = {**CFG, "results-dir": str(tmp_path), "run-name": "crash"}
    folder = faulted(DyingGrid(client_app, node_configs(4), cfg, die_at=4), cfg, ConnectionError)
    before = (folder / "segments.jsonl").read_text()
    given = {"results-dir": str(tmp_path), "run-name": "crash", "resume": True}
    with pytest.raises(ConfigError, match=r"^run config 'seed' = 42 differs from 8 recorded by run crash"):
        run_inline(given, node_configs(4))  # the silos read the problem's keys from the run config
    given.update({k: CFG[k] for k in ("n-train", "n-test", "num-items", "seed")})
    with pytest.raises(ConfigError, match=r"^run config 'num-rounds' = 3 conflicts with 4 recorded"):
        run_inline({**given, "num-rounds": 3}, node_configs(4))
    assert (folder / "segments.jsonl").read_text() == before  # the refusal wrote nothing
    resumed = run_inline(given, node_configs(4))
    assert resumed["status"] == "completed" and resumed["clients"] == whole["clients"]
    assert [s["engine"] for s in resumed["segments"]] == ["DyingGrid", "DyingGrid"]  # the recorded engine
    with pytest.raises(ConfigError, match="already completed"):
        run_inline(given, node_configs(4))


class StoppedGrid(DyingGrid):
    """The SuperLink stops the run while a push is in flight: it refuses the message's objects
    (Flower raises ObjectPushError; seen in CI when SIGTERM's `flwr stop` met a round's push)."""

    def push_messages(self, messages):
        from flwr.supercore.inflatable.inflatable_utils import ObjectPushError

        self.pushes += 1
        if self.pushes == self.die_at:
            raise ObjectPushError("931addb0", 1, "session")
        return InlineGrid.push_messages(self, messages)


def test_a_push_refused_by_a_stopped_run_is_an_interruption_and_resumes(tmp_path: Path) -> None:
    whole = run_inline({**CFG, "results-dir": str(tmp_path), "run-name": "whole"}, node_configs(4))
    cfg = {**CFG, "results-dir": str(tmp_path), "run-name": "stopped"}
    from flwr.supercore.inflatable.inflatable_utils import ObjectPushError

    folder = faulted(StoppedGrid(client_app, node_configs(4), cfg, die_at=4), cfg, ObjectPushError)
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["status"] == "interrupted" and "refused a message in flight" in summary["error"]
    resumed = run_inline({**cfg, "resume": True}, node_configs(4))
    assert resumed["status"] == "completed" and resumed["clients"] == whole["clients"]


class StoppedMidPullGrid(InlineGrid):
    """``flwr stop`` lands while the ServerApp's pull of round ``stop_round``'s replies is inside the
    SuperLink: the pull had passed the task-token check, the stop then deleted the run's messages,
    so the SuperLink answers each with Flower's own "message unavailable" error
    (``verify_message_ids`` on a store without them). Every later call is refused, as for a stopped
    run (Flower's grid raises RunNotRunningException). Seen in CI: the SIGINT fault-matrix cell."""

    def __init__(self, *args, stop_round: int, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.stop_round, self.stopped = str(stop_round), False

    def _refuse_if_stopped(self) -> None:
        from flwr.supercore.run import RunNotRunningException

        if self.stopped:
            raise RunNotRunningException

    def get_node_ids(self):
        self._refuse_if_stopped()
        return super().get_node_ids()

    def push_messages(self, messages):
        self._refuse_if_stopped()
        messages = list(messages)
        ids = list(super().push_messages(messages))
        if messages and messages[0].metadata.group_id == self.stop_round:
            from flwr.server.superlink.linkstate.utils import verify_message_ids

            self.stopped = True
            self._replies = verify_message_ids(set(ids), {}, run_id=1)  # keyed by instruction id
        return ids


def test_a_stop_during_a_pull_interrupts_the_round_instead_of_failing_every_client(tmp_path: Path) -> None:
    whole = run_inline({**CFG, "results-dir": str(tmp_path), "run-name": "whole"}, node_configs(4))
    cfg = {**CFG, "results-dir": str(tmp_path), "run-name": "stopped"}
    from flwr.supercore.run import RunNotRunningException

    grid = StoppedMidPullGrid(client_app, node_configs(4), cfg, stop_round=3)
    folder = faulted(grid, cfg, RunNotRunningException)
    assert json.loads((folder / "summary.json").read_text())["status"] == "interrupted"
    assert json.loads((folder / "progress.json").read_text())["round"] == 2
    with open(folder / "rounds.csv", newline="") as f:
        assert all(r["status"] == "ok" and r["round"] in ("1", "2") for r in csv.DictReader(f))
    resumed = run_inline({**cfg, "resume": True}, node_configs(4))
    assert resumed["status"] == "completed" and "failed-rounds" not in resumed
    assert resumed["clients"] == whole["clients"]
