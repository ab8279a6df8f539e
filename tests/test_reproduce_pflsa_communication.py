"""`hetfed reproduce pflsa-communication`: its curves are the runs' errors, against bench/lsa_reference.py."""

from __future__ import annotations

import json

import numpy as np
import pytest

from bench.lsa_reference import fedlsa, pflsa, stacked
from hetfed.cli import main
from hetfed.problems.garnet import make_agents
from hetfed.reproduce.pflsa_communication import METHODS, N, markdown
from tests.test_pflsa import client_samples, shared_sq_errors, sq_errors


@pytest.fixture(scope="module")
def study(tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp("comm")
    assert main(["reproduce", "pflsa-communication", "--quick", "--rounds", "20", "--out", str(out)]) == 0
    data = json.loads((out / "pflsa-communication.json").read_text())
    assert (out / "pflsa-communication.md").read_text() == markdown(data)
    return data["levels"]["0.5"]


def test_fedlsa_with_local_steps_is_the_reference_trajectory_against_messages(study: dict) -> None:
    """FedLSA H = 20 and PF-LSA, run 0 (samples seeded 0) on Garnet seed 42, zeta 0.5: the error after
    every 10 rounds (= 100 messages) is the NumPy transcription's on the same samples."""
    agents = make_agents(N, 42, 0.5, 0.5)
    _, _, star = stacked(agents)
    shared = fedlsa(client_samples(agents, 0, 1), np.zeros(5), 0.2, 20, 20, N)
    curve = study["FedLSA H=20"]
    assert curve["messages"] == [0, 100, 200]
    np.testing.assert_allclose(
        curve["error-mean"], shared_sq_errors(shared[[0, 10, 20]], star).mean(axis=1), rtol=1e-9
    )
    thetas = pflsa(client_samples(agents, 0, 1), np.zeros((N, 5)), METHODS["PF-LSA"][1], 1 / N, 20)
    np.testing.assert_allclose(
        study["PF-LSA"]["error-mean"], sq_errors(thetas[[0, 10, 20]], star).mean(axis=1), rtol=1e-9
    )


def test_one_local_step_makes_scafflsa_fedlsa(study: dict) -> None:
    """With H = 1 SCAFFLSA's control variates cancel (each round's correction is the mean of the
    last round's updates minus the agent's own, applied once): the two curves coincide."""
    np.testing.assert_allclose(
        study["SCAFFLSA H=1"]["error-mean"], study["FedLSA H=1"]["error-mean"], rtol=1e-9
    )
    assert study["SCAFFLSA H=5"]["error-mean"] != study["FedLSA H=5"]["error-mean"]  # but not with H > 1


def test_the_committed_report_is_what_its_json_renders() -> None:
    from tests.conftest import REPO

    results = REPO / "docs" / "results"
    data = json.loads((results / "pflsa-communication.json").read_text())
    assert (results / "pflsa-communication.md").read_text() == markdown(data)
    assert {len(m["error-runs"]) for level in data["levels"].values() for m in level.values()} == {5}


@pytest.mark.parametrize("option", ["--runs", "--rounds"])
def test_a_zero_budget_is_refused_not_replaced_by_the_default(
    option: str, tmp_path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["reproduce", "pflsa-communication", "--quick", option, "0", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "--runs must be >= 1 and --rounds >=" in err and err.count("\n") == 1, err
    assert not any(tmp_path.iterdir())
