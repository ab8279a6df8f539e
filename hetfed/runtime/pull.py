"""A SuperNode's message pull in ``hetfed-superlink``: its own messages only, once their objects are in.

Flower 1.42's in-memory LinkState answers each PullMessages (``get_message_ins``) by walking every
instruction the SuperLink holds and checking each one's expiry and federation, whoever it is for:
with N silos in a round, N messages are held and every pull costs O(N), so a round costs the
SuperLink O(N^2). And it hands a node its message as soon as the ServerApp has stored it, before
the ServerApp has pushed the message's objects: at 500 simulated silos, 51 of a silo's 81 Fleet
requests per round were object pulls that found nothing yet (docs/benchmarks.md, SuperLink capacity).

:func:`own_complete_messages` answers the same question for one node: it checks only that node's
undelivered messages (as Flower checks each, then marks the returned ones delivered), and skips a
message whose object tree is not yet complete in the object store, so the node finds it on a later
pull with every object there. What a node receives, and when it counts as delivered, is Flower's;
only the moment changes (after the ServerApp's pushes instead of before), so stock SuperNodes and
hetfed's work against it alike. Expired messages of other nodes are dropped when those are pulled
or when the ServerApp asks for their replies, as Flower also does, instead of on any node's pull.
A message whose object tree is missing goes out as before: Flower's handler reports and drops it.

What it relies on (Flower 1.42.0), pinned by SHA-256 in :data:`PINNED_SOURCE` and checked by
``hetfed-superlink`` before installing it (:func:`missing_pull_internals`): the method it replaces
and the check it reuses, the in-memory object store's ``get`` and ``get_object_tree``, and the
Fleet handler that calls it. The SQL LinkState (a SuperLink whose state is on disk) stays stock.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hetfed.runtime.internals import attr, changed_pinned

STATE = "flwr.server.superlink.linkstate.in_memory_linkstate:InMemoryLinkState"
STORE = "flwr.supercore.object_store.in_memory_object_store:InMemoryObjectStore"
IN_MEMORY = ":flwr-in-memory:"  # flwr.supercore.constant.FLWR_IN_MEMORY_DB_NAME, --database's default

PINNED_SOURCE: dict[str, str] = {
    f"{STATE}.get_message_ins": "6547c8dcbc62e12f5b2aa5c69f4de8c7c7072c10d6c0876512cf37197d941056",
    f"{STATE}._check_stored_messages": ("2be47567d2478a58b766c116f1f0cd0ae3aa791d4e7e3ee85cb20d31f15a8082"),
    f"{STORE}.get": "b67cbc37f989c81167cbb6591a993cb8974ad1e01d46eb622890e2e74183d387",
    f"{STORE}.get_object_tree": "1283fc620bd1f73ca6df4d0ade0a310313453a6220cf9a5b00036301dd7f35ac",
    "flwr.superlink.servicer.fleet.fleet_handlers:pull_messages": (
        "5f1d8861a9eb14651a1cea9ec21b4d7955470e5559ea76dc84745bf2d1964bd0"
    ),
}


def objects_in(store: Any, object_id: str) -> bool:
    """Whether every object of ``object_id``'s tree is in ``store`` (pushed, not only preregistered);
    True when the tree itself is missing (Flower's pull handler reports and drops such a message)."""
    from flwr.supercore.inflatable.inflatable_object import iterate_object_tree
    from flwr.supercore.object_store import NoObjectInStoreError

    try:
        tree = store.get_object_tree(object_id)
    except NoObjectInStoreError:
        return True
    return all(store.get(node.object_id) for node in iterate_object_tree(tree))


def own_complete_messages(
    self: Any, node_id: int, limit: int | None, *, run_id: int | None = None
) -> list[Any]:
    """``InMemoryLinkState.get_message_ins`` for one node: at most ``limit`` of the node's
    undelivered messages (of ``run_id``, given) that pass Flower's check and whose objects are all
    in the store, in the order stored, marked delivered."""
    from flwr.supercore.date import now

    if limit is not None and limit < 1:
        raise AssertionError("`limit` must be >= 1")
    found: list[Any] = []
    with self.lock:
        waiting = [
            msg_id
            for msg_id, msg in self.message_ins_store.items()
            if msg.metadata.dst_node_id == node_id and msg.metadata.delivered_at == ""
        ]
        for msg_id in waiting:
            self._check_stored_messages({msg_id})  # drops it if expired or out of the federation
            msg = self.message_ins_store.get(msg_id)
            if msg is None or (run_id is not None and msg.metadata.run_id != run_id):
                continue
            if not objects_in(self.object_store, msg_id):
                continue  # the ServerApp is still pushing its objects: a later pull gets it whole
            found.append(msg)
            if limit and len(found) == limit:
                break
    delivered_at = now().isoformat()
    for msg in found:
        msg.metadata.delivered_at = delivered_at
    return found


def missing_pull_internals(pinned: Mapping[str, str] = PINNED_SOURCE) -> list[str]:
    """What :func:`install` relies on and this Flower lacks ([] = all there); ``pinned``: the sources
    it relies on as read."""
    try:
        changed = changed_pinned(pinned)
        attr("flwr.supercore.inflatable.inflatable_object:iterate_object_tree")
        attr("flwr.supercore.date:now")
        return changed
    except (ImportError, AttributeError, OSError, TypeError) as exc:
        return [f"{type(exc).__name__}: {exc}"]


def state_in_memory(superlink_args: list[str]) -> bool:
    """Whether a SuperLink started with ``superlink_args`` keeps its state in memory (Flower's
    default ``--database``), the only state whose pull :func:`install` changes."""
    import argparse

    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--database", default=IN_MEMORY)
    return bool(parser.parse_known_args(superlink_args)[0].database == IN_MEMORY)


def install() -> None:
    """Make every in-memory LinkState of this process answer pulls with :func:`own_complete_messages`."""
    attr(STATE).get_message_ins = own_complete_messages
