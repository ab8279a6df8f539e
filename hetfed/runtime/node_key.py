"""The key a warm SuperNode signs its Fleet API requests with: EC P-256, not Flower's P-384.

Every Fleet API request carries an ECDSA signature over its timestamp (SHA-256), which the
SuperLink verifies before anything else. A SuperNode without ``--auth-supernode-private-key``
registers itself with a key pair from Flower's ``generate_key_pairs``: P-384. On this kind of
machine a P-384 verification costs ~0.47 ms and a signature ~0.21 ms, against ~0.06 ms and
~0.02 ms for P-256 (the curve that matches the SHA-256 Flower signs with; 128-bit security, the
default of TLS), and the verification was the largest single cost of the SuperLink's empty pull
(docs/benchmarks.md). Flower's SuperLink accepts a key on any NIST curve (``uses_nist_ec_curve``),
so only the key changes: the protocol, and a stock SuperLink's view of the node, do not.
:func:`hetfed.credentials.write_node_key` makes P-256 keys for node authentication too.
"""

from __future__ import annotations

from cryptography.hazmat.primitives.asymmetric import ec

CURVE = ec.SECP256R1()


def generate_key_pair() -> tuple[ec.EllipticCurvePrivateKey, ec.EllipticCurvePublicKey]:
    """A fresh P-256 key pair, in the shape of Flower's ``generate_key_pairs``."""
    private = ec.generate_private_key(CURVE)
    return private, private.public_key()


def install() -> None:
    """Make this process's self-registering SuperNode connection use :func:`generate_key_pair`.

    Call only after :func:`hetfed.runtime.internals.missing_internals` returned nothing."""
    import flwr.supernode.fleet_http_connection as connection

    # http_request_response looks generate_key_pairs up in its module's globals at each call.
    vars(connection)["generate_key_pairs"] = generate_key_pair
