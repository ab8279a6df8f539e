"""The inline engine: Flower's Grid without transport, for fast sweeps and tests.

:class:`InlineGrid` implements Flower's ``Grid`` by handing each instruction
straight to the ClientApp callable of its virtual node, each node with its own
``Context`` (node config, persistent ``state``), exactly as a SuperNode would,
but in one process. A ClientApp exception becomes an error reply, as in a
deployment. The ServerApp code path is the same as on the other engines.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from flwr.app import Context, Error, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.common.constant import SUPERLINK_NODE_ID, ErrorCode
from flwr.serverapp import Grid
from flwr.supercore.run import Run
from flwr.supercore.task_identity import TaskIdentity


class InlineGrid(Grid):
    """Virtual nodes in this process; ``push_messages`` runs the ClientApp at once."""

    def __init__(
        self,
        client_app: ClientApp | Callable[[Message, Context], Message],
        node_configs: Iterable[Mapping[str, Any]],
        run_config: Mapping[str, Any],
        run_id: int = 1,
    ) -> None:
        self.client_app = client_app
        ids = random.Random(run_id)  # node ids are arbitrary, as on a SuperLink
        self.contexts = {
            ids.getrandbits(63): Context(
                run_id=run_id,
                node_id=0,
                node_config=dict(nc),
                state=RecordDict(),
                run_config=dict(run_config),
            )
            for nc in node_configs
        }
        for node_id, ctx in self.contexts.items():
            ctx.node_id = node_id
        self._run = Run.create_empty(run_id)
        self._replies: dict[str, Message] = {}
        self.observers: list[Any] = []  # callables(instruction, reply), e.g. a traffic audit in tests

    def set_run(self, run: Run) -> None:
        self._run = run

    @property
    def run(self) -> Run:
        return self._run

    def create_message(
        self,
        content: RecordDict,
        message_type: str,
        dst_node_id: int,
        group_id: str,
        ttl: float | None = None,
    ) -> Message:
        return Message(
            content, dst_node_id=dst_node_id, message_type=message_type, group_id=group_id, ttl=ttl
        )

    def get_node_ids(self) -> Iterable[int]:
        return list(self.contexts)

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        ids = []
        for msg in messages:
            msg.metadata.__dict__["_message_id"] = uuid.uuid4().hex
            reply = self._deliver(msg)
            reply.metadata.__dict__["_message_id"] = uuid.uuid4().hex
            for observe in self.observers:
                observe(msg, reply)
            self._replies[msg.metadata.message_id] = reply
            ids.append(msg.metadata.message_id)
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        return [self._replies.pop(mid) for mid in message_ids if mid in self._replies]

    def send_and_receive(
        self, messages: Iterable[Message], *, timeout: float | None = None
    ) -> Iterable[Message]:
        return self.pull_messages(self.push_messages(messages))

    def _deliver(self, msg: Message) -> Message:
        ctx = self.contexts.get(msg.metadata.dst_node_id)
        if ctx is None:
            return Message(Error(code=ErrorCode.NODE_UNAVAILABLE, reason="Node Unavailable"), reply_to=msg)
        try:
            return self.client_app(msg, ctx)
        except Exception as exc:  # a raising ClientApp answers with an error, as on a SuperNode
            reason = str(type(exc)) + ":<'" + str(exc) + "'>"
            return Message(Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION, reason=reason), reply_to=msg)


def node_configs(num_nodes: int, extra: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
    """``partition-id`` / ``num-partitions`` for ``num_nodes`` nodes, plus shared extras."""
    return [{"partition-id": i, "num-partitions": num_nodes, **(extra or {})} for i in range(num_nodes)]


def run_inline(
    run_config: Mapping[str, Any], configs: list[dict[str, Any]], observers: Iterable[Any] = ()
) -> dict:
    """Run the hetfed ServerApp against ``len(configs)`` virtual nodes; return the summary."""
    from hetfed.client.app import app as client_app
    from hetfed.server.app import run_server

    grid = InlineGrid(client_app, configs, run_config)
    grid.observers.extend(observers)
    # Instruction messages take their source from the task identity a SuperLink would set.
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, SUPERLINK_NODE_ID, 1
    return run_server(grid, dict(run_config))
