"""The client's side of a summed round: its contribution, clipped and noised for DP, and masked for
secure aggregation (docs/algorithms.md "Secure aggregation", "Differential privacy").

A round whose replies the server only sums (server/aggregation.py) says so in the train message:
``sum-weight`` (a number, or the name of the reply metric that is the weight, e.g. ``num-examples``),
``dp-clip`` and ``dp-local-noise``, and with secure aggregation the encrypted shares sent to this
client. The client's contribution is

    x = reply - sent   (per array the reply shares with the instruction; the reply itself otherwise),

clipped to ||x||_2 <= dp-clip (DP), plus N(0, (dp-local-noise dp-clip)^2 I) (local DP). Without
secure aggregation the reply carries ``sent + x`` in clear (with DP, and the metric ``dp-within``
= 1{||x|| <= clip}). With it the reply carries only

    y = q([a x, a, 1{||x|| <= clip}]) + PRG(b) + sum_{j != i} +-PRG(s_ij)   (mod 2^64)

Under local DP the within-clip bit is sent neither way: it is not noised, and the server, which local
DP does not trust, would learn from it whether this silo's update was within the clip.

and the exchanges around the train message run the rest of SecAgg+ (Bell et al. 2020) with this
client's secrets in the SuperNode's memory (``context.state``), never on disk:

- ``query.secagg_keys``: two X25519 key pairs (shares' encryption c, masks s), one Ed25519 pair;
  a silo with a roster (node config ``secagg-identity`` / ``secagg-roster``, hetfed/silo_identity.py)
  signs them with its identity, bound to the run, the round and its partition;
- ``query.secagg_shares``: Shamir shares (threshold t) of the self-mask seed b and of s_sk, one
  per other participant, each encrypted for it; a silo with a roster first verifies every
  participant's keys against the roster (a substituted or replayed key is refused, naming the peer),
  which authenticates d-pk and so the survivors' signatures below;
- ``train``: the shares addressed to this client arrive; it trains and replies y;
- ``query.secagg_check``: it signs the list of clients whose y the server holds (once a round; a
  round redone after a resume only with the list it signed the first time);
- ``query.secagg_unmask``: for a client in the signed list, its share of b; for a client that
  dropped out, its share of s_sk; never both, and only with t signatures on that same list.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from logging import WARNING
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, ConfigRecordValues, Context, RecordDict
from flwr.common.logger import log

from hetfed import secagg, silo_identity
from hetfed.client.refusal import Refusal
from hetfed.records import to_numpy, to_record

STATE = "secagg"  # the ConfigRecord of context.state holding this round's secrets
PINNED = "secagg-signed"  # ... and the survivors' lists it signed, by round, for the run (_pin_survivors)
MASKED = "masked"  # the reply's ArrayRecord of masked words (uint64)


class Refused(secagg.SecAggError, Refusal):
    """The server asked for something the protocol forbids (an unmasking that would reveal a value)."""


# --- the contribution -----------------------------------------------------------------------
def privatized(
    x: Mapping[str, np.ndarray], clip: float, local_noise: float, rng: np.random.Generator
) -> tuple[dict[str, np.ndarray], bool]:
    """(x clipped to L2 norm ``clip`` over all arrays, plus N(0, (local_noise clip)^2) per entry;
    whether x was within the clip). ``clip`` = 0: x unchanged."""
    if clip <= 0:
        return dict(x), True
    norm = float(np.sqrt(sum(float(np.sum(v * v)) for v in x.values())))
    scale = min(1.0, clip / norm) if norm > 0 else 1.0
    out = {k: v * scale for k, v in x.items()}
    if local_noise > 0:
        out = {k: v + rng.normal(0.0, local_noise * clip, size=v.shape) for k, v in out.items()}
    return out, norm <= clip


def finish_reply(
    sent: RecordDict, reply: RecordDict, config: Mapping[str, Any], context: Context
) -> RecordDict:
    """The reply of a summed round: clipped/noised in clear, or masked (see the module docs)."""
    arrays = reply.array_records.get("arrays")
    if arrays is None:
        raise secagg.SecAggError("a summed round's reply carries no arrays")
    received = to_numpy(arrays)
    reference = to_numpy(sent.array_records["arrays"]) if "arrays" in sent.array_records else {}
    x = secagg.contribution(reference, received)
    if not all(np.all(np.isfinite(v)) for v in x.values()):
        raise secagg.SecAggError("the update contains NaN or Inf; it is not sent")
    rng = np.random.default_rng()  # noise must not be reproducible by anyone else: fresh entropy
    local_noise = float(config.get("dp-local-noise", 0.0))
    x, within = privatized(x, float(config.get("dp-clip", 0.0)), local_noise, rng)
    bit = [] if local_noise > 0 else [float(within)]  # local DP: no un-noised bit (module docs)
    if "secagg-step" not in config:  # in clear: the clipped (noised) update, as the model it gives
        model = {
            k: reference[k] + v if k in reference and reference[k].shape == v.shape else v
            for k, v in x.items()
        }
        reply["arrays"] = to_record({k: v.astype(received[k].dtype) for k, v in model.items()})
        if "metrics" in reply.metric_records and float(config.get("dp-clip", 0.0)) > 0 and bit:
            reply.metric_records["metrics"]["dp-within"] = int(within)
        return reply
    state = _state(context, str(config.get("run-id", "")), secagg.one(config, "secagg-round", int))
    if state.get("sent-masked"):
        # The same masks on a second input: the difference of the two replies would be in clear.
        raise Refused("refused: this client sent its masked input of this round already")
    bits, bound, max_weight = (float(v) for v in secagg.items(state["code"], float))
    a = _weight(reply, config["sum-weight"])
    if not 0 <= a <= max_weight:  # beyond it the sum of the codes could wrap (checked at the shares)
        raise Refused(f"refused: this client's weight {a:g} is outside 0..{max_weight:g} (secagg-max-weight)")
    flat = np.concatenate([x[k].ravel() for k in sorted(x)])
    clipped = int(np.count_nonzero(np.abs(flat) > bound))
    vector = np.concatenate([a * np.clip(flat, -bound, bound), [a, *bit]])
    y = _masked_input(vector, secagg.step_of(bound, int(bits)), state, context)
    out = RecordDict({k: v for k, v in reply.items() if k != "arrays"})
    if "metrics" in out.metric_records:
        out.metric_records["metrics"]["secagg-clipped"] = clipped
    out[MASKED] = ArrayRecord({"y": Array(np.ascontiguousarray(y, dtype=np.uint64))})
    return out


def _weight(reply: RecordDict, weight: Any) -> float:
    """a: the number, or the reply metric it names (e.g. ``num-examples``)."""
    if not isinstance(weight, str):
        return float(weight)
    value = reply.metric_records["metrics"][weight] if "metrics" in reply.metric_records else None
    if not isinstance(value, int | float):
        raise secagg.SecAggError(f"the weight {weight!r} is not a number among the reply's metrics")
    return float(value)


# --- the exchanges ---------------------------------------------------------------------------
def handle(kind: str, config: Mapping[str, ConfigRecordValues], context: Context, pid: int) -> RecordDict:
    """Serve one of the protocol's queries (``query.secagg_*``) for partition ``pid``."""
    run_id, rnd = str(config.get("run-id", "")), secagg.one(config, "secagg-round", int)
    silo = silo_keys(context.node_config, pid)
    if kind == "query.secagg_keys":
        return _keys(context, run_id, rnd, pid, silo)
    state = _state(context, run_id, rnd)
    if kind == "query.secagg_shares":
        if silo is not None:
            _verify_peers(silo, config, run_id, rnd)
        return _shares(state, config, context, pid)
    if kind == "query.secagg_check":
        return _check(state, config, context, pid)
    if kind == "query.secagg_unmask":
        return _unmask(state, config, pid)
    raise secagg.SecAggError(f"unknown secure-aggregation exchange {kind!r}")


def silo_keys(node: Mapping[str, Any], pid: int) -> silo_identity.SiloKeys | None:
    """This silo's identity and roster (node config ``secagg-identity`` and ``secagg-roster``, both or
    neither); None without them: keys unauthenticated, the server trusted to forward them (logged once)."""
    identity, roster = str(node.get("secagg-identity", "") or ""), str(node.get("secagg-roster", "") or "")
    if bool(identity) != bool(roster):
        given, missing = (
            ("secagg-identity", "secagg-roster") if identity else ("secagg-roster", "secagg-identity")
        )
        raise silo_identity.IdentityError(f"node config {given!r} needs {missing!r} too (signed keys)")
    if not roster:
        _semi_honest_notice()
        return None
    return silo_identity.load(identity, roster, pid)


@functools.cache
def _semi_honest_notice() -> None:
    log(
        WARNING,
        "secure aggregation without a roster (node config 'secagg-roster'): this silo's peers' keys are "
        "not authenticated, a server that substitutes keys can unmask it (semi-honest server assumed)",
    )


def _keys(
    context: Context, run_id: str, rnd: int, pid: int, silo: silo_identity.SiloKeys | None
) -> RecordDict:
    c_sk, c_pk = secagg.new_agreement_key()
    s_sk, s_pk = secagg.new_agreement_key()
    d_sk, d_pk = secagg.new_signing_key()
    # A new round replaces the last one's secrets: they are never needed again.
    context.state[STATE] = ConfigRecord(
        {"run-id": run_id, "round": rnd, "pid": pid, "c-sk": c_sk, "s-sk": s_sk, "d-sk": d_sk}
    )
    reply: dict[str, Any] = {"c-pk": c_pk, "s-pk": s_pk, "d-pk": d_pk, "authenticated": silo is not None}
    if silo is not None:
        reply["signature"] = secagg.sign(
            silo.private, secagg.keys_statement(run_id, rnd, pid, c_pk, s_pk, d_pk)
        )
    return RecordDict({"secagg": ConfigRecord(reply)})


def _verify_peers(silo: silo_identity.SiloKeys, config: Mapping[str, Any], run_id: str, rnd: int) -> None:
    """Refuse (one line naming the peer) unless every participant's keys carry its roster key's
    signature for this run, this round and its partition."""
    peers = secagg.items(config["secagg-peers"], int)
    keys = [secagg.items(config[f"secagg-{k}"], bytes) for k in ("c-pk", "s-pk", "d-pk")]
    signatures = secagg.items(config.get("secagg-key-signatures", []), bytes)
    if len(signatures) != len(peers) or any(len(k) != len(peers) for k in keys):
        raise Refused(
            "refused to share keys: the round does not forward a signature with every participant's keys"
        )
    for peer, c_pk, s_pk, d_pk, signature in zip(peers, *keys, signatures, strict=True):
        if peer not in silo.roster:
            raise Refused(f"refused to share keys: peer {peer} is not in the roster {silo.roster_path}")
        # This round, else the earlier round it was signed for (a replay); None: neither. Round 0 has
        # a secure round too (FedRSPO+'s shared calibration).
        signed = next(
            (
                r
                for r in range(rnd, -1, -1)
                if secagg.verify(
                    silo.roster[peer], signature, secagg.keys_statement(run_id, r, peer, c_pk, s_pk, d_pk)
                )
            ),
            None,
        )
        if signed == rnd:
            continue
        if signed is not None:
            raise Refused(
                f"refused to share keys: peer {peer}'s keys were signed for round {signed} of this run, "
                f"not round {rnd} (replayed)"
            )
        raise Refused(
            f"refused to share keys: peer {peer}'s keys are not signed by its key in roster "
            f"{silo.roster_path} for run {run_id} round {rnd} (substituted by the server, or replayed "
            "from another run)"
        )


def _state(context: Context, run_id: str, rnd: int) -> ConfigRecord:
    state = context.state.config_records.get(STATE)
    if state is None or state.get("run-id") != run_id or state.get("round") != rnd:
        raise secagg.SecAggError(
            f"no secure-aggregation keys of round {rnd} on this client (a restarted SuperNode drops out "
            "of the round)"
        )
    return state


def _shares(state: ConfigRecord, config: Mapping[str, Any], context: Context, pid: int) -> RecordDict:
    """Shamir shares of b and s_sk for every participant, each encrypted for its recipient; refused
    (before any share leaves) for a threshold or a fixed-point code this client cannot accept."""
    peers, t = secagg.items(config["secagg-peers"], int), secagg.one(config, "secagg-threshold", int)
    if pid not in peers or len(set(peers)) != len(peers):
        raise Refused(f"refused: participants {peers} do not name this client ({pid}) once each")
    # The run's declared tolerance, from the run config the operator started (not from the message).
    corrupt = int(context.run_config.get("secagg-tolerated-corrupt", 0))
    if problem := secagg.threshold_problem(t, len(peers), corrupt):
        raise Refused(f"refused to share keys: {problem}")
    code = _code_settings(config)
    if problem := secagg.code_problem(len(peers), *code):
        raise Refused(f"refused to share keys: {problem}")
    c_pk = dict(zip(peers, secagg.items(config["secagg-c-pk"], bytes), strict=True))
    run_id, rnd = str(state["run-id"]), secagg.one(state, "round", int)
    b = os.urandom(secagg.SECRET_BYTES)
    b_shares = secagg.split(b, t, len(peers))
    s_shares = secagg.split(secagg.one(state, "s-sk", bytes), t, len(peers))
    to, ciphertexts = [], []
    for index, peer in enumerate(peers):
        if peer == pid:
            continue
        key = secagg.agree(
            secagg.one(state, "c-sk", bytes),
            c_pk[peer],
            secagg.context(run_id, rnd, "share-key", *sorted((pid, peer))),
        )
        payload = b_shares[index] + s_shares[index]
        to.append(peer)
        ciphertexts.append(secagg.encrypt(key, payload, secagg.context(run_id, rnd, "share", pid, peer)))
    own = peers.index(pid)
    state.update(
        {
            "b": b,
            "threshold": t,
            "peers": peers,
            "s-pk": secagg.items(config["secagg-s-pk"], bytes),
            "d-pk": secagg.items(config["secagg-d-pk"], bytes),
            "c-pk": secagg.items(config["secagg-c-pk"], bytes),
            # The code this client checked: its train reply is encoded with these, not the train
            # message's (which could differ).
            "code": [float(v) for v in code],
            "held-from": [pid],  # whose shares this client holds: its own first
            "held-b": [b_shares[own]],
            "held-s": [s_shares[own]],
        }
    )
    context.state[STATE] = state
    return RecordDict({"secagg": ConfigRecord({"to": to, "ciphertexts": ciphertexts})})


def _code_settings(config: Mapping[str, Any]) -> tuple[int, float, float]:
    """(bits, range, weight bound) of the round's fixed-point code, as the shares query declares them."""
    bits, bound = secagg.one(config, "secagg-bits", int), config.get("secagg-range")
    weight = config.get("secagg-max-weight")
    if not all(isinstance(v, int | float) and not isinstance(v, bool) and v > 0 for v in (bound, weight)):
        raise Refused(
            "refused to share keys: the round declares no positive secagg-range and secagg-max-weight"
        )
    if not 8 <= bits <= 62:
        raise Refused(f"refused to share keys: secagg-bits {bits} is not within 8..62")
    return bits, float(bound), float(weight)  # type: ignore[arg-type]


def receive_shares(content: RecordDict, context: Context, config: Mapping[str, Any], pid: int) -> None:
    """Decrypt and keep the shares the train message brings (from every peer that sent shares)."""
    state = _state(context, str(config.get("run-id", "")), secagg.one(config, "secagg-round", int))
    record = content.config_records["secagg"]
    senders, ciphertexts = secagg.items(record["from"], int), secagg.items(record["ciphertexts"], bytes)
    peers = secagg.items(state["peers"], int)
    c_pk = dict(zip(peers, secagg.items(state["c-pk"], bytes), strict=True))
    run_id, rnd = str(state["run-id"]), secagg.one(state, "round", int)
    held_from, held_b, held_s = (
        [pid],
        list(secagg.items(state["held-b"], bytes))[:1],
        list(secagg.items(state["held-s"], bytes))[:1],
    )
    for sender, ciphertext in zip(senders, ciphertexts, strict=True):
        if sender not in c_pk or sender == pid:
            raise Refused(f"refused: a share from {sender}, who is not a peer of this round")
        key = secagg.agree(
            secagg.one(state, "c-sk", bytes),
            c_pk[sender],
            secagg.context(run_id, rnd, "share-key", *sorted((pid, sender))),
        )
        payload = secagg.decrypt(key, ciphertext, secagg.context(run_id, rnd, "share", sender, pid))
        held_from.append(sender)
        held_b.append(payload[:32])
        held_s.append(payload[32:])
    state.update({"held-from": held_from, "held-b": held_b, "held-s": held_s})
    context.state[STATE] = state


def _masked_input(vector: np.ndarray, step: float, state: ConfigRecord, context: Context) -> np.ndarray:
    """y = q(vector) + PRG(b) + sum over the peers that sent shares of +-PRG(s_ij) (mod 2^64)."""
    pid = secagg.one(state, "pid", int)
    run_id, rnd = str(state["run-id"]), secagg.one(state, "round", int)
    peers = secagg.items(state["peers"], int)
    s_pk = dict(zip(peers, secagg.items(state["s-pk"], bytes), strict=True))
    y = secagg.add(
        secagg.encode(vector, step),
        secagg.mask(secagg.one(state, "b", bytes), vector.size),
    )
    for peer in secagg.items(state["held-from"], int)[1:]:
        seed = secagg.agree(
            secagg.one(state, "s-sk", bytes),
            s_pk[peer],
            secagg.context(run_id, rnd, "mask", *sorted((pid, peer))),
        )
        y = secagg.add(y, secagg.signed_pair_mask(pid, peer, seed, vector.size))
    state["sent-masked"] = True
    context.state[STATE] = state
    return y


def _check(state: ConfigRecord, config: Mapping[str, Any], context: Context, pid: int) -> RecordDict:
    """Sign the survivors' list, once a round, if this client is on it and it is large enough."""
    survivors = sorted(secagg.items(config["secagg-survivors"], int))
    held = set(secagg.items(state.get("held-from", []), int))
    t = secagg.one(state, "threshold", int)
    if not state.get("sent-masked") or pid not in survivors:
        raise Refused("refused to sign: this client sent no masked input this round")
    if not set(survivors) <= held or len(survivors) < t:
        raise Refused(f"refused to sign survivors {survivors}: fewer than {t} or not all of them shared keys")
    if "signed" in state and sorted(secagg.items(state["signed"], int)) != survivors:
        raise Refused(
            f"refused to sign survivors {survivors}: this client signed {secagg.items(state['signed'], int)}"
        )
    _pin_survivors(context, str(state["run-id"]), secagg.one(state, "round", int), survivors)
    state["signed"] = survivors
    context.state[STATE] = state
    statement = secagg.survivors_statement(str(state["run-id"]), secagg.one(state, "round", int), survivors)
    return RecordDict(
        {"secagg": ConfigRecord({"signature": secagg.sign(secagg.one(state, "d-sk", bytes), statement)})}
    )


def _pin_survivors(context: Context, run_id: str, rnd: int, survivors: list[int]) -> None:
    """A round of a run unmasks one set of clients, however often it runs: a resume redoes a round the
    silos served, which is allowed, but a redo that unmasked another set would give the server two sums
    of the same round over sets that differ by one client, and their difference is that client's
    update. The lists this client signed stay in the SuperNode's memory for the run (PINNED)."""
    pinned = context.state.config_records.get(PINNED)
    if pinned is None or pinned.get("run-id") != run_id:
        pinned = ConfigRecord({"run-id": run_id})
    before = pinned.get(str(rnd))
    if before is not None and sorted(secagg.items(before, int)) != survivors:
        raise Refused(
            f"refused to sign survivors {survivors}: this client signed {sorted(secagg.items(before, int))} "
            f"for round {rnd} of this run before (a redone round unmasks the same clients)"
        )
    pinned[str(rnd)] = survivors
    context.state[PINNED] = pinned


def _unmask(state: ConfigRecord, config: Mapping[str, Any], pid: int) -> RecordDict:
    """Shares of b for the survivors, of s_sk for the dropped; refused unless t peers signed the
    same survivors' list this client signed, and nobody on it is asked as dropped."""
    if "signed" not in state:
        raise Refused("refused to unmask: this client signed no survivors' list this round")
    survivors, dropped = (
        sorted(secagg.items(config["secagg-survivors"], int)),
        sorted(secagg.items(config["secagg-dropped"], int)),
    )
    signed = sorted(secagg.items(state["signed"], int))
    if survivors != signed:
        raise Refused(
            f"refused to unmask: the survivors {survivors} are not the list this client signed {signed}"
        )
    if wrong := sorted(set(dropped) & set(signed)):
        raise Refused(f"refused to unmask: clients {wrong} sent their masked input but are named as dropped")
    peers, t = secagg.items(state["peers"], int), secagg.one(state, "threshold", int)
    d_pk = dict(zip(peers, secagg.items(state["d-pk"], bytes), strict=True))
    statement = secagg.survivors_statement(str(state["run-id"]), secagg.one(state, "round", int), signed)
    signers = secagg.items(config["secagg-signers"], int)
    valid = {
        s
        for s, sig in zip(signers, secagg.items(config["secagg-signatures"], bytes), strict=True)
        if s in signed and s in d_pk and secagg.verify(d_pk[s], sig, statement)
    }
    if len(valid) < t:
        raise Refused(f"refused to unmask: {len(valid)} valid signatures on the survivors' list, {t} needed")
    held = dict(
        zip(
            secagg.items(state["held-from"], int),
            zip(secagg.items(state["held-b"], bytes), secagg.items(state["held-s"], bytes), strict=True),
            strict=True,
        )
    )
    if unknown := sorted(set(dropped) - (set(peers) - set(signed))):
        raise Refused(f"refused to unmask: {unknown} are not dropped participants of this round")
    b_from = [j for j in survivors if j in held]
    s_from = [j for j in dropped if j in held]
    return RecordDict(
        {
            "secagg": ConfigRecord(
                {
                    "b-from": b_from,
                    "b-shares": [held[j][0] for j in b_from],
                    "s-from": s_from,
                    "s-shares": [held[j][1] for j in s_from],
                }
            )
        }
    )
