"""Checks of the paths a command is given, made before anything starts (one line each), and the
exclusive lock two commands on one folder take.

``{partition}`` is the only placeholder a per-node path may hold (``--data-path``, ``--state-dir``).
"""

from __future__ import annotations

import contextlib
import csv
import fcntl
import os
import re
import tempfile
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from hetfed.config import ConfigError

PLACEHOLDER = "{partition}"


def read_toml(path: str | os.PathLike, what: str, node_key: str, error: type[Exception]) -> dict[str, Any]:
    """The TOML file a silo's node config names (``node_key``); ``error`` in one line naming it."""
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except OSError as exc:
        raise error(f"{what} file {path} (node config {node_key!r}) cannot be read: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise error(f"{what} file {path} is not TOML: {exc}") from None


def per_partition(flag: str, pattern: str, nodes: int) -> list[Path]:
    """``pattern`` with ``{partition}`` replaced by 0..nodes-1; any other brace is refused."""
    if re.search(r"[{}]", pattern.replace(PLACEHOLDER, "")):
        raise ConfigError(f"{flag} {pattern}: only {PLACEHOLDER} may appear in braces")
    return [Path(pattern.replace(PLACEHOLDER, str(i))) for i in range(nodes)]


def check_existing(flag: str, pattern: str, paths: list[Path]) -> None:
    """Every node's data path exists."""
    missing = [i for i, p in enumerate(paths) if not p.exists()]
    if missing:
        more = ", ..." if len(missing) > 10 else ""
        raise ConfigError(
            f"{flag} {pattern}: {paths[missing[0]]} does not exist "
            f"(partition {', '.join(map(str, missing[:10]))}{more} of {len(paths)})"
        )


def check_writable_folder(flag: str, path: Path, shown: str | None = None) -> None:
    """``path`` is a folder, or can be made as one, in a writable place. Tried, not asked: root
    passes every ``access(2)`` check, also on a read-only mount or under /proc, where a folder
    still cannot be made (a probe folder is made and removed at once)."""
    shown = shown if shown is not None else str(path)
    if not shown.strip():
        raise ConfigError(f"{flag} {shown!r}: empty; give a folder")
    if path.exists() and not path.is_dir():
        raise ConfigError(f"{flag} {shown}: {path} exists and is not a folder")
    resolved = path.resolve()
    parent = next(p for p in [resolved, *resolved.parents] if p.exists())
    if not parent.is_dir():
        raise ConfigError(f"{flag} {shown}: {parent} is a file, not a folder")
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".hetfed-probe-", dir=parent))
    except OSError as exc:
        raise ConfigError(f"{flag} {shown}: {parent} is not a writable folder ({exc.strerror})") from None


def check_output_file(flag: str, out: Path, inputs: Mapping[str, Path]) -> None:
    """``out`` and its sidecar (``out`` with suffix ``.json``) are two files, neither a folder, and
    neither is one of the command's ``inputs`` (option -> path): a command writes them only after
    reading its inputs, so it would overwrite them, or the sidecar the output, and say it succeeded."""
    sidecar = out.with_suffix(".json")
    if sidecar == out:
        raise ConfigError(f"{flag} {out}: its sidecar would be the same file ({sidecar}); give a .csv name")
    for target in (out, sidecar):
        if target.is_dir():
            raise ConfigError(f"{flag} {out}: {target} is a folder")
        for option, path in inputs.items():
            if _same_file(target, path):
                what = "" if target == out else "'s sidecar"
                raise ConfigError(f"{flag} {out}{what} is {option} {path}: it would overwrite that input")


def _same_file(a: Path, b: Path) -> bool:
    if a.exists() and b.exists():
        return os.path.samefile(a, b)
    return a.resolve() == b.resolve()


def write_csv_atomically(out: Path, header: Sequence[str], rows: Iterable[Sequence[Any]]) -> None:
    """Write ``out`` through a temporary file beside it, replaced at the end (a reader never sees half
    a file); an error names ``out``, not the temporary file."""
    tmp = out.with_name(f".{out.name}.tmp")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(header)
            writer.writerows(rows)
        tmp.replace(out)
    except OSError as exc:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise OSError(f"cannot write {out} ({exc.strerror or exc})") from None


def check_port(flag: str, port: int, *, free: bool = True) -> None:
    """A TCP port: 1-65535 (0 = a free one, where ``free``)."""
    low = 0 if free else 1
    if not low <= port <= 65535:
        raise ConfigError(f"{flag} {port}: must be in {low}-65535" + (" (0: a free port)" if free else ""))


def flock_holder(path: Path) -> str:
    """`` (pid N)`` for the process holding a flock on ``path`` (from /proc/locks), else ''."""
    try:
        inode = path.stat().st_ino
        for line in Path("/proc/locks").read_text().splitlines():
            fields = line.split()
            if fields[1:2] == ["FLOCK"] and fields[5].rsplit(":", 1)[-1] == str(inode):
                return f" (pid {fields[4]})"
    except (OSError, IndexError):
        pass
    return ""


def exclusive_lock(path: Path) -> int | None:
    """Hold an exclusive flock on ``path`` (made if missing); the fd, or None when another live
    process holds it (the kernel frees it when its holder dies)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def write_with_mode(path: Path, data: bytes, mode: int) -> None:
    """Write ``data`` at ``path`` with ``mode`` from the start (a key is never world-readable, even
    briefly), replacing the file atomically."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.chmod(tmp, mode)
    os.replace(tmp, path)


def write_private(path: Path, data: bytes) -> None:
    """Write a private key's ``data`` at ``path`` with mode 0600 from the start."""
    write_with_mode(path, data, 0o600)
