"""A silo's long-term signing identity and the federation's roster: the trust root of signed keys.

Secure aggregation against a server that substitutes keys (docs/security.md "Signed keys", docs/algorithms.md
"Secure aggregation") needs each client to know its peers' keys from somewhere other than the server:

- the **identity**: an Ed25519 private key (PKCS8 PEM, mode 0600) that the silo keeps; the node config
  names it (``secagg-identity``). It signs the silo's round keys (client/secure_aggregation.py);
- the **roster**: a TOML file mapping every partition id of the federation to its silo's Ed25519
  public key (64 hex digits), installed on each silo by its operator out of band and named in the
  node config (``secagg-roster``)::

      [silos]
      0 = "3b6a27bc..."
      1 = "8f1e0d4a..."

The identity is bound to the silo's partition by the roster: a silo whose identity is not its
partition's entry refuses to start its keys exchange. The ClientApp never takes an identity from the
server. Keys are made with ``hetfed federation identity`` (and by ``federation up``).
"""

from __future__ import annotations

import functools
import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from hetfed.paths import read_toml, write_private


class IdentityError(ValueError):
    """An identity or roster file that cannot be used (one line: file, key or line, culprit)."""


def write_identity(path: str | os.PathLike) -> bytes:
    """Write a new Ed25519 identity at ``path`` (mode 0600, refused if it exists); its public key."""
    path = Path(path).resolve()
    if path.exists():
        raise FileExistsError(f"{path} exists; a silo keeps its identity (its roster entry) across runs")
    path.parent.mkdir(parents=True, exist_ok=True)
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    write_private(path, pem)
    return key.public_key().public_bytes_raw()


def read_identity(path: str | os.PathLike) -> Ed25519PrivateKey:
    """The identity at ``path``; IdentityError (one line) when unreadable, readable by others or not
    an unencrypted Ed25519 PEM key."""
    try:
        mode = os.stat(path).st_mode
        data = Path(path).read_bytes()
    except OSError as exc:
        raise IdentityError(
            f"identity file {path} (node config 'secagg-identity') cannot be read: {exc.strerror}"
        ) from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise IdentityError(
            f"identity file {path} is accessible to others (mode {stat.S_IMODE(mode):04o}): chmod 600 it"
        )
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as exc:
        raise IdentityError(f"identity file {path} is not an unencrypted PEM private key ({exc})") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise IdentityError(f"identity file {path} holds a {type(key).__name__}, not an Ed25519 key")
    return key


def public_hex(key: Ed25519PrivateKey) -> str:
    return key.public_key().public_bytes_raw().hex()


def read_roster(path: str | os.PathLike) -> dict[int, bytes]:
    """The roster at ``path``: partition id -> raw Ed25519 public key; IdentityError in one line."""
    raw = read_toml(path, "roster", "secagg-roster", IdentityError)
    if set(raw) != {"silos"} or not isinstance(raw["silos"], dict):
        raise IdentityError(f"roster file {path}: expected one table [silos], got keys {sorted(raw)}")
    roster: dict[int, bytes] = {}
    for key, value in raw["silos"].items():
        if not key.isdigit():
            raise IdentityError(f"roster file {path}: [silos] key {key!r} is not a partition id")
        try:
            public = bytes.fromhex(value) if isinstance(value, str) else b""
            Ed25519PublicKey.from_public_bytes(public)
        except ValueError:
            public = b""
        if len(public) != 32:
            raise IdentityError(
                f"roster file {path}: [silos] {key} = {value!r} is not an Ed25519 public key (64 hex digits)"
            )
        roster[int(key)] = public
    if not roster:
        raise IdentityError(f"roster file {path}: [silos] names no silo")
    return roster


def write_roster(path: str | os.PathLike, roster: Mapping[int, bytes]) -> None:
    """Write ``roster`` (partition id -> raw public key) as TOML at ``path`` (mode 0644: it is public)."""
    lines = [
        "# hetfed roster: partition id = the silo's Ed25519 public key (hetfed/silo_identity.py)",
        "[silos]",
    ]
    lines += [f'{p} = "{roster[p].hex()}"' for p in sorted(roster)]
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text("\n".join(lines) + "\n")


def enrol(identity: str | os.PathLike, partition: int, roster: str | os.PathLike | None = None) -> str:
    """Make ``identity`` if it does not exist and, with ``roster``, set ``partition``'s entry in it
    (creating the file); the identity's public key in hex."""
    path = Path(identity)
    public = (
        write_identity(path) if not path.exists() else read_identity(path).public_key().public_bytes_raw()
    )
    if roster is not None:
        entries = read_roster(roster) if Path(roster).exists() else {}
        write_roster(roster, {**entries, partition: public})
    return public.hex()


ROSTER_FILE = "roster.toml"  # a federation folder's roster (``federation up``, the compose files)


def identity_file(folder: Path, partition: int) -> Path:
    """A federation folder's identity of ``partition`` (``federation up``, the compose files)."""
    return folder / f"silo-{partition}.key"


def make_federation(folder: Path, partitions: int) -> tuple[list[Path], Path]:
    """An identity per partition (``folder/silo-<i>.key``, kept if present) and their roster
    (``folder/roster.toml``, rewritten): what ``federation up`` installs on its silos."""
    keys = [identity_file(folder, i) for i in range(partitions)]
    roster = folder / ROSTER_FILE
    write_roster(
        roster,
        {i: bytes.fromhex(enrol(key, i)) for i, key in enumerate(keys)},
    )
    return keys, roster


@dataclass(frozen=True)
class SiloKeys:
    """What a silo with a roster holds: its identity (raw private key) and the roster it trusts."""

    private: bytes
    roster: Mapping[int, bytes]
    roster_path: str


@functools.cache
def load(identity: str, roster: str, partition: int) -> SiloKeys:
    """The silo's identity and roster, checked to agree (read once per process); IdentityError."""
    key = read_identity(identity)
    entries = read_roster(roster)
    if entries.get(partition) != key.public_key().public_bytes_raw():
        listed = "no entry" if partition not in entries else f"{entries[partition].hex()[:16]}..."
        raise IdentityError(
            f"roster file {roster}: partition {partition} has {listed}, not this silo's identity {identity} "
            f"({public_hex(key)[:16]}...)"
        )
    return SiloKeys(key.private_bytes_raw(), entries, roster)
