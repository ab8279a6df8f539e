"""The hetfed ClientApp: one entry point for every strategy, dispatching by message type.

Each strategy has a client class (``CLIENTS``) whose methods handle the message
types it lists in ``handles`` (``query.info`` -> ``query_info``). The node's own
partition comes from its node config; the run config is identical to the server's.
"""

from __future__ import annotations

import torch
from flwr.app import Context, Message
from flwr.clientapp import ClientApp

from client.constrained import ConstrainedClient
from client.decision_client import DecisionClient
from client.lsa import FedLSAClient, PFLSAClient, SCAFFLSAClient, SingleLSAClient
from client.session import ClientSession

# Strategy name -> client class. Every class handles "query.info".
CLIENTS = {
    **dict.fromkeys(("fedavg", "fedrspo", "local-only"), DecisionClient),
    "pflsa": PFLSAClient,
    "fedlsa": FedLSAClient,
    "scafflsa": SCAFFLSAClient,
    "single-lsa": SingleLSAClient,
    **dict.fromkeys(
        ("softmax-switching", "penalty", "primal-dual", "fedavg-unconstrained", "crpo"), ConstrainedClient
    ),
}

# Small models: one thread is faster and leaves the other core to the other clients.
torch.set_num_threads(1)

app = ClientApp()


class FaultDrill(RuntimeError):
    """Raised on purpose (node config ``fail-round``) to rehearse a failing silo."""


def handle(message: Message, context: Context) -> Message:
    """Run the handler of this message's type on this node's client."""
    fail_round = context.node_config.get("fail-round")
    if fail_round is not None and message.metadata.group_id == str(fail_round):
        raise FaultDrill(
            f"fault drill: node {context.node_id} fails round {fail_round} (node config fail-round)"
        )
    session = ClientSession.from_context(context)
    client_cls = CLIENTS[session.cfg["strategy"]]
    kind = message.metadata.message_type
    if kind not in client_cls.handles:
        raise ValueError(f"strategy {session.cfg['strategy']!r} has no client handler for {kind!r}")
    client = client_cls(session, context)
    return Message(getattr(client, kind.replace(".", "_"))(message.content), reply_to=message)


def _register(app: ClientApp) -> None:
    categories = {"train": app.train, "evaluate": app.evaluate, "query": app.query}
    kinds = sorted({kind for cls in CLIENTS.values() for kind in cls.handles})
    for kind in kinds:
        category, _, action = kind.partition(".")
        categories[category](action or "default")(handle)


_register(app)
