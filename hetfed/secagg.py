"""The primitives of secure aggregation (docs/algorithms.md "Secure aggregation"), from libraries.

Nothing here is home-made cryptography: key agreement is X25519 with HKDF-SHA256, encryption
of the shares AES-256-GCM, the consistency check's signatures Ed25519 (all ``cryptography``),
the masks an AES-256-CTR key stream, and secret sharing Shamir's scheme over GF(2^128) of
``pycryptodome`` (a Flower dependency). What this module adds is the layout: which bytes are
shared, what each key is bound to (``context``: the run, the round, the pair), and the
fixed-point code of the sums in Z_{2^64}:

    q(v) = round(v / step) mod 2^64,   step = clip / 2^(bits - 1),

so a value clipped to [-clip, clip] takes ``bits`` bits and a sum of codes, taken mod 2^64,
decodes to the sum of the values while it stays below 2^63 steps in magnitude.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from typing import TypeVar

import numpy as np
from Crypto.Protocol.SecretSharing import Shamir
from cryptography.exceptions import InvalidSignature, InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

T = TypeVar("T")
SECRET_BYTES = 32  # a self-mask seed and a private key: two halves of Shamir's 16-byte secrets
_HALF = 16


class SecAggError(ValueError):
    """A message of the protocol that cannot be used (a bad share, key, signature or size)."""


def new_agreement_key() -> tuple[bytes, bytes]:
    """(private, public) raw 32-byte X25519 keys."""
    key = X25519PrivateKey.generate()
    return key.private_bytes_raw(), key.public_key().public_bytes_raw()


def new_signing_key() -> tuple[bytes, bytes]:
    """(private, public) raw 32-byte Ed25519 keys."""
    key = Ed25519PrivateKey.generate()
    return key.private_bytes_raw(), key.public_key().public_bytes_raw()


def agree(private: bytes, peer_public: bytes, context: bytes) -> bytes:
    """A 32-byte key both ends derive alike: HKDF-SHA256(X25519(private, peer), info=context)."""
    try:
        secret = X25519PrivateKey.from_private_bytes(private).exchange(
            X25519PublicKey.from_public_bytes(peer_public)
        )
    except ValueError as exc:
        raise SecAggError(f"unusable agreement key ({exc})") from None
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=context).derive(secret)


def encrypt(key: bytes, plaintext: bytes, context: bytes) -> bytes:
    """AES-256-GCM of ``plaintext`` bound to ``context``: nonce (12 bytes) + ciphertext + tag."""
    nonce = os.urandom(12)
    return nonce + AESGCM(key).encrypt(nonce, plaintext, context)


def decrypt(key: bytes, ciphertext: bytes, context: bytes) -> bytes:
    """The inverse of :func:`encrypt`; SecAggError when it was altered or bound to another context."""
    try:
        return AESGCM(key).decrypt(ciphertext[:12], ciphertext[12:], context)
    except (InvalidTag, ValueError):
        raise SecAggError("a share does not decrypt: altered, or meant for another client or round") from None


def sign(private: bytes, data: bytes) -> bytes:
    return Ed25519PrivateKey.from_private_bytes(private).sign(data)


def verify(public: bytes, signature: bytes, data: bytes) -> bool:
    """Whether ``signature`` is ``public``'s Ed25519 signature of ``data``."""
    try:
        Ed25519PublicKey.from_public_bytes(public).verify(signature, data)
    except (InvalidSignature, ValueError):
        return False
    return True


def mask(seed: bytes, size: int) -> np.ndarray:
    """PRG(seed): ``size`` uint64 words of the AES-256-CTR key stream of ``seed`` (32 bytes)."""
    if len(seed) != 32:
        raise SecAggError(f"a mask seed has 32 bytes, got {len(seed)}")
    stream = Cipher(algorithms.AES(seed), modes.CTR(bytes(16))).encryptor()
    return np.frombuffer(stream.update(bytes(8 * size)), dtype="<u8").astype(np.uint64)


def split(secret: bytes, threshold: int, n: int) -> list[bytes]:
    """Shamir shares of a 32-byte ``secret``: share i (0-based) for evaluation point i + 1; any
    ``threshold`` of the n give the secret back, fewer tell nothing of it."""
    if len(secret) != SECRET_BYTES:
        raise SecAggError(f"a shared secret has {SECRET_BYTES} bytes, got {len(secret)}")
    halves = [Shamir.split(threshold, n, secret[i : i + _HALF], ssss=False) for i in (0, _HALF)]
    return [low[1] + high[1] for low, high in zip(*halves, strict=True)]


def combine(shares: Mapping[int, bytes]) -> bytes:
    """The secret from shares ``{point: share}`` (points 1-based, as :func:`split` numbers them)."""
    if any(len(s) != 2 * _HALF for s in shares.values()):
        raise SecAggError("a Shamir share has 32 bytes")
    return b"".join(
        Shamir.combine([(point, share[i : i + _HALF]) for point, share in shares.items()], ssss=False)
        for i in (0, _HALF)
    )


def contribution(sent: Mapping[str, np.ndarray], reply: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """x = reply - sent for the arrays both hold (same name and shape), the reply's array otherwise
    (float64). The client and the server apply this one rule."""
    out = {}
    for key, value in reply.items():
        v = np.asarray(value, dtype=np.float64)
        ref = sent.get(key)
        out[key] = v - np.asarray(ref, dtype=np.float64) if ref is not None and ref.shape == v.shape else v
    return out


def step_of(clip: float, bits: int) -> float:
    """The fixed-point resolution ``clip / 2^(bits - 1)``."""
    return clip / 2.0 ** (bits - 1)


def smallest_threshold(participants: int, corrupt: int) -> int:
    """The smallest t a client accepts: 2t > m + c, and t >= 2 (docs/algorithms.md "Secure aggregation").

    With t at or below (m + c) / 2 a server that tells two groups of clients different stories about
    who dropped out gets t shares of one client's self-mask seed from one group and t of its mask key
    from the other (c of the holders colluding with it answer both): that client's input unmasked
    (Bonawitz et al. 2017, the active setting)."""
    return max(2, (participants + corrupt) // 2 + 1)


def threshold_problem(threshold: int, participants: int, corrupt: int) -> str | None:
    """Why threshold t over m participants with c colluding is unsafe or unusable, or None."""
    if participants < 2:
        return f"{participants} participant(s): secure aggregation needs at least 2"
    if threshold > participants:
        return f"threshold {threshold} exceeds the {participants} participants (no sum could be unmasked)"
    if threshold < smallest_threshold(participants, corrupt):
        return (
            f"threshold {threshold} over {participants} participants with {corrupt} colluding tolerated "
            f"lets a server that splits the clients' views unmask one client (needs 2t > m + c: "
            f"t >= {smallest_threshold(participants, corrupt)})"
        )
    return None


def largest_code(bits: int, bound: float, max_weight: float) -> int:
    """The largest |q(v)| of an entry of a summed round's vector [a x, a, c]: |a x_k| <= A range
    (x clipped to +-range), |a| <= A, c in {0, 1}, so |q| <= ceil(max(A range, A, 1) / step)."""
    return math.ceil(max(max_weight * bound, max_weight, 1.0) / step_of(bound, bits))


def code_problem(participants: int, bits: int, bound: float, max_weight: float) -> str | None:
    """Why m participants' codes could wrap: a sum decodes right while |sum| <= m |q|_max < 2^63."""
    largest = largest_code(bits, bound, max_weight)
    if participants * largest < 2**63:
        return None
    fits = (2**63 - 1) // largest
    return (
        f"{participants} clients' fixed-point codes of {bits} bits within +-{bound:g} at weights up to "
        f"{max_weight:g} can wrap the 64-bit sum (at most {fits} fit)"
    )


MEAN_FRACTION_BITS = 40  # a secure mean's resolution 2^-40 (~9e-13) at every number of clients


def mean_code(participants: int) -> tuple[int, float]:
    """(bits, bound) of a secure mean's code (weights 1): step 2^-40 whatever m, and the widest
    bound 2^k (bits = k + 41 <= 62) whose sum over ``participants`` cannot wrap
    (:func:`code_problem`); SecAggError when none can. A fixed step keeps a mean's value the same
    at any m (2^21 at 2 clients, 2^19 at 10, 2^16 at 100)."""
    for bits in range(62, MEAN_FRACTION_BITS + 1, -1):
        bound = 2.0 ** (bits - 1 - MEAN_FRACTION_BITS)
        if code_problem(participants, bits, bound, 1.0) is None:
            return bits, bound
    raise SecAggError(
        f"no secure-mean code at resolution 2^-{MEAN_FRACTION_BITS} fits the sum of {participants} clients"
    )


def encode(values: np.ndarray, step: float) -> np.ndarray:
    """q(v) = round(v / step) as uint64 (two's complement); SecAggError for NaN/Inf or a value
    beyond 2^62 steps (a sum of a few such codes would wrap)."""
    v = np.asarray(values, dtype=np.float64) / step
    if not np.all(np.isfinite(v)) or np.any(np.abs(v) >= 2.0**62):
        raise SecAggError("a value to encode is not finite or beyond the fixed-point range")
    return np.round(v).astype(np.int64).view(np.uint64)


def decode(code: np.ndarray, step: float) -> np.ndarray:
    """The inverse of :func:`encode`, for a code or a sum of codes (mod 2^64)."""
    return np.asarray(code, dtype=np.uint64).view(np.int64).astype(np.float64) * step


def add(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a + b mod 2^64."""
    with np.errstate(over="ignore"):
        return np.asarray(a, dtype=np.uint64) + np.asarray(b, dtype=np.uint64)


def subtract(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a - b mod 2^64."""
    with np.errstate(over="ignore"):
        return np.asarray(a, dtype=np.uint64) - np.asarray(b, dtype=np.uint64)


def signed_pair_mask(own: int, peer: int, seed: bytes, size: int) -> np.ndarray:
    """The pair mask as client ``own`` adds it for ``peer``: +PRG(s) if peer > own, else -PRG(s)
    (mod 2^64), so the two ends' masks cancel in a sum."""
    words = mask(seed, size)
    return words if peer > own else subtract(np.zeros(size, dtype=np.uint64), words)


def context(run_id: str, server_round: int, what: str, *pair: int) -> bytes:
    """What a key, share or signature is bound to: run id, round, purpose and the pair's ids."""
    return f"hetfed secagg|{run_id}|{server_round}|{what}|{'-'.join(map(str, pair))}".encode()


def keys_statement(run_id: str, server_round: int, pid: int, c_pk: bytes, s_pk: bytes, d_pk: bytes) -> bytes:
    """What a silo's identity signs of its round keys: run, round, partition and the three keys."""
    return context(run_id, server_round, "keys", pid) + b"|" + c_pk + s_pk + d_pk


def survivors_statement(run_id: str, server_round: int, survivors: Sequence[int]) -> bytes:
    """What the consistency check signs: the clients whose masked input the server holds."""
    return context(run_id, server_round, "survivors", *sorted(survivors))


def one(record: Mapping[str, object], key: str, kind: type[T]) -> T:
    """``record[key]`` if it is a ``kind``, else SecAggError (a message or state out of shape)."""
    value = record.get(key)
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise SecAggError(f"secure aggregation: {key!r} is missing or not {kind.__name__}")
    return value


def items(value: object, kind: type[T]) -> list[T]:
    """``value`` as a list of ``kind``, else SecAggError."""
    if not isinstance(value, list) or not all(isinstance(v, kind) for v in value):
        raise SecAggError(f"secure aggregation: expected a list of {kind.__name__}")
    return list(value)
