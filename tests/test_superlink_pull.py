"""hetfed-superlink's message pull (hetfed/runtime/pull.py) against Flower's own, on real LinkStates.

Two in-memory LinkStates of Flower 1.42 receive the same messages as the Runtime API stores them
(a push session, the message without content, its object tree, then its objects); one answers
pulls with Flower's ``get_message_ins``, the other with ``own_complete_messages``.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from flwr.app import ArrayRecord, ConfigRecord, Message, RecordDict
from flwr.app.message import remove_content_from_message
from flwr.common.constant import NOOP_FLWR_AID, SUPERLINK_NODE_ID
from flwr.common.serde import message_from_proto, message_to_proto
from flwr.server.superlink.linkstate.in_memory_linkstate import InMemoryLinkState
from flwr.supercore.constant import NOOP_FEDERATION_ID, TaskType
from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects, get_object_tree
from flwr.supercore.object_store.in_memory_object_store import InMemoryObjectStore
from flwr.supercore.task_identity import TaskIdentity
from flwr.superlink.federation.noop_federation_manager import NoOpFederationManager

from hetfed.runtime import pull

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


class Link:
    """One in-memory LinkState with three online nodes and a run, fed as the Runtime API feeds it."""

    def __init__(self, keys: list[bytes]) -> None:
        self.state = InMemoryLinkState(NoOpFederationManager(), InMemoryObjectStore())
        self.nodes = []
        for key in keys:
            node = self.state.create_node(NOOP_FLWR_AID, "silo", key, 30.0)
            self.state.activate_node(node, 30.0)
            self.nodes.append(node)
        self.run_id = self.state.create_run(
            None, None, None, {}, NOOP_FEDERATION_ID, None, NOOP_FLWR_AID, TaskType.SERVER_APP
        )
        self.pending: dict[str, tuple[str, list[str], dict[str, Any]]] = {}
        self.k_of: dict[str, int] = {}  # message id -> its k (ids differ between links: run, nodes, time)

    def push(self, node: int, k: int, *, ttl: float | None = None, objects: bool = True) -> str:
        """A train message for node index ``node`` (shared model, its own config); its objects
        pushed unless ``objects`` is False (then :meth:`push_objects` does it later)."""
        content = RecordDict({"arrays": ArrayRecord([np.arange(6.0)]), "config": ConfigRecord({"k": k})})
        msg = self.message(content, self.nodes[node], ttl)
        msg.metadata.__dict__["_message_id"] = msg.object_id  # as Flower's Grid does before a push
        session = self.state.start_session(self.run_id)
        bare = message_from_proto(message_to_proto(remove_content_from_message(msg)))
        stored, missing = self.state.store_message_and_object_tree(bare, get_object_tree(msg), session)
        assert stored
        self.pending[msg.object_id] = (session, missing, get_all_nested_objects(msg))
        self.k_of[msg.object_id] = k
        if objects:
            self.push_objects(msg.object_id)
        return msg.object_id

    def message(self, content: RecordDict, node_id: int, ttl: float | None) -> Message:
        """A message of the run's ServerApp (its task's identity, as a ServerApp process has it)."""
        saved = TaskIdentity._run_id, TaskIdentity._task_id, TaskIdentity._node_id
        TaskIdentity.run_id = self.run_id
        TaskIdentity.task_id = self.state.run_ids[self.run_id].run.primary_task_id
        TaskIdentity.node_id = SUPERLINK_NODE_ID
        try:
            return Message(content, dst_node_id=node_id, message_type="train", ttl=ttl)
        finally:  # this process runs other tests: leave the identity unset, as it was
            TaskIdentity._run_id, TaskIdentity._task_id, TaskIdentity._node_id = saved

    def push_objects(self, message_id: str) -> None:
        session, missing, objects = self.pending.pop(message_id)
        for object_id in missing:
            assert self.state.store_object(self.run_id, session, object_id, objects[object_id].deflate())

    def drain(self, node: int, get: Any) -> list[int]:
        """Pull node index ``node``'s messages one by one (``limit=1``, as a SuperNode does) until
        none; their ``k`` in the order pulled."""
        out = []
        while got := get(self.state, self.nodes[node], 1):
            assert len(got) == 1 and got[0].metadata.delivered_at != ""
            out.append(self.k_of[got[0].metadata.message_id])
        return out


def key() -> bytes:
    public = ec.generate_private_key(ec.SECP256R1()).public_key()
    return public.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)


@pytest.fixture
def links() -> tuple[Link, Link]:
    keys = [key() for _ in range(3)]
    return Link(keys), Link(keys)


def test_the_pull_self_test_passes_on_this_flower() -> None:
    assert pull.missing_pull_internals() == []


def test_a_node_pulls_what_flower_gives_it_in_the_same_order(links: tuple[Link, Link]) -> None:
    stock, own = links
    for link in links:
        for node, k in [(0, 1), (1, 2), (0, 3), (2, 4), (0, 5), (1, 6)]:
            link.push(node, k)
    flower = InMemoryLinkState.get_message_ins
    assert flower is not pull.own_complete_messages  # Flower's own: nothing installed in this process
    for node in range(3):
        expected = stock.drain(node, flower)
        assert expected and own.drain(node, pull.own_complete_messages) == expected
    # With no limit: every one at once, the same for both.
    for link in links:
        link.push(0, 7), link.push(0, 8)
    ids = [
        [link.k_of[m.metadata.message_id] for m in f(link.state, link.nodes[0], None)]
        for f, link in ((flower, stock), (pull.own_complete_messages, own))
    ]
    assert len(ids[0]) == 2 and ids[0] == ids[1]


def test_a_message_is_pulled_only_once_its_objects_are_in(links: tuple[Link, Link]) -> None:
    stock, own = links
    first = [link.push(0, 1, objects=False) for link in links]
    for link in links:
        link.push(0, 2)
    # Flower hands out the first message at once, though the ServerApp has not pushed its objects.
    assert stock.drain(0, InMemoryLinkState.get_message_ins) == [1, 2]
    assert own.drain(0, pull.own_complete_messages) == [2]
    own.push_objects(first[1])
    assert own.drain(0, pull.own_complete_messages) == [1]


def test_an_expired_message_is_dropped_as_flower_drops_it(links: tuple[Link, Link]) -> None:
    for link in links:
        link.push(1, 1, ttl=0.2)
    time.sleep(0.4)
    for link, get in zip(links, (InMemoryLinkState.get_message_ins, pull.own_complete_messages), strict=True):
        assert link.drain(1, get) == []
        assert link.state.message_ins_store == {}


@pytest.mark.parametrize(
    ("args", "in_memory"),
    [
        ([], True),
        (["--insecure", "--database", ":flwr-in-memory:"], True),
        (["--database", "/state/state.db", "--insecure"], False),
        (["--database=state.db"], False),
    ],
)
def test_the_pull_is_changed_only_for_a_state_in_memory(args: list[str], in_memory: bool) -> None:
    assert pull.state_in_memory(args) is in_memory


def test_a_limit_below_one_is_refused_as_flower_refuses_it(links: tuple[Link, Link]) -> None:
    with pytest.raises(AssertionError, match="limit"):
        pull.own_complete_messages(links[1].state, links[1].nodes[0], 0)


def test_a_held_pull_is_rung_when_the_last_object_of_its_message_is_stored(links: tuple[Link, Link]) -> None:
    """hetfed.runtime.held_pull: the doorbell of node 0 rings once the ServerApp stored the last object
    of node 0's message (from another thread, as the Runtime API's thread pool stores them), not at
    the message alone, and never node 1's; the message is then what node 0's pull gets."""
    import asyncio
    import types

    from flwr.supercore.corestate.in_memory_corestate import InMemoryCoreState

    from hetfed.runtime import held_pull

    assert held_pull.why_not_as_read(held_pull.PINNED_SOURCE) == ""
    link = links[1]
    # The wrapper hetfed-superlink installs on the class, on this one state (other tests share the class).
    link.state.store_object = types.MethodType(held_pull.ringing(InMemoryCoreState.store_object), link.state)
    bell = held_pull.DOORBELL

    async def scenario() -> tuple[bool, bool, bool]:
        with bell.held(link.nodes[0]) as node0, bell.held(link.nodes[1]) as node1:
            message = link.push(0, 1, objects=False)
            await asyncio.sleep(0.05)
            early = node0.is_set()
            await asyncio.to_thread(link.push_objects, message)
            await asyncio.wait_for(node0.wait(), 5)
            await asyncio.sleep(0.05)
            return early, node0.is_set(), node1.is_set()

    early, rung, other = asyncio.run(scenario())
    assert (early, rung, other) == (False, True, False)
    assert link.drain(0, pull.own_complete_messages) == [1]
    assert not bell._held  # every held pull let go of its node
