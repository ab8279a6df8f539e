"""`hetfed reproduce energy-pilot`: every number of its report is read back from the runs."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from hetfed.reproduce import energy_pilot
from tests.conftest import REPO, reproduce_quick


@pytest.fixture(scope="module")
def quick(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("pilot")
    out = reproduce_quick("energy-pilot", tmp, workers=2)
    assert out.returncode == 0, out.stderr[-3000:]
    return tmp


def summaries(tmp: Path) -> dict[tuple[str, str], dict]:
    """(split, run label) -> the summary of its (only, --quick) seed's run."""
    return {
        (split, label): json.loads(
            (tmp / "runs" / f"pilot-{split}-{label.replace(' ', '-')}-s42" / "summary.json").read_text()
        )
        for split in ("as-is", "no-storm")
        for label in energy_pilot.RUNS
    }


def test_each_table_cell_and_step_is_its_runs_number(quick: Path) -> None:
    data = json.loads((quick / "out" / "energy-pilot.json").read_text())
    runs = summaries(quick)
    for (split, label), summary in runs.items():
        for stage in energy_pilot.STAGES:
            cell = data["tables"]["regret"][split][label][stage]
            assert cell["values"] == [summary["aggregate"][f"{stage}-absolute-regret"]]
        for step, ((ra, sa), (rb, sb)) in energy_pilot.STEPS.items():
            a = runs[(split, ra)]["aggregate"][f"{sa}-absolute-regret"]
            b = runs[(split, rb)]["aggregate"][f"{sb}-absolute-regret"]
            entry = data["tables"]["steps"][split][step]
            assert entry["values"] == [pytest.approx(a - b)] and entry["negative"] == int(a < b)
    assert (quick / "out" / "energy-pilot.md").read_text() == energy_pilot.markdown(data)


def test_no_silo_deploys_a_model_worse_on_its_validation_days_than_the_federated_one(quick: Path) -> None:
    data = json.loads((quick / "out" / "energy-pilot.json").read_text())
    runs = summaries(quick)
    for split, by_run in data["per-zone"].items():
        for label, by_zone in by_run.items():
            for zone, entry in by_zone.items():
                m = runs[(split, label)]["clients"][zone]
                personal = m["per-val-relative-regret"] < m["fed-val-relative-regret"]
                assert entry["dep"] == m["per-absolute-regret" if personal else "fed-absolute-regret"]
                assert m["dep-val-relative-regret"] <= m["fed-val-relative-regret"]
                assert entry["never-worse-on-validation"] is True


def test_the_median_calibration_is_the_median_cost_norm_over_the_radius(quick: Path) -> None:
    from hetfed.reproduce.energy.analysis import zone_data

    data = json.loads((quick / "out" / "energy-pilot.json").read_text())
    zone = data["zones"][0]
    d = zone_data(zone)
    norms = np.linalg.norm(d.train.c.numpy(), axis=1)
    radius = d.polytope.radius()
    assert data["calibration"][zone]["as-is"]["median"] == pytest.approx(np.median(norms) / radius, rel=1e-12)
    assert data["calibration"][zone]["as-is"]["mean"] == pytest.approx(norms.mean() / radius, rel=1e-12)


def test_the_committed_pilot_report_is_what_its_json_renders() -> None:
    results = REPO / "docs" / "results"
    data = json.loads((results / "energy-pilot.json").read_text(encoding="utf-8"))
    assert (results / "energy-pilot.md").read_text(encoding="utf-8") == energy_pilot.markdown(data)


def test_the_report_names_the_engine_its_runs_used() -> None:
    """The committed runs predate the "engine" field and were inline; a simulation run says so."""
    data = json.loads((REPO / "docs" / "results" / "energy-pilot.json").read_text(encoding="utf-8"))
    assert "ERCOT zones as silos, inline engine;" in energy_pilot.markdown(data)
    simulated = energy_pilot.markdown({**data, "engine": "simulation"})
    assert "ERCOT zones as silos, simulation engine;" in simulated and "inline engine" not in simulated
