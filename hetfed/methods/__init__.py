"""The methods: name -> its strategy class (imported only when a run builds it) and its typed
parameters, from which the run-config schema and every message's settings come; and the client
handlers a message can name (``client``), with the message types each serves, and secure
aggregation's exchanges, which every client serves; from them the ClientApp registers its handlers
(client/app.py) and the silo's policy tells the protocol's replies from updates."""

from __future__ import annotations

from dataclasses import dataclass

from hetfed.methods.constrained import ConstrainedParams, PenaltyParams, PrimalDualParams, SwitchingParams
from hetfed.methods.decision import CalibratedParams, DecisionParams
from hetfed.methods.lsa import LSAParams, PFLSAParams
from hetfed.params import Params


@dataclass(frozen=True)
class Method:
    """One method of the registry: its strategy class, ``module:Class`` (strategies/registry.py),
    its parameters beyond the run's keys and its problem's, and the engines it runs on (empty:
    every engine)."""

    strategy: str
    params: type[Params]
    engines: tuple[str, ...] = ()


@dataclass(frozen=True)
class ClientHandler:
    """A client class (``module:Class``, imported by a node on the first message naming it) and the
    message types it serves, each by its method of that name (``query.info`` -> ``query_info``)."""

    cls: str
    handles: tuple[str, ...]


DECISION_MESSAGES = (
    "query.info",
    "query.calibrate",
    "query.masked_calibration",
    "train",
    "train.personalize",
    "evaluate",
)
LSA_MESSAGES = ("query.info", "train", "evaluate")
CLIENTS: dict[str, ClientHandler] = {
    "decision": ClientHandler("hetfed.client.decision_client:DecisionClient", DECISION_MESSAGES),
    "decision-local": ClientHandler("hetfed.client.local_only:LocalOnlyClient", DECISION_MESSAGES),
    "decision-pooled": ClientHandler(
        "hetfed.client.pooled:PooledClient", ("query.info", "train", "evaluate")
    ),
    "constrained": ClientHandler(
        "hetfed.client.constrained:ConstrainedClient", ("query.info", "query.fg", "train", "evaluate")
    ),
    "lsa-mixing": ClientHandler("hetfed.client.lsa:PFLSAClient", LSA_MESSAGES),
    "lsa-local-steps": ClientHandler("hetfed.client.lsa:FedLSAClient", LSA_MESSAGES),
    "lsa-control-variates": ClientHandler("hetfed.client.lsa:SCAFFLSAClient", LSA_MESSAGES),
    "lsa-alone": ClientHandler("hetfed.client.lsa:SingleLSAClient", LSA_MESSAGES),
}
# Secure aggregation's exchanges, served for every client class (client/secure_aggregation.py).
SECAGG_EXCHANGES = ("query.secagg_keys", "query.secagg_shares", "query.secagg_check", "query.secagg_unmask")

METHODS: dict[str, Method] = {
    "fedavg": Method("hetfed.strategies.fedavg:FedAvg", DecisionParams),
    "fedrspo": Method("hetfed.strategies.fedrspo:FedRSPO", CalibratedParams),
    "local-only": Method("hetfed.strategies.fedrspo:LocalOnly", CalibratedParams),
    # A yardstick, not a federation: one process pools every client's data (the inline engine's).
    "centralized": Method("hetfed.strategies.centralized:Centralized", CalibratedParams, ("inline",)),
    "softmax-switching": Method("hetfed.strategies.softmax_switching:SoftmaxSwitching", SwitchingParams),
    "penalty": Method("hetfed.strategies.constrained_baselines:FederatedPenalty", PenaltyParams),
    "primal-dual": Method("hetfed.strategies.constrained_baselines:FederatedPrimalDual", PrimalDualParams),
    "fedavg-unconstrained": Method(
        "hetfed.strategies.constrained_baselines:UnconstrainedFedAvg", ConstrainedParams
    ),
    "crpo": Method("hetfed.strategies.constrained_baselines:ParallelCRPO", ConstrainedParams),
    "pflsa": Method("hetfed.strategies.pflsa:PFLSA", PFLSAParams),
    "fedlsa": Method("hetfed.strategies.fedlsa:FedLSA", LSAParams),
    "scafflsa": Method("hetfed.strategies.fedlsa:SCAFFLSA", LSAParams),
    "single-lsa": Method("hetfed.strategies.lsa:SingleLSA", LSAParams),
}
