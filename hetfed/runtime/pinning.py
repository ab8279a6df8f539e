"""Silo-side app pinning: a SuperNode runs only the app builds its silo approved.

An app build is named by its FAB hash: the SHA-256 of the FAB that ``flwr run`` builds
from the app folder (Flower's own ``build_fab_from_disk``), the hash Flower's SuperLink
sends with every run. A silo keeps the hashes it approved in an allow-list file, one
per line (``hetfed federation approve APP_DIR`` appends one; ``#`` starts a comment).

:func:`install_supernode_check` makes this SuperNode process refuse every other app,
in the warm and the stock runtime alike, before the FAB is even fetched: the first
message of a run whose hash is not in the file is answered with Flower's
``INVALID_FAB`` error (the reply Flower itself inserts when a FAB fails
verification), naming the refused hash; the run is not stored, so each of its later
messages is refused too. A FAB whose content does not hash to the approved hash (a
SuperLink that substitutes code) is refused the same way. The file is read anew for
every new run, so approving a build needs no restart. The warm worker checks the
same file again before it installs or imports a build (:func:`refused`).
"""

from __future__ import annotations

import datetime
import hashlib
import re
from collections.abc import Mapping
from logging import ERROR, INFO
from pathlib import Path
from typing import Any

APPROVED_FILE = "approved-apps"  # default allow-list name, in the silo's state dir
HASH = re.compile(r"^[0-9a-f]{64}$")


class AppRefused(Exception):
    """A run's app build is not on this silo's allow-list (raised inside Flower's pull)."""

    def __init__(self, fab_hash: str, why: str) -> None:
        super().__init__(why)
        self.fab_hash, self.why = fab_hash, why


def fab_hash(app_dir: Path) -> str:
    """The FAB hash of ``app_dir`` exactly as ``flwr run`` builds and hashes it."""
    from flwr.cli.build import build_fab_from_disk

    if not (Path(app_dir) / "pyproject.toml").is_file():
        raise FileNotFoundError(f"{app_dir} is not a Flower app folder (no pyproject.toml)")
    return hashlib.sha256(build_fab_from_disk(Path(app_dir))).hexdigest()


def read_approved(path: Path) -> list[str]:
    """The approved hashes in ``path`` (missing file: none); a malformed line is one error naming it."""
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        return []
    hashes = []
    for number, line in enumerate(text.splitlines(), 1):
        entry = line.split("#", 1)[0].strip()
        if not entry:
            continue
        if not HASH.match(entry):
            raise ValueError(f"{path}:{number}: not a FAB hash (64 hex digits): {entry[:80]!r}")
        hashes.append(entry)
    return hashes


def approve(path: Path, digest: str, note: str = "") -> bool:
    """Append ``digest`` to the allow-list ``path`` (made if missing); False if it was there already."""
    if not HASH.match(digest):
        raise ValueError(f"not a FAB hash (64 hex digits): {digest!r}")
    path = Path(path)
    if digest in read_approved(path):
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    with open(path, "a") as f:
        f.write(f"{digest}  # approved {when}{' ' + note if note else ''}\n")
    return True


def revoke(path: Path, digest: str) -> bool:
    """Remove ``digest`` from the allow-list ``path``; False if it was not there."""
    path = Path(path)
    if digest not in read_approved(path):
        return False
    keep = [line for line in path.read_text().splitlines() if line.split("#", 1)[0].strip() != digest]
    path.write_text("".join(f"{line}\n" for line in keep))
    return True


def refused(path: Path, digest: str, content: bytes | None = None) -> str:
    """Why this silo refuses build ``digest`` ('' if approved); ``content`` must hash to ``digest``."""
    try:
        approved = read_approved(path)
    except ValueError as exc:
        return f"refused app build {digest}: the allow-list is unreadable ({exc})"
    if content is not None and hashlib.sha256(content).hexdigest() != digest:
        return (
            f"refused app build {digest}: the FAB received hashes to "
            f"{hashlib.sha256(content).hexdigest()}, not to the hash announced"
        )
    if digest in approved:
        return ""
    listed = ", ".join(h[:12] for h in approved) or "none"
    return (
        f"refused app build {digest}: not approved by this silo (approved: {listed}); "
        "the silo approves a build with `hetfed federation approve APP_DIR`"
    )


def reason_for(node_config: Mapping[str, Any], why: str) -> str:
    """The error reason the server reads: ``partition <i> of <n>: <why>`` when the node has a partition."""
    if "partition-id" in node_config and "num-partitions" in node_config:
        return f"partition {node_config['partition-id']} of {node_config['num-partitions']}: {why}"
    return why


def install_supernode_check(path: Path) -> None:
    """Patch this SuperNode process: a run whose app build is not in ``path`` gets an error reply.

    Wraps Flower's ``_pull_and_store_message`` (called with keyword arguments only, as
    the self-test checks): the run's hash is checked when Flower fetches the run, and
    the FAB's content when Flower fetches the FAB, so nothing of a refused app reaches
    the silo's disk, let alone runs.
    """
    import flwr.supernode.start_client_internal as sci
    from flwr.app import Message
    from flwr.app.error import Error
    from flwr.common.constant import ErrorCode
    from flwr.supercore import log

    original = sci._pull_and_store_message
    path = Path(path).resolve()

    def pull_and_store(**kwargs: Any) -> int | None:
        seen: list[Message] = []
        receive, get_run, get_fab = kwargs["receive"], kwargs["get_run"], kwargs["get_fab"]

        def receive_seen() -> Any:
            got = receive()
            if got is not None:
                seen.append(got[0])
            return got

        def get_run_checked(run_id: int) -> Any:
            run = get_run(run_id)
            why = refused(path, run.fab_hash)
            if why:
                raise AppRefused(run.fab_hash, why)
            return run

        def get_fab_checked(digest: str, run_id: int) -> Any:
            fab = get_fab(digest, run_id)
            why = refused(path, digest, fab.content)
            if why:
                raise AppRefused(digest, why)
            return fab

        try:
            return original(
                **{**kwargs, "receive": receive_seen, "get_run": get_run_checked, "get_fab": get_fab_checked}
            )
        except AppRefused as exc:
            message = seen[-1]
            reason = reason_for(kwargs["node_config"], exc.why)
            log(ERROR, "hetfed pinning: run %s %s", message.metadata.run_id, reason)
            reply = Message(Error(code=ErrorCode.INVALID_FAB, reason=reason), reply_to=message)
            sci._insert_message(reply, kwargs["state"], kwargs["object_store"])
            return int(message.metadata.run_id)

    # Flower calls it with keyword arguments only (see above), which **kwargs takes; its declared
    # signature is positional.
    sci._pull_and_store_message = pull_and_store  # type: ignore[assignment]
    approved = read_approved(path)
    log(
        INFO,
        "hetfed pinning: this SuperNode runs only the app builds in %s (%d approved: %s)",
        path,
        len(approved),
        ", ".join(h[:12] for h in approved) or "none",
    )
