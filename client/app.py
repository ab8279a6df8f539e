"""The hetfed ClientApp: one entry point for every strategy, dispatching by message type.

Every message names, in its ConfigRecord's ``client``, the client class that serves it
(``CLIENTS``, hetfed/methods; the strategy sets it, strategies/base.py ``client_settings``),
whose methods handle the message types the table lists for it (``query.info`` ->
``query_info``). The node's own partition comes from its node config, its problem from the run
config.

A client class is imported on its first message, so a node imports only what its run
needs: the LSA clients (NumPy) never import torch.
"""

from __future__ import annotations

import functools
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from pkgutil import resolve_name
from typing import Any

from flwr.app import ConfigRecordValues, Context, Message
from flwr.clientapp import ClientApp

from hetfed.client.ledger import ledger_mod
from hetfed.client.refusal import refusal_mod
from hetfed.client.session import ClientSession
from hetfed.client.silo_policy import policy_mod
from hetfed.methods import CLIENTS, SECAGG_EXCHANGES

# Every message type some client class handles: registered up front, without importing the classes.
MESSAGE_TYPES = (*dict.fromkeys(kind for c in CLIENTS.values() for kind in c.handles), *SECAGG_EXCHANGES)

# The first mod is the outermost: the silo's policy (client/silo_policy.py) checks each message before the
# ClientApp runs and each reply before it leaves, inside the ledger (client/ledger.py), which so
# records every reply that leaves, a refusal included; outside both, a refusal (the policy's, secure
# aggregation's) becomes its one-line error reply (client/refusal.py).
app = ClientApp(mods=[refusal_mod, ledger_mod, policy_mod])


class FaultDrill(RuntimeError):
    """Raised on purpose (node config ``fail-round``) to rehearse a failing silo."""


def fault_drills(message: Message, context: Context) -> None:
    """The node config's fault drills for this message's round.

    ``fail-round = r`` (or ``"r1,r2"``): raise in round r (a failing silo). ``stall-round = r``:
    sleep ``stall-seconds`` (default 60) in round r before working (a straggler; or a silo
    whose ClientApp is killed mid-task). ``drill-exchange = kind`` limits both to the messages
    of that type (e.g. ``query.secagg_check``: a silo lost after its masked input was sent).
    """
    node, server_round = context.node_config, message.metadata.group_id
    if "drill-exchange" in node and str(node["drill-exchange"]) != message.metadata.message_type:
        return
    partition = node.get("partition-id", f"node {context.node_id}")
    if "stall-round" in node and str(node["stall-round"]) == server_round:
        time.sleep(float(node.get("stall-seconds", 60)))
    if server_round in str(node.get("fail-round", "")).replace(",", " ").split():
        raise FaultDrill(
            f"fault drill: partition {partition} fails round {server_round} (node config fail-round)"
        )


@functools.cache
def client_class(name: str) -> Any:
    """The client class named ``name`` by a message, imported on first use."""
    if name not in CLIENTS:
        raise ValueError(
            f"the message names client {name!r}, which this ClientApp does not have "
            f"({', '.join(CLIENTS)}): is the server running another hetfed version?"
        )
    cls = resolve_name(CLIENTS[name].cls)
    if "torch" in sys.modules:
        # Small models: one thread is faster and leaves the other core to the other clients.
        sys.modules["torch"].set_num_threads(1)
    return cls


def handle(message: Message, context: Context) -> Message:
    """Run the handler of this message's type on this node's client."""
    fault_drills(message, context)
    session = ClientSession.from_context(context)
    records = message.content.config_records
    config: Mapping[str, ConfigRecordValues] = records["config"] if "config" in records else {}
    kind = message.metadata.message_type
    if kind in SECAGG_EXCHANGES:
        from hetfed.client import secure_aggregation

        content = secure_aggregation.handle(kind, config, context, session.partition_id)
        return Message(content, reply_to=message)
    name = str(config.get("client", ""))
    client_cls = client_class(name)
    if kind not in CLIENTS[name].handles:
        raise ValueError(f"client {config['client']!r} has no handler for {kind!r}")
    client = client_cls(session, context, config)
    summed = "sum-weight" in config  # a summed round (server/aggregation.py): DP and secure aggregation
    if summed and "secagg" in message.content.config_records:
        from hetfed.client import secure_aggregation

        secure_aggregation.receive_shares(message.content, context, config, session.partition_id)
    content = getattr(client, kind.replace(".", "_"))(message.content)
    if summed:
        from hetfed.client import secure_aggregation

        content = secure_aggregation.finish_reply(message.content, content, config, context)
    if "run-name" in config and (report := session.state_report(context, config)) is not None:
        content["client-state"] = report  # server/pool.py: which clients hold state, and lost state
    if kind == "query.info" and "approved-apps" in context.node_config:
        content.config_records["info"]["approved-apps"] = approved_builds(
            str(context.node_config["approved-apps"])
        )
    return Message(content, reply_to=message)


def approved_builds(path: str) -> list[str]:
    """The app builds this silo approved (its allow-list), for the server's ``silos.json``."""
    from hetfed.runtime.seam import read_approved

    try:
        return read_approved(Path(path)) or ["none"]
    except (OSError, ValueError) as exc:
        return [f"unreadable: {exc}"]


def _register(app: ClientApp) -> None:
    categories = {"train": app.train, "evaluate": app.evaluate, "query": app.query}
    for kind in MESSAGE_TYPES:
        category, _, action = kind.partition(".")
        categories[category](action or "default")(handle)


_register(app)
