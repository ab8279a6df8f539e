"""bench/_report.py: each benchmark's section of docs/benchmarks.md names where it was measured."""

from __future__ import annotations

import subprocess
from importlib import metadata
from pathlib import Path

import pytest
import torch

from bench import _report
from hetfed import versions
from tests.conftest import lscpu_model


def test_a_section_names_the_cpu_and_versions_and_replaces_only_itself(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    doc = tmp_path / "benchmarks.md"
    monkeypatch.setattr(_report, "DOC", doc)
    _report.write_section("one", "One", "first body")
    _report.write_section("two", "Two", "second body")
    _report.write_section("one", "One", "new body")
    text = doc.read_text()
    assert "first body" not in text and "new body" in text and "second body" in text
    assert text.index("new body") < text.index("second body")  # replaced where it was
    model = lscpu_model()
    line = next(ln for ln in text.splitlines() if ln.startswith("_Measured"))
    cores = int(subprocess.run(["nproc"], capture_output=True, text=True, check=True).stdout)
    assert f"{model} ({torch.backends.cpu.get_cpu_capability()}, {cores} cores)" in line
    assert f"Flower {versions.flower()}" in line and f"torch {metadata.version('torch')}" in line
    env = _report.environment()
    assert env["versions"]["starlette"] == metadata.version("starlette")  # the SuperLink's web stack
    assert env["machine"]["cpu"] == model
