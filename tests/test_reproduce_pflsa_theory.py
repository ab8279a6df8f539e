"""`hetfed reproduce pflsa-theory --quick`: exact floors and limits, real runs against them, the fit."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from bench.lsa_reference import stacked, theta_lim
from hetfed.cli import main
from hetfed.problems.garnet import make_agents
from hetfed.reproduce.pflsa_theory import fit_floor, markdown


def test_quick_study_checks_floors_limits_and_convergence_against_runs(tmp_path: Path) -> None:
    assert main(["reproduce", "pflsa-theory", "--quick", "--out", str(tmp_path)]) == 0
    assert (tmp_path / "pflsa-theory.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    result = json.loads((tmp_path / "pflsa-theory.json").read_text())
    # Real runs settle at the exact floor (1 run over 1500 iterations: within 25%).
    for check in result["floor"]["checks"]:
        assert check["runs-tail-mean"] == pytest.approx(check["expected-tail"], rel=0.25)
        assert check["floor"] < check["runs-tail-mean"] * 2
    # Limits: theta_c* for beta > 0, the shared theta_lim at beta = 0 (independent closed form).
    beta = result["beta"]
    a_bar, b_bar, star = stacked(make_agents(beta["N"], 42, beta["zeta_ker"], beta["zeta_rew"]))
    dispersion = float(np.mean(np.sum((theta_lim(a_bar, b_bar) - star) ** 2, axis=1)))
    rows = {row["beta"]: row for row in beta["rows"]}
    assert rows[0.0]["limit-to-shared"] < 1e-12
    assert rows[0.0]["limit-to-own"] == pytest.approx(dispersion, rel=1e-9)
    assert all(row["limit-to-own"] < 1e-12 for b, row in rows.items() if b > 0)
    # ... and the runs of each checked beta agree with the exact expectation at their horizon.
    for row in rows.values():
        if "check" in row:
            assert np.mean(row["check"]["runs-at-T"]) == pytest.approx(row["check"]["expected-at-T"], rel=0.3)
    # The floor grows with eta (beta + 1/N) on the grid.
    (fit,) = result["floor"]["fits"].values()
    assert 0.8 < fit["slope"] < 1.2
    # The page renders from the JSON alone, identically.
    page = (tmp_path / "pflsa-theory.md").read_text()
    assert page == markdown(result)
    assert "## 3. Fig. 2 at convergence" in page and "Not checked" in page


def test_the_floor_fit_recovers_a_known_power_law() -> None:
    x = np.array([0.1, 0.3, 1.0, 2.0])
    fit = fit_floor(x, 0.8 * x)
    assert fit["slope"] == pytest.approx(1.0) and fit["k"] == pytest.approx(0.8)
    assert fit["r2-proportional"] == pytest.approx(1.0) and fit["ratio-max"] == pytest.approx(1.0)
    curved = fit_floor(x, 0.8 * x**1.5)
    assert curved["slope"] == pytest.approx(1.5) and curved["r2-free"] == pytest.approx(1.0)
    assert curved["r2-proportional"] < 0.9 and curved["ratio-max"] / curved["ratio-min"] > 2


def test_the_committed_page_is_what_its_json_renders() -> None:
    committed = Path(__file__).resolve().parents[1] / "docs" / "results"
    result = json.loads((committed / "pflsa-theory.json").read_text())
    assert (committed / "pflsa-theory.md").read_text() == markdown(result)
