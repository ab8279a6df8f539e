"""The server's side of secure aggregation: SecAgg+ (Bell et al., CCS 2020) over the complete graph.

One summed round runs five exchanges with the round's participants U1 (the clients the strategy
sent a train message), each shrinking the set to those that answered (client/secure_aggregation.py
holds the other side and docs/algorithms.md "Secure aggregation" the maths):

1. ``query.secagg_keys`` -> U2: each client's public keys (c: shares, s: masks, d: signatures),
   signed by its silo's identity when it has a roster (hetfed/silo_identity.py);
2. ``query.secagg_shares`` (U2's keys and their signatures, which a client with a roster verifies)
   -> U3: Shamir shares, threshold t, of each client's self-mask seed b_i and mask key s_sk_i,
   encrypted for each other client;
3. ``train`` (the strategy's message, plus the shares addressed to the client) -> U4: masked inputs
   y_i = q([a_i x_i, a_i, c_i]) + PRG(b_i) + sum_{j in U3, j != i} +-PRG(s_ij);
4. ``query.secagg_check`` (U4) -> U5: each survivor's signature of the list U4;
5. ``query.secagg_unmask`` (U4, U3 minus U4, t signatures) -> shares of b_i for i in U4 and of
   s_sk_j for j in U3 minus U4, from which

       sum_{i in U4} q(v_i) = sum_i y_i - sum_{i in U4} PRG(b_i) - sum_{j dropped} sum_{i in U4} +-PRG(s_ij).

A set below the threshold t fails the round with one line (the strategy's rule for a round
without usable replies applies). The server holds the masked inputs and the sum, never a client's
value: y_i is uniformly distributed whatever x_i while b_i stays secret, and b_i is reconstructed
only for clients whose y_i is already in the sum.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from flwr.app import ConfigRecord, Message, RecordDict

from hetfed import secagg
from hetfed.records import to_numpy
from hetfed.server.pool import ClientPool, with_config

MASKED = "masked"  # the masked reply's ArrayRecord (client/secure_aggregation.py)


@dataclass(frozen=True)
class Unmasked:
    """What a secure round gives the server: sum_{i in U4} v_i (decoded) and who is in it."""

    total: np.ndarray
    survivors: list[int]
    dropped: list[int]


class BelowThreshold(RuntimeError):
    """Fewer clients than the threshold remain at some exchange: the round has no sum."""


def threshold_for(requested: int, participants: int, corrupt: int) -> int:
    """t: the requested one, or (0) the smallest every client accepts, 2t > m + c (smallest_threshold)."""
    return requested or secagg.smallest_threshold(participants, corrupt)


@dataclass(frozen=True)
class FixedPointCode:
    """The round's fixed-point code (hetfed/secagg.py): ``bits`` within +-``bound``, weights up to
    ``max_weight``; every client checks it against the participants before it shares a key."""

    bits: int
    bound: float
    max_weight: float

    @property
    def step(self) -> float:
        return secagg.step_of(self.bound, self.bits)

    def declared(self) -> dict[str, Any]:
        """What the shares query declares of it (client/secure_aggregation.py checks it)."""
        return {"secagg-bits": self.bits, "secagg-range": self.bound, "secagg-max-weight": self.max_weight}


class SecureRound:
    """The five exchanges of one summed round (see the module docs)."""

    def __init__(
        self,
        pool: ClientPool,
        server_round: int,
        *,
        threshold: int,
        code: FixedPointCode,
        log: Callable[[str], None],
    ):
        self.pool, self.round, self.t, self.code, self.log = pool, server_round, threshold, code, log
        self.keys: dict[int, dict[str, bytes]] = {}
        self.key_signatures: dict[int, bytes] = {}  # by partition: its identity's signature of its keys
        self.authenticated = False  # whether every client that sent keys verifies its peers' (a roster)
        self.peers: list[int] = []

    def run(self, train: list[Message], size: int) -> tuple[list[Message], Unmasked]:
        """Send ``train`` inside the protocol; the train replies (masked, metrics in clear) and the sum
        of the survivors' vectors of ``size`` entries. BelowThreshold when a stage leaves < t."""
        by_pid = {self.pool.partition_to(m): m for m in train}
        self._require(len(by_pid), "participants")
        self.keys = self._exchange_keys(sorted(by_pid))
        shares = self._exchange_shares()
        senders = sorted(shares)  # U3: who sent shares (every one of them holds shares of the others)
        replies = self.pool.send(
            [self._train_message(by_pid[p], p, shares, senders) for p in senders], self.round
        )
        masked: dict[int, np.ndarray] = {}
        for reply in replies:
            pid = self.pool.partition_of(reply)
            y = _masked(reply.content, size)
            if y is None:
                self.pool.reject(reply, f"the masked input is not {size} uint64 words")
            else:
                masked[pid] = y
        survivors = sorted(masked)
        self._require(len(survivors), "masked inputs")
        dropped = sorted(set(senders) - set(survivors))
        total = self._unmask(masked, survivors, dropped)
        return [r for r in replies if self.pool.partition_of(r) in masked], Unmasked(
            secagg.decode(total, self.code.step), survivors, dropped
        )

    def _require(self, n: int, what: str) -> None:
        if n < self.t:
            raise BelowThreshold(
                f"round {self.round}: secure aggregation needs {self.t} clients (secagg-threshold), "
                f"only {n} {what}; the round has no sum"
            )

    def _query(self, kind: str, pids: list[int], values: Mapping[str, Any]) -> dict[int, ConfigRecord]:
        """Send one stage's config to ``pids``; their ``secagg`` records by partition."""
        config = ConfigRecord({"secagg-round": self.round, **values})
        msgs = [self.pool.message(p, kind, RecordDict({"config": config}), self.round) for p in pids]
        out = {}
        for reply in self.pool.send_aside(msgs, self.round):
            record = reply.content.config_records.get("secagg")
            if record is not None:
                out[self.pool.partition_of_aside(reply)] = record
        return out

    def _exchange_keys(self, pids: list[int]) -> dict[int, dict[str, bytes]]:
        got = self._query("query.secagg_keys", pids, {})
        keys = {p: {k: secagg.one(r, k, bytes) for k in ("c-pk", "s-pk", "d-pk")} for p, r in got.items()}
        self._require(len(keys), "sent keys")
        self.key_signatures = {
            p: secagg.one(r, "signature", bytes) for p, r in got.items() if "signature" in r
        }
        self.authenticated = all(r.get("authenticated") is True for r in got.values())
        return keys

    def _exchange_shares(self) -> dict[int, dict[int, bytes]]:
        """sender -> recipient -> ciphertext."""
        self.peers = sorted(self.keys)
        out = {}
        for pid, record in self._query("query.secagg_shares", self.peers, self.shares_request()).items():
            to, ciphertexts = secagg.items(record["to"], int), secagg.items(record["ciphertexts"], bytes)
            if sorted(to) == [p for p in self.peers if p != pid]:
                out[pid] = dict(zip(to, ciphertexts, strict=True))
        self._require(len(out), "sent shares")
        return out

    def shares_request(self) -> dict[str, Any]:
        """What the shares exchange sends: the participants, t, the code, and every participant's keys
        with their signatures (a test's dishonest server changes this)."""
        return {
            "secagg-peers": self.peers,
            "secagg-threshold": self.t,
            **self.code.declared(),
            **{f"secagg-{k}": [self.keys[p][k] for p in self.peers] for k in ("c-pk", "s-pk", "d-pk")},
            "secagg-key-signatures": [self.key_signatures.get(p, b"") for p in self.peers],
        }

    def _train_message(
        self, msg: Message, pid: int, shares: Mapping[int, Mapping[int, bytes]], senders: list[int]
    ) -> Message:
        """The strategy's message with the shares for ``pid`` and the round's protocol values."""
        incoming = [s for s in senders if s != pid]
        shares_in = ConfigRecord({"from": incoming, "ciphertexts": [shares[s][pid] for s in incoming]})
        return with_config(msg, {"secagg-round": self.round}, secagg=shares_in)

    def _unmask(
        self, masked: Mapping[int, np.ndarray], survivors: list[int], dropped: list[int]
    ) -> np.ndarray:
        signatures = {
            p: secagg.one(r, "signature", bytes)
            for p, r in self._query("query.secagg_check", survivors, {"secagg-survivors": survivors}).items()
        }
        self._require(len(signatures), "signed the survivors' list")
        signers = sorted(signatures)
        values = self.unmask_request(survivors, dropped, signatures)
        b_shares: dict[int, dict[int, bytes]] = {}  # owner -> point -> share
        s_shares: dict[int, dict[int, bytes]] = {}
        for holder, record in self._query("query.secagg_unmask", signers, values).items():
            point = self.peers.index(holder) + 1
            for key, into in (("b", b_shares), ("s", s_shares)):
                owners, shares = (
                    secagg.items(record[f"{key}-from"], int),
                    secagg.items(record[f"{key}-shares"], bytes),
                )
                for owner, share in zip(owners, shares, strict=True):
                    into.setdefault(owner, {})[point] = share
        size = next(iter(masked.values())).size
        total = np.zeros(size, dtype=np.uint64)
        for y in masked.values():
            total = secagg.add(total, y)
        for i in survivors:
            total = secagg.subtract(total, secagg.mask(self._recover(b_shares, i, "self-mask seed"), size))
        run_id = self.pool.run_id
        for j in dropped:
            s_sk = self._recover(s_shares, j, "mask key")
            for i in survivors:
                seed = secagg.agree(
                    s_sk, self.keys[i]["s-pk"], secagg.context(run_id, self.round, "mask", *sorted((i, j)))
                )
                total = secagg.subtract(total, secagg.signed_pair_mask(i, j, seed, size))
        return total

    def unmask_request(
        self, survivors: list[int], dropped: list[int], signatures: Mapping[int, bytes]
    ) -> dict[str, Any]:
        """What the unmasking exchange asks: b-shares of ``survivors``, s_sk-shares of ``dropped``,
        with the survivors' signatures of that list (a test's dishonest server changes this)."""
        signers = sorted(signatures)
        return {
            "secagg-survivors": survivors,
            "secagg-dropped": dropped,
            "secagg-signers": signers,
            "secagg-signatures": [signatures[p] for p in signers],
        }

    def _recover(self, shares: Mapping[int, Mapping[int, bytes]], owner: int, what: str) -> bytes:
        got = dict(list(shares.get(owner, {}).items())[: self.t])
        if len(got) < self.t:
            raise BelowThreshold(
                f"round {self.round}: only {len(got)} shares of {self.pool.who(owner)}'s {what}, "
                f"{self.t} needed; the round has no sum"
            )
        return secagg.combine(got)


def _masked(content: RecordDict, size: int) -> np.ndarray | None:
    record = content.array_records.get(MASKED)
    if record is None:
        return None
    try:
        arrays = to_numpy(record)
    except (TypeError, ValueError):
        return None
    y = arrays.get("y")
    if y is None or list(arrays) != ["y"] or y.dtype != np.uint64 or y.shape != (size,):
        return None
    return y
