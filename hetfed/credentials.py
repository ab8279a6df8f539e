"""TLS certificates for a SuperLink and authentication keys for SuperNodes, made offline.

- :func:`write_certificates`: a private CA (``ca.crt``, ``ca.key``) and a SuperLink
  server certificate (``server.pem``, ``server.key``) whose subject alternative
  names are the host names and addresses silos use to reach the SuperLink, plus
  loopback (the SuperLink's own ServerApp executor connects to its bind address,
  127.0.0.1 when it binds 0.0.0.0). An existing CA in the folder is reused, so
  re-issuing the server certificate for new host names keeps silos' trust.
- :func:`write_node_key`: an EC P-256 key pair in OpenSSH format, the form
  ``flower-supernode --auth-supernode-private-key`` and
  ``flwr supernode register`` read.

Private keys are written with mode 0600, certificates and public keys 0644.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from hetfed.paths import write_with_mode
from hetfed.runtime import node_key

LOOPBACK = ("localhost", "127.0.0.1", "::1")
CA_CERT, CA_KEY, SERVER_CERT, SERVER_KEY = "ca.crt", "ca.key", "server.pem", "server.key"


@dataclass(frozen=True)
class TlsFiles:
    """The three files a TLS SuperLink needs (a silo needs only ``ca``)."""

    ca: Path
    cert: Path
    key: Path

    @classmethod
    def from_dir(cls, tls_dir: str | os.PathLike) -> TlsFiles:
        """``ca.crt``, ``server.pem`` and ``server.key`` in ``tls_dir`` (as written by write_certificates)."""
        root = Path(tls_dir).resolve()
        files = cls(root / CA_CERT, root / SERVER_CERT, root / SERVER_KEY)
        missing = [p.name for p in (files.ca, files.cert, files.key) if not p.is_file()]
        if missing:
            raise FileNotFoundError(
                f"--tls-dir '{root}' lacks {', '.join(missing)}; create them with "
                "`hetfed federation certs --out DIR --host <superlink host name>`"
            )
        return files


def write_certificates(out_dir: str | os.PathLike, hosts: Sequence[str] = (), days: int = 365) -> TlsFiles:
    """Write (or reuse) a CA and issue a server certificate valid for ``hosts`` + loopback."""
    if days < 1:
        raise ValueError(f"--days must be >= 1, got {days}")
    out = Path(out_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    names = list(dict.fromkeys([*LOOPBACK, *(h.strip() for h in hosts)]))
    if "" in names:
        raise ValueError("--host must not be empty")
    now = dt.datetime.now(dt.UTC)
    if (out / CA_CERT).exists() and (out / CA_KEY).exists():
        ca_cert = x509.load_pem_x509_certificate((out / CA_CERT).read_bytes())
        ca_key = serialization.load_pem_private_key((out / CA_KEY).read_bytes(), None)
    else:
        ca_key = ec.generate_private_key(ec.SECP384R1())
        ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "hetfed federation CA")])
        ca_cert = (
            _builder(ca_name, ca_name, ca_key.public_key(), now, days * 5)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(_key_usage(cert_sign=True), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA384())
        )
        write_with_mode(out / CA_KEY, _private_pem(ca_key), 0o600)
        write_with_mode(out / CA_CERT, ca_cert.public_bytes(serialization.Encoding.PEM), 0o644)
    key = ec.generate_private_key(ec.SECP384R1())
    common_name = hosts[0].strip() if hosts else "localhost"
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    cert = (
        _builder(subject, ca_cert.subject, key.public_key(), now, days)
        .add_extension(x509.SubjectAlternativeName([_general_name(n) for n in names]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(cert_sign=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(
            # a reused ca.crt/ca.key is typed as any key; one that cannot sign fails in cryptography
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_cert.public_key()),  # type: ignore[arg-type]
            critical=False,
        )
        .sign(ca_key, hashes.SHA384())  # type: ignore[arg-type]  # (the reused CA key, as above)
    )
    write_with_mode(out / SERVER_KEY, _private_pem(key), 0o600)
    write_with_mode(out / SERVER_CERT, cert.public_bytes(serialization.Encoding.PEM), 0o644)
    return TlsFiles(out / CA_CERT, out / SERVER_CERT, out / SERVER_KEY)


def certificate_names(cert_path: str | os.PathLike) -> list[str]:
    """The DNS names and IP addresses a certificate is valid for (its subject alternative names)."""
    cert = x509.load_pem_x509_certificate(Path(cert_path).read_bytes())
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return [*san.get_values_for_type(x509.DNSName), *map(str, san.get_values_for_type(x509.IPAddress))]


def write_node_key(path: str | os.PathLike, name: str | None = None) -> tuple[Path, Path]:
    """Write ``path`` (private, OpenSSH) and ``path.pub`` (public, OpenSSH) of a new EC P-256 key pair
    (hetfed.runtime.node_key: why P-256)."""
    private = Path(path).resolve()
    public = private.with_name(private.name + ".pub")
    if private.exists():
        raise FileExistsError(f"{private} exists; a SuperNode keeps its key (its node id) across restarts")
    private.parent.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(node_key.CURVE)
    write_with_mode(
        private,
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
        ),
        0o600,
    )
    line = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    write_with_mode(public, line + f" {name or private.name}\n".encode(), 0o644)
    return private, public


def _builder(
    subject: x509.Name, issuer: x509.Name, public_key: ec.EllipticCurvePublicKey, now: dt.datetime, days: int
) -> x509.CertificateBuilder:
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))  # tolerate small clock skew between machines
        .not_valid_after(now + dt.timedelta(days=days))
    )


def _key_usage(cert_sign: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=not cert_sign,
        key_cert_sign=cert_sign,
        crl_sign=cert_sign,
        encipher_only=False,
        decipher_only=False,
    )


def _general_name(name: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(name))
    except ValueError:
        return x509.DNSName(name)


def _private_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
