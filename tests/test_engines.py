"""The same config and seed on the inline and simulation engines: same clients, same results."""

from __future__ import annotations

import csv
import subprocess
from pathlib import Path

import pytest

from hetfed.engines.runner import run_experiment
from tests.conftest import hetfed_cli

FAST = {
    "num-rounds": 3,
    "n-train": 40,
    "n-test": 30,
    "local-epochs": 1,
    "num-items": 10,
    "seed": 4,
    "fraction": 0.5,
}


def sampled_per_round(run_dir: Path) -> dict[str, list[str]]:
    with open(run_dir / "rounds.csv", newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["exchange"] == "train"]
    out: dict[str, list[str]] = {}
    for r in rows:
        out.setdefault(r["round"], []).append(r["client"])
    return {k: sorted(v) for k, v in out.items()}


@pytest.mark.simulation
def test_inline_and_simulation_sample_the_same_clients_and_agree(tmp_path: Path) -> None:
    inline = run_experiment("inline", {**FAST, "run-name": "inline"}, nodes=4, results_dir=tmp_path)
    sim = run_experiment(
        "simulation", {**FAST, "run-name": "sim"}, nodes=4, results_dir=tmp_path, timeout=900
    )
    assert sim["status"] == inline["status"] == "completed"
    assert sim["engine"] == "simulation" and inline["engine"] == "inline"
    assert sampled_per_round(tmp_path / "sim") == sampled_per_round(tmp_path / "inline")
    for name in ("sim", "inline"):  # each engine's ServerApp drew the run's picture (tests/test_plots.py)
        assert (tmp_path / name / "rounds.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(sampled_per_round(tmp_path / "sim")) == 3
    assert sim["clients"].keys() == inline["clients"].keys()
    for name, metrics in inline["clients"].items():
        for key, value in metrics.items():
            assert sim["clients"][name][key] == pytest.approx(value, rel=1e-6), (name, key)


def test_cli_bad_input_is_one_line_naming_the_culprit(tmp_path: Path) -> None:
    def hetfed(*args: str) -> subprocess.CompletedProcess:
        return hetfed_cli(*args, timeout=120)

    cases = {
        ("run", "--set", "num-roundz=3"): "unknown key 'num-roundz'",
        ("run", "--set", "num-rounds=three"): "'num-rounds': expected int",
        ("run", "--set", "strategy=fedsgd"): "'strategy': unknown value 'fedsgd'",
        ("run", "--set", "problem=tsp"): "'problem': unknown value 'tsp'",
        ("run", "--engine", "deployment", "--federation-dir", str(tmp_path / "none")): "no local federation",
    }
    for args, message in cases.items():
        out = hetfed(*args, "--results-dir", str(tmp_path)) if args[0] == "run" else hetfed(*args)
        assert out.returncode == 2, (args, out.stdout, out.stderr)
        lines = out.stderr.strip().splitlines()
        assert len(lines) == 1 and message in lines[0], (args, out.stderr)
    assert not any(tmp_path.iterdir())  # nothing was written for refused runs


def test_cli_run_inline_prints_the_per_client_table(tmp_path: Path) -> None:
    out = hetfed_cli(
        "run",
        "--nodes",
        "3",
        "--results-dir",
        str(tmp_path),
        "--set",
        "num-rounds=1",
        "--set",
        "num-items=10",
        "--set",
        "run-name=cli",
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    assert "| client-02 |" in out.stdout and "status: completed" in out.stdout
    assert (tmp_path / "cli" / "summary.json").exists()
