"""A silo keeps its own local-DP budget (client/silo_budget.py): it counts the releases of its data
it made, across runs, from its own ledger, and its policy refuses the release that would exceed
``max-epsilon`` (this run) or ``lifetime-epsilon`` (every run), also when the server declares a
smaller budget than it spends. Real inline runs, the real ClientApp with its mods."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import pytest
from dp_accounting.rdp import RdpAccountant

from hetfed.client.ledger import read
from hetfed.client.silo_budget import epsilon, releases
from hetfed.engines.inline import node_configs, run_inline
from hetfed.server.privacy import Privacy
from tests.conftest import hetfed_cli
from tests.test_privacy import epsilon_from_rdp, gaussian_rdp

FAST = {"num-rounds": 2, "n-train": 40, "n-test": 30, "local-epochs": 1, "num-items": 10, "seed": 3}
Z = 2.0
LOCAL = {"dp": "local", "dp-noise-multiplier": Z, "dp-clipping-norm": 1.0, "fraction": 1.0}


def closed_form(multipliers: list[float], delta: float = 1e-5) -> float:
    """The Gaussian mechanism's RDP alpha / (2 z^2) per release, summed, then (epsilon, delta)
    (tests/test_privacy.py's transcription of Balle et al. 2020, Prop. 12)."""
    orders = [float(a) for a in RdpAccountant()._orders]  # the orders the silo's accountant uses
    rdp = [sum(gaussian_rdp(a, z) for z in multipliers) for a in orders]
    return epsilon_from_rdp(rdp, orders, delta)


def test_the_silos_epsilon_is_the_gaussian_closed_form() -> None:
    for multipliers in ([Z], [Z] * 4, [1.0, 2.0, 2.0, 5.0], [0.7] * 30):
        assert epsilon(multipliers) == pytest.approx(closed_form(multipliers), rel=1e-6)
    assert epsilon([]) == 0.0


def silo_run(tmp_path: Path, name: str, policy: str, **overrides: Any) -> list[dict[str, str]]:
    """Three silos with state dirs; silo 1 has ``policy``. Returns the run's rounds.csv rows."""
    (tmp_path / "policy.toml").write_text(policy)
    configs = [{**c, "state-dir": str(tmp_path / f"node-{c['partition-id']}")} for c in node_configs(3)]
    configs[1]["policy"] = str(tmp_path / "policy.toml")
    run_inline({**FAST, **LOCAL, "results-dir": str(tmp_path), "run-name": name, **overrides}, configs)
    with open(tmp_path / name / "rounds.csv", newline="") as f:
        return list(csv.DictReader(f))


def refused(rows: list[dict[str, str]]) -> list[tuple[str, str, str]]:
    return [(r["round"], r["client"], r["error"]) for r in rows if r["status"] == "failed"]


def test_a_silo_refuses_the_release_that_would_exceed_its_lifetime_epsilon(tmp_path: Path) -> None:
    """lifetime-epsilon between the epsilon of 3 and of 4 releases: a first run of 2 rounds releases
    twice, a second run once and then is refused in round 2, from the silo's own count."""
    limit = (epsilon([Z] * 3) + epsilon([Z] * 4)) / 2
    policy = f"lifetime-epsilon = {limit}\n"
    first = silo_run(tmp_path, "first", policy)
    assert refused(first) == []
    second = silo_run(tmp_path, "second", policy)
    line = (
        f"rule 'lifetime-epsilon': one more local-DP release at noise multiplier 2 would make 4 in all runs, "
        f"epsilon {epsilon([Z] * 4):.4g} at delta 1e-05 by this silo's own count, over {limit:g}"
    )
    assert [(r, c) for r, c, _ in refused(second)] == [("2", "client-01")]
    assert line in refused(second)[0][2]
    ledger = read(tmp_path / "node-1")
    assert releases(ledger) == [Z] * 3  # the refused round released nothing
    assert releases(read(tmp_path / "node-0")) == [Z] * 4  # a silo without the policy: every round
    out = hetfed_cli("federation", "ledger", "--state-dir", str(tmp_path / "node-1"))
    assert out.returncode == 0, out.stderr
    assert f"2 local-DP releases, epsilon {closed_form([Z] * 2):.4g} at delta 1e-05" in out.stdout
    assert f"1 local-DP releases, epsilon {closed_form([Z]):.4g} at delta 1e-05" in out.stdout
    total = [line for line in out.stdout.splitlines() if "all runs:" in line]
    assert len(total) == 1 and f"3 local-DP releases, epsilon {closed_form([Z] * 3):.4g}" in total[0]


def test_a_silo_counts_its_own_releases_when_the_server_declares_less(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server that declares a budget of 0.5 and spends more (its own check switched off): the silo
    with max-epsilon between the epsilon of 2 and 3 releases serves two rounds and refuses the third."""
    monkeypatch.setattr(Privacy, "check_budget", lambda self, planned_rounds: None)
    limit = (epsilon([Z] * 2) + epsilon([Z] * 3)) / 2
    rows = silo_run(tmp_path, "liar", f"max-epsilon = {limit}\n", **{"num-rounds": 3, "dp-epsilon": 0.5})
    assert [(r, c) for r, c, _ in refused(rows)] == [("3", "client-01")]
    assert (
        "rule 'max-epsilon': one more local-DP release at noise multiplier 2 would make 3 in this run"
        in (refused(rows)[0][2])
    )
    assert releases(read(tmp_path / "node-1")) == [Z] * 2


def test_a_lifetime_budget_without_a_ledger_refuses_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "policy.toml").write_text("lifetime-epsilon = 100\n")
    configs = node_configs(3)
    configs[1]["policy"] = str(tmp_path / "policy.toml")
    run_inline({**FAST, **LOCAL, "results-dir": str(tmp_path), "run-name": "r"}, configs)
    with open(tmp_path / "r" / "rounds.csv", newline="") as f:
        failed = [r for r in csv.DictReader(f) if r["status"] == "failed"]
    assert {r["client"] for r in failed} == {"client-01"} and {r["round"] for r in failed} == {"1", "2"}
    assert all("this silo keeps no ledger (no state-dir) to count its releases" in r["error"] for r in failed)
