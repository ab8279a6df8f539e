"""Secure aggregation (SecAgg+ with dropout recovery) on the inline engine: the real ClientApp and
ServerApp code, every exchange of the protocol, against the plain run of the same seeds."""

from __future__ import annotations

import csv
import json
import logging
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from flwr.app import Message

from hetfed import secagg
from hetfed.config import ConfigError
from hetfed.engines.inline import node_configs, run_inline
from hetfed.server import aggregation
from hetfed.server.secure_aggregation import SecureRound

FEDAVG = {"num-rounds": 3, "n-train": 40, "n-test": 30, "local-epochs": 1, "num-items": 10, "fraction": 1.0}
SECURE = {"secure-aggregation": True}


def run(
    tmp_path: Path, name: str, nodes: int = 4, configs: list[dict] | None = None, observers=(), **cfg: Any
) -> dict:
    run_config = {**FEDAVG, "results-dir": str(tmp_path), "run-name": name, **cfg}
    return run_inline(run_config, configs or node_configs(nodes), observers=list(observers))


def rows(path: Path) -> list[dict[str, str]]:
    with open(path / "rounds.csv", newline="") as f:
        return list(csv.DictReader(f))


def models(path: Path) -> dict[str, np.ndarray]:
    with np.load(path / "models.npz") as z:
        return {k: z[k] for k in z.files}


def quantization_bound(cfg_bits: int = 32, clip: float = 100.0, clients: int = 4) -> float:
    """|mean error| <= (sum_j a_j step/2 + |mean| * clients step/2) / sum_j a_j: a few steps at most."""
    return clients * secagg.step_of(clip, cfg_bits)


# --- primitives ------------------------------------------------------------------------------
def test_any_threshold_of_the_shares_gives_the_secret_and_fewer_do_not() -> None:
    secret = os.urandom(32)
    shares = secagg.split(secret, 3, 5)
    for subset in ([0, 1, 2], [2, 3, 4], [0, 2, 4], [0, 1, 2, 3, 4]):
        assert secagg.combine({i + 1: shares[i] for i in subset}) == secret
    assert secagg.combine({1: shares[0], 2: shares[1]}) != secret  # two points of a degree-2 polynomial


def test_fixed_point_sums_wrap_and_decode_to_the_sum() -> None:
    rng = np.random.default_rng(0)
    values = rng.normal(size=(6, 50)) * 30
    step = secagg.step_of(100.0, 32)
    total = np.zeros(50, dtype=np.uint64)
    for v in values:
        total = secagg.add(total, secagg.encode(v, step))
    np.testing.assert_allclose(secagg.decode(total, step), values.sum(axis=0), atol=6 * step / 2)
    with pytest.raises(secagg.SecAggError):
        secagg.encode(np.array([np.nan]), step)


def test_pair_masks_cancel_and_keys_agree() -> None:
    a_sk, a_pk = secagg.new_agreement_key()
    b_sk, b_pk = secagg.new_agreement_key()
    ctx = secagg.context("run", 3, "mask", 1, 2)
    assert secagg.agree(a_sk, b_pk, ctx) == secagg.agree(b_sk, a_pk, ctx)
    assert secagg.agree(a_sk, b_pk, ctx) != secagg.agree(a_sk, b_pk, secagg.context("run", 4, "mask", 1, 2))
    seed = secagg.agree(a_sk, b_pk, ctx)
    total = secagg.add(secagg.signed_pair_mask(1, 2, seed, 100), secagg.signed_pair_mask(2, 1, seed, 100))
    assert not total.any()
    key = os.urandom(32)
    sealed = secagg.encrypt(key, b"share", b"ctx 1->2")
    assert secagg.decrypt(key, sealed, b"ctx 1->2") == b"share"
    with pytest.raises(secagg.SecAggError):
        secagg.decrypt(key, sealed, b"ctx 1->3")  # a share replayed to another pair does not open


# --- runs equal the plain runs ---------------------------------------------------------------
def test_fedavg_with_secure_aggregation_equals_the_plain_run(tmp_path: Path) -> None:
    plain = run(tmp_path, "plain")
    secure = run(tmp_path, "secure", **SECURE)
    a, b = models(tmp_path / "plain"), models(tmp_path / "secure")
    assert max(float(np.abs(a[k] - b[k]).max()) for k in a) <= quantization_bound()
    assert secure["aggregate"]["fed-relative-regret"] == pytest.approx(
        plain["aggregate"]["fed-relative-regret"], abs=1e-6
    )
    assert secure["privacy"] == {
        "secure-aggregation": True,
        "dp": "off",
        "secagg-step": secagg.step_of(100.0, 32),
        "secagg-max-weight": float(FEDAVG["n-train"]),  # FedAvg weights by data size: the largest set
        "secagg-tolerated-corrupt": 0,
        "secagg-authenticated-keys": False,  # no roster on the silos: semi-honest (test_signed_keys.py)
    }
    exchanges = [r["exchange"] for r in rows(tmp_path / "secure") if r["round"] == "1"]
    kinds = ["query.secagg_keys", "query.secagg_shares", "train", "query.secagg_check", "query.secagg_unmask"]
    assert [k for k in dict.fromkeys(exchanges) if k != "round"] == kinds


def test_fedrspo_warm_start_with_secure_aggregation_equals_the_plain_run(tmp_path: Path) -> None:
    cfg = {"strategy": "fedrspo", "loss": "rspo+", "num-rounds": 2, "personal-rounds": 2}
    plain = run(tmp_path, "plain", **cfg)
    secure = run(tmp_path, "secure", **cfg, **SECURE)
    for client, metrics in plain["clients"].items():
        for key, value in metrics.items():
            assert secure["clients"][client][key] == pytest.approx(value, abs=1e-6), (client, key)
    secure_rounds = {r["round"] for r in rows(tmp_path / "secure") if r["exchange"] == "query.secagg_keys"}
    assert secure_rounds == {"1", "2"}  # the warm start only: personal models never leave the clients


def test_pflsa_with_secure_aggregation_equals_the_plain_run(tmp_path: Path) -> None:
    cfg = {"problem": "garnet", "strategy": "pflsa", "num-rounds": 30, "lsa-eta": 0.3, "garnet-zeta-rew": 0.5}
    plain = run(tmp_path, "plain", nodes=3, **cfg)
    secure = run(tmp_path, "secure", nodes=3, **cfg, **SECURE)
    for client, metrics in plain["clients"].items():
        assert secure["clients"][client]["sq-error"] == pytest.approx(metrics["sq-error"], rel=1e-6, abs=1e-9)


def test_switching_with_secure_aggregation_equals_the_plain_run(tmp_path: Path) -> None:
    cfg = {
        "strategy": "softmax-switching",
        "problem": "quadratic",
        "num-rounds": 8,
        "switching-m": 2,
        "switching-eval-every": 4,
    }
    plain = run(tmp_path, "plain", nodes=3, **cfg)
    secure = run(tmp_path, "secure", nodes=3, **cfg, **SECURE)
    a, b = models(tmp_path / "plain"), models(tmp_path / "secure")
    assert max(float(np.abs(a[k] - b[k]).max()) for k in a) <= 1e-6
    assert secure["aggregate"] == pytest.approx(plain["aggregate"], abs=1e-6)


# --- dropouts ----------------------------------------------------------------------------------
def test_a_client_lost_after_its_masked_input_is_unmasked_from_the_others_shares(tmp_path: Path) -> None:
    """client-01 sends its masked input in round 2, then fails the consistency check: its input is
    in the sum, its self-mask comes back from the others' shares, the model equals the plain run's."""
    plain = run(tmp_path, "plain")
    configs = node_configs(4)
    configs[1] |= {"fail-round": 2, "drill-exchange": "query.secagg_check"}
    secure = run(tmp_path, "secure", configs=configs, **SECURE)
    a, b = models(tmp_path / "plain"), models(tmp_path / "secure")
    assert max(float(np.abs(a[k] - b[k]).max()) for k in a) <= quantization_bound()
    failed = [
        (r["round"], r["exchange"], r["client"]) for r in rows(tmp_path / "secure") if r["status"] == "failed"
    ]
    assert failed == [("2", "query.secagg_check", "client-01")]
    assert secure["status"] == plain["status"] == "completed"


def test_a_client_lost_after_its_shares_has_its_pair_masks_removed(tmp_path: Path) -> None:
    """client-02 shares its keys in round 2 and fails training: the survivors' pair masks with it are
    removed with its reconstructed mask key; the sum equals the plain run where it fails alike."""
    configs = node_configs(4)
    configs[2] |= {"fail-round": 2, "drill-exchange": "train"}
    plain = run(tmp_path, "plain", configs=configs)
    secure = run(tmp_path, "secure", configs=[dict(c) for c in configs], **SECURE)
    a, b = models(tmp_path / "plain"), models(tmp_path / "secure")
    assert max(float(np.abs(a[k] - b[k]).max()) for k in a) <= quantization_bound()
    assert secure["failed-rounds"] == plain["failed-rounds"] == {"client-02": [2]}


def test_below_the_threshold_the_round_fails_with_one_line_and_the_run_goes_on(tmp_path: Path) -> None:
    configs = node_configs(3)
    configs[2] |= {"fail-round": 2, "drill-exchange": "train"}
    lines: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: lines.append(record.getMessage())  # type: ignore[method-assign]
    logging.getLogger("flwr").addHandler(handler)  # the ServerApp logs through Flower's logger
    try:
        summary = run(tmp_path, "t", nodes=3, configs=configs, **SECURE, **{"secagg-threshold": 3})
    finally:
        logging.getLogger("flwr").removeHandler(handler)
    below = [line for line in lines if "secure aggregation needs 3 clients" in line]
    assert len(below) == 1 and "only 2 masked inputs" in below[0] and "\n" not in below[0]
    server = {r["round"]: r for r in rows(tmp_path / "t") if r["client"] == "server"}
    assert server["2"]["clients-used"] == "0" and summary["status"] == "completed"


def test_below_the_threshold_pflsa_stops_and_resumes_from_its_checkpoint(tmp_path: Path) -> None:
    cfg = {"problem": "garnet", "strategy": "pflsa", "num-rounds": 4, **SECURE, "secagg-threshold": 3}
    state = {"state-dir": str(tmp_path / "state")}
    configs = node_configs(3, state)
    configs[0] |= {"fail-round": 3, "drill-exchange": "train"}
    with pytest.raises(
        Exception, match="round 3 train has no sum: fewer clients than secure aggregation's threshold"
    ):
        run(tmp_path, "p", configs=configs, **cfg)
    assert json.loads((tmp_path / "p" / "progress.json").read_text())["round"] == 2
    resumed = run(tmp_path, "p", configs=node_configs(3, state), resume=True, **cfg)
    plain = run(tmp_path, "plain", nodes=3, **{**cfg, "secure-aggregation": False})
    assert resumed["status"] == "completed"
    for client, metrics in plain["clients"].items():
        assert resumed["clients"][client]["sq-error"] == pytest.approx(metrics["sq-error"], rel=1e-6)


# --- the server's view -----------------------------------------------------------------------
def test_the_server_receives_only_uniform_masked_words(tmp_path: Path) -> None:
    seen: list[tuple[Message, Message]] = []
    run(
        tmp_path,
        "s",
        observers=[lambda ins, reply: seen.append((ins, reply))],
        **SECURE,
        **{"audit-traffic": True},
    )
    train = [reply for ins, reply in seen if ins.metadata.message_type == "train"]
    assert train and all("arrays" not in r.content.array_records for r in train)
    words = np.concatenate([r.content.array_records["masked"]["y"].numpy() for r in train])
    assert words.dtype == np.uint64
    # Each of the 64 bits is set in half of the words (4 x 3 rounds x ~1100 words): no structure.
    bits = (words[:, None] >> np.arange(64, dtype=np.uint64)) & np.uint64(1)
    frac = bits.mean(axis=0)
    assert np.all(np.abs(frac - 0.5) < 5 * 0.5 / np.sqrt(len(words)))
    # The clear code of an update is far from it: its high bits are all 0 or all 1.
    clear = secagg.encode(
        np.random.default_rng(0).normal(scale=0.01, size=len(words)), secagg.step_of(100, 32)
    )
    assert np.all(((clear >> np.uint64(40)) == 0) | ((clear >> np.uint64(40)) == (1 << 24) - 1))
    audit = [json.loads(line) for line in (tmp_path / "s" / "traffic.jsonl").read_text().splitlines()]
    for entry in (e for e in audit if e["exchange"] == "train"):
        assert set(entry["arrays"]) == {"masked/y"} and entry["dtypes"] == {"masked/y": "uint64"}
    keys = [e for e in audit if e["exchange"].startswith("query.secagg")]
    assert keys and all(not e["arrays"] for e in keys)  # keys, shares and signatures: no arrays


class DishonestRound(SecureRound):
    """A server that asks for the mask key of a client whose masked input it holds."""

    def unmask_request(self, survivors, dropped, signatures):  # type: ignore[no-untyped-def]
        victim = survivors[0]
        return super().unmask_request(survivors, [*dropped, victim], signatures)


class EquivocatingRound(SecureRound):
    """A server that claims a survivor dropped, leaving it out of the survivors' list it sends."""

    def unmask_request(self, survivors, dropped, signatures):  # type: ignore[no-untyped-def]
        return super().unmask_request(survivors[1:], [*dropped, survivors[0]], signatures)


@pytest.mark.parametrize("dishonest", [DishonestRound, EquivocatingRound])
def test_clients_refuse_to_unmask_a_client_that_sent_its_input(
    tmp_path: Path, monkeypatch, dishonest
) -> None:
    monkeypatch.setattr(aggregation, "SecureRound", dishonest)
    summary = run(tmp_path, "d", **SECURE, **{"num-rounds": 1})
    unmask = [r for r in rows(tmp_path / "d") if r["exchange"] == "query.secagg_unmask"]
    assert len(unmask) == 4 and all(
        r["status"] == "failed" and "refused to unmask" in r["error"] for r in unmask
    )
    server = [r for r in rows(tmp_path / "d") if r["client"] == "server"]
    assert server[-1]["clients-used"] == "0" and summary["status"] == "completed"


@pytest.mark.simulation
def test_secure_aggregation_on_the_simulation_engine_equals_the_plain_inline_run(tmp_path: Path) -> None:
    from hetfed.engines.runner import run_experiment

    secure = run_experiment(
        "simulation", {**FEDAVG, **SECURE, "run-name": "sim"}, nodes=4, results_dir=tmp_path, timeout=900
    )
    plain = run(tmp_path, "plain")
    assert secure["status"] == "completed" and secure["engine"] == "simulation"
    a, b = models(tmp_path / "plain"), models(tmp_path / "sim")
    assert max(float(np.abs(a[k] - b[k]).max()) for k in a) <= quantization_bound()
    assert secure["aggregate"]["fed-relative-regret"] == pytest.approx(
        plain["aggregate"]["fed-relative-regret"], abs=1e-6
    )


def test_a_plan_with_fewer_clients_per_round_than_the_threshold_is_refused_before_round_1(
    tmp_path: Path,
) -> None:
    with pytest.raises(
        ConfigError,
        match=r"^run config 'secagg-threshold': .* at least 2 clients per round, the plan has 1 of 4",
    ):
        run(tmp_path, "few", **SECURE, fraction=0.25)
    with pytest.raises(ConfigError, match=r"at least 4 clients per round, the plan has 3 of 3"):
        run(tmp_path, "t", nodes=3, **SECURE, **{"secagg-threshold": 4})
    summary = json.loads((tmp_path / "t" / "summary.json").read_text())
    assert summary["status"] == "failed" and not (tmp_path / "t" / "rounds.csv").exists()  # no round ran
