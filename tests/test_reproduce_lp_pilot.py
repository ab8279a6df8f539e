"""``hetfed reproduce lp-pilot``: the worked pilot's loss comparison (docs/results/lp-pilot.*)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from hetfed.reproduce import lp_pilot
from tests.conftest import REPO, reproduce_quick


def test_the_quick_reproduction_tabulates_its_runs(tmp_path: Path) -> None:
    out = reproduce_quick("lp-pilot", tmp_path)
    assert out.returncode == 0, out.stderr
    data = json.loads((tmp_path / "out" / "lp-pilot.json").read_text())
    assert data["runs"] == 3 and data["seeds"] == [42]
    for loss in lp_pilot.LOSSES:
        run = tmp_path / "runs" / f"lp-pilot-{loss}-s42"
        summary = json.loads((run / "summary.json").read_text())
        config = json.loads((run / "config.json").read_text())["config"]
        assert summary["status"] == "completed" and config["loss"] == loss and config["problem"] == "lp"
        for model in lp_pilot.MODELS:
            per_silo = [summary["clients"][silo][f"{model}-relative-regret"] for silo in lp_pilot.SILOS]
            table = data["tables"][loss][model]
            assert [table[silo]["mean"] for silo in lp_pilot.SILOS] == per_silo
            assert table["mean"]["mean"] == pytest.approx(np.mean(per_silo), rel=1e-12)
    assert (tmp_path / "out" / "lp-pilot.md").read_text() == lp_pilot.markdown(data)


def test_the_committed_report_is_what_its_json_renders() -> None:
    results = REPO / "docs" / "results"
    data = json.loads((results / "lp-pilot.json").read_text(encoding="utf-8"))
    assert (results / "lp-pilot.md").read_text(encoding="utf-8") == lp_pilot.markdown(data)
    assert not data["quick"] and len(data["seeds"]) == 5
