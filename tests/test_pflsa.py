"""PF-LSA, FedLSA, SCAFFLSA and single-agent LSA on the inline engine, against bench/lsa_reference.py.

Every run here is the real ServerApp strategy and ClientApp client; the reference is fed the
same samples (each client draws iteration t from ``sample_rng(seed, c, t)``), so trajectories
must agree to round-off.
"""

from __future__ import annotations

import csv
import itertools
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from flwr.app import Context
from flwr.common.constant import SUPERLINK_NODE_ID
from flwr.supercore.task_identity import TaskIdentity

from bench.lsa_reference import (
    fedlsa,
    per_agent_oracle,
    pflsa,
    scafflsa,
    single_lsa,
    stacked,
    theta_lim,
)
from hetfed.client.app import app as client_app
from hetfed.client.lsa import RoundLog, sample_rng
from hetfed.client.state import ClientState, run_key
from hetfed.config import ConfigError
from hetfed.engines.inline import InlineGrid, node_configs
from hetfed.problems.garnet import make_agents
from hetfed.records import to_numpy
from hetfed.server.app import run_server
from hetfed.server.pool import FederationError

SEED = 5
BASE = {"problem": "garnet", "seed": SEED, "checkpoint-every": 0}


def run(
    tmp_path: Path,
    nodes: int,
    *,
    name: str = "r",
    configs: list | None = None,
    observers=(),
    **overrides: Any,
) -> tuple[dict, InlineGrid]:
    """One inline run; returns its summary and the grid (whose node contexts hold the client state)."""
    cfg = {**BASE, "results-dir": str(tmp_path), "run-name": name, **overrides}
    grid = InlineGrid(client_app, configs or node_configs(nodes), cfg)
    grid.observers.extend(observers)
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, SUPERLINK_NODE_ID, 1
    return run_server(grid, cfg), grid


def node_state(ctx: Context, run_name: str = "r") -> ClientState:
    """A node's client state of run ``run_name`` (keyed by the run id its config.json records)."""
    config = json.loads((Path(str(ctx.run_config["results-dir"])) / run_name / "config.json").read_text())
    return ClientState(ctx, run_key(run_name, config["run-id"], int(ctx.node_config["partition-id"])), None)


def final_thetas(grid: InlineGrid, run_name: str = "r") -> np.ndarray:
    """Every client's final parameter [N, d], read from its node's state, in partition order."""
    by_pid = {}
    for ctx in grid.contexts.values():
        by_pid[ctx.node_config["partition-id"]] = node_state(ctx, run_name).arrays("final")["theta"]
    return np.array([by_pid[p] for p in sorted(by_pid)])


def shared_theta(tmp_path: Path, run_name: str = "r") -> np.ndarray:
    """FedLSA/SCAFFLSA: the server's shared parameter after the last round (its checkpoint)."""
    return torch.load(tmp_path / run_name / "checkpoint.pt", weights_only=False)["strategy"]["arrays"][
        "theta"
    ]


def client_errors(tmp_path: Path, nodes: int, run_name: str = "r") -> np.ndarray:
    """``sq-error`` reported by each client in each train round, [rounds, N]."""
    with open(tmp_path / run_name / "rounds.csv", newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["exchange"] == "train"]
    rounds = max(int(r["round"]) for r in rows)
    out = np.full((rounds, nodes), np.nan)
    for r in rows:
        out[int(r["round"]) - 1, int(r["partition-id"])] = float(r["sq-error"])
    return out


def client_samples(agents, seed: int, batch: int):
    """The reference's oracle fed the clients' own samples: call t draws iteration t's."""
    counter = itertools.count(1)

    def draw():
        t = next(counter)
        return per_agent_oracle(agents, [sample_rng(seed, c, t) for c in range(len(agents))], batch)()

    return draw


def sq_errors(thetas: np.ndarray, star: np.ndarray) -> np.ndarray:
    """``||theta_c - theta_c*||^2`` per agent c; ``thetas`` [..., N, d] holds one parameter per agent."""
    return np.sum((thetas - star) ** 2, axis=-1)


def shared_sq_errors(thetas: np.ndarray, star: np.ndarray) -> np.ndarray:
    """The same for one shared parameter per step, ``thetas`` [..., d]."""
    return sq_errors(thetas[..., None, :], star)


# --- the update rules equal the NumPy transcription on the same samples -------------------------


@pytest.mark.parametrize("beta", [0.0, 0.6])
def test_pflsa_equals_the_reference_for_100_iterations(tmp_path: Path, beta: float) -> None:
    nodes, T, batch, eta = 4, 100, 2, 1.5
    summary, grid = run(
        tmp_path,
        nodes,
        strategy="pflsa",
        **{
            "num-rounds": T,
            "lsa-eta": eta,
            "lsa-batch": batch,
            "pflsa-beta": beta,
            "garnet-zeta-ker": 0.5,
            "garnet-zeta-rew": 0.5,
        },
    )
    agents = make_agents(nodes, SEED, 0.5, 0.5)
    _, _, star = stacked(agents)
    ref = pflsa(client_samples(agents, SEED, batch), np.zeros((nodes, 5)), eta, beta or 1 / nodes, T)
    np.testing.assert_allclose(final_thetas(grid), ref[T], rtol=1e-12, atol=1e-12)
    # round t reports the parameter it starts from, theta^{t-1}; evaluate reports theta^T
    np.testing.assert_allclose(client_errors(tmp_path, nodes), sq_errors(ref[:T], star), rtol=1e-12)
    assert summary["aggregate"]["sq-error"] == pytest.approx(sq_errors(ref[T], star).mean(), rel=1e-12)
    assert summary["aggregate"]["iteration"] == T
    assert not np.allclose(ref[T], ref[T][0])  # the agents really are personalised


@pytest.mark.parametrize("strategy", ["fedlsa", "scafflsa"])
def test_fedlsa_and_scafflsa_equal_the_reference(tmp_path: Path, strategy: str) -> None:
    nodes, rounds, steps, eta = 3, 15, 3, 2.0
    run(
        tmp_path,
        nodes,
        strategy=strategy,
        **{"num-rounds": rounds, "lsa-eta": eta, "lsa-local-steps": steps, "garnet-zeta-rew": 1.0},
    )
    agents = make_agents(nodes, SEED, 0.0, 1.0)
    _, _, star = stacked(agents)
    oracle = client_samples(agents, SEED, 1)
    if strategy == "fedlsa":
        ref = fedlsa(oracle, np.zeros(5), eta, steps, rounds, nodes)
    else:
        ref, _ = scafflsa(oracle, np.zeros(5), eta, steps, rounds, np.zeros((nodes, 5)))
    np.testing.assert_allclose(shared_theta(tmp_path), ref[rounds], rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(
        client_errors(tmp_path, nodes), shared_sq_errors(ref[:rounds], star), rtol=1e-12
    )


def test_single_agent_lsa_equals_the_reference_and_sends_no_arrays(tmp_path: Path) -> None:
    nodes, rounds, steps, eta = 3, 12, 4, 0.5
    seen = []
    summary, grid = run(
        tmp_path,
        nodes,
        strategy="single-lsa",
        observers=[lambda ins, reply: seen.append((ins, reply))],
        **{"num-rounds": rounds, "lsa-eta": eta, "lsa-local-steps": steps, "garnet-zeta-ker": 1.0},
    )
    agents = make_agents(nodes, SEED, 1.0, 0.0)
    _, _, star = stacked(agents)
    ref = single_lsa(client_samples(agents, SEED, 1), np.zeros((nodes, 5)), eta, rounds * steps)
    np.testing.assert_allclose(final_thetas(grid), ref[-1], rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(client_errors(tmp_path, nodes), sq_errors(ref[:-1:steps], star), rtol=1e-12)
    assert summary["aggregate"]["iteration"] == rounds * steps
    assert all(not ins.content.array_records and not reply.content.array_records for ins, reply in seen)


# --- what the algorithms converge to (noise-free means) -------------------------------------------


def test_noise_free_pflsa_reaches_every_personal_solution_and_fedlsa_theta_lim(tmp_path: Path) -> None:
    nodes = 4
    hetero = {"garnet-zeta-ker": 1.0, "garnet-zeta-rew": 1.0, "lsa-exact": True, "lsa-eta": 60.0}
    a_bar, b_bar, star = stacked(make_agents(nodes, SEED, 1.0, 1.0))
    _, grid = run(
        tmp_path, nodes, name="pf", strategy="pflsa", **hetero, **{"num-rounds": 400, "pflsa-beta": 0.75}
    )
    np.testing.assert_allclose(final_thetas(grid, "pf"), star, rtol=1e-9)

    fed, _ = run(tmp_path, nodes, name="fed", strategy="fedlsa", **hetero, **{"num-rounds": 400})
    lim = theta_lim(a_bar, b_bar)
    np.testing.assert_allclose(shared_theta(tmp_path, "fed"), lim, rtol=1e-9)
    dispersion = shared_sq_errors(lim, star)
    assert fed["aggregate"]["sq-error"] == pytest.approx(dispersion.mean(), rel=1e-9)
    assert dispersion.min() > 1.0  # the shared point is far from every agent's own solution


def test_noise_free_scafflsa_removes_the_client_drift_of_local_steps(tmp_path: Path) -> None:
    nodes, cfg = 4, {"garnet-zeta-ker": 1.0, "garnet-zeta-rew": 1.0, "lsa-exact": True, "lsa-eta": 40.0}
    cfg.update({"num-rounds": 100, "lsa-local-steps": 4})
    a_bar, b_bar, star = stacked(make_agents(nodes, SEED, 1.0, 1.0))
    lim = theta_lim(a_bar, b_bar)
    run(tmp_path, nodes, name="scaff", strategy="scafflsa", **cfg)
    run(tmp_path, nodes, name="fed", strategy="fedlsa", **cfg)
    np.testing.assert_allclose(shared_theta(tmp_path, "scaff"), lim, rtol=1e-9)
    # FedLSA with H > 1 stops at another point: sum_c (I - (I - eta A_c)^H)(theta - theta_c*) = 0
    eye = np.eye(5)
    contraction = np.array([eye - np.linalg.matrix_power(eye - 40.0 * a, 4) for a in a_bar])
    drifted = np.linalg.solve(contraction.sum(0), np.einsum("nij,nj->i", contraction, star))
    np.testing.assert_allclose(shared_theta(tmp_path, "fed"), drifted, rtol=1e-9)
    assert np.abs(drifted - lim).max() > 1e-3


# --- protocol: what crosses the wire -------------------------------------------------------------


def test_pflsa_exchanges_updates_never_parameters(tmp_path: Path) -> None:
    seen = []
    nodes, T = 3, 6
    _, grid = run(
        tmp_path,
        nodes,
        strategy="pflsa",
        observers=[lambda ins, reply: seen.append((ins, reply))],
        **{"num-rounds": T, "garnet-zeta-rew": 1.0, "lsa-report-every": 4},
    )
    train = [(i, r) for i, r in seen if i.metadata.message_type == "train"]
    assert len(train) == nodes * T  # full participation, one exchange per iteration
    for ins, reply in train:
        sent = {k: v.shape for rec in ins.content.array_records.values() for k, v in to_numpy(rec).items()}
        back = {k: v.shape for rec in reply.content.array_records.values() for k, v in to_numpy(rec).items()}
        assert sent == ({} if ins.metadata.group_id == "1" else {"g-bar": (5,)})
        assert back == {"g": (5,)}
        metrics = dict(reply.content["metrics"])
        assert set(metrics) == ({"sq-error"} if int(ins.metadata.group_id) in (1, 5) else set())
    # the server's message equals the mean of the previous round's replies
    by_round = {}
    for ins, reply in train:
        by_round.setdefault(int(ins.metadata.group_id), []).append((ins, reply))
    for t in range(2, T + 1):
        mean = np.mean([to_numpy(r.content["arrays"])["g"] for _, r in by_round[t - 1]], axis=0)
        for ins, _ in by_round[t]:
            np.testing.assert_array_equal(to_numpy(ins.content["arrays"])["g-bar"], mean)
    thetas = final_thetas(grid)
    for _, reply in seen:  # no reply carries a client's parameter
        for rec in reply.content.array_records.values():
            assert not any(np.allclose(v, theta) for v in to_numpy(rec).values() for theta in thetas)


# --- state, failures and resume ----------------------------------------------------------------


def rows_of(tmp_path: Path, run_name: str = "r") -> list[dict]:
    with open(tmp_path / run_name / "rounds.csv", newline="") as f:
        return list(csv.DictReader(f))


MISSING = {(3, 1), (4, 1), (6, 2)}  # (round, partition): client-01 misses rounds 3-4, client-02 round 6


def missing_configs(nodes: int, extra: dict | None = None) -> list[dict]:
    """Node configs whose fault drills (``fail-round``) make the agents of MISSING miss their rounds."""
    configs = node_configs(nodes, extra)
    for c in configs:
        rounds = sorted(r for r, pid in MISSING if pid == c["partition-id"])
        if rounds:
            c["fail-round"] = ",".join(map(str, rounds))
    return configs


@pytest.mark.parametrize("strategy", ["pflsa", "fedlsa", "scafflsa"])
def test_a_missing_agent_continues_with_its_last_update_and_equals_the_reference(
    tmp_path: Path, strategy: str
) -> None:
    """Our extension: the run goes on, the stand-in is recorded, and the math is the reference's."""
    nodes, rounds, eta = 3, 10, 1.5
    steps = 1 if strategy == "pflsa" else 3
    summary, grid = run(
        tmp_path,
        nodes,
        strategy=strategy,
        configs=missing_configs(nodes),
        **{"num-rounds": rounds, "lsa-eta": eta, "lsa-local-steps": steps, "garnet-zeta-rew": 1.0},
    )
    assert summary["status"] == "completed" and sorted(summary["clients"]) == [
        f"client-0{i}" for i in range(3)
    ]
    agents = make_agents(nodes, SEED, 0.0, 1.0)
    _, _, star = stacked(agents)
    oracle = client_samples(agents, SEED, 1)
    if strategy == "pflsa":
        ref = pflsa(oracle, np.zeros((nodes, 5)), eta, 1 / nodes, rounds, missing=MISSING)
        np.testing.assert_allclose(final_thetas(grid), ref[rounds], rtol=1e-12, atol=1e-12)
        reported = sq_errors(ref[:rounds], star)  # round t reports the parameter it starts from
    else:
        algo = fedlsa if strategy == "fedlsa" else scafflsa
        extra = (nodes,) if strategy == "fedlsa" else (np.zeros((nodes, 5)),)
        ref = algo(oracle, np.zeros(5), eta, steps, rounds, *extra, missing=MISSING)
        ref = ref if strategy == "fedlsa" else ref[0]
        np.testing.assert_allclose(shared_theta(tmp_path), ref[rounds], rtol=1e-12, atol=1e-12)
        reported = shared_sq_errors(ref[:rounds], star)
    table = rows_of(tmp_path)
    for row in (r for r in table if r["exchange"] == "train"):
        t, pid = int(row["round"]), int(row["partition-id"])
        if (t, pid) in MISSING:
            assert row["status"] == "failed" and "fault drill" in row["error"]
            assert int(row["stale-round"]) == min(r for r, p in MISSING if p == pid) - 1  # recorded
        else:
            assert row["status"] == "ok" and not row["stale-round"]
            assert float(row["sq-error"]) == pytest.approx(reported[t - 1, pid], rel=1e-12)
    stale = {int(r["round"]): r["stale-clients"] for r in table if r["client"] == "server"}
    assert {t: n for t, n in stale.items() if n} == {3: "1", 4: "1", 6: "1"}


def test_an_agent_missing_the_final_evaluate_is_left_out_of_the_summary(tmp_path: Path) -> None:
    nodes, rounds, eta = 3, 4, 1.5
    configs = node_configs(nodes)
    configs[0]["fail-round"] = rounds  # its last train round and the evaluate exchange after it
    summary, grid = run(
        tmp_path, nodes, strategy="pflsa", configs=configs, **{"num-rounds": rounds, "lsa-eta": eta}
    )
    assert summary["status"] == "completed" and sorted(summary["clients"]) == ["client-01", "client-02"]
    assert "fault drill" in summary["failed"]["client-00"]
    agents = make_agents(nodes, SEED, 0.0, 0.0)
    ref = pflsa(
        client_samples(agents, SEED, 1), np.zeros((nodes, 5)), eta, 1 / nodes, rounds, missing={(rounds, 0)}
    )
    finals = {ctx.node_config["partition-id"]: node_state(ctx) for ctx in grid.contexts.values()}
    for pid in (1, 2):
        np.testing.assert_allclose(
            finals[pid].arrays("final")["theta"], ref[rounds][pid], rtol=1e-12, atol=1e-12
        )


@pytest.mark.parametrize("strategy", ["pflsa", "fedlsa", "scafflsa"])
def test_an_agent_missing_before_its_first_update_stops_the_run_in_one_line(
    tmp_path: Path, strategy: str
) -> None:
    configs = node_configs(3)
    configs[2]["fail-round"] = 1
    with pytest.raises(FederationError) as err:
        run(tmp_path, 3, strategy=strategy, configs=configs, **{"num-rounds": 3})
    message = str(err.value)
    assert "round 1 train lost client-02" in message and "no earlier update to continue with" in message
    assert "\n" not in message


def test_a_round_with_no_usable_reply_stops_and_resume_ends_exactly_like_an_uninterrupted_run(
    tmp_path: Path,
) -> None:
    """The missing-agent state (who is behind, its last update) is in the checkpoint."""
    nodes = 3
    cfg = {"strategy": "scafflsa", "num-rounds": 12, "checkpoint-every": 5, "lsa-local-steps": 2}
    cfg["garnet-zeta-rew"] = 1.0
    gap = node_configs(nodes)
    gap[1]["fail-round"] = "5,6"  # client-01 is behind at checkpoint 5
    whole, _ = run(tmp_path, nodes, name="whole", configs=gap, **cfg)

    state = {"state-dir": str(tmp_path / "state")}
    failing = node_configs(nodes, state)
    for c in failing:
        c["fail-round"] = "5,6,8" if c["partition-id"] == 1 else "8"
    with pytest.raises(FederationError, match=r"round 8 train has no usable reply \(client-00: "):
        run(tmp_path, nodes, name="crash", configs=failing, **cfg)
    assert list((tmp_path / "state").glob("crash.*-p0/lsa-log.json"))  # theta_c on the node's disk
    # fresh node processes (empty memory), the same disks: rounds 6.. are redone from checkpoint 5
    fresh = node_configs(nodes, state)
    fresh[1]["fail-round"] = "6"
    resumed, _ = run(tmp_path, nodes, name="crash", configs=fresh, resume=True, **cfg)
    assert resumed["status"] == "completed"
    assert resumed["clients"] == whole["clients"]  # bit for bit


def test_a_client_that_lost_its_state_fails_with_a_clear_reason(tmp_path: Path) -> None:
    cfg = {"strategy": "pflsa", "num-rounds": 6, "checkpoint-every": 2}
    configs = node_configs(2, {"fail-round": 4})
    with pytest.raises(FederationError):
        run(tmp_path, 2, configs=configs, **cfg)
    with pytest.raises(FederationError, match="state was lost"):  # no state-dir: memory died with the nodes
        run(tmp_path, 2, resume=True, **cfg)


def test_round_log_keeps_what_a_repeat_or_resume_needs(tmp_path: Path) -> None:
    from flwr.app import Context, RecordDict

    ctx = Context(run_id=1, node_id=1, node_config={}, state=RecordDict(), run_config={})
    log = RoundLog(ClientState(ctx, "k", tmp_path), checkpoint_every=5)
    for r in range(1, 13):
        log.record(r, {"theta": np.full(2, r + 0.1), "g": np.full(2, -r / 3)})
    assert sorted(log.entries) == [5, 10, 11, 12]
    reloaded = RoundLog(ClientState(Context(1, 1, {}, RecordDict(), {}), "k", tmp_path), 5)  # from disk
    for r in (5, 10, 11, 12):
        np.testing.assert_array_equal(reloaded.after(r)["theta"], np.full(2, r + 0.1))
        np.testing.assert_array_equal(reloaded.after(r)["g"], np.full(2, -r / 3))
    assert reloaded.after(0) is None
    with pytest.raises(
        ValueError, match=r"round 10 needs the state after round 9.*holds rounds \[5, 10, 11, 12\]"
    ):
        reloaded.after(9)


# --- configuration errors name the key -----------------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"strategy": "pflsa", "problem": "knapsack"}, "'problem'"),
        ({"strategy": "pflsa", "lsa-local-steps": 2}, "'lsa-local-steps': PF-LSA exchanges every iteration"),
        ({"strategy": "fedlsa", "garnet-gamma": 1.0}, "'garnet-gamma': must be < 1"),
        ({"strategy": "single-lsa", "garnet-dim": 11}, "'garnet-dim': must be at most garnet-states = 10"),
        ({"strategy": "pflsa", "pflsa-beta": 1.5}, "'pflsa-beta': must be <= 1"),
        ({"strategy": "pflsa", "lsa-eta": 0.0}, "'lsa-eta': must be > 0"),
    ],
)
def test_bad_lsa_configs_are_refused_before_any_round(tmp_path: Path, overrides: dict, message: str) -> None:
    seen = []
    with pytest.raises(ConfigError, match=message):
        run(tmp_path, 2, observers=[lambda i, r: seen.append(i)], **overrides)
    assert not seen
