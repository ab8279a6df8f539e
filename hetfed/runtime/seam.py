"""The one door from hetfed's core into its Flower runtime (hetfed/runtime).

The core (server/, client/, strategies/, problems/ and hetfed/engines) imports nothing else of
hetfed/runtime (tests/test_layers.py checks it): what it uses of the runtime is here, and each part
applies where its checks of the installed Flower pass and is Flower's own otherwise.

- :func:`serverapp_grid`: the ServerApp's side, which runs bundle code only: the short object-pull
  backoff and the batched grid, or Flower's own backoff and grid (one log line each) where the
  Flower internals they rely on differ from those read;
- :func:`read_approved`: a silo's allow-list of app builds (:mod:`hetfed.runtime.pinning`), which
  its ClientApp reports to the server;
- :data:`RUNTIMES` and :data:`ASGI_MODES`: the launchers' choices the engines pass on
  (``hetfed-supernode --runtime``, ``hetfed-superlink --asgi``).
"""

from __future__ import annotations

from logging import WARNING
from typing import Any

from hetfed.runtime.object_batch import BatchedObjects, batch_grid
from hetfed.runtime.pinning import read_approved
from hetfed.runtime.waits import shorten_object_pull_backoff, why_not_short_backoff

__all__ = ["ASGI_MODES", "RUNTIMES", "BatchedObjects", "read_approved", "serverapp_grid"]

RUNTIMES = ("warm", "stock")  # a SuperNode's ClientApp runtime (hetfed-supernode --runtime)
ASGI_MODES = ("gated", "stock")  # a SuperLink's HTTP middleware (hetfed-superlink --asgi)


def serverapp_grid(grid: Any) -> BatchedObjects | None:
    """Ready the ServerApp's side of ``grid``: replies reach the SuperLink before their arrays and
    Flower retries a missing object after 1 s, so the object pulls back off from 20 ms; and a
    message's objects go in one Runtime API request each way (hetfed-superlink's routes). Returns
    the batching client (its counts) or None where the grid stays Flower's own (an inline or
    simulation grid, or an ``HttpGrid`` not as read: said in one line, as is a backoff left
    Flower's)."""
    if not shorten_object_pull_backoff():
        from flwr.common import log

        log(WARNING, "hetfed ServerApp: Flower's object-pull backoff (from 1 s): %s", why_not_short_backoff())
    return batch_grid(grid)
