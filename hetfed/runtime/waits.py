"""Waits that follow the work: short while messages flow, Flower's own values when idle.

Flower 1.42's SuperNode sleeps 3 s after every empty pull, 0.5 s between checks for a
ClientApp's reply, and retries a not-yet-available object after 1 s, 2 s, 4 s ... A
fixed short interval would cut latency and multiply idle load (8 SuperNodes polling
every 0.1 s saturate 2 cores), so every wait here is a :class:`Backoff`: fast right
after work, growing geometrically back to Flower's value while nothing happens.

:func:`install` patches one SuperNode process: it replaces the module ``time`` seen by
``flwr.supernode.start_client_internal`` (no Flower file is changed) and the keyword
defaults of the object-pull helpers. Call it only after
:func:`hetfed.runtime.internals.missing_internals` returned nothing.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from hetfed.runtime.internals import IDLE_SLEEP, REPLY_SLEEP, attr, why_not_as_read

# Object pulls retry a missing object after PULL_INITIAL_BACKOFF s, doubling up to PULL_BACKOFF_CAP
# (Flower: 1 s up to 10 s, at most 500 tries). They happen while a message is in flight and its
# objects are still on their way: a short cap keeps the latency after they arrive short. The
# tries are then unbounded, so a pull gives up after Flower's PULL_MAX_TIME, not after 500
# short tries (~4 min here against ~80 min with Flower's backoff: an upload slowed by a loaded
# silo would be given up on).
PULL_INITIAL_BACKOFF = 0.02
PULL_BACKOFF_CAP = 0.5


class Backoff:
    """Poll interval t_k = min(slow, fast * factor**k), k = empty polls since the last work.

    Starts at ``slow`` (an idle process costs what stock Flower costs) until the first
    :meth:`reset`.
    """

    def __init__(self, fast: float, slow: float, factor: float = 1.5) -> None:
        if not 0 < fast <= slow or factor < 1:
            raise ValueError(f"Backoff needs 0 < fast <= slow and factor >= 1, got {fast}, {slow}, {factor}")
        self.fast, self.slow, self.factor = fast, slow, factor
        self._next = slow

    def reset(self) -> None:
        """Work was seen: the next wait is ``fast``."""
        self._next = self.fast

    def next(self) -> float:
        """The wait to make now; the one after it is ``factor`` times longer (at most ``slow``)."""
        wait = self._next
        self._next = min(self.slow, wait * self.factor)
        return wait


class SuperNodeClock:
    """Stands in for module ``time`` inside ``start_client_internal``; only ``sleep`` differs.

    ``sleep(3)`` (nothing pulled) waits ``idle.next()``; ``sleep(0.5)`` (a reply or
    object not there yet) waits until ``reply_ready`` is set by the worker's supervisor,
    at most ``reply.next()``. Any other sleep is Flower's own.
    """

    def __init__(self, idle: Backoff, reply: Backoff, reply_ready: threading.Event) -> None:
        self.idle, self.reply, self.reply_ready = idle, reply, reply_ready

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)

    def sleep(self, seconds: float) -> None:
        if seconds == IDLE_SLEEP:
            time.sleep(self.idle.next())
        elif seconds == REPLY_SLEEP:
            if self.reply_ready.wait(self.reply.next()):
                self.reply_ready.clear()
        else:
            time.sleep(seconds)


def install(
    *,
    idle: Backoff,
    reply: Backoff,
    reply_ready: threading.Event,
    on_message: Callable[[], None] = lambda: None,
) -> None:
    """Patch this process's SuperNode loop: adaptive waits; ``on_message()`` after each pulled message."""
    import flwr.supernode.start_client_internal as sci

    pull = sci._pull_and_store_message

    def pull_and_store(*args: Any, **kwargs: Any) -> int | None:
        run_id = pull(*args, **kwargs)
        if run_id is not None:  # a message is in: poll fast until the work dies down
            idle.reset()
            reply.reset()
            on_message()
        return run_id

    sci._pull_and_store_message = pull_and_store
    sci.time = SuperNodeClock(idle, reply, reply_ready)  # type: ignore[assignment]
    shorten_object_pull_backoff()


# The two pull helpers whose keyword defaults shorten_object_pull_backoff changes, as read (their
# loops read max_tries_per_object=None as "no limit but max_time").
_UTILS = "flwr.supercore.inflatable.inflatable_utils"
PULL_HELPERS = {
    f"{_UTILS}:pull_objects": "31bb2de46b450e6acfadb7a8bb15e3f2074bb112199826a40a5eaa648bad5b2b",
    f"{_UTILS}:pull_and_inflate_object_from_tree": (
        "139811483a15e4a6c1f8523614c12f28dd3049194e5713816be0931387adb1cf"
    ),
}
PULL_KEYWORDS = {"initial_backoff", "backoff_cap", "max_tries_per_object", "max_time"}


def why_not_short_backoff(pinned: Mapping[str, str] = PULL_HELPERS) -> str:
    """What :func:`shorten_object_pull_backoff` relies on and this Flower lacks ("" = it applies)."""
    if why := why_not_as_read(pinned):
        return why
    if not all(PULL_KEYWORDS <= set(attr(path).__kwdefaults__ or {}) for path in pinned):
        return f"the keywords {', '.join(sorted(PULL_KEYWORDS))} of Flower's object-pull helpers"
    return ""


def shorten_object_pull_backoff(initial: float = PULL_INITIAL_BACKOFF, cap: float = PULL_BACKOFF_CAP) -> bool:
    """Retry a not-yet-available object after ``initial`` s, doubling up to ``cap`` (Flower: 1 s, 10 s),
    until Flower's ``max_time`` (not a count of tries).

    A message reaches the other side before its objects (arrays) do, so the first pull
    of them often finds nothing. Returns False, changing nothing, where Flower's pull
    helpers are not as read (:func:`why_not_short_backoff`).
    """
    if why_not_short_backoff():
        return False
    from flwr.supercore.inflatable import inflatable_utils

    helpers = (inflatable_utils.pull_objects, inflatable_utils.pull_and_inflate_object_from_tree)
    for fn in helpers:
        fn.__kwdefaults__.update(  # type: ignore[union-attr]
            initial_backoff=initial, backoff_cap=cap, max_tries_per_object=None
        )
    return True
