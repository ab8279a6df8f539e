"""A batched pull confirms its messages (Flower's ConfirmMessageReceived) only once all their objects
were pulled: on Flower's own in-memory SuperNode state, with Flower's own Runtime API handlers.

hetfed.runtime.object_batch: the client names the messages whose trees a batch pulls; the server
confirms, with Flower's handler, those of them whose objects the batch pulled when every object was
there, and says which; the client then answers Flower's confirm call for them without a request.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from flwr.app import ArrayRecord, Message, RecordDict
from flwr.common.constant import SUPERLINK_NODE_ID
from flwr.proto.message_pb2 import PullObjectRequest
from flwr.supercore.inflatable.inflatable_object import (
    get_all_nested_objects,
    get_object_tree,
    iterate_object_tree,
)
from flwr.supercore.object_store.in_memory_object_store import InMemoryObjectStore
from flwr.supercore.task_identity import TaskIdentity
from flwr.supernode.nodestate.in_memory_nodestate import InMemoryNodeState
from flwr.supernode.servicer.runtime import runtime_handlers
from starlette.requests import Request

from hetfed.runtime.object_batch import CONFIRM, CONFIRMED, PULL, _answer, framed, frames

RUN = 1


@pytest.fixture(autouse=True)
def a_task_identity() -> None:
    """Flower builds a message inside a task (its run and node): as a ServerApp would."""
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = RUN, SUPERLINK_NODE_ID, 1


def stored_message(state: InMemoryNodeState, seed: int, *, complete: bool = True) -> tuple[str, list[str]]:
    """A Flower message with an array, its tree preregistered in the node's store and its objects
    put (all but one leaf when not ``complete``); (message id, every object id of its tree)."""
    arrays = ArrayRecord([np.random.default_rng(seed).standard_normal(4)])
    message = Message(RecordDict({"a": arrays}), dst_node_id=7, message_type="train")
    tree = get_object_tree(message)
    state.object_store.preregister(RUN, tree)
    objects = get_all_nested_objects(message)
    ids = [node.object_id for node in iterate_object_tree(tree)]
    missing = {ids[0]} if not complete else set()  # a leaf: the tree iterates children first
    for object_id, obj in objects.items():
        if object_id not in missing:
            state.object_store.put(object_id, obj.deflate())
    return message.object_id, ids


def pulled(state: InMemoryNodeState, object_ids: list[str], confirm: list[str]) -> tuple[Any, list[Any]]:
    """hetfed's batched pull route's answer (headers, Flower's PullObjectResponse per object)."""
    from flwr.proto.message_pb2 import PullObjectResponse

    task = SimpleNamespace(run_id=RUN)  # the task Flower's token dependency authenticated
    body = framed(PullObjectRequest(run_id=RUN, object_id=i).SerializeToString() for i in object_ids)
    headers = [(b"content-type", b"application/x-hetfed-protobuf-frames")]
    if confirm:
        headers.append((CONFIRM.encode(), ",".join(confirm).encode()))

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": body, "more_body": False}

    scope = {"type": "http", "method": "POST", "path": PULL, "headers": headers, "query_string": b""}
    response = asyncio.run(
        _answer(
            Request(scope, receive),
            PullObjectRequest,
            lambda rs: [runtime_handlers.pull_object(r, state, task) for r in rs],
            lambda cs: [runtime_handlers.confirm_message_received(c, state, task) for c in cs],
        )
    )
    return response.headers, [PullObjectResponse.FromString(f) for f in frames(response.body)]


def test_a_batch_with_every_object_confirms_the_messages_it_pulled_and_says_which() -> None:
    state = InMemoryNodeState(InMemoryObjectStore())
    first, first_ids = stored_message(state, 0)
    second, second_ids = stored_message(state, 1)
    not_pulled = "f" * 64  # named, but none of its objects is in the batch: not confirmed
    headers, answers = pulled(state, first_ids + second_ids, [first, not_pulled, second])
    assert all(a.object_available for a in answers)
    assert headers[CONFIRMED] == f"{first},{second}"
    # Flower's confirm handler deleted each message and its objects from the node's store.
    assert all(state.object_store.get(i) is None for i in first_ids + second_ids)


def test_a_batch_missing_an_object_confirms_nothing() -> None:
    state = InMemoryNodeState(InMemoryObjectStore())
    message, ids = stored_message(state, 0, complete=False)
    headers, answers = pulled(state, ids, [message])
    assert [a.object_available for a in answers].count(False) == 1
    assert CONFIRMED not in headers
    assert state.object_store.get(message) is not None  # still there: Flower's client pulls on, then confirms


def test_a_batch_that_asks_for_no_confirmation_confirms_nothing() -> None:
    state = InMemoryNodeState(InMemoryObjectStore())
    message, ids = stored_message(state, 0)
    headers, _ = pulled(state, ids, [])
    assert CONFIRMED not in headers and state.object_store.get(message) is not None
