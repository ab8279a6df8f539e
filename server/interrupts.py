"""Interrupts (SIGINT, SIGTERM) that wait until a round's files are written together.

``hetfed run`` turns both signals into an exception (:func:`hetfed.engines.runner.signals_raise`).
Raised while rounds.csv, progress.json and checkpoint.pt are being written, it would leave them
out of step; :func:`raise_or_defer` holds it until the :func:`deferred` block is done.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

_state = threading.local()


@contextmanager
def deferred() -> Iterator[None]:
    """An interrupt raised through :func:`raise_or_defer` inside this block is raised at its end."""
    depth = getattr(_state, "depth", 0)
    _state.depth = depth + 1
    try:
        yield
    finally:
        _state.depth = depth
        pending = getattr(_state, "pending", None)
        if depth == 0 and pending is not None:
            _state.pending = None
            raise pending


def raise_or_defer(exc: BaseException) -> None:
    """Raise ``exc`` now (from a signal handler), or at the end of the current :func:`deferred` block."""
    if getattr(_state, "depth", 0):
        _state.pending = exc
        return
    raise exc
