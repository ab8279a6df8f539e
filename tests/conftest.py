"""Shared fixtures: a private FLWR_HOME for the whole session, Flower's task identity for
in-process messages, and a throw-away real deployment (SuperLink + SuperNodes on 127.0.0.1)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import NoReturn

import pytest

REPO = Path(__file__).resolve().parents[1]


def lscpu_model() -> str:
    """The CPU's model name as lscpu (util-linux) reports it: a reference independent of hetfed's."""
    lines = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout.splitlines()
    return next(ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("Model name"))


SHARED_DATA = REPO.parent / "shared" / "data"


@pytest.fixture(autouse=True, scope="session")
def private_flower_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Never touch ~/.flwr: every Flower process of the tests uses a private home."""
    home = tmp_path_factory.mktemp("flwr-home")
    saved = {
        k: os.environ.get(k)
        for k in ("FLWR_HOME", "FLWR_DISABLE_UPDATE_CHECK", "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION")
    }
    os.environ.update(
        FLWR_HOME=str(home), FLWR_DISABLE_UPDATE_CHECK="1", FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION="1"
    )
    yield home
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.fixture
def task_identity() -> Iterator[None]:
    """Instruction messages built outside a Flower runtime need a task identity."""
    from flwr.common.constant import SUPERLINK_NODE_ID
    from flwr.supercore.task_identity import TaskIdentity

    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, SUPERLINK_NODE_ID, 1
    yield


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """A real SuperLink and 3 SuperNodes (own processes, own node configs) for one test module."""
    from hetfed.engines.flower import LocalFlower
    from hetfed.federation import node_config

    root = tmp_path_factory.mktemp("deployment")
    flower = LocalFlower(root)
    try:
        flower.start_superlink(cwd=REPO)
        for i in range(3):
            flower.start_supernode(i, node_config(i, 3, root, None, None))
        flower.wait_for_nodes(3)
        yield flower
    finally:
        flower.stop()


def cannot_run(reason: str) -> NoReturn:
    """A live test this machine cannot run (no nginx, no network namespaces, no Docker engine...):
    skipped with ``reason``; under ``CI=true`` it fails instead, as CI must run every test."""
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"CI=true, and this test cannot run here: {reason}", pytrace=False)
    pytest.skip(reason)


def needs_nginx() -> str:
    """nginx for the SuperLink host's reverse proxy (hetfed.proxy), or :func:`cannot_run`."""
    from hetfed.proxy import find_nginx

    try:
        return find_nginx()
    except FileNotFoundError as exc:
        cannot_run(str(exc))


def pytest_configure(config: pytest.Config) -> None:
    """Tiny models run faster on one thread, and the suite shares 2 cores with Flower's processes.
    The fuzz tests' seed is drawn here once, so every xdist worker (started after this) draws the
    same examples, and printed in the header."""
    import random

    import torch

    torch.set_num_threads(1)
    os.environ.setdefault("HETFED_FUZZ_SEED", str(random.randrange(2**32)))


def pytest_report_header(config: pytest.Config) -> str:
    return f"fuzz seed (tests/test_fuzz_inputs.py): HETFED_FUZZ_SEED={os.environ['HETFED_FUZZ_SEED']}"


def hetfed_cli(
    *args: str, timeout: float = 300, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """``hetfed <args>`` as a user types it (a fresh process in the repository), output captured."""
    return subprocess.run(
        [sys.executable, "-m", "hetfed.cli", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=timeout,
        env=env,
    )


def reproduce_quick(
    experiment: str, tmp_path: Path, workers: int = 1, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """``hetfed reproduce <experiment> --quick``: runs in ``tmp_path/runs``, reports in ``tmp_path/out``."""
    return hetfed_cli(
        "reproduce",
        experiment,
        "--quick",
        "--workers",
        str(workers),
        "--results-dir",
        str(tmp_path / "runs"),
        "--out",
        str(tmp_path / "out"),
        timeout=900,
        env=env,
    )
