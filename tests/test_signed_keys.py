"""Signed keys: secure aggregation against a server that substitutes or replays keys, on real clients.

Each silo holds an identity and the federation's roster (hetfed/silo_identity.py, named in its node
config); the inline engine runs the real ClientApp and ServerApp code, and a dishonest server is a
SecureRound subclass (as in tests/test_dishonest_server.py). Every attack is played twice: on silos
without a roster (today's semi-honest clients), where it goes through, and on silos with one, where
every honest client refuses it in one line and nothing leaves."""

from __future__ import annotations

import csv
import json
import os
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest

from hetfed import secagg, silo_identity
from hetfed.client import secure_aggregation as client_side
from hetfed.engines.inline import node_configs, run_inline
from hetfed.server import aggregation
from hetfed.server.secure_aggregation import SecureRound
from hetfed.strategies.base import FederationError
from tests.test_dishonest_server import record_inputs, unmask_one

FEDAVG = {"num-rounds": 1, "n-train": 40, "n-test": 30, "local-epochs": 1, "num-items": 10, "fraction": 1.0}
SECURE = {"secure-aggregation": True}
STEP = secagg.step_of(100.0, 32)


def silos(tmp_path: Path, nodes: int = 4, roster: bool = True) -> list[dict[str, Any]]:
    """Node configs, each with its identity and the one roster (made in ``tmp_path``) if ``roster``."""
    configs = node_configs(nodes)
    if roster:
        keys, roster_file = silo_identity.make_federation(tmp_path / "identities", nodes)
        for cfg, key in zip(configs, keys, strict=True):
            cfg |= {"secagg-identity": str(key), "secagg-roster": str(roster_file)}
    return configs


def run(tmp_path: Path, name: str, configs: list[dict[str, Any]], **cfg: Any) -> dict:
    return run_inline({**FEDAVG, **SECURE, "results-dir": str(tmp_path), "run-name": name, **cfg}, configs)


def rows(path: Path) -> list[dict[str, str]]:
    with open(path / "rounds.csv", newline="") as f:
        return list(csv.DictReader(f))


def exchanges(path: Path, kind: str) -> list[dict[str, str]]:
    return [r for r in rows(path) if r["exchange"] == kind]


def roster_of(tmp_path: Path) -> Path:
    return tmp_path / "identities" / "roster.toml"


def run_id(path: Path) -> str:
    return str(json.loads((path / "config.json").read_text())["run-id"])


@pytest.fixture
def inputs(monkeypatch: pytest.MonkeyPatch) -> dict[int, np.ndarray]:
    return record_inputs(monkeypatch)


# --- the files -----------------------------------------------------------------------------------
def test_identities_are_private_and_the_roster_lists_their_public_keys(tmp_path: Path) -> None:
    keys, roster = silo_identity.make_federation(tmp_path, 3)
    assert [stat.S_IMODE(os.stat(k).st_mode) for k in keys] == [0o600] * 3
    entries = silo_identity.read_roster(roster)
    for i, key in enumerate(keys):
        private = silo_identity.read_identity(key)
        assert entries[i] == private.public_key().public_bytes_raw()
        message = b"bound to the partition"
        assert secagg.verify(entries[i], secagg.sign(private.private_bytes_raw(), message), message)
    # A second `make_federation` keeps the identities (a silo keeps its roster entry) and adds one.
    keys4, _ = silo_identity.make_federation(tmp_path, 4)
    assert {i: v for i, v in silo_identity.read_roster(roster).items() if i < 3} == entries
    assert len(silo_identity.read_roster(roster)) == 4 and keys4[:3] == keys


@pytest.mark.parametrize(
    ("content", "line"),
    [
        ("[silos\n", "is not TOML: "),
        ("[peers]\n0 = 'ab'\n", "expected one table [silos], got keys ['peers']"),
        ("[silos]\nzero = '00'\n", "[silos] key 'zero' is not a partition id"),
        ("[silos]\n0 = 'abcd'\n", "[silos] 0 = 'abcd' is not an Ed25519 public key (64 hex digits)"),
        ("[silos]\n", "[silos] names no silo"),
    ],
)
def test_a_malformed_roster_is_refused_in_one_line_naming_the_culprit(
    tmp_path: Path, content: str, line: str
) -> None:
    path = tmp_path / "roster.toml"
    path.write_text(content)
    with pytest.raises(silo_identity.IdentityError) as refused:
        silo_identity.read_roster(path)
    assert str(refused.value).startswith(f"roster file {path}") and line in str(refused.value)
    assert "\n" not in str(refused.value)


def test_an_identity_open_to_others_or_not_ed25519_or_not_in_the_roster_is_refused(tmp_path: Path) -> None:
    key = tmp_path / "identity.key"
    silo_identity.write_identity(key)
    os.chmod(key, 0o644)
    with pytest.raises(
        silo_identity.IdentityError, match=r"accessible to others \(mode 0644\): chmod 600 it"
    ):
        silo_identity.read_identity(key)
    other = tmp_path / "other.key"
    other.write_text("not a key")
    os.chmod(other, 0o600)
    with pytest.raises(silo_identity.IdentityError, match="is not an unencrypted PEM private key"):
        silo_identity.read_identity(other)
    _, roster = silo_identity.make_federation(tmp_path / "fed", 2)
    os.chmod(key, 0o600)
    with pytest.raises(silo_identity.IdentityError) as refused:
        silo_identity.load(str(key), str(roster), 1)
    assert str(refused.value).startswith(f"roster file {roster}: partition 1 has ") and str(key) in str(
        refused.value
    )
    with pytest.raises(silo_identity.IdentityError, match="'secagg-identity' needs 'secagg-roster' too"):
        client_side.silo_keys({"secagg-identity": str(key)}, 0)


def test_a_new_silo_enrols_with_the_identity_command_and_a_silo_host_checks_its_files(tmp_path: Path) -> None:
    """`hetfed federation identity` makes a silo's identity and its roster line; `federation silo`
    puts both in the node config after checking they agree for its partition (one line if not)."""
    from hetfed.federation import silo_host
    from tests.conftest import hetfed_cli

    key, roster = tmp_path / "silo-5.key", tmp_path / "roster.toml"
    made = hetfed_cli(
        "federation", "identity", "--key", str(key), "--partition-id", "5", "--roster", str(roster)
    )
    assert made.returncode == 0, made.stderr
    public = silo_identity.read_identity(key).public_key().public_bytes_raw()
    assert made.stdout.splitlines()[0] == f'5 = "{public.hex()}"'
    assert silo_identity.read_roster(roster) == {5: public} and stat.S_IMODE(os.stat(key).st_mode) == 0o600
    common = {"superlink": "127.0.0.1:9092", "ca": None, "key": None, "num_partitions": 6}
    command = silo_host(**common, partition_id=5, state_dir=tmp_path / "s", identity=key, roster=roster)
    assert f'secagg-identity="{key}" secagg-roster="{roster}"' in command.argv[-1]
    with pytest.raises(silo_identity.IdentityError, match=f"roster file {roster}: partition 4 has no entry"):
        silo_host(**common, partition_id=4, state_dir=tmp_path / "s", identity=key, roster=roster)
    with pytest.raises(ValueError, match="--identity and --roster go together"):
        silo_host(**common, partition_id=5, state_dir=tmp_path / "s", identity=key)


# --- honest runs ---------------------------------------------------------------------------------
def test_an_honest_run_with_rosters_equals_the_plain_run_and_records_authenticated_keys(
    tmp_path: Path,
) -> None:
    cfg = {"num-rounds": 2}
    plain = run(tmp_path, "plain", node_configs(4), **{**cfg, "secure-aggregation": False})
    signed = run(tmp_path, "signed", silos(tmp_path), **cfg)
    unsigned = run(tmp_path, "unsigned", node_configs(4), **cfg)
    with np.load(tmp_path / "plain" / "models.npz") as a, np.load(tmp_path / "signed" / "models.npz") as b:
        assert max(float(np.abs(a[k] - b[k]).max()) for k in a.files) <= 4 * STEP
    assert signed["aggregate"]["fed-relative-regret"] == pytest.approx(
        plain["aggregate"]["fed-relative-regret"], abs=1e-6
    )
    assert [r for r in rows(tmp_path / "signed") if r["status"] != "ok"] == []
    assert signed["privacy"]["secagg-authenticated-keys"] is True
    assert unsigned["privacy"]["secagg-authenticated-keys"] is False


def test_one_silo_without_a_roster_makes_the_run_unauthenticated_and_is_refused_by_the_others(
    tmp_path: Path,
) -> None:
    """Silo 3 has no identity: it sends unsigned keys, which every silo with a roster refuses."""
    configs = silos(tmp_path)
    del configs[3]["secagg-identity"], configs[3]["secagg-roster"]
    summary = run(tmp_path, "mixed", configs)
    failed = [r for r in exchanges(tmp_path / "mixed", "query.secagg_shares") if r["status"] == "failed"]
    assert {r["client"] for r in failed} == {"client-00", "client-01", "client-02"}
    assert all(
        "refused to share keys: peer 3's keys are not signed by its key in roster" in r["error"]
        for r in failed
    )
    assert summary["privacy"]["secagg-authenticated-keys"] is False


def test_a_peer_missing_from_the_roster_is_refused_by_name(tmp_path: Path) -> None:
    """Silos 0-2 hold a roster without partition 3 (silo 3 holds the full one): they refuse the round
    naming peer 3; silo 3 refuses nothing of its own and has no sum either."""
    configs = silos(tmp_path)
    partial = tmp_path / "partial.toml"
    silo_identity.write_roster(
        partial, {p: k for p, k in silo_identity.read_roster(roster_of(tmp_path)).items() if p < 3}
    )
    for cfg in configs[:3]:
        cfg["secagg-roster"] = str(partial)
    run(tmp_path, "partial", configs)
    shares = {r["client"]: r for r in exchanges(tmp_path / "partial", "query.secagg_shares")}
    line = f"refused to share keys: peer 3 is not in the roster {partial}"
    assert all(
        shares[f"client-0{i}"]["status"] == "failed" and line in shares[f"client-0{i}"]["error"]
        for i in range(3)
    )
    assert shares["client-03"]["status"] == "ok" and exchanges(tmp_path / "partial", "train") == []


# --- key substitution ------------------------------------------------------------------------------
class KeySubstitutingRound(SecureRound):
    """A server in the middle: every client is told the server's own share-encryption key for every
    peer; the server decrypts every share, re-encrypts it for its recipient (the round runs on as if
    honest) and, with all m - 1 >= t shares of each client's secrets, unmasks the victim (partition 0)."""

    recovered: ClassVar[list[np.ndarray]] = []

    def shares_request(self) -> dict[str, Any]:
        self.own_sk, own_pk = secagg.new_agreement_key()
        return {**super().shares_request(), "secagg-c-pk": [own_pk] * len(self.peers)}

    def _pair_key(self, a: int, b: int, public: bytes) -> bytes:
        return secagg.agree(
            self.own_sk, public, secagg.context(self.pool.run_id, self.round, "share-key", *sorted((a, b)))
        )

    def _exchange_shares(self) -> dict[int, dict[int, bytes]]:
        sent = super()._exchange_shares()
        self.stolen: dict[int, dict[int, bytes]] = {}  # owner -> point -> b share + s_sk share
        relayed: dict[int, dict[int, bytes]] = {}
        for sender, by_recipient in sent.items():
            for to, ciphertext in by_recipient.items():
                where = secagg.context(self.pool.run_id, self.round, "share", sender, to)
                payload = secagg.decrypt(
                    self._pair_key(sender, to, self.keys[sender]["c-pk"]), ciphertext, where
                )
                self.stolen.setdefault(sender, {})[self.peers.index(to) + 1] = payload
                relayed.setdefault(sender, {})[to] = secagg.encrypt(
                    self._pair_key(sender, to, self.keys[to]["c-pk"]), payload, where
                )
        return relayed

    def _unmask(
        self, masked: Mapping[int, np.ndarray], survivors: list[int], dropped: list[int]
    ) -> np.ndarray:
        victim = survivors[0]
        shares = dict(list(self.stolen[victim].items())[: self.t])
        b = secagg.combine({p: v[:32] for p, v in shares.items()})
        s_sk = secagg.combine({p: v[32:] for p, v in shares.items()})
        KeySubstitutingRound.recovered.append(unmask_one(self, masked[victim], victim, b, s_sk))
        return super()._unmask(masked, survivors, dropped)


def test_key_substitution_unmasks_a_client_without_a_roster_and_is_refused_by_every_client_with_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, inputs: dict[int, np.ndarray]
) -> None:
    monkeypatch.setattr(aggregation, "SecureRound", KeySubstitutingRound)
    KeySubstitutingRound.recovered = []
    run(tmp_path, "semi-honest", silos(tmp_path, roster=False))
    assert len(KeySubstitutingRound.recovered) == 1  # the attack is real: the victim's exact vector
    np.testing.assert_allclose(KeySubstitutingRound.recovered[0], inputs[0], rtol=0, atol=STEP / 2 + 1e-12)
    assert KeySubstitutingRound.recovered[0][-2] == pytest.approx(FEDAVG["n-train"], abs=STEP)

    inputs.clear()
    KeySubstitutingRound.recovered = []
    summary = run(tmp_path, "signed", silos(tmp_path))
    shares = exchanges(tmp_path / "signed", "query.secagg_shares")
    rid, roster = run_id(tmp_path / "signed"), roster_of(tmp_path)
    line = (  # partition 0 is the first participant each client checks (its own entry too)
        f"refused to share keys: peer 0's keys are not signed by its key in roster {roster} for run "
        f"{rid} round 1 (substituted by the server, or replayed from another run)"
    )
    assert all(r["status"] == "failed" and line in r["error"] for r in shares), shares
    assert len(shares) == 4 and not inputs and KeySubstitutingRound.recovered == []
    assert exchanges(tmp_path / "signed", "train") == [] and summary["status"] == "completed"


def test_the_shared_calibrations_secure_mean_is_signed_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """FedRSPO+'s shared calibration (round 0) runs on the same SecAgg+ round without
    secure-aggregation: key substitution recovers the victim's exact (lam0_j, lr0_j) from silos
    without a roster, and every silo with one refuses it (round 0's keys are signed) so the run
    fails in one line before any training round."""
    from hetfed.client.calibration import calibrate
    from hetfed.problems.knapsack import KnapsackParams, load_client

    monkeypatch.setattr(aggregation, "SecureRound", KeySubstitutingRound)
    cfg = {**FEDAVG, "strategy": "fedrspo", "loss": "rspo+", "personal-rounds": 0}
    cfg |= {"per-client-calibration": False, "results-dir": str(tmp_path)}
    KeySubstitutingRound.recovered = []
    run_inline({**cfg, "run-name": "semi-honest"}, silos(tmp_path, roster=False))
    own = calibrate(load_client(KnapsackParams(num_items=10, n_train=40, n_test=30), 42, 0), 0.01)
    (victim,) = KeySubstitutingRound.recovered  # [lam0, lr0, weight 1, within-clip 1] of partition 0
    step = 2.0**-secagg.MEAN_FRACTION_BITS
    np.testing.assert_allclose(victim, [own["lam0"], own["lr0"], 1.0, 1.0], rtol=0, atol=step)

    KeySubstitutingRound.recovered = []
    with pytest.raises(FederationError, match="shared calibration: the secure mean") as raised:
        run_inline({**cfg, "run-name": "signed"}, silos(tmp_path))
    assert "\n" not in str(raised.value)
    summary = json.loads((tmp_path / "signed" / "summary.json").read_text())
    shares = exchanges(tmp_path / "signed", "query.secagg_shares")
    assert len(shares) == 4 and all(r["status"] == "failed" for r in shares), shares
    assert all("refused to share keys: peer 0's keys are not signed" in r["error"] for r in shares)
    assert KeySubstitutingRound.recovered == [] and summary["status"] == "failed"
    assert "shared calibration: the secure mean" in summary["error"]
    assert exchanges(tmp_path / "signed", "train") == []


# --- split survivors' lists: both secrets of one client ----------------------------------------------
class SplitSigningRound(SecureRound):
    """A server that tells every client its own signing key for every peer, so it can sign any
    survivors' list in their name, and asks for both secrets of the victim (partition 0): group A is
    told the victim survived (its self-mask seed's shares), group B that it dropped (its mask key's)."""

    released: ClassVar[dict[str, set[int]]] = {}

    def shares_request(self) -> dict[str, Any]:
        self.own_sk, own_pk = secagg.new_signing_key()
        return {**super().shares_request(), "secagg-d-pk": [own_pk] * len(self.peers)}

    def _unmask(
        self, masked: Mapping[int, np.ndarray], survivors: list[int], dropped: list[int]
    ) -> np.ndarray:
        victim = survivors[0]
        without = [p for p in survivors if p != victim]
        for group, told, told_dropped, secret in (
            (survivors[:2], survivors, dropped, "b"),
            (survivors[2:], without, [*dropped, victim], "s"),
        ):
            self._query("query.secagg_check", group, {"secagg-survivors": told})
            statement = secagg.survivors_statement(self.pool.run_id, self.round, told)
            forged = {p: secagg.sign(self.own_sk, statement) for p in told}
            request = self.unmask_request(told, told_dropped, forged)
            for holder, record in self._query("query.secagg_unmask", group, request).items():
                if victim in secagg.items(record[f"{secret}-from"], int):
                    SplitSigningRound.released.setdefault(secret, set()).add(holder)
        return np.zeros(masked[victim].size, dtype=np.uint64)


def test_split_survivor_lists_get_both_secrets_released_without_a_roster_and_are_refused_with_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, inputs: dict[int, np.ndarray]
) -> None:
    """Without a roster the forged signatures pass and honest clients release shares of both of the
    victim's secrets (the threshold 2t > m still keeps each kind below t here); with one, the
    substituted signing keys are refused before any share leaves."""
    monkeypatch.setattr(aggregation, "SecureRound", SplitSigningRound)
    SplitSigningRound.released = {}
    run(tmp_path, "semi-honest", silos(tmp_path, roster=False))
    assert SplitSigningRound.released == {"b": {0, 1}, "s": {2, 3}}

    inputs.clear()
    SplitSigningRound.released = {}
    run(tmp_path, "signed", silos(tmp_path))
    shares = exchanges(tmp_path / "signed", "query.secagg_shares")
    assert len(shares) == 4 and all(
        r["status"] == "failed" and "keys are not signed by its key in roster" in r["error"] for r in shares
    )
    assert SplitSigningRound.released == {} and not inputs
    assert exchanges(tmp_path / "signed", "query.secagg_unmask") == []


class ForgedListRound(SecureRound):
    """A split view with the clients' real signing keys (substituting them is refused, above): each
    group gets its own list with the signatures the server holds, relabelled as signatures of it."""

    def _unmask(
        self, masked: Mapping[int, np.ndarray], survivors: list[int], dropped: list[int]
    ) -> np.ndarray:
        victim = survivors[0]
        told = {"a": survivors, "b": [p for p in survivors if p != victim]}
        groups = {"a": survivors[:2], "b": survivors[2:]}
        signed = {
            g: {
                p: secagg.one(r, "signature", bytes)
                for p, r in self._query(
                    "query.secagg_check", groups[g], {"secagg-survivors": told[g]}
                ).items()
            }
            for g in groups
        }
        everyone = signed["a"] | signed["b"]  # the other group's signatures, presented as on this list
        self._query("query.secagg_unmask", groups["a"], self.unmask_request(told["a"], dropped, everyone))
        self._query(
            "query.secagg_unmask", groups["b"], self.unmask_request(told["b"], [*dropped, victim], everyone)
        )
        return np.zeros(masked[victim].size, dtype=np.uint64)


def test_a_split_list_with_the_real_keys_gets_fewer_than_t_valid_signatures(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(aggregation, "SecureRound", ForgedListRound)
    run(tmp_path, "signed", silos(tmp_path))
    unmask = exchanges(tmp_path / "signed", "query.secagg_unmask")
    line = "refused to unmask: 2 valid signatures on the survivors' list, 3 needed"
    assert len(unmask) == 4 and all(r["status"] == "failed" and line in r["error"] for r in unmask), unmask


class DoubleSecretRound(SecureRound):
    """After the honest unmasking (every survivor's self-mask seed), the server asks the same clients
    for the victim's mask key too: the victim named dropped, on the list they signed and on the list
    without it (with the signatures it holds)."""

    released: ClassVar[list[int]] = []

    def unmask_request(
        self, survivors: list[int], dropped: list[int], signatures: Mapping[int, bytes]
    ) -> dict[str, Any]:
        self.signatures = dict(signatures)
        return super().unmask_request(survivors, dropped, signatures)

    def _unmask(
        self, masked: Mapping[int, np.ndarray], survivors: list[int], dropped: list[int]
    ) -> np.ndarray:
        total = super()._unmask(masked, survivors, dropped)
        victim = survivors[0]
        for told in (survivors, [p for p in survivors if p != victim]):
            request = self.unmask_request(told, [*dropped, victim], self.signatures)
            for holder, record in self._query("query.secagg_unmask", survivors, request).items():
                if victim in secagg.items(record["s-from"], int):
                    DoubleSecretRound.released.append(holder)
        return total


def test_a_request_for_the_second_secret_of_a_client_is_refused_by_every_client(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(aggregation, "SecureRound", DoubleSecretRound)
    DoubleSecretRound.released = []
    run(tmp_path, "signed", silos(tmp_path))
    unmask = exchanges(tmp_path / "signed", "query.secagg_unmask")
    assert len(unmask) == 12 and [r["status"] for r in unmask[:4]] == ["ok"] * 4  # the honest one
    lines = (
        "refused to unmask: clients [0] sent their masked input but are named as dropped",
        "refused to unmask: the survivors [1, 2, 3] are not the list this client signed [0, 1, 2, 3]",
    )
    for line, attempt in zip(lines, (unmask[4:8], unmask[8:]), strict=True):
        assert all(r["status"] == "failed" and line in r["error"] for r in attempt), attempt
    assert DoubleSecretRound.released == []


# --- replay ------------------------------------------------------------------------------------------
class ReplayingRound(SecureRound):
    """Round 2 forwards partition 0's keys and signature of round 1 (the server kept them)."""

    kept: ClassVar[dict[str, Any]] = {}

    def shares_request(self) -> dict[str, Any]:
        values = super().shares_request()
        if self.round == 1:
            ReplayingRound.kept = {k: list(v) for k, v in values.items() if isinstance(v, list)}
            return values
        for k in ("secagg-c-pk", "secagg-s-pk", "secagg-d-pk", "secagg-key-signatures"):
            values[k] = [ReplayingRound.kept[k][0], *values[k][1:]]
        return values


class RepeatedRound(SecureRound):
    """Round 2 runs again as round 1 (a resume redoes a served round): the first time it unmasks all
    four clients, the second time the server asks every client to sign the list without client 0,
    whose update the difference of the two sums would be."""

    def __init__(self, pool: Any, server_round: int, **kwargs: Any) -> None:
        super().__init__(pool, 1, **kwargs)
        self.again = server_round == 2

    def _unmask(self, masked: Any, survivors: list[int], dropped: list[int]) -> Any:
        if self.again:
            signatures = self._query("query.secagg_check", survivors[1:], {"secagg-survivors": survivors[1:]})
            RepeatedRound.signed_again = sorted(signatures)
        return super()._unmask(masked, survivors, dropped)

    signed_again: ClassVar[list[int]] = []


@pytest.mark.parametrize("roster", [False, True], ids=["semi-honest", "signed"])
def test_a_replayed_round_is_refused_by_every_client_with_a_roster(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, roster: bool
) -> None:
    monkeypatch.setattr(aggregation, "SecureRound", ReplayingRound)
    run(tmp_path, "keys", silos(tmp_path, roster=roster), **{"num-rounds": 2})
    replayed = [r for r in exchanges(tmp_path / "keys", "query.secagg_shares") if r["round"] == "2"]
    line = "refused to share keys: peer 0's keys were signed for round 1 of this run, not round 2 (replayed)"
    assert len(replayed) == 4
    if roster:
        assert all(r["status"] == "failed" and line in r["error"] for r in replayed), replayed
    else:  # today's clients take the replayed keys (and encrypt their shares for partition 0 to them)
        assert all(r["status"] == "ok" for r in replayed)

    monkeypatch.setattr(aggregation, "SecureRound", RepeatedRound)
    RepeatedRound.signed_again = []
    run(tmp_path, "round", silos(tmp_path, roster=roster), **{"num-rounds": 2})
    keys = exchanges(tmp_path / "round", "query.secagg_keys")
    assert len(keys) == 8 and all(r["status"] == "ok" for r in keys)  # a redone round is served
    checks = exchanges(tmp_path / "round", "query.secagg_check")
    other = [r for r in checks if r["status"] == "failed"]
    line = (
        "refused to sign survivors [1, 2, 3]: this client signed [0, 1, 2, 3] for round 1 of this run "
        "before (a redone round unmasks the same clients)"
    )
    assert len(other) == 3 and all(line in r["error"] for r in other), other
    assert RepeatedRound.signed_again == []  # no signature on the other list
    server = [r for r in exchanges(tmp_path / "round", "round") if r["client"] == "server"]
    assert [r["clients-used"] for r in server] == ["4", "4"]  # the redo, with the same four, sums


# --- a real local federation ---------------------------------------------------------------------------
@pytest.mark.deployment
def test_federation_up_installs_identities_and_a_secure_run_records_authenticated_keys(
    tmp_path: Path,
) -> None:
    """`federation up` makes an identity per silo and one roster, names them in every node config; a
    secure run on the real SuperNodes signs and verifies every round's keys and says so in its summary,
    and its model equals the plain inline run's within the fixed-point resolution."""
    from hetfed.engines.runner import prepare
    from hetfed.federation import federation_down, federation_up
    from tests.conftest import REPO

    cfg = {**FEDAVG, **SECURE, "num-rounds": 2, "seed": 2, "round-timeout": 300.0}
    info = federation_up(tmp_path / "fed", 3, app_dir=REPO)
    try:
        roster = silo_identity.read_roster(info.root / "identities" / "roster.toml")
        for i in range(3):
            key = silo_identity.read_identity(info.root / "identities" / f"silo-{i}.key")
            assert roster[i] == key.public_key().public_bytes_raw()
        flower = info.flower()
        run_id = flower.submit(REPO, prepare({**cfg, "run-name": "signed"}, "deployment", tmp_path))
        assert flower.wait_run(run_id, timeout=900) == "finished:completed"
    finally:
        federation_down(info.root)
    summary = json.loads((tmp_path / "signed" / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["privacy"]["secagg-authenticated-keys"] is True
    assert [r for r in rows(tmp_path / "signed") if r["status"] != "ok"] == []
    assert {r["exchange"] for r in rows(tmp_path / "signed")} >= {
        "query.secagg_shares",
        "query.secagg_unmask",
    }
    plain = {**cfg, "secure-aggregation": False, "results-dir": str(tmp_path), "run-name": "plain"}
    run_inline(plain, node_configs(3))
    with np.load(tmp_path / "plain" / "models.npz") as a, np.load(tmp_path / "signed" / "models.npz") as b:
        assert max(float(np.abs(a[k] - b[k]).max()) for k in a.files) <= 3 * STEP
