"""Strategies are built from keywords (as Flower's): their defaults are the run config's defaults."""

from __future__ import annotations

import inspect

import pytest

from hetfed.config import PROBLEM_KEYS, RUN_KEYS, SCHEMA, validate
from strategies.registry import METHODS, build_strategy, strategy_class

PROBLEM = {"decision": "knapsack", "constrained": "np-classification", "lsa": "garnet"}


def keyword_defaults(cls: type) -> dict[str, object]:
    """Every keyword default along ``cls``'s constructors (the most derived one wins)."""
    out: dict[str, object] = {}
    for klass in reversed(cls.__mro__):
        if "__init__" in vars(klass):
            for name, param in inspect.signature(vars(klass)["__init__"]).parameters.items():
                if param.default is not inspect.Parameter.empty:
                    out[name] = param.default
    return out


@pytest.mark.parametrize("name", list(METHODS))
def test_every_constructor_default_is_the_run_configs_default(name: str) -> None:
    cls = strategy_class(name)
    defaults = keyword_defaults(cls)
    for param, key in cls.config_map().items():
        assert key in SCHEMA, f"{cls.__name__}.{param} maps to unknown key {key!r}"
        if param in defaults:
            assert defaults[param] == SCHEMA[key].default, f"{cls.__name__}({param}=) vs {key!r}"
    assert set(cls.client_keys) <= set(SCHEMA)


@pytest.mark.parametrize("name", list(METHODS))
def test_build_passes_each_mapped_key_to_its_keyword(name: str) -> None:
    """A run-config value reaches the constructor keyword it is mapped to (not a default)."""
    cls = strategy_class(name)
    cfg = validate({"strategy": name, "problem": PROBLEM[cls.family]})
    seen: dict[str, object] = {}
    original, own = cls.__init__, "__init__" in vars(cls)

    def spy(self, **kwargs: object) -> None:
        seen.update(kwargs)
        original(self, **kwargs)

    cls.__init__ = spy  # type: ignore[method-assign]  # records the keywords, then builds for real
    try:
        build_strategy(cfg)
    finally:
        if own:
            cls.__init__ = original  # type: ignore[method-assign]
        else:
            del cls.__init__  # back to the inherited constructor
    assert {p: seen[p] for p in cls.config_map()} == {p: cfg[k] for p, k in cls.config_map().items()}
    assert seen["client_options"] == {k: cfg[k] for k in cls.client_keys}


@pytest.mark.parametrize("name", list(METHODS))
def test_the_registry_lists_exactly_the_keys_each_method_reads(name: str) -> None:
    """hetfed.config.METHODS[name].keys (the schema's source) == what its class reads, beyond the
    run's and the problem's keys: its constructor's keywords and its client handler's values."""
    cls = strategy_class(name)
    reads = set(cls.config_map().values()) | set(cls.client_keys)
    assert reads - set(RUN_KEYS) - PROBLEM_KEYS == set(METHODS[name].keys)


def test_every_schema_key_is_read_by_the_run_a_method_or_a_problem() -> None:
    method_keys = {key for method in METHODS.values() for key in method.keys}
    assert set(SCHEMA) == set(RUN_KEYS) | method_keys | PROBLEM_KEYS


def test_hetfed_config_lists_a_methods_keys_and_no_other_methods(
    capsys: pytest.CaptureFixture[str]) -> None:
    from hetfed.cli import main

    assert main(["config", "--strategy", "pflsa"]) == 0
    listed = {line.split()[0] for line in capsys.readouterr().out.splitlines()}
    assert {"pflsa-beta", "lsa-eta", "num-rounds", "garnet-states"} <= listed
    assert not listed & {"switching-alpha", "loss", "per-client-calibration"}
