"""A server that deviates from secure aggregation, against real clients (the inline engine runs the
real ClientApp and ServerApp code): the parameters it chooses are checked by every client.

The split-view attack (Bonawitz et al. 2017, the active setting) is played out in full: the server
tells one group of clients that the victim survived (they reveal their shares of its self-mask seed)
and the other group that it dropped out (they reveal their shares of its mask key). With a
threshold t where 2t <= m + c that unmasks the victim's exact update; the test shows it does with the
clients' threshold check switched off, and that with it every client refuses and nothing is
recovered. The fixed-point code is checked the same way: a property test over every code the checks
accept finds none whose sum wraps."""

from __future__ import annotations

import csv
import itertools
import logging
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from flwr.app import Message
from hypothesis import example, given, settings
from hypothesis import strategies as st

from hetfed import secagg
from hetfed.client import secure_aggregation as client_side
from hetfed.config import ConfigError
from hetfed.engines.inline import node_configs, run_inline
from hetfed.server import aggregation
from hetfed.server.secure_aggregation import FixedPointCode, SecureRound
from tests.test_silo_policy import assert_refused

FEDAVG = {"num-rounds": 1, "n-train": 40, "n-test": 30, "local-epochs": 1, "num-items": 10, "fraction": 1.0}
SECURE = {"secure-aggregation": True}


def run(tmp_path: Path, name: str, nodes: int = 4, observers: list[Any] | None = None, **cfg: Any) -> dict:
    run_config = {**FEDAVG, **SECURE, "results-dir": str(tmp_path), "run-name": name, **cfg}
    return run_inline(run_config, node_configs(nodes), observers=observers or [])


def rows(path: Path) -> list[dict[str, str]]:
    with open(path / "rounds.csv", newline="") as f:
        return list(csv.DictReader(f))


# --- the threshold rule ------------------------------------------------------------------------
def split_view_possible(t: int, m: int, c: int) -> bool:
    """Brute force: can a server gather t shares of the victim's seed b and t of its mask key from
    m holders (the victim among them), c of them colluding (they give both), each honest holder
    giving one of the two? Tries every split of the honest holders."""
    honest = m - c
    return any(k + c >= t and (honest - k) + c >= t for k in range(honest + 1))


def test_the_threshold_clients_accept_is_exactly_the_one_no_split_view_can_break() -> None:
    for m, c in itertools.product(range(2, 25), range(0, 6)):
        if c >= m:
            continue
        for t in range(2, m + 1):
            accepted = secagg.threshold_problem(t, m, c) is None
            assert accepted == (not split_view_possible(t, m, c)), (t, m, c)
        assert secagg.threshold_problem(secagg.smallest_threshold(m, c), m, c) is None or (
            secagg.smallest_threshold(m, c) > m  # c too large for m: nothing is safe, and it says so
        )
        assert secagg.threshold_problem(m + 1, m, c) is not None  # no sum could ever be unmasked


# --- the split-view attack, played by the server -------------------------------------------------
def unmask_one(server: SecureRound, y: np.ndarray, victim: int, b: bytes, s_sk: bytes) -> np.ndarray:
    """What a server holding both of a client's secrets gets: its vector, y - PRG(b) - its pair masks."""
    y = secagg.subtract(y, secagg.mask(b, y.size))
    for peer in server.peers:
        if peer != victim:
            where = secagg.context(server.pool.run_id, server.round, "mask", *sorted((victim, peer)))
            seed = secagg.agree(s_sk, server.keys[peer]["s-pk"], where)
            y = secagg.subtract(y, secagg.signed_pair_mask(victim, peer, seed, y.size))
    return secagg.decode(y, server.code.step)


class SplitViewRound(SecureRound):
    """A dishonest server: threshold 2 whatever the run says, and at the end a split view of the
    survivors that asks one group for the victim's seed shares and the other for its key shares."""

    recovered: list[np.ndarray] = []  # the victim's vector, when the clients let the attack through

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.t = 2

    def _unmask(
        self, masked: Mapping[int, np.ndarray], survivors: list[int], dropped: list[int]
    ) -> np.ndarray:
        victim, size = survivors[0], next(iter(masked.values())).size
        told_survived, told_dropped = survivors[:2], survivors[2:]  # the victim is in the first group
        seed_shares = self._reveal(told_survived, survivors, dropped, "b", victim)
        key_shares = self._reveal(told_dropped, told_dropped, [victim], "s", victim)
        b, s_sk = secagg.combine(seed_shares), secagg.combine(key_shares)
        SplitViewRound.recovered.append(unmask_one(self, masked[victim], victim, b, s_sk))
        return np.zeros(size, dtype=np.uint64)

    def _reveal(self, group: list[int], told: list[int], dropped: list[int], key: str, victim: int) -> dict:
        """Tell ``group`` that ``told`` survived; their shares (``key``: b or s) of the victim's secret."""
        signatures = {
            p: secagg.one(r, "signature", bytes)
            for p, r in self._query("query.secagg_check", group, {"secagg-survivors": told}).items()
        }
        shares = {}
        for holder, record in self._query(
            "query.secagg_unmask", group, self.unmask_request(told, dropped, signatures)
        ).items():
            owners = secagg.items(record[f"{key}-from"], int)
            values = secagg.items(record[f"{key}-shares"], bytes)
            shares |= {
                self.peers.index(holder) + 1: v for o, v in zip(owners, values, strict=True) if o == victim
            }
        return shares


def record_inputs(monkeypatch: pytest.MonkeyPatch) -> dict[int, np.ndarray]:
    """Each client's vector [a x, a, c] as it encodes it (the truth an attack is measured by)."""
    seen: dict[int, np.ndarray] = {}
    original = client_side._masked_input

    def recording(vector: np.ndarray, step: float, state: Any, context: Any) -> np.ndarray:
        seen[secagg.one(state, "pid", int)] = vector.copy()
        return original(vector, step, state, context)

    monkeypatch.setattr(client_side, "_masked_input", recording)
    return seen


@pytest.fixture
def inputs(monkeypatch: pytest.MonkeyPatch) -> dict[int, np.ndarray]:
    seen = record_inputs(monkeypatch)
    SplitViewRound.recovered = []
    monkeypatch.setattr(aggregation, "SecureRound", SplitViewRound)
    return seen


def test_without_the_clients_check_a_split_view_recovers_one_update(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, inputs: dict[int, np.ndarray]
) -> None:
    """The attack is real: with clients that accept t = 2 of 4 (the check off, as before), the server
    gets the victim's exact vector; this is what the check below prevents."""
    monkeypatch.setattr(secagg, "threshold_problem", lambda *args: None)
    run(tmp_path, "attack")
    assert len(SplitViewRound.recovered) == 1
    truth = inputs[0]
    step = secagg.step_of(100.0, 32)
    np.testing.assert_allclose(SplitViewRound.recovered[0], truth, rtol=0, atol=step / 2 + 1e-12)
    assert SplitViewRound.recovered[0][-2] == pytest.approx(FEDAVG["n-train"], abs=step)  # its weight


def test_every_client_refuses_a_threshold_a_split_view_can_break(
    tmp_path: Path, inputs: dict[int, np.ndarray]
) -> None:
    seen: list[tuple[Message, Message]] = []
    summary = run(tmp_path, "refused", observers=[lambda ins, reply: seen.append((ins, reply))])
    shares = [r for r in rows(tmp_path / "refused") if r["exchange"] == "query.secagg_shares"]
    line = (
        "refused to share keys: threshold 2 over 4 participants with 0 colluding tolerated lets a server "
        "that splits the clients' views unmask one client (needs 2t > m + c: t >= 3)"
    )
    assert len(shares) == 4 and all(r["status"] == "failed" and line in r["error"] for r in shares)
    # Nothing of any secret left a client: no share ciphertext, no masked input, nothing recovered.
    replies = [reply for ins, reply in seen if ins.metadata.message_type == "query.secagg_shares"]
    assert len(replies) == 4 and all(r.has_error() for r in replies)
    assert not inputs and SplitViewRound.recovered == []
    assert not any(ins.metadata.message_type == "train" for ins, _ in seen)
    assert summary["status"] == "completed"  # the round has no sum; the model is unchanged


def test_the_runs_colluding_silos_raise_the_threshold_every_client_demands(tmp_path: Path) -> None:
    """With c = 1 of 4 the server's default is t = 3 (2 * 3 > 4 + 1) and the run sums as before; a
    requested t = 3 with c = 2 is refused before round 1 in one line naming both keys."""
    summary = run(tmp_path, "c1", **{"secagg-tolerated-corrupt": 1})
    assert summary["status"] == "completed" and summary["privacy"]["secagg-tolerated-corrupt"] == 1
    assert [r["clients-used"] for r in rows(tmp_path / "c1") if r["client"] == "server"][-1] == "4"
    with pytest.raises(ConfigError) as refused:
        run(tmp_path, "c2", **{"secagg-tolerated-corrupt": 2, "secagg-threshold": 3})
    assert str(refused.value) == (
        "run config 'secagg-threshold' / 'secagg-tolerated-corrupt': threshold 3 over 4 participants with "
        "2 colluding tolerated lets a server that splits the clients' views unmask one client (needs "
        "2t > m + c: t >= 4); every client would refuse it"
    )
    assert not (tmp_path / "c2" / "rounds.csv").exists()


def test_a_silos_policy_demands_its_own_threshold_and_round_size(tmp_path: Path) -> None:
    """Three silos, t = 2 by default: a silo whose policy asks t >= 3 (or 4 clients per round, or
    tolerance of 1 colluding silo) refuses to share its keys in every round, in one line, and the
    others sum without it."""
    cases = {
        "min-secagg-threshold = 3": "rule 'min-secagg-threshold': threshold 2 < 3",
        "min-round-clients = 4": "rule 'min-round-clients': the round has 3 participants, fewer than 4",
        "secagg-tolerated-corrupt = 1": (
            "rule 'secagg-tolerated-corrupt': threshold 2 over 3 participants with 1 colluding tolerated "
            "lets a server that splits the clients' views unmask one client (needs 2t > m + c: t >= 3)"
        ),
    }
    for i, (policy, refusal) in enumerate(cases.items()):
        assert_refused(tmp_path / str(i), policy, refusal, {1, 2}, **SECURE)


# --- the fixed-point code ------------------------------------------------------------------------
def test_the_wrapping_example_is_refused_before_round_1_in_one_line(tmp_path: Path) -> None:
    """48 bits within +-0.1 and 2000 examples per client: the weight slot alone is 2^61.3 steps, four
    of them wrap 2^63 (the summed weight decoded to -5107.2 instead of 8000)."""
    with pytest.raises(ConfigError) as refused:
        run(tmp_path, "wrap", **{"secagg-bits": 48, "secagg-range": 0.1, "n-train": 2000})
    assert str(refused.value) == (
        "run config 'secagg-bits' / 'secagg-range' / 'secagg-max-weight': 4 clients' fixed-point codes of "
        "48 bits within +-0.1 at weights up to 2000 can wrap the 64-bit sum (at most 3 fit); lower "
        "secagg-bits or raise secagg-range"
    )
    assert not (tmp_path / "wrap" / "rounds.csv").exists()


@settings(max_examples=400, deadline=None)
@example(bits=8, bound=256.0, max_weight=0.0039, clients=2, sign=-1)  # a code of 0: no sign to keep
@given(
    bits=st.integers(8, 48),  # what validation accepts (hetfed/config.py)
    bound=st.floats(1e-4, 1e4),
    max_weight=st.floats(1e-3, 1e7),
    clients=st.integers(2, 5000),
    sign=st.sampled_from([1, -1]),
)
def test_no_code_the_checks_accept_wraps_and_every_one_they_refuse_can(
    bits: int, bound: float, max_weight: float, clients: int, sign: int
) -> None:
    """Every client at the extreme of every slot: the sum of their codes decodes to the true sum
    exactly when the checks accept the code, and wraps when they refuse it."""
    step = secagg.step_of(bound, bits)
    extreme = sign * max(max_weight * bound, max_weight, 1.0)
    exact = clients * round(extreme / step)  # the true sum of the codes, in Python's integers
    wraps = not -(2**63) <= exact < 2**63
    accepted = secagg.code_problem(clients, bits, bound, max_weight) is None
    assert accepted != wraps or (not accepted and abs(exact) >= 2**63 - clients), (exact, accepted)
    if accepted:
        code = secagg.encode(np.array([extreme]), step)
        total = np.zeros(1, dtype=np.uint64)
        with np.errstate(over="ignore"):
            total = total + code * np.uint64(clients)
        assert secagg.decode(total, step)[0] == pytest.approx(exact * step, rel=1e-12)
        assert exact == 0 or math.copysign(1, secagg.decode(total, step)[0]) == sign  # (-0.5 rounds to 0)


class WrappingRound(SecureRound):
    """A server that declares a code whose sum can wrap for the round's clients."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.code = FixedPointCode(bits=48, bound=0.1, max_weight=1e6)


class LowWeightRound(SecureRound):
    """A server that declares a weight bound below the clients' weights (data sizes of 40)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.code = FixedPointCode(bits=32, bound=100.0, max_weight=1.0)


@pytest.mark.parametrize(
    ("dishonest", "exchange", "line"),
    [
        (
            WrappingRound,
            "query.secagg_shares",
            "refused to share keys: 4 clients' fixed-point codes of 48 bits within +-0.1 at weights up to "
            "1e+06 can wrap the 64-bit sum (at most 0 fit)",
        ),
        (LowWeightRound, "train", "refused: this client's weight 40 is outside 0..1 (secagg-max-weight)"),
    ],
)
def test_every_client_refuses_a_code_that_could_wrap(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, dishonest: type, exchange: str, line: str
) -> None:
    monkeypatch.setattr(aggregation, "SecureRound", dishonest)
    summary = run(tmp_path, "d")
    failed = [r for r in rows(tmp_path / "d") if r["exchange"] == exchange]
    assert len(failed) == 4 and all(r["status"] == "failed" and line in r["error"] for r in failed), failed
    server = [r for r in rows(tmp_path / "d") if r["client"] == "server"]
    assert server[-1]["clients-used"] == "0" and summary["status"] == "completed"


# --- a bad silo under secure aggregation: what the server checks of the sum ------------------------
def bad_input(slot: str, vector: np.ndarray) -> np.ndarray:
    """What a bad silo encodes instead of its vector [a x, a, c]."""
    out = vector.copy()
    if slot == "weight":
        out[-2] *= 100  # claims 100 times its data
    elif slot == "count":
        out[-1] = 50  # 50 clients within the clip, of 4
    else:
        out[:-2] = 0.0
        out[0] = 40.0  # norm 40 at weight 1 under DP: ten times what four clients within clip 1 sum to
    return out


@pytest.mark.parametrize(
    ("slot", "cfg", "problem"),
    [
        ("weight", {}, "its weight slot is 4120, the survivors' weights sum to 160"),
        (
            "count",
            {"dp": "central", "dp-noise-multiplier": 0.01},
            "its within-clip count is 53, outside 0..4",
        ),
        (
            "norm",
            {"dp": "central", "dp-noise-multiplier": 0.01},
            "exceeds the survivors' weights times the clip",
        ),
    ],
)
def test_a_sum_a_bad_silo_broke_is_refused_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, slot: str, cfg: dict, problem: str
) -> None:
    """Silo 1 encodes a vector that breaks one of the sum's checks: the round has no sum (one line)
    and the model is unchanged; the clean run of the same config sums all four."""
    original = client_side._masked_input

    def bad(vector: np.ndarray, step: float, state: Any, context: Any) -> np.ndarray:
        if secagg.one(state, "pid", int) == 1:
            vector = bad_input(slot, vector)
        return original(vector, step, state, context)

    clean = run(tmp_path, "clean", **cfg)
    assert [r["clients-used"] for r in rows(tmp_path / "clean") if r["client"] == "server"][-1] == "4"
    monkeypatch.setattr(client_side, "_masked_input", bad)
    lines: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: lines.append(record.getMessage())  # type: ignore[method-assign]
    logging.getLogger("flwr").addHandler(handler)  # the ServerApp logs through Flower's logger
    try:
        summary = run(tmp_path, "bad", **cfg)
    finally:
        logging.getLogger("flwr").removeHandler(handler)
    refused = [line for line in lines if "the secure sum is refused" in line]
    assert len(refused) == 1 and problem in refused[0] and "\n" not in refused[0], refused
    assert [r["clients-used"] for r in rows(tmp_path / "bad") if r["client"] == "server"][-1] == "0"
    assert summary["status"] == clean["status"] == "completed"


class DoubleInputRound(SecureRound):
    """A server that sends a round's train message again once it holds the masked inputs: a second
    input under the same masks would give it the difference of the two in clear."""

    again: list[Message] = []

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.sent: list[tuple[Any, ...]] = []

    def _train_message(self, *args: Any) -> Message:
        self.sent.append(args)
        return super()._train_message(*args)

    def _unmask(
        self, masked: Mapping[int, np.ndarray], survivors: list[int], dropped: list[int]
    ) -> np.ndarray:
        messages = [SecureRound._train_message(self, *a) for a in self.sent]
        DoubleInputRound.again = self.pool.send_aside(messages, self.round)
        return super()._unmask(masked, survivors, dropped)


def test_every_client_refuses_a_second_masked_input_in_one_round(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, inputs: dict[int, np.ndarray]
) -> None:
    monkeypatch.setattr(aggregation, "SecureRound", DoubleInputRound)
    DoubleInputRound.again = []
    run(tmp_path, "twice")
    assert len(DoubleInputRound.again) == 0  # every second train reply is an error, none usable
    train = [r for r in rows(tmp_path / "twice") if r["exchange"] == "train"]
    refused = [r for r in train if r["status"] == "failed"]
    line = "refused: this client sent its masked input of this round already"
    assert len(refused) == 4 and all(line in r["error"] for r in refused), train
    assert len(inputs) == 4  # each client encoded its input once


@settings(max_examples=200, deadline=None)
@given(
    bits=st.integers(8, 48),
    bound=st.floats(1e-3, 1e3),
    max_weight=st.floats(1.0, 1e7),
    clients=st.integers(2, 50),
)
def test_an_honest_sum_at_the_codes_extreme_passes_the_servers_checks(
    bits: int, bound: float, max_weight: float, clients: int
) -> None:
    """Every client at the weight bound (its code beyond 2^53 steps where the code allows): the honest
    sum decodes, in float64, within what the server's weight-slot check accepts."""
    if secagg.code_problem(clients, bits, bound, max_weight) is not None:
        return
    code = FixedPointCode(bits, bound, max_weight)
    vector = np.array([max_weight * bound, max_weight, 1.0])  # [a x, a, c] at the extreme
    total = np.zeros(3, dtype=np.uint64)
    for _ in range(clients):
        total = secagg.add(total, secagg.encode(vector, code.step))
    decoded = secagg.decode(total, code.step)
    assert aggregation.implausible_sum(decoded, clients * max_weight, clients, code.step, True, None) is None
