"""FedRSPO+ protocol logic against hand-computed values (docs/algorithms.md 1.3-1.6)."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from flwr.app import ConfigRecord, Context, Message, RecordDict

from hetfed import secagg
from hetfed.client.app import app as client_app
from hetfed.client.calibration import CalibrationError, calibrate
from hetfed.client.decision import proximal_term
from hetfed.client.personalization import PersonalSchedule
from hetfed.config import ConfigError, validate
from hetfed.decide import state_folder
from hetfed.engines.inline import InlineGrid, node_configs, run_inline
from hetfed.methods.decision import DecisionParams
from hetfed.problems.base import DecisionClientData, DecisionSplit
from hetfed.problems.knapsack import KnapsackParams, client_law, load_client
from hetfed.problems.models import make_mlp, model_record
from hetfed.problems.polytope import KnapsackPolytope
from hetfed.server.store import RunResult
from hetfed.strategies.base import FederationError
from hetfed.strategies.registry import build_strategy

SMALL = {
    "strategy": "fedrspo",
    "loss": "rspo+",
    "num-items": 10,
    "n-train": 40,
    "n-test": 30,
    "local-epochs": 1,
    "num-rounds": 2,
    "personal-rounds": 3,
}


def run(tmp_path: Path, nodes: int = 4, name: str = "r", **overrides) -> dict:
    return run_inline(
        {**SMALL, "results-dir": str(tmp_path), "run-name": name, **overrides}, node_configs(nodes)
    )


def rows(tmp_path: Path, name: str = "r") -> list[dict]:
    with open(tmp_path / name / "rounds.csv", newline="") as f:
        return list(csv.DictReader(f))


# --- calibration -----------------------------------------------------------------------------
def test_calibration_is_mean_cost_norm_over_radius() -> None:
    params = KnapsackParams(num_items=10, n_train=30, eta_c=0.5)
    data = load_client(params, seed=1, partition_id=2)
    law = client_law(params, seed=1, partition_id=2)
    cal = calibrate(data, alpha=0.01)
    norms = np.linalg.norm(data.train.c.numpy(), axis=1)
    # The reference code's radius: whole items in ascending weight while they fit, then a fraction.
    capacity, fill = law.capacity, []
    for w in np.sort(law.weights):
        take = min(1.0, max(capacity, 0.0) / w)
        fill.append(take)
        capacity -= take * w
    radius = float(np.linalg.norm(fill))
    assert cal["radius"] == pytest.approx(radius, rel=1e-12)
    assert cal["lam0"] == pytest.approx(norms.mean() / radius, rel=1e-12)
    assert cal["lr0"] == pytest.approx(0.01 * cal["lam0"] / 4, rel=1e-12)
    # The robust option: the (interpolated) median norm; a spike in a few samples barely moves it.
    median = calibrate(data, alpha=0.01, norm="median")
    assert median["lam0"] == pytest.approx(np.median(norms) / radius, rel=1e-12)
    data.train.c[:3] *= 1000.0  # three "storm days"
    spiked = np.linalg.norm(data.train.c.numpy(), axis=1)
    assert calibrate(data, alpha=0.01)["lam0"] == pytest.approx(spiked.mean() / radius, rel=1e-12)
    assert calibrate(data, alpha=0.01, norm="median")["lam0"] == pytest.approx(np.median(spiked) / radius)
    assert calibrate(data, alpha=0.01)["lam0"] > 10 * cal["lam0"]  # the mean explodes, the median
    assert calibrate(data, alpha=0.01, norm="median")["lam0"] < 2 * median["lam0"]  # shifts by ranks
    # A fixed lam0 (the paper's shortest-path setting) ignores the data's scale, not the radius.
    fixed = calibrate(data, alpha=0.01, norm="median", fixed=2.0)
    assert fixed == {"lam0": 2.0, "lr0": 0.01 * 2.0 / 4, "radius": pytest.approx(radius, rel=1e-12)}


def test_each_silo_deploys_the_model_better_on_its_own_validation_data(tmp_path: Path) -> None:
    """Per client: the deployed model's test metrics are the personal model's where its validation
    regret is lower, else the federated model's; so no silo deploys a model worse on validation
    than the federated one. The choice and the model stay in the client's state."""
    configs = node_configs(4, {"state-dir": str(tmp_path / "state")})
    # MSE with a large step: personalization helps some clients on validation and hurts others.
    cfg = {**SMALL, "results-dir": str(tmp_path), "run-name": "r", "seed": 3, "loss": "mse", "lr": 0.3}
    summary = run_inline(cfg, configs)
    chose = []
    for name, m in summary["clients"].items():
        personal = m["per-val-relative-regret"] < m["fed-val-relative-regret"]
        chosen = "per" if personal else "fed"
        chose.append(personal)
        assert m["dep-personal"] == int(personal)
        for key in ("relative-regret", "absolute-regret", "val-relative-regret"):
            assert m[f"dep-{key}"] == m[f"{chosen}-{key}"], (name, key)
        assert m["dep-val-relative-regret"] <= m["fed-val-relative-regret"]
        pid = int(name.removeprefix("client-"))
        saved = json.loads((state_folder(tmp_path / "state", "r", pid) / "deployed.json").read_text())
        assert saved == {"model": "personal" if personal else "federated"}
    assert any(chose) and not all(chose)  # this seed exercises both choices
    assert summary["aggregate"]["dep-relative-regret"] == pytest.approx(
        np.mean([m["dep-relative-regret"] for m in summary["clients"].values()])
    )


def test_degenerate_clients_cannot_calibrate() -> None:
    split = DecisionSplit(torch.zeros(4, 2, dtype=torch.float64), -torch.ones(4, 3, dtype=torch.float64))
    empty_knapsack = KnapsackPolytope(torch.ones(3, dtype=torch.float64), 0.0)  # S = {0}
    with pytest.raises(CalibrationError, match="radius 0"):
        calibrate(DecisionClientData("c0", 0, split, split, split, empty_knapsack), 0.01)
    zero = DecisionSplit(split.x, torch.zeros(4, 3, dtype=torch.float64))
    poly = KnapsackPolytope(torch.ones(3, dtype=torch.float64), 1.0)
    with pytest.raises(CalibrationError, match="costs are all zero"):
        calibrate(DecisionClientData("c0", 0, zero, zero, zero, poly), 0.01)


def test_a_client_failing_calibration_is_left_out(tmp_path: Path) -> None:
    def degenerate_one(message, context):
        if context.node_config["partition-id"] == 3 and message.metadata.message_type == "query.calibrate":
            raise CalibrationError("client-03: lam0 = 0 (its training costs are all zero)")
        return client_app(message, context)

    from flwr.common.constant import SUPERLINK_NODE_ID
    from flwr.supercore.task_identity import TaskIdentity

    from hetfed.server.app import run_server

    cfg = {**SMALL, "results-dir": str(tmp_path), "run-name": "r", "fraction": 1.0}
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, SUPERLINK_NODE_ID, 1
    summary = run_server(InlineGrid(degenerate_one, node_configs(4), cfg), cfg)
    assert summary["status"] == "completed"
    assert sorted(summary["clients"]) == ["client-00", "client-01", "client-02"]
    trained = {r["client"] for r in rows(tmp_path) if r["exchange"] == "train"}
    assert trained == {"client-00", "client-01", "client-02"}


# --- calibration stays on the client; warm start ------------------------------------------------
CALIBRATION_KEYS = ("lam0", "lr0", "radius", "lam", "lr")  # in a metric record: never
# In a config record: the shared calibration's mean only (per-client-calibration = false); "lr" is the
# run's own public learning rate (DecisionParams), the same in every message.
SHARED_KEYS = ("shared-lam", "shared-lr")


def test_calibration_stays_on_the_client(tmp_path: Path) -> None:
    """No message carries a client's lam0_j, lr0_j or radius, in either direction, nor the lam_t, lr_t
    path derived from them; the clients still train with their own (the plain-loop test below)."""
    seen: list[tuple[Message, Message]] = []
    cfg = {**SMALL, "results-dir": str(tmp_path), "run-name": "r", "audit-traffic": True}
    run_inline(cfg, node_configs(5), observers=[lambda ins, reply: seen.append((ins, reply))])
    assert len([ins for ins, _ in seen if ins.metadata.message_type == "train"]) == 2 * math.ceil(0.4 * 5)
    for ins, reply in seen:
        for message in (ins, reply):
            for record in message.content.config_records.values():
                secret = set(CALIBRATION_KEYS + SHARED_KEYS) - {"lr"}
                assert not set(record) & secret, (ins.metadata.message_type, dict(record))
                assert record.get("lr", SMALL.get("lr", 1e-3)) == SMALL.get("lr", 1e-3), dict(record)
            for record in message.content.metric_records.values():
                leaked = [k for k in record if k in CALIBRATION_KEYS or k.endswith(("-lam", "-lr"))]
                assert not leaked, (ins.metadata.message_type, leaked)
    for line in (tmp_path / "r" / "traffic.jsonl").read_text().splitlines():  # and the audit agrees
        entry = json.loads(line)
        assert not [k for k in entry["metrics"] if k in CALIBRATION_KEYS or k.endswith(("-lam", "-lr"))]


# The shared calibration's secure mean: step 2^-40 at any number of clients (hetfed/secagg.py
# mean_code; at 4 clients 61 bits, range +-2^20: 4 codes of up to 2^60 stay below 2^63).
SHARED_STEP = 2.0**-40


def test_the_secure_means_code_has_a_fixed_step_and_never_wraps() -> None:
    """mean_code(m): step 2^-40 for every m, the widest power-of-two range whose m codes cannot wrap
    (a brute check of m |q|max < 2^63 and that twice the range would wrap)."""
    for m in (2, 3, 4, 10, 100, 1000, 10**5):
        bits, bound = secagg.mean_code(m)
        assert secagg.step_of(bound, bits) == SHARED_STEP
        assert m * math.ceil(bound / SHARED_STEP) < 2**63 <= m * math.ceil(2 * bound / SHARED_STEP)
    assert secagg.mean_code(4) == (61, 2.0**20) and secagg.mean_code(10) == (60, 2.0**19)
    with pytest.raises(secagg.SecAggError):
        secagg.mean_code(2**23)


def own_calibrations(nodes: int = 4) -> list[dict[str, float]]:
    """What each client computes from its own data (SMALL's knapsack, seed 42)."""
    data = [load_client(KnapsackParams(num_items=10, n_train=40, n_test=30), 42, j) for j in range(nodes)]
    return [calibrate(d, 0.01) for d in data]


def shared_mean(seen: list[tuple[Message, Message]]) -> tuple[float, float]:
    """The (shared-lam, shared-lr) every train message of a run carried (the same in each)."""
    pairs = {
        (i.content["config"]["shared-lam"], i.content["config"]["shared-lr"])
        for i, _ in seen
        if i.metadata.message_type == "train"
    }
    assert len(pairs) == 1, pairs
    lam, lr = pairs.pop()
    return float(lam), float(lr)  # type: ignore[arg-type]


def assert_mean_of(seen: list[tuple[Message, Message]], own: list[dict[str, float]]) -> None:
    """The run's mean equals, bit for bit, a NumPy transcription of the fixed-point mean
    sum_j round(v_j 2^40) 2^-40 / n (the value the committed results were computed with), and the
    clients' plain mean to the code's resolution."""
    lam, lr = shared_mean(seen)
    for got, key in ((lam, "lam0"), (lr, "lr0")):
        values = np.array([c[key] for c in own])
        codes = np.round(values / SHARED_STEP).astype(np.int64)
        assert got == float(codes.sum()) * SHARED_STEP / len(own)
        assert got == pytest.approx(values.mean(), rel=1e-14, abs=SHARED_STEP)


def test_shared_calibration_is_the_secure_mean_and_other_losses_keep_their_lr(tmp_path: Path) -> None:
    """The shared calibration's mean runs on SecAgg+ (also without secure-aggregation): it equals the
    NumPy mean of the clients' own (lam0_j, lr0_j) to the code's resolution, and what the server
    receives of them is only masked words, uniformly distributed."""
    seen: list[tuple[Message, Message]] = []
    cfg = {
        **SMALL,
        "results-dir": str(tmp_path),
        "run-name": "r",
        "personal-rounds": 0,
        "per-client-calibration": False,
    }
    observe = [lambda ins, reply: seen.append((ins, reply))]
    run_inline({**cfg, "audit-traffic": True}, node_configs(4), observers=observe)
    own = own_calibrations()
    secrets = [c[k] for c in own for k in ("lam0", "lr0", "radius")]
    kinds = [i.metadata.message_type for i, _ in seen]
    assert kinds.count("query.masked_calibration") == 4
    assert {"query.secagg_keys", "query.secagg_shares", "query.secagg_check", "query.secagg_unmask"} <= set(
        kinds
    )
    for ins, reply in seen:  # no calibration value crosses the wire in the clear, in any record
        for message in (ins, reply):
            content = message.content
            for record in [*content.config_records.values(), *content.metric_records.values()]:
                assert not set(record) & set(CALIBRATION_KEYS) - {"lam", "lr"}, dict(record)
                assert record.get("lr", 1e-3) == 1e-3, dict(record)  # the run's lr, not a client's
                numbers = [v for v in record.values() if isinstance(v, float)]
                assert not any(v == pytest.approx(x, rel=1e-9) for v in numbers for x in secrets)
    assert_mean_of(seen, own)
    for line in (tmp_path / "r" / "traffic.jsonl").read_text().splitlines():  # the audit agrees
        entry = json.loads(line)
        assert not [k for k in entry["metrics"] if k in CALIBRATION_KEYS]
        if entry["exchange"] == "query.masked_calibration":
            assert set(entry["arrays"]) == {"masked/y"} and entry["dtypes"] == {"masked/y": "uint64"}
    words = [masked_words(seen)]
    seen.clear()
    run_inline(
        {**cfg, "loss": "spo+", "run-name": "s", "lr": 0.003},
        node_configs(4),
        observers=[lambda ins, reply: seen.append((ins, reply))],
    )
    assert {i.content["config"]["lr"] for i, _ in seen if i.metadata.message_type == "train"} == {0.003}
    words.append(masked_words(seen))
    seen.clear()  # with a fixed lam0 every client holds lam0 = 2, lr0 = alpha 2 / 4: so does their mean
    run_inline(
        {**cfg, "run-name": "f", "fixed-lam0": 2.0, "rspo-alpha": 0.02},
        node_configs(4),
        observers=[lambda ins, reply: seen.append((ins, reply))],
    )
    lam, lr = shared_mean(seen)
    assert lam == pytest.approx(2.0, abs=SHARED_STEP) and lr == pytest.approx(0.02 * 2.0 / 4, abs=SHARED_STEP)
    words.append(masked_words(seen))
    y = np.concatenate(words)  # 3 runs x 4 clients x [lam0, lr0, weight 1, within-bit 1]
    assert y.dtype == np.uint64 and y.size == 48
    assert np.abs(secagg.decode(y, SHARED_STEP)[:, None] - np.asarray([*secrets, 1.0, 2.0])).min() > 1e-3
    # A clear code of a value within +-2^20 at 61 bits has its 3 top bits equal; a uniform word in 1 of 4.
    top = y >> np.uint64(61)
    assert np.mean((top == 0) | (top == 7)) < 0.6
    bits = (y[:, None] >> np.arange(64, dtype=np.uint64)) & np.uint64(1)
    assert np.all(np.abs(bits.mean(axis=0) - 0.5) < 5 * 0.5 / np.sqrt(y.size))


def masked_words(seen: list[tuple[Message, Message]]) -> np.ndarray:
    """The words of a run's query.masked_calibration replies (each reply: masked words only)."""
    replies = [r for i, r in seen if i.metadata.message_type == "query.masked_calibration"]
    assert replies and all(set(r.content.array_records) == {"masked"} for r in replies)
    return np.concatenate([r.content.array_records["masked"]["y"].numpy() for r in replies])


@pytest.mark.parametrize(
    ("exchange", "in_mean"),
    [("query.secagg_check", [0, 1, 2, 3]), ("query.masked_calibration", [0, 1, 3])],
    ids=["after-its-input", "before-its-input"],
)
def test_a_client_lost_in_the_shared_calibration_is_recovered(
    tmp_path: Path, exchange: str, in_mean: list[int]
) -> None:
    """client-02 lost after its masked input (at the consistency check) is in the mean, its self-mask
    recovered from the others' shares; lost before it (at the calibration message), the mean is over
    the three others, its pair masks removed with its recovered mask key. The run completes."""
    seen: list[tuple[Message, Message]] = []
    configs = node_configs(4)
    configs[2] |= {"fail-round": 0, "drill-exchange": exchange}
    cfg = {**SMALL, "results-dir": str(tmp_path), "run-name": "r", "personal-rounds": 0}
    summary = run_inline(
        {**cfg, "per-client-calibration": False},
        configs,
        observers=[lambda ins, reply: seen.append((ins, reply))],
    )
    assert summary["status"] == "completed"
    own = own_calibrations()
    assert_mean_of(seen, [own[j] for j in in_mean])
    failed = [(r["round"], r["exchange"], r["client"]) for r in rows(tmp_path) if r["status"] == "failed"]
    assert ("0", exchange, "client-02") in failed


def test_below_the_threshold_the_shared_calibration_fails_the_run_in_one_line(tmp_path: Path) -> None:
    """With two of four clients gone before their masked values, the two others are below the
    threshold 3: the run stops before any training round with one line, instead of training with a
    mean of two (or a wrong one)."""
    from flwr.common.constant import SUPERLINK_NODE_ID
    from flwr.supercore.task_identity import TaskIdentity

    from hetfed.server.app import run_server

    def two_gone(message, context):
        kind = message.metadata.message_type
        if context.node_config["partition-id"] in (2, 3) and kind == "query.masked_calibration":
            raise ConnectionError("went away")
        return client_app(message, context)

    cfg = {**SMALL, "results-dir": str(tmp_path), "run-name": "r", "per-client-calibration": False}
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, SUPERLINK_NODE_ID, 1
    with pytest.raises(FederationError, match="shared calibration: the secure mean .* has no sum") as raised:
        run_server(InlineGrid(two_gone, node_configs(4), cfg), cfg)
    assert "\n" not in str(raised.value)
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["status"] == "failed" and "secagg-threshold" in summary["error"]
    failed = {(r["exchange"], r["client"]): r["error"] for r in rows(tmp_path) if r["status"] == "failed"}
    assert "went away" in failed[("query.masked_calibration", "client-02")]  # the reason, on disk
    assert "went away" in failed[("query.masked_calibration", "client-03")]
    assert {r["exchange"] for r in rows(tmp_path)} >= {"query.calibrate", "query.masked_calibration"}
    assert not (tmp_path / "r" / "checkpoint.pt").exists()  # no round trained: nothing to resume


def test_a_client_refuses_to_send_its_calibration_outside_secure_aggregation(task_identity: None) -> None:
    """A server that asks for (lam0_j, lr0_j) in a message that is not a secure sum's gets a refusal
    (the ClientApp raises: no reply content leaves)."""
    full = validate({**SMALL, "per-client-calibration": False})
    node = {"partition-id": 1, "num-partitions": 4}
    context = Context(run_id=1, node_id=7, node_config=node, state=RecordDict(), run_config=full)
    settings = build_strategy(full).client_settings()
    for extra in ({}, {"sum-weight": 1.0}):  # in clear, or summed in clear (no secagg-step)
        config = ConfigRecord({**settings, "run-name": "p", "server-round": 0, **extra})
        ins = Message(RecordDict({"config": config}), dst_node_id=7, message_type="query.masked_calibration")
        with pytest.raises(
            PermissionError, match="refused to send its calibration outside secure aggregation"
        ):
            client_app(ins, context)


def test_sampled_clients_are_the_same_for_every_loss(tmp_path: Path) -> None:
    def sampled(name: str) -> list[tuple[str, str]]:
        return [(r["round"], r["client"]) for r in rows(tmp_path, name) if r["exchange"] == "train"]

    for loss in ("rspo+", "mse", "pfyl"):
        run(tmp_path, nodes=6, name=loss, loss=loss, **{"personal-rounds": 0})
    assert sampled("rspo+") == sampled("mse") == sampled("pfyl")


# --- personalization: schedules, freezing, stop after freezing ----------------------------------
def personalize(cfg: dict, state_dir: Path | None = None, context: Context | None = None) -> dict:
    """Send one train.personalize instruction to client 1 directly; return its reply metrics."""
    from flwr.common.constant import SUPERLINK_NODE_ID
    from flwr.supercore.task_identity import TaskIdentity

    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, SUPERLINK_NODE_ID, 1
    full = validate({**SMALL, **cfg})
    node = {"partition-id": 1, "num-partitions": 4, **({"state-dir": str(state_dir)} if state_dir else {})}
    context = context or Context(run_id=1, node_id=7, node_config=node, state=RecordDict(), run_config=full)
    model = make_mlp(8, 64, full["num-items"], seed=full["seed"])
    settings = build_strategy(full).client_settings()  # the method, as the strategy sends it
    exchange = {"run-name": "p", "server-round": 3, "shared-lam": 0.8, "shared-lr": 0.002}
    content = RecordDict({"arrays": model_record(model), "config": ConfigRecord({**settings, **exchange})})
    ins = Message(content, dst_node_id=7, message_type="train.personalize")
    reply = client_app(ins, context)
    assert not reply.has_error(), reply.error
    sent = dict(reply.content["metrics"])
    assert not [k for k in sent if k.endswith(("-lam", "-lr"))]  # the lam_t, lr_t path stays on the client
    log = next(dict(v) for k, v in context.state.config_records.items() if k.endswith(":personal-log"))
    return {**sent, **log, "_context": context}


def test_personalize_and_evaluate_is_what_the_client_app_replies(task_identity: None) -> None:
    """The typed entry point (data and params, no messages or state) gives, bit for bit, the metrics
    of the ClientApp's evaluate after its train.personalize on a received model."""
    from hetfed.client.decision_client import personalize_and_evaluate
    from hetfed.client.session import load_partition
    from hetfed.methods.decision import CalibratedParams

    full = validate({**SMALL, "personal-rounds": 4})
    node = {"partition-id": 0, "num-partitions": 1}
    context = Context(run_id=1, node_id=7, node_config=node, state=RecordDict(), run_config=full)
    received = make_mlp(8, 64, full["num-items"], seed=5)
    settings = build_strategy(full).client_settings()
    replies = {}
    for kind in ("train.personalize", "evaluate"):
        config = ConfigRecord({**settings, "run-name": "p", "server-round": 3})
        ins = Message(
            RecordDict({"arrays": model_record(received), "config": config}), dst_node_id=7, message_type=kind
        )
        reply = client_app(ins, context)
        assert not reply.has_error(), reply.error
        replies[kind] = dict(reply.content["metrics"])
    arrays = {k: v.detach().numpy() for k, v in received.state_dict().items()}
    data = load_partition(full, 0, 1, None)
    direct = personalize_and_evaluate(data, CalibratedParams.from_config(full), arrays, full["seed"])
    assert direct == {k: v for k, v in replies["evaluate"].items() if k != "num-examples"}
    assert replies["train.personalize"]["rounds-trained"] == 4
    assert direct["per-absolute-regret"] != direct["fed-absolute-regret"]  # it did personalize


def test_inverse_time_schedules_freeze_and_stop_three_rounds_later() -> None:
    m = personalize({"personal-rounds": 12, "freeze-tau": 0.05})
    frozen = int(m["frozen-at"])
    assert 1 <= frozen <= 12 - 3
    for t in range(1, frozen + 1):  # annealed until it freezes
        assert m[f"r{t}-lam"] == pytest.approx(0.8 / (1 + 1.0 * (t - 1)), rel=1e-14)
        assert m[f"r{t}-lr"] == pytest.approx(0.002 / (1 + 0.1 * (t - 1)), rel=1e-14)
        assert (m[f"r{t}-freeze-stat"] <= 0.05) == (t == frozen)  # frozen at the first U_t <= tau
    for t in range(frozen + 1, frozen + 4):  # then 3 more rounds at the frozen values
        assert m[f"r{t}-lam"] == m[f"r{frozen}-lam"] and m[f"r{t}-lr"] == m[f"r{frozen}-lr"]
    assert m["rounds-trained"] == frozen + 3 and f"r{frozen + 4}-lam" not in m


def test_freeze_statistic_is_the_qp_lp_gap_of_an_independent_solver() -> None:
    """U_t from a DAQP projection and HiGHS LPs (not the exact sort/greedy the client uses)."""
    m = personalize({"personal-rounds": 2, "freeze-tau": 0.0, "monitor-size": 10})  # the whole val set
    data = load_client(KnapsackParams(num_items=10, n_train=40, n_test=30), seed=42, partition_id=1)
    c = data.val.c
    lam = m["r2-lam"]
    z = torch.tensor([float(ci @ data.polytope.solve_lp(ci[None], backend="highs")[0]) for ci in c])
    qp = (c * data.polytope.project(-c / lam, backend="daqp")).sum(1)
    expected = float((qp - z).mean() / (z.abs().mean() + 1e-8))
    assert m["r2-freeze-stat"] == pytest.approx(expected, abs=1e-8)  # solver tolerances, not a bug margin


def test_the_lam_lr_path_is_rebuilt_from_lam0_lr0_and_the_reported_freeze_statistics() -> None:
    m = personalize({"personal-rounds": 12, "freeze-tau": 0.05})
    rounds = int(m["rounds-trained"])
    assert 0 < int(m["frozen-at"]) < rounds  # a path with annealing, a freeze and the extra rounds
    sched = PersonalSchedule.from_params(
        DecisionParams.from_config(validate({**SMALL, "freeze-tau": 0.05})), "rspo+", 0.8, 0.002
    )
    path = sched.replay({t: m[f"r{t}-freeze-stat"] for t in range(1, rounds + 1)})
    assert path == {t: (m[f"r{t}-lam"], m[f"r{t}-lr"]) for t in range(1, rounds + 1)}
    assert sched.frozen_at == m["frozen-at"]


def test_the_personal_trace_reports_every_rounds_test_regret_and_changes_nothing(tmp_path: Path) -> None:
    over = {"personal-rounds": 5, "freeze-tau": 0.05}
    plain = run(tmp_path, name="a", **over)
    traced = run(tmp_path, name="b", **over, **{"personal-trace": True})
    assert traced["clients"] == plain["clients"]  # the trace only reads the personal model
    personal = [
        r for r in rows(tmp_path, "b") if r["exchange"] == "train.personalize" and r["status"] == "ok"
    ]
    assert len(personal) == 4
    trace = RunResult.read(tmp_path / "b")
    relative = trace.local_rounds("test-relative-regret")
    absolute = trace.local_rounds("test-absolute-regret")
    for r in personal:
        last, client = int(float(r["rounds-trained"])), traced["clients"][r["client"]]
        assert sorted(relative[r["client"]]) == list(range(1, last + 1))
        # after its last round the personal model is the one the evaluation reports
        assert relative[r["client"]][last] == pytest.approx(client["per-relative-regret"], rel=1e-12)
        assert absolute[r["client"]][last] == pytest.approx(client["per-absolute-regret"], rel=1e-12)
    assert not RunResult.read(tmp_path / "a").local_rounds("test-relative-regret")


def test_other_losses_do_not_anneal_or_freeze() -> None:
    m = personalize({"loss": "spo+", "lr": 0.002, "personal-rounds": 4, "freeze-tau": 10.0})  # the run's lr
    assert m["frozen-at"] == 0 and m["rounds-trained"] == 4
    assert {m[f"r{t}-lr"] for t in range(1, 5)} == {0.002}


def test_a_restarted_node_resumes_personalization_from_its_state_dir(tmp_path: Path) -> None:
    whole = personalize({"personal-rounds": 6, "freeze-tau": 0.0}, tmp_path / "a")
    personalize({"personal-rounds": 2, "freeze-tau": 0.0}, tmp_path / "b")  # the node dies after round 2 ...
    resumed = personalize({"personal-rounds": 6, "freeze-tau": 0.0}, tmp_path / "b")  # ... and restarts
    assert resumed["rounds-trained"] == 6 and "r1-train-loss" not in resumed  # only rounds 3..6 were trained
    for t in range(3, 7):
        assert resumed[f"r{t}-train-loss"] == whole[f"r{t}-train-loss"]
    saved_a = np.load(tmp_path / "a" / "p-p1" / "personal.npz")
    saved_b = np.load(tmp_path / "b" / "p-p1" / "personal.npz")
    for key in saved_a.files:
        np.testing.assert_array_equal(saved_a[key], saved_b[key])


# --- FedProx / Ditto terms ---------------------------------------------------------------------
def test_proximal_term_value_and_gradient() -> None:
    model, anchor = make_mlp(3, 4, 2, seed=0), make_mlp(3, 4, 2, seed=1)
    term = proximal_term(model, anchor, mu=0.3)
    diff = [p.detach() - a.detach() for p, a in zip(model.parameters(), anchor.parameters(), strict=True)]
    value = term()
    assert value.item() == pytest.approx(0.15 * sum(float((d * d).sum()) for d in diff), rel=1e-12)
    value.backward()
    for p, d in zip(model.parameters(), diff, strict=True):
        torch.testing.assert_close(p.grad, 0.3 * d, rtol=1e-12, atol=0)
    with torch.no_grad():  # the anchor is frozen at construction
        next(anchor.parameters()).add_(1.0)
    assert term().item() == pytest.approx(value.item(), rel=1e-12)


def test_fedprox_and_ditto_change_training_as_configured(tmp_path: Path) -> None:
    # Three local steps: the proximal gradient mu (theta - theta_g) is zero at the first one.
    base = run(tmp_path, name="base", loss="spo+", **{"personal-rounds": 0, "local-epochs": 3})
    prox = run(
        tmp_path, name="prox", loss="spo+", **{"personal-rounds": 0, "local-epochs": 3, "proximal-mu": 1.0}
    )
    ditto = run(tmp_path, name="ditto", loss="spo+", fraction=1.0, **{"personal-rounds": 0, "ditto-mu": 0.5})
    assert prox["aggregate"]["fed-relative-regret"] != base["aggregate"]["fed-relative-regret"]
    assert "per-relative-regret" not in base["aggregate"]
    assert ditto["aggregate"]["clients-reporting"] == 4 and "per-relative-regret" in ditto["aggregate"]


def test_bad_combinations_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="'loss'"):
        run(tmp_path, strategy="fedavg", loss="rspo+")
    with pytest.raises(ConfigError, match="'ditto-mu'"):
        run(tmp_path, name="d", **{"ditto-mu": 0.1})


# --- end to end, every loss ----------------------------------------------------------------------
@pytest.mark.parametrize("loss", ["mse", "spo+", "rspo+", "pfyl", "dpo", "mse->spo+", "optnet"])
def test_every_loss_runs_the_whole_protocol(tmp_path: Path, loss: str) -> None:
    summary = run(tmp_path, loss=loss)
    agg = summary["aggregate"]
    assert summary["status"] == "completed" and agg["clients-reporting"] == 4
    assert 0 <= agg["fed-relative-regret"] < 1 and 0 <= agg["per-relative-regret"] < 1


def test_local_only_shares_no_model(tmp_path: Path) -> None:
    seen: list[tuple[Message, Message]] = []
    cfg = {**SMALL, "strategy": "local-only", "results-dir": str(tmp_path), "run-name": "r"}
    summary = run_inline(cfg, node_configs(3), observers=[lambda ins, reply: seen.append((ins, reply))])
    assert summary["status"] == "completed" and "per-relative-regret" in summary["aggregate"]
    assert "fed-relative-regret" not in summary["aggregate"]
    for ins, reply in seen:
        if ins.metadata.message_type != "train.personalize":  # personalization starts from the own model
            assert not ins.content.array_records and not reply.content.array_records


# --- the Flower protocol computes what a plain loop computes -----------------------------------------
@pytest.mark.parametrize("loss", ["rspo+", "mse->spo+"])
def test_flower_run_equals_an_independent_plain_loop(tmp_path: Path, loss: str) -> None:
    from bench.fedrspo_reference import fedrspo_plain

    overrides = {
        **SMALL,
        "loss": loss,
        "num-rounds": 3,
        "personal-rounds": 4,
        "freeze-tau": 0.05,
        "eta-c": 0.5,
    }
    plain = fedrspo_plain(overrides, clients=5)
    flower = run(tmp_path, nodes=5, **{k: v for k, v in overrides.items() if k != "strategy"})
    for name, metrics in plain.items():
        for key, value in metrics.items():
            assert flower["clients"][name][key] == pytest.approx(value, rel=1e-12, abs=1e-15), (name, key)


def test_a_polytope_without_the_needed_projection_is_named_before_round_1(tmp_path: Path) -> None:
    """OptNet with the `exact` QP layer on a flow polytope (no closed-form projection): the client
    fails calibration with the reason and is left out; with every client so, the run stops."""
    from hetfed.client.calibration import check_projection
    from hetfed.methods.decision import CalibratedParams
    from hetfed.problems.polytope import GridFlowPolytope

    poly = GridFlowPolytope(3)
    split = DecisionSplit(
        torch.zeros(2, 2, dtype=torch.float64), torch.ones(2, poly.dim, dtype=torch.float64)
    )
    data = DecisionClientData("silo-7", 0, split, split, split, poly)
    params = CalibratedParams(loss="optnet", optnet_backend="exact")
    with pytest.raises(ValueError, match="silo-7: loss 'optnet' needs projections onto its GridFlowPolytope"):
        check_projection(data, params)
    check_projection(data, CalibratedParams(loss="rspo+"))  # auto picks DAQP: fine


def test_a_client_with_fewer_samples_than_a_batch_trains_on_one_full_batch(tmp_path: Path) -> None:
    summary = run(tmp_path, **{"n-train": 5, "batch-size": 64, "personal-rounds": 0, "local-epochs": 2})
    assert summary["status"] == "completed"
    losses = [float(r["train-loss"]) for r in rows(tmp_path) if r["exchange"] == "train"]
    assert losses and all(math.isfinite(v) for v in losses)
