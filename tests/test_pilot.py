"""docs/pilot.md's worked pilot, run as written: a real local deployment federation of 3
SuperNodes, each with its own LP file (LP, Maximize LP, MPS) and ERCOT days, FedRSPO+ with RSPO+, then
``hetfed decide`` on silo 1. The same run on the inline and simulation engines gives the same
per-client metrics (to 1e-6, relative for the MSEs of order 1e3: a simulation run's differ from the
inline run's in the 10th digit), and every engine's silo state gives the same decisions.
"""

from __future__ import annotations

import csv
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from hetfed.engines.runner import run_experiment
from tests.conftest import REPO

pytestmark = [pytest.mark.deployment, pytest.mark.simulation]


def readme_commands() -> list[str]:
    """The commands of the pilot guide's block, continuation lines joined."""
    text = (REPO / "docs" / "pilot.md").read_text()
    block = text.split("<!-- pilot-commands:", 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    return [line.strip() for line in block.replace("\\\n", " ").splitlines() if line.strip()]


def run_config(command: str) -> dict[str, object]:
    """The ``--set`` values of the pilot guide's ``hetfed run`` command, typed as hetfed reads them."""
    from hetfed.config import parse_assignments

    return dict(parse_assignments(re.findall(r"--set (\S+)", command)))


def decisions(path: Path) -> np.ndarray:
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    return np.array([[float(v) for v in r[1:]] for r in rows[1:]])


def test_the_readme_pilot_runs_as_written_and_every_engine_agrees(tmp_path: Path) -> None:
    commands = readme_commands()
    assert [c.split()[:3] for c in commands] == [
        ["hetfed", "federation", "up"],
        ["hetfed", "run", "--engine"],
        ["hetfed", "decide", "--state-dir"],
        ["hetfed", "federation", "down"],
    ]
    # A fresh folder standing for the repository's (the guide's paths are relative to it).
    (tmp_path / "examples").symlink_to(REPO / "examples")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    try:
        for command in commands:
            out = subprocess.run(
                ["bash", "-c", command], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900
            )
            assert out.returncode == 0, (command, out.stdout[-2000:], out.stderr[-2000:])
    finally:
        subprocess.run(
            [sys.executable, "-m", "hetfed.cli", "federation", "down", "--dir", ".hetfed/pilot"],
            cwd=tmp_path,
            capture_output=True,
            timeout=120,
        )
    deployed = json.loads((tmp_path / "results" / "pilot" / "summary.json").read_text())
    assert deployed["status"] == "completed" and deployed["engine"] == "deployment"
    assert sorted(deployed["clients"]) == ["client-00-silo-0", "client-01-silo-1", "client-02-silo-2"]
    sidecar = json.loads((tmp_path / "decisions" / "silo-1.json").read_text())
    assert sidecar["rows"] == 14 and sidecar["sense"] == "maximize" and sidecar["max-violation"] <= 1e-7

    cfg = run_config(commands[1])
    data = str(REPO / "examples" / "pilot" / "silo-{partition}")
    for engine in ("inline", "simulation"):
        summary = run_experiment(
            engine,
            {**cfg, "run-name": f"pilot-{engine}"},
            nodes=3,
            results_dir=tmp_path / "results",
            data_path=data,
            state_dir=str(tmp_path / engine / "{partition}"),
            echo=lambda *_: None,
        )
        assert summary["status"] == "completed"
        for client, metrics in deployed["clients"].items():
            assert set(summary["clients"][client]) == set(metrics), (engine, client)
            for key, value in metrics.items():
                got = summary["clients"][client][key]
                assert got == pytest.approx(value, rel=1e-6, abs=1e-6), (engine, client, key)
        out = tmp_path / "decisions" / f"silo-1-{engine}.csv"
        state, features = str(tmp_path / engine / "1"), "examples/pilot/silo-1/new-days.csv"
        decide = subprocess.run(
            [sys.executable, "-m", "hetfed.cli", "decide", "--state-dir", state, "--run", f"pilot-{engine}",
             "--features", features, "--out", str(out)],
            cwd=tmp_path, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert decide.returncode == 0, decide.stderr
        reference = decisions(tmp_path / "decisions" / "silo-1.csv")
        np.testing.assert_allclose(decisions(out), reference, atol=1e-6)
