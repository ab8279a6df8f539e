"""App pinning with real processes: every silo refuses a build it did not approve, in both runtimes.

A SuperLink and two SuperNodes on this machine, each SuperNode with the allow-list of
``hetfed federation approve``. The operator submits the approved build with one line
added to the ClientApp module (it would write a canary file when imported): every silo
refuses it before loading it, the run records each refusal and fails, no canary exists;
the approved build then runs to completion. Approving the new build (the rollout of a
new version) lets it run without restarting anything, and its canary appears, which
shows the canary would have been written had the refused build been loaded.
"""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import pytest

from hetfed.engines.flower import BIN, LocalFlower, free_port, supernode_args
from hetfed.federation import federation_down, federation_up
from hetfed.runtime.pinning import approve, fab_hash
from tests.conftest import hetfed_cli
from tests.test_pinning import app_copy

pytestmark = pytest.mark.deployment

RUN = {
    "num-items": 10,
    "n-train": 40,
    "n-test": 30,
    "local-epochs": 1,
    "num-rounds": 1,
    "round-timeout": 300.0,
    "node-wait-timeout": 60.0,
    "num-clients": 2,
}


@pytest.fixture(scope="module")
def builds(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """(approved app, the same app with one line added to its ClientApp module, its canary)."""
    root = tmp_path_factory.mktemp("builds")
    approved = app_copy(root / "approved")
    modified = root / "modified"
    shutil.copytree(approved, modified)
    canary = root / "canary"
    client = modified / "client" / "app.py"
    lines = client.read_text().splitlines(keepends=True)
    at = next(i for i, line in enumerate(lines) if line.startswith("import "))
    lines.insert(at, f"import pathlib; pathlib.Path({str(canary)!r}).write_text('imported')  # noqa\n")
    client.write_text("".join(lines))
    assert fab_hash(approved) != fab_hash(modified)
    return approved, modified, canary


def _run(flower: LocalFlower, app: Path, results: Path, name: str) -> dict:
    run_id = flower.submit(app, {**RUN, "run-name": name, "results-dir": str(results)})
    status = flower.wait_run(run_id, 600)
    path = results / name / "summary.json"
    summary = json.loads(path.read_text()) if path.exists() else {}
    return {"status": status, "summary": summary, "log": flower.run_log(run_id)}


def _refusals(results: Path, name: str) -> dict[str, str]:
    with open(results / name / "rounds.csv", newline="") as f:
        return {
            r["client"]: r["error"]
            for r in csv.DictReader(f)
            if r["exchange"] == "query.info" and r["status"] == "failed"
        }


def _check_refused(run: dict, results: Path, name: str, bad: str, logs: list[str]) -> None:
    assert run["status"] == "finished:failed", run["log"][-3000:]
    summary = run["summary"]
    assert summary["status"] == "failed"
    for pid in (0, 1):
        assert f"partition-{pid}: refused app build {bad}: not approved by this silo" in summary["error"]
    refusals = _refusals(results, name)
    assert sorted(refusals) == ["partition-0", "partition-1"], refusals
    assert all(f"refused app build {bad}" in why for why in refusals.values()), refusals
    for log in logs:  # logged on each silo
        assert f"refused app build {bad}" in log, log[-3000:]


@pytest.mark.parametrize("runtime", ["warm", "stock"])
def test_every_silo_refuses_an_unapproved_build_and_runs_the_approved_one(
    runtime: str, builds: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    approved, modified, canary = builds
    canary.unlink(missing_ok=True)
    allow, results = tmp_path / "approved-apps", tmp_path / "results"
    approve(allow, fab_hash(approved))
    bad = fab_hash(modified)
    info = federation_up(tmp_path / "fed", 2, app_dir=approved, approved_apps=allow, runtime=runtime)
    try:
        flower = info.flower()
        logs = lambda: [(info.root / f"supernode-{i}.log").read_text() for i in range(2)]  # noqa: E731
        refused = _run(flower, modified, results, "refused")
        _check_refused(refused, results, "refused", bad, logs())
        assert not canary.exists(), "a refused build's ClientApp module was imported on a silo"

        good = fab_hash(approved)
        silos = json.loads((results / "refused" / "silos.json").read_text())["silos"]
        assert {k: v["approved-apps"] for k, v in silos.items()} == {
            "partition-0": [good[:12]],
            "partition-1": [good[:12]],
        }  # reported by each silo's SuperNode with its refusal

        ok = _run(flower, approved, results, "approved")
        assert ok["status"] == "finished:completed", ok["log"][-3000:]
        assert ok["summary"]["status"] == "completed"
        assert sorted(ok["summary"]["clients"]) == ["client-00", "client-01"]
        silos = json.loads((results / "approved" / "silos.json").read_text())["silos"]
        assert {k: (v["approved-apps"], v["reported-by"]) for k, v in silos.items()} == {
            f"partition-{i}": ([good], "ClientApp query.info") for i in range(2)
        }
        status = hetfed_cli("federation", "status", "--dir", str(info.root), "--results-dir", str(results))
        assert status.returncode == 0, status.stderr
        assert "as each silo reported them in run approved" in status.stdout
        assert f"partition-1: {good[:12]} (by its ClientApp query.info)" in status.stdout

        approve(allow, bad, note="v2")  # the rollout: each silo approves the new build; no restart
        rolled = _run(flower, modified, results, "rolled-out")
        assert rolled["status"] == "finished:completed", rolled["log"][-3000:]
        assert canary.read_text() == "imported"  # so the refused build would have written it
    finally:
        federation_down(info.root)


def test_the_warm_worker_refuses_an_unapproved_build_as_an_external_executor(
    builds: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    """Flower's own SuperNode (process isolation, unpinned) with a warm worker as its executor."""
    approved, modified, canary = builds
    canary.unlink(missing_ok=True)
    allow, results = tmp_path / "approved-apps", tmp_path / "results"
    approve(allow, fab_hash(approved))
    bad = fab_hash(modified)
    flower = LocalFlower(tmp_path / "fed")
    try:
        flower.start_superlink(cwd=approved)
        for i in range(2):
            port = free_port()
            cfg = {"partition-id": i, "num-partitions": 2, "state-dir": str(tmp_path / f"state-{i}")}
            args = supernode_args(
                superlink=flower.address, node_config=cfg, ca=None, port=port, isolation="process"
            )
            flower.spawn(f"supernode-{i}", [str(BIN / "flower-supernode"), *args])
            worker = ["-m", "hetfed.runtime.worker", "--runtime-api-address", f"127.0.0.1:{port}"]
            flower.spawn(f"worker-{i}", [str(BIN / "python"), *worker, "--approved-apps", str(allow)])
        flower.wait_for_nodes(2)
        refused = _run(flower, modified, results, "refused")
        logs = [(flower.root / f"worker-{i}.log").read_text() for i in range(2)]
        _check_refused(refused, results, "refused", bad, logs)
        assert all("hetfed pinning (warm worker)" in log for log in logs)
        assert not canary.exists()
        ok = _run(flower, approved, results, "approved")
        assert ok["status"] == "finished:completed", ok["log"][-3000:]
    finally:
        flower.stop()
