"""End to end on the inline engine: the real ServerApp and ClientApp code, no transport."""

from __future__ import annotations

import csv
import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict

from hetfed import versions
from hetfed.client.app import app as client_app
from hetfed.config import ConfigError
from hetfed.engines.inline import InlineGrid, node_configs, run_inline
from hetfed.problems.models import make_mlp
from hetfed.records import to_numpy, to_record
from hetfed.server.app import run_server
from hetfed.server.pool import FederationError
from hetfed.server.store import existing_run
from tests.conftest import hetfed_cli, lscpu_model

FAST = {"num-rounds": 2, "n-train": 40, "n-test": 30, "local-epochs": 1, "num-items": 10}


def run(tmp_path: Path, nodes: int = 4, observers=(), **overrides) -> dict:
    cfg = {**FAST, "results-dir": str(tmp_path), "run-name": "r", **overrides}
    return run_inline(cfg, node_configs(nodes), observers=list(observers))


def rows(tmp_path: Path, name: str = "r") -> list[dict]:
    with open(tmp_path / name / "rounds.csv", newline="") as f:
        return list(csv.DictReader(f))


def cpu_flags() -> list[str]:
    """The CPU's feature flags, as the kernel lists them."""
    lines = Path("/proc/cpuinfo").read_text().splitlines()
    return next(ln for ln in lines if ln.startswith("flags")).split(":", 1)[1].split()


def test_run_writes_complete_results(tmp_path: Path) -> None:
    summary = run(tmp_path, nodes=5, seed=3)
    folder = tmp_path / "r"
    assert summary["status"] == "completed"
    assert set(summary["clients"]) == {f"client-{i:02d}" for i in range(5)}
    on_disk = json.loads((folder / "summary.json").read_text())
    assert on_disk["aggregate"]["fed-relative-regret"] == pytest.approx(
        np.mean([m["fed-relative-regret"] for m in on_disk["clients"].values()])
    )
    pooled = sum(m["fed-regret-sum"] for m in on_disk["clients"].values()) / sum(
        m["fed-abs-opt-sum"] for m in on_disk["clients"].values()
    )
    assert on_disk["aggregate"]["fed-pooled-relative-regret"] == pytest.approx(pooled)
    config = json.loads((folder / "config.json").read_text())
    assert (
        config["seed"] == 3
        and config["config"]["num-rounds"] == 2
        and config["versions"]["flwr"] == versions.flower()  # also where flwr-nightly installs Flower
    )
    # Where it ran: the CPU as lscpu names it, the cores nproc counts, and the kernels torch picked,
    # which follow the CPU's vector units (the last bits of a result can depend on them).
    machine, flags = config["platform"], set(cpu_flags())
    assert machine["cpu"] == lscpu_model()
    assert machine["cpus"] == int(subprocess.run(["nproc"], capture_output=True, text=True).stdout)
    avx512 = {"avx512f", "avx512bw", "avx512vl", "avx512dq", "fma"} <= flags
    assert machine["cpu-capability"] == (
        "AVX512" if avx512 else "AVX2" if {"avx2", "fma"} <= flags else "DEFAULT"
    )
    table = rows(tmp_path)
    train = [r for r in table if r["exchange"] == "train"]
    assert len(train) == 2 * 2  # ceil(0.4 * 5) = 2 clients per round
    assert {r["client"] for r in table if r["exchange"] == "evaluate"} == set(summary["clients"])
    assert all(r["status"] == "ok" for r in table)
    assert "client-00" in (folder / "report.md").read_text()
    assert json.loads((folder / "progress.json").read_text())["round"] == 2


def test_sampling_is_seeded_by_partition_and_independent_of_training(tmp_path: Path) -> None:
    def sampled(path: Path) -> list[list[str]]:
        table = rows(path)
        return [
            sorted(r["client"] for r in table if r["exchange"] == "train" and r["round"] == str(k))
            for k in (1, 2)
        ]

    run(tmp_path / "a", nodes=10, seed=5)
    run(tmp_path / "b", nodes=10, seed=5, lr=0.01, **{"batch-size": 7})
    run(tmp_path / "c", nodes=10, seed=6)
    a, b, c = sampled(tmp_path / "a"), sampled(tmp_path / "b"), sampled(tmp_path / "c")
    assert a == b and a != c
    assert all(len(s) == 4 for s in a)  # ceil(0.4 * 10)


def test_fedavg_aggregates_deltas_weighted_by_sample_counts(task_identity) -> None:
    """One round by hand: w + sum n_j (w_j - w) / sum n_j over the usable replies."""
    from hetfed.methods.decision import DecisionParams
    from hetfed.server.pool import ClientInfo, ClientPool
    from hetfed.strategies.fedavg import FedAvg

    class Store:
        rows: list = []
        run_id = ""

        def add_row(self, **row):
            self.rows.append(row)
            return row

    rng = np.random.default_rng(0)
    model = make_mlp(3, 4, 2, seed=0)
    w = to_numpy(to_record(model.state_dict()))
    params = DecisionParams(fraction=1.0, lr=0.1, local_epochs=1)
    strategy = FedAvg(initial_arrays=to_record(w), num_rounds=1, seed=0, params=params)
    grid = InlineGrid(client_app, [], {})
    pool = ClientPool(grid, Store(), required=0, wait_timeout=1, round_timeout=1, log=lambda _: None)
    pool.clients = {p: ClientInfo(p, 100 + p, f"c{p}", 0) for p in range(4)}
    strategy.pool = pool
    updates = [{k: v + rng.normal(size=v.shape) for k, v in w.items()} for _ in range(4)]
    updates[2]["2.bias"][0] = np.nan  # rejected: NaN
    updates[3]["0.weight"] = np.zeros((2, 2))  # rejected: wrong shape
    counts = [10, 30, 5, 5]
    replies = []
    for p in range(4):
        ins = pool.message(p, "train", RecordDict({"config": ConfigRecord({})}), 1)
        ins.metadata.__dict__["_message_id"] = f"m{p}"
        pool._sent[f"m{p}"] = p
        pool._rows[p] = {}
        content = RecordDict(
            {
                "arrays": to_record(updates[p]),
                "metrics": MetricRecord({"num-examples": counts[p], "train-loss": 1.0}),
            }
        )
        replies.append(Message(content, reply_to=ins))
    (train,) = [phase for phase in strategy.phases(1) if phase.name == "train"]
    before = strategy.arrays
    folded = train.fold(1, pool.screen(replies, train.check))  # as server/rounds.py run_phases
    assert strategy.arrays is before  # a fold changes nothing itself: the round loop applies it
    strategy.apply(folded.state)
    metrics, new = folded.metrics, strategy.arrays
    expected = {k: w[k] + (10 * (updates[0][k] - w[k]) + 30 * (updates[1][k] - w[k])) / 40 for k in w}
    for k, v in to_numpy(new).items():
        np.testing.assert_allclose(v, expected[k], rtol=1e-13, atol=1e-15)
    assert metrics["clients-used"] == 2
    assert "NaN" in pool.failed[2] and "shape" in pool.failed[3]
    assert pool._rows[2]["status"] == "rejected"


def test_a_rejected_update_is_recorded_in_its_round_and_the_round_goes_on(tmp_path: Path) -> None:
    """A NaN update (poisoned on its way back) is left out, and rounds.csv says whose and why."""

    def poison(instruction: Message, reply: Message) -> None:
        if instruction.metadata.message_type == "train" and instruction.metadata.group_id == "2":
            if instruction.metadata.dst_node_id == first_node[0]:
                arrays = to_numpy(reply.content["arrays"])
                reply.content["arrays"] = to_record({k: np.full_like(v, np.nan) for k, v in arrays.items()})

    first_node: list[int] = []

    def remember(instruction: Message, reply: Message) -> None:
        if instruction.metadata.message_type == "train" and not first_node:
            first_node.append(instruction.metadata.dst_node_id)

    summary = run(tmp_path, nodes=3, observers=[remember, poison], fraction=1.0, **{"num-rounds": 3})
    assert summary["status"] == "completed"
    train = [r for r in rows(tmp_path) if r["exchange"] == "train"]
    bad = [r for r in train if r["status"] != "ok"]
    assert len(bad) == 1 and bad[0]["round"] == "2" and bad[0]["status"] == "rejected"
    assert "NaN" in bad[0]["error"]
    assert sum(r["round"] == "3" and r["status"] == "ok" for r in train) == 3  # the next round has all


def test_only_model_weights_and_scalars_leave_the_clients(tmp_path: Path) -> None:
    """Inspect every reply of a run: arrays must be model parameters, metrics scalars."""
    seen: list[Message] = []
    run(tmp_path, nodes=3, observers=[lambda ins, reply: seen.append(reply)])
    params = {k: tuple(v.shape) for k, v in make_mlp(8, 64, 10, seed=0).state_dict().items()}
    assert len(seen) == 3 + 2 * 2 + 3  # discovery, 2 rounds of ceil(0.4 * 3) = 2, final evaluation
    for reply in seen:
        assert not reply.has_error()
        for record in reply.content.array_records.values():
            # to_numpy refuses a packed Array holding more values than its layout names
            for key, value in to_numpy(record).items():
                assert params.get(key) == value.shape, f"array {key} is not a model parameter"
        for record in reply.content.metric_records.values():
            assert all(isinstance(v, int | float) for v in record.values()), dict(record)
        for record in reply.content.config_records.values():
            # the info of discovery; whether the client keeps state or lost it (client-state)
            assert set(record) <= {"name", "partition-id", "num-partitions", "kept", "lost"}
            assert str(tmp_path) not in str(dict(record))  # no silo path


def test_a_raising_client_is_recorded_and_the_run_continues(tmp_path: Path) -> None:
    def faulty(message, context):
        if context.node_config["partition-id"] == 1 and message.metadata.message_type == "train":
            raise RuntimeError("disk full on silo 1")
        return client_app(message, context)

    cfg = {**FAST, "results-dir": str(tmp_path), "run-name": "r", "fraction": 1.0}
    grid = InlineGrid(faulty, node_configs(3), cfg)
    from flwr.common.constant import SUPERLINK_NODE_ID
    from flwr.supercore.task_identity import TaskIdentity

    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, SUPERLINK_NODE_ID, 1
    summary = run_server(grid, cfg)
    assert summary["status"] == "completed" and len(summary["clients"]) == 3
    failed = [r for r in rows(tmp_path) if r["status"] == "failed"]
    assert [(r["round"], r["client"]) for r in failed] == [("1", "client-01"), ("2", "client-01")]
    assert all("disk full on silo 1" in r["error"] for r in failed)


def test_missing_clients_give_a_clear_error_and_keep_the_results(tmp_path: Path) -> None:
    with pytest.raises(
        FederationError, match=r"only 3 of 5 required clients .*missing partition-id \[3, 4\]"
    ):
        run(tmp_path, nodes=3, **{"num-clients": 5, "node-wait-timeout": 0.5})
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["status"] == "failed" and "only 3 of 5" in summary["error"]
    assert (tmp_path / "r" / "config.json").exists()


def test_a_missing_data_path_names_the_node(tmp_path: Path) -> None:
    configs = node_configs(2)
    configs[1]["data-path"] = str(tmp_path / "nowhere")
    with pytest.raises(FederationError, match=r"partition-1: data-path '.*nowhere' does not exist"):
        run_inline({**FAST, "results-dir": str(tmp_path), "run-name": "r"}, configs)


def test_an_existing_run_is_never_overwritten(tmp_path: Path) -> None:
    run(tmp_path, nodes=2)
    before = (tmp_path / "r" / "summary.json").read_text()
    with pytest.raises(ConfigError) as refused:
        run(tmp_path, nodes=2)
    assert str(refused.value) == existing_run(tmp_path / "r")
    assert f"{tmp_path / 'r'} holds a run already" in str(refused.value)
    assert (tmp_path / "r" / "summary.json").read_text() == before


@pytest.mark.parametrize("engine", ["inline", "simulation"])
def test_every_engine_refuses_an_existing_results_folder_before_it_starts(
    tmp_path: Path, engine: str
) -> None:
    """The real path and `--resume NAME` (the simulation engine used to submit, print the old run's
    progress and fail later with `results/NAME` and `resume=true`)."""
    args = ["--results-dir", str(tmp_path), "--nodes", "2", "--set", "run-name=r", "--set", "num-rounds=1"]
    args += ["--set", "n-train=20", "--set", "n-test=10", "--set", "num-items=5"]
    first = hetfed_cli("run", "--engine", "inline", *args)
    assert first.returncode == 0, first.stderr
    again = hetfed_cli("run", "--engine", engine, *args)
    line = f"hetfed: error: {existing_run(tmp_path / 'r')}"
    assert again.returncode == 2 and again.stderr.strip().splitlines() == [line], again.stderr
    assert f"--resume r --results-dir {tmp_path}" in line and again.stdout == ""  # nothing submitted
    resumed = hetfed_cli("run", "--resume", "r", "--results-dir", str(tmp_path))  # the advice works
    assert resumed.returncode == 2 and "already completed" in resumed.stderr  # (it completed: one line)


def test_client_data_never_reaches_the_server_store(tmp_path: Path) -> None:
    """The results folder holds metrics, not client data (no array the size of a data split)."""
    run(tmp_path, nodes=2, **{"audit-traffic": True})
    for line in (tmp_path / "r" / "traffic.jsonl").read_text().splitlines():
        entry = json.loads(line)
        assert all(shape in ([64, 8], [64], [10, 64], [10]) for shape in entry["arrays"].values()), entry
        assert all(kind in ("int", "float") for kind in entry["metrics"].values()), entry


def test_wrong_array_record_is_an_error_not_a_crash() -> None:
    """A reply whose arrays cannot load into the model is refused by load_record, by name."""
    from hetfed.problems.models import load_record

    with pytest.raises(RuntimeError, match="size mismatch|Missing key"):
        load_record(make_mlp(2, 3, 1, seed=0), ArrayRecord({}))


def test_a_plain_serverapp_main_runs_through_run_server_as_hetfed_run(tmp_path: Path) -> None:
    """One run lifecycle: plain Flower code (a ServerApp's main on its own grid) calls ``run_server``
    and gets hetfed's own run, bit for bit; the strategy a user writes with the constructor's
    keywords and typed parameters is the one the run config builds."""
    from flwr.supercore.task_identity import TaskIdentity

    from hetfed.config import validate
    from hetfed.methods.decision import CalibratedParams
    from hetfed.problems.models import model_record
    from hetfed.problems.registry import get_problem
    from hetfed.server.store import load_checkpoint_file
    from hetfed.strategies.fedrspo import FedRSPO
    from hetfed.strategies.registry import build_strategy

    method = {"strategy": "fedrspo", "loss": "rspo+", "personal-rounds": 2, "fraction": 0.5, "seed": 4}
    summary = run(tmp_path, nodes=3, **method)
    hetfed_run = load_checkpoint_file(tmp_path / "r" / "checkpoint.pt")

    cfg = validate({**FAST, **method})
    in_dim, out_dim = get_problem("knapsack").model_dims(cfg)
    strategy = FedRSPO(  # what a user writes: the constructor's keywords and the method's typed parameters
        initial_arrays=model_record(make_mlp(in_dim, cfg["hidden"], out_dim, seed=4)),
        num_rounds=2,
        seed=4,
        params=CalibratedParams(fraction=0.5, local_epochs=1, loss="rspo+", personal_rounds=2),
    )
    built = build_strategy(cfg)
    assert strategy.params == built.params and strategy.num_rounds == built.num_rounds == 3
    mine, theirs = strategy.state_dict(), built.state_dict()
    assert all(np.array_equal(mine["arrays"][k], theirs["arrays"][k]) for k in theirs["arrays"])
    assert mine["rng"] == theirs["rng"]

    grid = InlineGrid(client_app, node_configs(3), {k: cfg[k] for k in FAST | {"seed": 4}})
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 1, 1
    plain = run_server(grid, {**FAST, **method, "results-dir": str(tmp_path), "run-name": "plain"})

    expected = hetfed_run["strategy"]["arrays"]
    got = load_checkpoint_file(tmp_path / "plain" / "checkpoint.pt")["strategy"]
    assert set(got["arrays"]) == set(expected)
    assert all(np.array_equal(got["arrays"][k], expected[k]) for k in expected)
    assert plain["status"] == "completed" and plain["clients"] == summary["clients"]
    assert sorted(got["history"]) == [1, 2, 3]  # 2 warm rounds + personalization
    assert got["history"][3]["per-relative-regret"] == pytest.approx(
        summary["aggregate"]["per-relative-regret"]
    )


@pytest.mark.parametrize("hidden", [64, 0])
def test_a_runs_final_model_loads_from_its_folder_and_scores_as_the_clients_reported(
    tmp_path: Path, hidden: int
) -> None:
    """hetfed.server.store.read_models + hetfed.problems.models.mlp_from_arrays: the federated model
    of a finished run, judged again here on each client's test set, gives the regret the clients reported
    (``hidden = 0``: the linear predictor c_hat = W x, no bias)."""
    from hetfed.client.decision import decision_metrics
    from hetfed.config import validate
    from hetfed.problems.models import mlp_from_arrays
    from hetfed.problems.registry import get_problem
    from hetfed.server.store import StoreError, read_models

    summary = run(tmp_path, nodes=3, seed=2, hidden=hidden)
    models = read_models(tmp_path / "r")
    assert list(models) == ["global"]
    model = mlp_from_arrays(models["global"])
    cfg = validate({**FAST, "seed": 2})
    if hidden == 0:
        (w,) = models["global"].values()
        x = get_problem("knapsack").load_client(cfg, 0, 3, None).test.x
        np.testing.assert_allclose(model(x).detach().numpy(), x.numpy() @ w.T, rtol=1e-12, atol=1e-15)
    for j in range(3):
        data = get_problem("knapsack").load_client(cfg, j, 3, None)
        regret = decision_metrics(model, data.test, data.polytope)["relative-regret"]
        reported = summary["clients"][f"client-{j:02d}"]["fed-relative-regret"]
        assert regret == pytest.approx(reported, rel=1e-12)
    run(tmp_path, nodes=3, seed=2, hidden=hidden, strategy="local-only", loss="spo+", **{"run-name": "own"})
    with pytest.raises(StoreError, match="no models.npz"):
        read_models(tmp_path / "own")  # local-only: every model stays on its client


@pytest.mark.parametrize(
    "settings",
    [["strategy=fedrspo", "num-items=5", "n-train=20", "n-test=10"], ["strategy=pflsa", "problem=garnet"]],
    ids=["fedrspo", "pflsa"],
)
def test_rounds_csv_is_byte_equal_whatever_pythons_hash_seed(tmp_path: Path, settings: list[str]) -> None:
    """Two identical runs (no DP) under different PYTHONHASHSEEDs write the same rounds.csv, columns
    in the same order (FedRSPO+'s pooled ratios were keyed by a set: their columns swapped)."""
    files = []
    for seed in ("1", "2", "3"):
        args = ["run", "--engine", "inline", "--results-dir", str(tmp_path / seed), "--nodes", "3"]
        for item in ["run-name=r", "num-rounds=2", *settings]:
            args += ["--set", item]
        out = hetfed_cli(*args, env={**os.environ, "PYTHONHASHSEED": seed})
        assert out.returncode == 0, out.stderr[-2000:]
        files.append((tmp_path / seed / "r" / "rounds.csv").read_bytes())
    assert files[0] == files[1] == files[2]
