"""`hetfed reproduce pflsa --quick`: real inline runs, the figures, the tables, the speed-up with N."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from hetfed.cli import main
from hetfed.reproduce.pflsa import iterations_to, read_errors, tail_mean


def test_quick_reproduction_writes_figures_and_tables_and_pflsa_speeds_up_with_n(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["reproduce", "pflsa", "--quick", "--out", str(tmp_path)]) == 0
    assert "wall time" in capsys.readouterr().out
    for name in ("pflsa-fig1.png", "pflsa-fig2.png"):
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    result = json.loads((tmp_path / "pflsa.json").read_text())
    # Homogeneous agents: iterations to 1e-2 of the initial error fall as N grows (the method's
    # specification reports a speed-up over single-agent LSA of about 1 / 3.9 / 8 for N = 2 / 8 / 16).
    (level,) = [row for row in result["fig2"]["levels"] if row["zeta_rew"] == 0.0]
    pf = [level["N"][n]["pflsa-iterations"] for n in ("2", "8", "16")]
    speed = [level["N"][n]["speed-up"] for n in ("2", "8", "16")]
    assert pf[0] > pf[1] > pf[2]
    assert 0.7 < speed[0] < 1.4 and 2.5 < speed[1] < 6 and 5 < speed[2] < 12, speed
    fig1 = {row["zeta_rew"]: row["methods"] for row in result["fig1"]["levels"]}
    assert set(fig1) == {0.0, 1.0} and set(fig1[0.0]) == {"single", "pflsa", "fedlsa"}
    # theta^0 = 0: every method starts from the same error (1/N) sum_c ||theta_c*||^2
    starts = [m["initial-error"] for m in fig1[1.0].values()]
    assert max(starts) == pytest.approx(min(starts), rel=1e-12)
    # Each method's exact expected curve starts where its runs start, and the run stays near it.
    for m in fig1[1.0].values():
        assert m["curve"]["expected"][0] == pytest.approx(m["initial-error"], rel=1e-12)
        assert m["error-at-T"] == pytest.approx(m["expected-at-T"], rel=0.25)
    assert fig1[1.0]["pflsa"]["floor"] < fig1[1.0]["single"]["floor"] and fig1[1.0]["fedlsa"]["floor"] is None
    page = (tmp_path / "pflsa.md").read_text()
    assert "![Fig. 1](pflsa-fig1.png)" in page and "| (0, 0) |" in page


def test_reading_a_run_and_the_threshold(tmp_path: Path) -> None:
    rows = [
        "round,exchange,partition-id,client,status,error,sq-error,iteration,mean-sq-error",
        "1,train,0,client-00,ok,,4.0,,",
        "1,train,1,client-01,ok,,8.0,,",
        "1,round,,server,ok,,,0,6.0",
        "2,train,0,client-00,ok,,,,",  # a round without a report
        "2,train,1,client-01,ok,,,,",
        "3,train,1,client-01,ok,,2.0,,",
        "3,train,0,client-00,ok,,1.0,,",
        "3,evaluate,0,client-00,ok,,0.03,,",
        "3,evaluate,1,client-01,ok,,0.05,,",
    ]
    (tmp_path / "rounds.csv").write_text("\n".join(rows) + "\n")
    its, errors = read_errors(tmp_path, local_steps=5, nodes=2)
    np.testing.assert_array_equal(its, [0, 10, 15])  # train round r: iteration (r - 1) H; evaluate: r H
    np.testing.assert_array_equal(errors, [[4.0, 8.0], [1.0, 2.0], [0.03, 0.05]])
    mean = errors.mean(axis=1)
    assert iterations_to(its, mean) == 15  # 0.04 <= 1e-2 * 6
    assert iterations_to(its, mean, fraction=0.25) == 10
    assert iterations_to(its[:2], mean[:2]) is None
    assert tail_mean(np.arange(100), np.arange(100.0)) == pytest.approx(np.mean(np.arange(90, 100)))


def test_bad_budgets_are_refused_by_name(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["reproduce", "pflsa", "--quick", "--runs", "0", "--out", str(tmp_path)]) == 2
    assert "--runs must be >= 1" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())


def test_the_committed_page_is_what_its_json_renders() -> None:
    from hetfed.reproduce.pflsa import markdown

    committed = Path(__file__).resolve().parents[1] / "docs" / "results"
    result = json.loads((committed / "pflsa.json").read_text())
    assert (committed / "pflsa.md").read_text() == markdown(result)
    # Fig. 1's runs agree with the exact expectation at every level and method (5 runs: within 35%)
    for row in result["fig1"]["levels"]:
        for m in row["methods"].values():
            assert m["error-last-10pct"] == pytest.approx(m["expected-last-10pct"], rel=0.35)
