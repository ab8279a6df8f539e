"""The methods: strategy name -> its server-side class, imported when a run builds it.

The registry itself (name -> class path and the method's typed parameters) is
hetfed.methods.METHODS, from which the run-config schema is built.

Each class says which kind of problem it solves (``family``: decision, constrained, lsa),
which client class serves it (``client_handler``), its parameters (``params_type``, the
registry's), and how it is built from the run config (``build``: its initial model).
Importing a class imports only its own module: an LSA run imports neither the torch models
nor the decision and constrained strategies.
"""

from __future__ import annotations

from collections.abc import Mapping
from pkgutil import resolve_name
from typing import Any

from hetfed.methods import METHODS
from hetfed.params import ConfigError
from hetfed.problems.registry import get_problem
from hetfed.strategies.base import FederatedStrategy
from hetfed.strategies.robust import RobustAggregation

__all__ = ["METHODS", "build_strategy", "strategy_class"]


def strategy_class(name: str) -> type[FederatedStrategy]:
    """The class of strategy ``name``; one line naming the choices if there is none."""
    if name not in METHODS:
        raise ConfigError(f"run config 'strategy': unknown strategy {name!r}; choose one of {list(METHODS)}")
    cls: type[FederatedStrategy] = resolve_name(METHODS[name].strategy)
    return cls


def build_strategy(cfg: Mapping[str, Any]) -> FederatedStrategy:
    """The strategy named by ``cfg['strategy']``, with its seeded initial model."""
    name = cfg["strategy"]
    cls = strategy_class(name)
    spec = get_problem(cfg["problem"])
    if spec.family != cls.family:
        raise ConfigError(
            f"run config 'problem': strategy {name!r} needs a {cls.family} problem, "
            f"but {spec.name!r} is a {spec.family} problem"
        )
    strategy = cls.build(cfg)
    strategy.method = name  # recorded by the clients with the models they keep
    strategy.aggregation = RobustAggregation.for_run(cfg, cls.robust_refusal)
    strategy.secret_sample = cfg["dp"] != "off" and cfg["dp-sampling"] == "secret"
    return strategy
