"""Robust aggregation in plain mode (strategies/robust.py): the rules against Flower's own aggregate
functions on the same updates, and real inline runs of 10 clients where one silo is bad."""

from __future__ import annotations

import csv
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from flwr.app import Context, Message
from flwr.common.constant import SUPERLINK_NODE_ID
from flwr.server.strategy.aggregate import aggregate_krum, aggregate_median, aggregate_trimmed_avg
from flwr.supercore.task_identity import TaskIdentity

from hetfed.client.app import app as client_app
from hetfed.config import ConfigError, validate
from hetfed.engines.inline import InlineGrid, node_configs
from hetfed.records import to_numpy, to_record
from hetfed.server.app import run_server
from hetfed.strategies.registry import build_strategy
from hetfed.strategies.robust import RobustAggregation, weighted_median, weighted_trimmed_mean

FEDAVG = {"num-rounds": 3, "n-train": 40, "n-test": 30, "local-epochs": 1, "num-items": 10, "fraction": 1.0}
CLIENTS, BAD = 10, 3  # partition 3 is the bad silo


# --- the rules against Flower's functions ----------------------------------------------------------
@pytest.mark.parametrize("n", [2, 3, 7, 10, 11])
def test_the_median_with_equal_weights_is_flowers_aggregate_median(n: int) -> None:
    rng = np.random.default_rng(n)
    layers = [[rng.normal(size=(3, 4)), rng.normal(size=5)] for _ in range(n)]
    flower = aggregate_median([(x, 1) for x in layers])
    ours = RobustAggregation("median").estimate([{"a": x[0], "b": x[1]} for x in layers], [0.7] * n)[0]
    assert ours is not None
    np.testing.assert_allclose(ours["a"], flower[0], rtol=0, atol=1e-12)
    np.testing.assert_allclose(ours["b"], flower[1], rtol=0, atol=1e-12)


@pytest.mark.parametrize(
    ("n", "trim"), [(10, 0.1), (10, 0.2), (10, 0.45), (7, 0.1), (7, 0.3), (11, 0.25), (4, 0.0)]
)
def test_the_trimmed_mean_with_equal_weights_is_flowers_aggregate_trimmed_avg(n: int, trim: float) -> None:
    rng = np.random.default_rng(int(100 * trim) + n)
    layers = [[rng.normal(size=(2, 6)), rng.normal(size=3) * 50] for _ in range(n)]
    flower = aggregate_trimmed_avg([(x, 1) for x in layers], trim)
    rule = RobustAggregation("trimmed-mean", trim=trim)
    ours = rule.estimate([{"a": x[0], "b": x[1]} for x in layers], [1.0] * n)[0]
    assert ours is not None
    np.testing.assert_allclose(ours["a"], flower[0], rtol=0, atol=1e-12)
    np.testing.assert_allclose(ours["b"], flower[1], rtol=0, atol=1e-12)


@pytest.mark.parametrize(("n", "f"), [(5, 1), (10, 1), (10, 3), (9, 2)])
def test_krum_is_flowers_aggregate_krum_and_never_picks_the_bad_update(n: int, f: int) -> None:
    rng = np.random.default_rng(n + f)
    layers = [[rng.normal(size=(3, 3)), rng.normal(size=2)] for _ in range(n)]
    layers[0] = [100 * v for v in layers[0]]  # one bad update, 100x
    flower = aggregate_krum([(x, 1) for x in layers], num_malicious=f, to_keep=0)
    ours = RobustAggregation("krum", krum_f=f).estimate([{"a": x[0], "b": x[1]} for x in layers], [1.0] * n)[
        0
    ]
    assert ours is not None
    np.testing.assert_allclose(ours["a"], flower[0], rtol=0, atol=1e-12)
    np.testing.assert_allclose(ours["b"], flower[1], rtol=0, atol=1e-12)
    assert any(np.array_equal(ours["a"], x[0]) for x in layers[1:])


def test_the_weighted_median_is_flowers_median_of_the_updates_repeated_by_their_weights() -> None:
    """Integer weights a_j: the minimiser of sum_j a_j |m - v_j| is the median of the multiset with
    v_j taken a_j times, which Flower's aggregate_median computes."""
    rng = np.random.default_rng(5)
    for _ in range(20):
        n = int(rng.integers(2, 9))
        values = rng.normal(size=(n, 30))
        counts = rng.integers(1, 5, size=n)
        repeated = [([values[j]], 1) for j in range(n) for _ in range(counts[j])]
        flower = aggregate_median(repeated)[0]
        np.testing.assert_allclose(weighted_median(values, counts * 0.25), flower, rtol=0, atol=1e-12)


def test_the_weighted_trimmed_mean_is_its_equation_entry_by_entry() -> None:
    """A direct transcription: per entry, drop the clients whose whole weight lies in the lowest or
    highest ``trim`` of the weight, then the weighted mean of the rest."""
    rng = np.random.default_rng(6)
    for trim in (0.0, 0.1, 0.25, 0.4):
        n = 8
        values, weights = rng.normal(size=(n, 40)), rng.uniform(0.1, 1.0, size=n)
        expected = np.empty(values.shape[1])
        for col in range(values.shape[1]):
            order = np.argsort(values[:, col])
            total, below, num, den = weights.sum(), 0.0, 0.0, 0.0
            for j in order:
                above = below + weights[j]
                if above / total > trim and below / total < 1 - trim:
                    num, den = num + weights[j] * values[j, col], den + weights[j]
                below = above
            expected[col] = num / den
        np.testing.assert_allclose(weighted_trimmed_mean(values, weights, trim), expected, rtol=0, atol=1e-12)


def test_krum_with_too_few_updates_gives_no_estimate_and_says_why() -> None:
    estimate, why = RobustAggregation("krum", krum_f=1).estimate([{"a": np.zeros(2)}] * 4, [1.0] * 4)
    assert estimate is None and "needs 5 updates, got 4" in why


# --- real runs: 10 clients, one bad silo ------------------------------------------------------------
def bad_silo(scale: float) -> Callable[[Message, Context], Message]:
    """The real ClientApp, except that partition BAD sends ``scale`` times its true update w_j - w_t."""

    def app(message: Message, context: Context) -> Message:
        reply = client_app(message, context)
        if context.node_config["partition-id"] != BAD or message.metadata.message_type != "train":
            return reply
        sent = to_numpy(message.content["arrays"])
        got = to_numpy(reply.content["arrays"])
        reply.content["arrays"] = to_record(
            {k: (sent[k] + scale * (v - sent[k])).astype(v.dtype) for k, v in got.items()}
        )
        return reply

    return app


def run(
    tmp_path: Path, name: str, scale: float | None = None, observers: list[Any] | None = None, **cfg: Any
) -> dict[str, Any]:
    """An inline run of 10 clients (partition BAD bad when ``scale`` is given); its summary."""
    run_config = {**FEDAVG, "results-dir": str(tmp_path), "run-name": name, **cfg}
    grid = InlineGrid(client_app if scale is None else bad_silo(scale), node_configs(CLIENTS), run_config)
    grid.observers.extend(observers or [])
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, SUPERLINK_NODE_ID, 1
    return run_server(grid, run_config)


def model(path: Path) -> dict[str, np.ndarray]:
    with np.load(path / "models.npz") as z:
        return {k.removeprefix("global/"): z[k].astype(np.float64) for k in z.files}


def distance(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> float:
    return float(np.sqrt(sum(np.sum((a[k] - b[k]) ** 2) for k in a)))


def rows(path: Path) -> list[dict[str, str]]:
    if not (path / "rounds.csv").exists():  # refused before any exchange
        return []
    with open(path / "rounds.csv", newline="") as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def clean(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, np.ndarray], float]:
    """The clean run (every silo honest, the mean): its folder, its model and how far training moved
    it from the initial model, D = ||w_T - w_0||."""
    tmp = tmp_path_factory.mktemp("clean")
    assert run(tmp, "clean")["status"] == "completed"
    initial = build_strategy(validate({**FEDAVG, "results-dir": str(tmp)})).arrays
    assert initial is not None
    w_T = model(tmp / "clean")
    return tmp / "clean", w_T, distance(w_T, {k: v.astype(np.float64) for k, v in to_numpy(initial).items()})


class Rounds:
    """An observer: each train round's sent model w_t and the updates x_j = reply - w_t it got."""

    def __init__(self) -> None:
        self.sent: dict[int, dict[str, np.ndarray]] = {}
        self.updates: dict[int, list[dict[str, np.ndarray]]] = {}

    def __call__(self, instruction: Message, reply: Message) -> None:
        if instruction.metadata.message_type != "train" or reply.has_error():
            return
        t = int(instruction.metadata.group_id)
        w = {k: v.astype(np.float64) for k, v in to_numpy(instruction.content["arrays"]).items()}
        self.sent[t] = w
        got = to_numpy(reply.content["arrays"])
        self.updates.setdefault(t, []).append({k: got[k].astype(np.float64) - w[k] for k in w})


# The bound: ||w_T(attacked) - w_T(clean)|| <= D, the distance the clean run's training moved the model.
# Each round, the median and the trimmed mean (trim 0.1 of 10 clients: one cut at each end) lie in the
# range of the honest updates entry by entry, and Krum (n = 10 >= 2f + 3) picks one honest update: the
# bad silo can move a round's step only within the spread of the honest updates, which is of the size
# of the honest steps that make up D. (Measured: 0.15 D trimmed-mean, 0.4 D median, 0.6 D krum, mostly
# their own difference from the mean on honest updates; the mean under +-100x: about 11 D.) A sign flip
# at the honest size (-1x) is within D for the mean too: it only shrinks the round's step to about 0.8.
ROBUST = [("trimmed-mean", {"aggregation-trim": 0.1}), ("median", {}), ("krum", {"aggregation-krum-f": 1})]
FLOWER = {
    "trimmed-mean": lambda xs: aggregate_trimmed_avg([(x, 1) for x in xs], 0.1),
    "median": lambda xs: aggregate_median([(x, 1) for x in xs]),
    "krum": lambda xs: aggregate_krum([(x, 1) for x in xs], num_malicious=1, to_keep=0),
}


@pytest.mark.parametrize("scale", [100.0, -100.0, -1.0], ids=["100x", "sign-flipped-100x", "sign-flipped"])
@pytest.mark.parametrize(("rule", "keys"), ROBUST, ids=[r for r, _ in ROBUST])
def test_a_robust_rule_keeps_the_model_near_the_clean_run_and_steps_by_flowers_function(
    tmp_path: Path, clean: tuple[Path, dict[str, np.ndarray], float], rule: str, keys: dict, scale: float
) -> None:
    _, w_clean, D = clean
    seen = Rounds()
    summary = run(tmp_path, rule, scale, [seen], aggregation=rule, **keys)
    assert summary["status"] == "completed"
    assert distance(model(tmp_path / rule), w_clean) <= D
    for t in (1, 2):  # w_{t+1} - w_t is Flower's function of round t's updates (float32 models)
        keys_ = sorted(seen.sent[t])
        flower = FLOWER[rule]([[x[k] for k in keys_] for x in seen.updates[t]])
        for k, expected in zip(keys_, flower, strict=True):
            np.testing.assert_allclose(seen.sent[t + 1][k] - seen.sent[t][k], expected, rtol=0, atol=2e-6)


@pytest.mark.parametrize("scale", [100.0, -100.0], ids=["100x", "sign-flipped-100x"])
def test_the_mean_follows_the_bad_silo_far_beyond_the_bound(
    tmp_path: Path, clean: tuple[Path, dict[str, np.ndarray], float], scale: float
) -> None:
    _, w_clean, D = clean
    assert run(tmp_path, "mean", scale)["status"] == "completed"
    assert distance(model(tmp_path / "mean"), w_clean) > 5 * D


def test_aggregation_mean_is_todays_run_bit_for_bit(
    tmp_path: Path, clean: tuple[Path, dict[str, np.ndarray], float]
) -> None:
    """``aggregation = mean`` (given) equals the run without the key, and each round's model is
    w_t + sum_j n_j x_j / sum_j n_j computed as today's FedAvg computes it (float64, reply order)."""
    folder, _, _ = clean
    seen = Rounds()
    run(tmp_path, "mean", None, [seen], aggregation="mean")
    with np.load(folder / "models.npz") as a, np.load(tmp_path / "mean" / "models.npz") as b:
        assert a.files == b.files and all(np.array_equal(a[k], b[k]) for k in a.files)
    n = 40.0  # every client's num-examples (n-train)
    for t in (1, 2):
        for k, w in seen.sent[t].items():
            total = 0.0
            for x in seen.updates[t]:
                total = total + n * x[k]
            step = total / (n * len(seen.updates[t]))
            assert np.array_equal((w + step).astype(np.float32), seen.sent[t + 1][k].astype(np.float32))


def test_the_norm_bound_rejects_the_bad_silo_and_rounds_csv_names_it(
    tmp_path: Path, clean: tuple[Path, dict[str, np.ndarray], float]
) -> None:
    _, w_clean, D = clean
    seen = Rounds()
    bound = 1.0
    summary = run(tmp_path, "bounded", 100.0, [seen], **{"aggregation-max-norm": bound})
    assert summary["status"] == "completed"
    norms = {
        t: [np.sqrt(sum(np.sum(v**2) for v in x.values())) for x in xs] for t, xs in seen.updates.items()
    }
    for t, ns in norms.items():  # the bound separates the honest updates from the bad one
        assert sorted(ns)[-2] < bound < sorted(ns)[-1], (t, ns)
    train = [r for r in rows(tmp_path / "bounded") if r["exchange"] == "train"]
    rejected = [(r["round"], r["client"]) for r in train if r["status"] == "rejected"]
    assert rejected == [(str(t), f"client-{BAD:02d}") for t in (1, 2, 3)]
    assert all("exceeds aggregation-max-norm 1" in r["error"] for r in train if r["status"] == "rejected")
    assert summary["failed-rounds"] == {f"client-{BAD:02d}": [1, 2, 3]}
    assert distance(model(tmp_path / "bounded"), w_clean) <= D


# --- refusals before round 1 -------------------------------------------------------------------
REFUSED = [
    ({"aggregation": "median", "dp": "central"}, "'aggregation': aggregation = median with dp = central"),
    ({"aggregation": "krum", "dp": "local"}, "'aggregation': aggregation = krum with dp = local"),
    ({"aggregation": "trimmed-mean", "secure-aggregation": True}, "with secure-aggregation = true"),
    (
        {"aggregation-max-norm": 5.0, "secure-aggregation": True},
        "'aggregation-max-norm': aggregation-max-norm = 5",
    ),
    (
        {"aggregation": "median", "strategy": "local-only"},
        "strategy 'local-only': every client trains its own",
    ),
    ({"aggregation": "median", "strategy": "centralized"}, "strategy 'centralized': one model"),
]
LSA = {"problem": "garnet", "aggregation": "median"}
REFUSED += [
    ({**LSA, "strategy": s}, f"strategy {s!r}: the LSA methods' fixed points need the mean")
    for s in ("pflsa", "fedlsa", "scafflsa", "single-lsa")
]


@pytest.mark.parametrize(("cfg", "message"), REFUSED, ids=[str(sorted(c.items())) for c, _ in REFUSED])
def test_a_robust_aggregation_the_run_cannot_keep_is_refused_in_one_line(
    tmp_path: Path, cfg: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError, match="^run config ") as refused:
        run(tmp_path, "refused", **cfg)
    assert message in str(refused.value) and "\n" not in str(refused.value)
    assert not [r for r in rows(tmp_path / "refused") if r["exchange"] == "train"]


def test_krum_below_2f_plus_3_planned_clients_is_refused_before_round_1(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as refused:
        run(tmp_path, "krum", **{"aggregation": "krum", "aggregation-krum-f": 4, "fraction": 0.5})
    text = str(refused.value)
    assert text.startswith("run config 'aggregation-krum-f': krum with f = 4 needs at least 11 clients")
    assert "the plan has 5" in text and "\n" not in text
    assert not [r for r in rows(tmp_path / "krum") if r["exchange"] == "train"]
    summary = json.loads((tmp_path / "krum" / "summary.json").read_text())
    assert summary["status"] == "failed"


def test_switching_steps_by_the_median_weighted_by_its_plan(tmp_path: Path) -> None:
    """Softmax switching keeps its plan's weights: w_{k+1} = w_k - eta wmedian(u_i; weight_i), the
    weights as rounds.csv records them (which differ, so the unweighted median would not do)."""
    seen: dict[tuple[str, int], list[tuple[Message, Message]]] = {}

    def observe(instruction: Message, reply: Message) -> None:
        key = (instruction.metadata.message_type, int(instruction.metadata.group_id))
        seen.setdefault(key, []).append((instruction, reply))

    cfg = {"strategy": "softmax-switching", "problem": "quadratic", "num-rounds": 3, "switching-m": 5}
    run_config = {"results-dir": str(tmp_path), "run-name": "s", "aggregation": "median", **cfg}
    grid = InlineGrid(client_app, node_configs(5), run_config)
    grid.observers.append(observe)
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, SUPERLINK_NODE_ID, 1
    eta = run_server(grid, run_config)["aggregate"]["setting-eta"]
    train = [r for r in rows(tmp_path / "s") if r["exchange"] == "train"]
    for k in (1, 2):
        weights = {r["client"]: float(r["weight"]) for r in train if r["round"] == str(k)}
        assert len(set(weights.values())) == len(weights)  # the plan's weights differ
        w_k = to_numpy(seen[("query.fg", k)][0][0].content["arrays"])
        w_next = to_numpy(seen[("query.fg", k + 1)][0][0].content["arrays"])
        pairs = seen[("train", k)]
        names = [
            f"client-{grid.contexts[i.metadata.dst_node_id].node_config['partition-id']}" for i, _ in pairs
        ]
        for key, w in w_k.items():
            u = np.stack([to_numpy(r.content["arrays"])[key].astype(np.float64).ravel() for _, r in pairs])
            expected = w.astype(np.float64).ravel() - eta * weighted_median(u, [weights[n] for n in names])
            unweighted = w.astype(np.float64).ravel() - eta * np.median(u, axis=0)
            np.testing.assert_allclose(w_next[key].ravel(), expected, rtol=1e-12, atol=1e-12)
            assert not np.allclose(w_next[key].ravel(), unweighted, rtol=1e-6, atol=1e-9)
