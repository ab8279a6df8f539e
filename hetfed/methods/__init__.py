"""The methods: name -> its strategy class (imported only when a run builds it) and its typed
parameters, from which the run-config schema and every message's settings come."""

from __future__ import annotations

from dataclasses import dataclass

from hetfed.methods.constrained import ConstrainedParams, PenaltyParams, PrimalDualParams, SwitchingParams
from hetfed.methods.decision import CalibratedParams, DecisionParams
from hetfed.methods.lsa import LSAParams, PFLSAParams
from hetfed.params import Params


@dataclass(frozen=True)
class Method:
    """One method of the registry: its strategy class, ``module:Class`` (strategies/registry.py),
    and its parameters beyond the run's keys and its problem's."""

    strategy: str
    params: type[Params]


METHODS: dict[str, Method] = {
    "fedavg": Method("strategies.fedavg:FedAvg", DecisionParams),
    "fedrspo": Method("strategies.fedrspo:FedRSPO", CalibratedParams),
    "local-only": Method("strategies.fedrspo:LocalOnly", CalibratedParams),
    "softmax-switching": Method("strategies.softmax_switching:SoftmaxSwitching", SwitchingParams),
    "penalty": Method("strategies.constrained_baselines:FederatedPenalty", PenaltyParams),
    "primal-dual": Method("strategies.constrained_baselines:FederatedPrimalDual", PrimalDualParams),
    "fedavg-unconstrained": Method("strategies.constrained_baselines:UnconstrainedFedAvg", ConstrainedParams),
    "crpo": Method("strategies.constrained_baselines:ParallelCRPO", ConstrainedParams),
    "pflsa": Method("strategies.pflsa:PFLSA", PFLSAParams),
    "fedlsa": Method("strategies.fedlsa:FedLSA", LSAParams),
    "scafflsa": Method("strategies.fedlsa:SCAFFLSA", LSAParams),
    "single-lsa": Method("strategies.lsa:SingleLSA", LSAParams),
}
