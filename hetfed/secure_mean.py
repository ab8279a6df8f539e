"""A mean over clients that the server learns without learning any client's value (pairwise masks).

For the few scalars an ablation must pool (the shared calibration: mean lam0_j, lr0_j), each
client j sends

    y_j = q(v_j) + sum_{i > j} m_ij - sum_{i < j} m_ij   (mod 2^64),

where q(v) = round(v 2^FRACTION_BITS) is a fixed-point code and m_ij = m_ji is a mask both ends
derive from an ECDH secret of their key pairs (the server relays only public keys). Every mask
appears once with each sign, so sum_j y_j = sum_j q(v_j) (mod 2^64): the server decodes the sum
and divides by n, while each y_j alone is uniformly distributed. This is the masking core of
SecAgg (Bonawitz et al., 2017) without its dropout recovery: every client that sent a key must
send its masked value, or the masks do not cancel and the mean is refused. It protects against a
server that follows the protocol but reads everything it receives; a server that substituted
public keys could unmask a client, and with two clients each learns the other's value from the
mean (as any mean would tell it).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

FRACTION_BITS = 40  # resolution 2^-40 ~ 9e-13; a sum must stay below 2^23 in magnitude
_CURVE = ec.SECP384R1()


class SecureMeanError(ValueError):
    """The masked values cannot give the mean (a missing client, a value out of range)."""


def new_key_pair() -> tuple[bytes, bytes]:
    """(private key, public key) of one client, both serialized (PEM private, DER public)."""
    key = ec.generate_private_key(_CURVE)
    private = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    public = key.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return private, public


def encode(values: Sequence[float]) -> np.ndarray:
    """q(v) = round(v 2^FRACTION_BITS) as uint64 (two's complement for negative values)."""
    v = np.asarray(values, dtype=np.float64)
    if not np.all(np.isfinite(v)) or np.any(np.abs(v) >= 2.0 ** (63 - FRACTION_BITS)):
        raise SecureMeanError(f"values {v.tolist()} are not finite or too large to mask exactly")
    return np.round(v * 2.0**FRACTION_BITS).astype(np.int64).view(np.uint64)


def decode(code: np.ndarray) -> np.ndarray:
    """The inverse of :func:`encode` (of a sum of codes: the sum of the values)."""
    return np.asarray(code, dtype=np.uint64).view(np.int64).astype(np.float64) / 2.0**FRACTION_BITS


def pair_mask(private_key: bytes, peer_public_key: bytes, size: int, context: bytes) -> np.ndarray:
    """m_ij: ``size`` uint64 words from HKDF-SHA256 of the ECDH secret of i and j (m_ij = m_ji)."""
    own = serialization.load_pem_private_key(private_key, password=None)
    peer = serialization.load_der_public_key(peer_public_key)
    if not isinstance(own, ec.EllipticCurvePrivateKey) or not isinstance(peer, ec.EllipticCurvePublicKey):
        raise SecureMeanError("a key of the secure mean is not an elliptic-curve key")
    secret = own.exchange(ec.ECDH(), peer)
    words = HKDF(algorithm=hashes.SHA256(), length=8 * size, salt=None, info=context).derive(secret)
    return np.frombuffer(words, dtype="<u8").astype(np.uint64)


def masked(
    values: Sequence[float],
    own_id: int,
    private_key: bytes,
    peers: Mapping[int, bytes],
    context: bytes = b"hetfed secure mean",
) -> np.ndarray:
    """y_j = q(v_j) + sum_{i > j} m_ij - sum_{i < j} m_ij (mod 2^64); ``peers``: id -> public key
    of every other client of the mean (an entry for ``own_id`` itself is ignored)."""
    y = encode(values)
    with np.errstate(over="ignore"):  # uint64 arithmetic is modulo 2^64 by design
        for peer_id, public in sorted(peers.items()):
            if peer_id == own_id:
                continue
            mask = pair_mask(private_key, public, y.size, context)
            y = y + mask if peer_id > own_id else y - mask
    return y


def unmasked_mean(masked_values: Sequence[np.ndarray]) -> np.ndarray:
    """(1/n) decode(sum_j y_j mod 2^64): the mean of the clients' values, when all n sent theirs."""
    if not masked_values:
        raise SecureMeanError("no masked values to average")
    total = np.sum(np.asarray(masked_values, dtype=np.uint64), axis=0)  # a uint64 sum wraps mod 2^64
    return decode(total) / len(masked_values)
