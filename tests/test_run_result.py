"""server/store.py RunResult: a run folder read back equals its files, parsed here independently."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import numpy as np
import pytest

from hetfed.engines.inline import node_configs, run_inline
from hetfed.server.store import RunResult, StoreError

RUN = {
    "strategy": "fedrspo",
    "loss": "rspo+",
    "num-rounds": 3,
    "fraction": 0.5,
    "personal-rounds": 4,
    "freeze-tau": 0.05,
    "n-train": 40,
    "n-test": 30,
    "num-items": 10,
    "local-epochs": 1,
}


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("runs")
    run_inline({**RUN, "results-dir": str(root), "run-name": "r"}, node_configs(4))
    return root / "r"


def csv_rows(run_dir: Path) -> list[dict[str, str]]:
    with open(run_dir / "rounds.csv", newline="") as f:
        return list(csv.DictReader(f))


def test_summary_config_rows_and_models_are_the_files(run_dir: Path) -> None:
    run = RunResult.read(run_dir)
    assert run.summary == json.loads((run_dir / "summary.json").read_text()) and run.completed
    assert run.config == json.loads((run_dir / "config.json").read_text())["config"]
    assert run.config["personal-rounds"] == 4
    assert run.rows == [{k: v for k, v in r.items() if v} for r in csv_rows(run_dir)]
    assert run.progress == json.loads((run_dir / "progress.json").read_text())
    assert run.progress["round"] == run.progress["total"] == 4  # 3 warm-start rounds and personalization
    lines = [json.loads(line) for line in (run_dir / "segments.jsonl").read_text().splitlines()]
    merged: dict = {}
    for line in lines:  # one segment: its start, then what it adds (first round, end)
        assert line["segment"] == 1
        merged |= line
    assert run.segments == [merged] and merged["status"] == "completed"
    with np.load(run_dir / "models.npz") as stored:
        models = run.models()
        assert {f"{name}/{k}" for name, arrays in models.items() for k in arrays} == set(stored.files)
        assert all(np.array_equal(models["global"][k.split("/", 1)[1]], stored[k]) for k in stored.files)


def test_series_has_each_sampled_clients_value_and_nan_elsewhere(run_dir: Path) -> None:
    rounds, clients, table = RunResult.read(run_dir).series("val-relative-regret")
    assert list(rounds) == [1, 2, 3] and clients == [f"client-{j:02d}" for j in range(4)]
    expected = np.full((3, 4), np.nan)
    for r in csv_rows(run_dir):
        if r["exchange"] == "train" and r["val-relative-regret"]:
            expected[int(r["round"]) - 1, int(r["partition-id"])] = float(r["val-relative-regret"])
    np.testing.assert_array_equal(table, expected)
    assert (~np.isnan(table)).sum(axis=1).tolist() == [2, 2, 2]  # fraction 0.5 of 4 clients


def local_rows(run_dir: Path) -> list[dict[str, str]]:
    with open(run_dir / "local-rounds.csv", newline="") as f:
        return list(csv.DictReader(f))


def test_local_rounds_are_rows_and_by_client_reads_the_personalization_replies(run_dir: Path) -> None:
    """The personalization reply's per-round values (r{t}-<metric> on the wire) are rows of
    local-rounds.csv, not columns of rounds.csv."""
    run = RunResult.read(run_dir)
    freeze, val = run.local_rounds("freeze-stat"), run.local_rounds("val-relative-regret")
    trained = run.by_client("rounds-trained", "train.personalize")
    frozen = run.by_client("frozen-at", "train.personalize")
    rows = [r for r in csv_rows(run_dir) if r["exchange"] == "train.personalize"]
    assert not [k for k in rows[0] if k.startswith("r1-")]  # no per-round columns
    assert sorted(freeze) == sorted(trained) == sorted(r["client"] for r in rows) and len(rows) == 4
    local = local_rows(run_dir)
    for r in rows:
        t_max = int(float(r["rounds-trained"]))
        assert trained[r["client"]] == t_max and frozen[r["client"]] == float(r["frozen-at"])
        mine = [x for x in local if x["client"] == r["client"]]
        assert [int(x["local-round"]) for x in mine] == list(range(1, t_max + 1))
        assert {x["round"] for x in mine} == {r["round"]} and {x["exchange"] for x in mine} == {r["exchange"]}
        assert freeze[r["client"]] == {int(x["local-round"]): float(x["freeze-stat"]) for x in mine}
        assert val[r["client"]] == {int(x["local-round"]): float(x["val-relative-regret"]) for x in mine}
    assert run.by_client("no-such-metric", "train.personalize", default=-1.0) == dict.fromkeys(trained, -1.0)
    assert all(math.isnan(v) for v in run.by_client("no-such-metric", "train.personalize").values())


def test_a_run_written_before_local_rounds_csv_reads_its_per_round_columns(tmp_path: Path) -> None:
    header = "round,exchange,partition-id,client,status,error,rounds-trained,r1-freeze-stat,r2-freeze-stat"
    lines = [
        header,
        "3,train.personalize,0,client-00,ok,,2,0.5,0.25",
        "3,train.personalize,1,client-01,failed,x,,,",
    ]
    (tmp_path / "rounds.csv").write_text("\n".join(lines) + "\n")
    run = RunResult.read(tmp_path)
    assert run.local_rounds("freeze-stat") == {"client-00": {1: 0.5, 2: 0.25}}
    assert run.by_client("rounds-trained", "train.personalize") == {"client-00": 2.0}


def test_a_run_still_being_written_reads_and_an_empty_folder_is_refused(tmp_path: Path) -> None:
    (tmp_path / "early").mkdir()
    (tmp_path / "early" / "config.json").write_text(json.dumps({"config": {"seed": 3}}))
    early = RunResult.read(tmp_path / "early")
    assert early.config == {"seed": 3} and early.rows == [] and early.summary == {} and not early.completed
    assert early.progress == {} and early.segments == []
    with pytest.raises(StoreError, match="no run there"):
        RunResult.read(tmp_path)
