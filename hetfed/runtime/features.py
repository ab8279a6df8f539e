"""Every change hetfed's runtime makes to Flower, with the check that decides whether it applies.

Each :class:`Feature` names the process it changes, what it does, the sources of Flower it relies on
as read in Flower 1.42.0 (``pinned``: path -> SHA-256) and its check: the same function its launcher
calls before installing it (hetfed-superlink, hetfed-supernode, the ServerApp's
:func:`hetfed.runtime.seam.serverapp_grid`). Where a check fails, that feature runs stock and its
launcher says so in one line; the others are not affected. ``hetfed runtime check`` prints the
verdict of each for the installed Flower (:func:`report`), before an upgrade reaches a silo.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from hetfed import versions
from hetfed.runtime import fast_path, held_pull, internals, object_batch, pull, superlink, waits
from hetfed.runtime.supernode import pinning_checks


@dataclass(frozen=True)
class Feature:
    """One change to Flower: ``check(pinned)`` is "" where it applies, else why not (one line)."""

    process: str  # SuperLink, SuperNode or ServerApp
    name: str
    does: str
    check: Callable[[Mapping[str, str]], str]
    pinned: Mapping[str, str] = field(default_factory=dict)
    needs: str = ""  # a feature it is installed with (it falls back with it)

    def why_not(self) -> str:
        return self.check(self.pinned)


def _first(missing: list[str]) -> str:
    return "; ".join(missing)


FEATURES: tuple[Feature, ...] = (
    Feature(
        "SuperLink",
        "gated-middleware",
        "a Fleet or Runtime API call passes only the middleware that acts on it (--asgi gated)",
        lambda p: _first(superlink.missing_gate_internals(p)),
        {**superlink.PINNED_SOURCE, **fast_path.PINNED_SOURCE},
    ),
    Feature(
        "SuperLink",
        "own-pull",
        "a node's pull reads only its own complete messages (--pull own, in-memory state)",
        lambda p: _first(pull.missing_pull_internals(p)),
        pull.PINNED_SOURCE,
    ),
    Feature(
        "SuperLink",
        "held-pull",
        "an empty Fleet pull of a hetfed-supernode is held until one of its messages is complete",
        held_pull.why_not_on_superlink,
        held_pull.PINNED_SOURCE,
        needs="own-pull",
    ),
    Feature(
        "SuperLink",
        "batched-objects",
        "a message's objects in one Fleet or Runtime API request each way (--objects batched)",
        object_batch.why_not_on_superlink,
        object_batch.SUPERLINK_PINNED,
    ),
    Feature(
        "SuperNode",
        "warm-runtime",
        "one long-lived ClientApp worker and adaptive waits (--runtime warm)",
        lambda p: _first(internals.missing_internals(p)),
        internals.WARM_PINNED,
    ),
    Feature(
        "SuperNode",
        "node-key",
        "a self-registering node signs its Fleet requests with a P-256 key",
        lambda _: _first(internals.missing_node_key_internals()),
        needs="warm-runtime",
    ),
    Feature(
        "SuperNode",
        "fast-path",
        "the Runtime API's protobuf calls skip BaseHTTPMiddleware's machinery",
        fast_path.why_not_on_supernode,
        {**fast_path.PINNED_SOURCE, **fast_path.SUPERNODE_APP},
        needs="warm-runtime",
    ),
    Feature(
        "SuperNode",
        "batched-objects",
        "a task's objects in one Runtime API request each way",
        object_batch.why_not_on_supernode,
        object_batch.PINNED_SOURCE,
        needs="warm-runtime",
    ),
    Feature(
        "SuperNode",
        "held-pull-client",
        "its Fleet client pulls through a SuperLink's held pull and batched objects",
        held_pull.why_not_fleet_client,
        held_pull.FLEET_CLIENT_PINNED,
        needs="warm-runtime",
    ),
    Feature(
        "SuperNode",
        "pinning-check",
        "with --approved-apps, a run's app build is checked before its FAB is fetched",
        lambda p: _first(internals.missing_pinning_internals(p)),
        internals.PULL_STEP,
    ),
    Feature(
        "ServerApp",
        "short-backoff",
        "a missing object is pulled again after 20 ms (Flower: 1 s)",
        waits.why_not_short_backoff,
        waits.PULL_HELPERS,
    ),
    Feature(
        "ServerApp",
        "batched-grid",
        "a message's objects in one Runtime API request each way",
        object_batch.why_not_batch_grid,
        object_batch.GRID_PINNED,
    ),
)


def verdicts(features: tuple[Feature, ...] = FEATURES) -> dict[tuple[str, str], str]:
    """(process, name) -> "" where the feature applies, else why it falls back."""
    out: dict[tuple[str, str], str] = {}
    for f in features:
        why = f.why_not()
        if why:
            why = f"this Flower lacks {why}"
        elif f.needs and out.get((f.process, f.needs)):
            why = f"it comes with {f.needs}, which falls back"
        out[f.process, f.name] = why
    return out


def pinning_line(verdict: Mapping[tuple[str, str], str]) -> str:
    """Who checks a pinned silo's app builds on this Flower (what hetfed-supernode decides)."""
    checks = pinning_checks(verdict["SuperNode", "pinning-check"], not verdict["SuperNode", "warm-runtime"])
    if "supernode" in checks:
        return f"{'applies':<12} checked by the SuperNode before a FAB is fetched, and by the warm worker"
    if checks:
        return f"{'applies':<12} checked by the warm worker alone, before installing a build (--runtime warm)"
    return f"{'refuses':<12} a SuperNode with --approved-apps does not start: no check it can run here"


def report(features: tuple[Feature, ...] = FEATURES) -> list[str]:
    """One line per feature: process, name, ``applies`` (what it does) or ``falls back`` (why), and
    the verdict for app pinning; headed by the installed Flower."""
    try:
        flower = f"Flower {versions.flower()} ({versions.distribution('flwr')})"
    except Exception as exc:  # noqa: BLE001 - said, not raised: the report is the diagnosis
        flower = f"Flower of unknown version ({exc})"
    lines = [f"{flower}; hetfed's runtime was read in Flower {internals.FLOWER_VERSION}"]
    verdict = verdicts(features)
    for f in features:
        why = verdict[f.process, f.name]
        state, text = ("falls back", why) if why else ("applies", f.does)
        lines.append(f"{f.process:<10} {f.name:<17} {state:<12} {text}")
    lines.append(f"{'SuperNode':<10} {'app-pinning':<17} {pinning_line(verdict)}")
    return lines
