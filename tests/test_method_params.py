"""A method's typed parameters (hetfed/methods) are the one source of its run-config keys, of its
strategy's settings and of what its clients rebuild from each message."""

from __future__ import annotations

from dataclasses import FrozenInstanceError, fields

import pytest
from flwr.app import ConfigRecord

from hetfed.config import METHOD_SCHEMA, PROBLEM_KEYS, RUN_KEYS, SCHEMA, ConfigError, Key, validate
from hetfed.methods import METHODS
from hetfed.methods.decision import LOSSES, CalibratedParams, DecisionParams, phase_loss
from hetfed.params import Params
from hetfed.strategies.registry import build_strategy, strategy_class

PROBLEM = {"decision": "knapsack", "constrained": "np-classification", "lsa": "garnet"}


def other_value(key: Key) -> bool | int | float | str:
    """A valid value of ``key`` that is not its default."""
    if isinstance(key.default, bool):
        return not key.default
    if key.choices is not None:
        return next(c for c in key.choices if c != key.default)
    if isinstance(key.default, int):
        value = key.default + 1
        return value if key.high is None or value <= key.high else key.default - 1
    value = key.default + 0.5 if key.high is None else (key.default + key.high) / 2
    if value == key.default:  # at the upper bound
        value = (key.default + (key.low or 0.0)) / 2
    return value


def changed(params: type[Params]) -> dict[str, bool | int | float | str]:
    """Every key of ``params`` at a value other than its default."""
    return {name: other_value(key) for name, key in params.schema().items()}


@pytest.mark.parametrize("name", list(METHODS))
def test_a_strategy_holds_the_parameters_its_registry_entry_names(name: str) -> None:
    assert strategy_class(name).params_type is METHODS[name].params


@pytest.mark.parametrize("name", list(METHODS))
def test_every_value_of_the_run_config_reaches_the_strategy_and_its_clients_messages(name: str) -> None:
    """Each of the method's keys at a non-default value: the built strategy holds it, and the
    settings of its messages, through a real ConfigRecord, rebuild the same typed parameters."""
    params = METHODS[name].params
    values = changed(params)
    if name in ("fedavg",):
        values["loss"] = "spo+"  # RSPO+ and OptNet need fedrspo's calibration
    if params is CalibratedParams:
        values["ditto-mu"] = 0.0  # Ditto keeps its own personal model: no personalization with it
    if "lsa-local-steps" in values and name == "pflsa":
        values["lsa-local-steps"] = 1  # PF-LSA exchanges every iteration
    if name.endswith("lsa"):
        values["lsa-report-every"] = 1
    cfg = validate({"strategy": name, "problem": PROBLEM[strategy_class(name).family], **values})
    strategy = build_strategy(cfg)
    assert strategy.params.to_config() == {k: cfg[k] for k in params.schema()}
    assert any(v != params.schema()[k].default for k, v in strategy.params.to_config().items())
    record = ConfigRecord(strategy.client_settings())
    assert params.from_config(record) == strategy.params
    assert record["client"] == strategy.client_handler and record["method"] == name


def test_parameters_round_trip_refuse_bad_values_by_key_and_are_frozen() -> None:
    p = CalibratedParams.from_config(changed(CalibratedParams))
    assert CalibratedParams.from_config(p.to_config()) == p != CalibratedParams()
    assert DecisionParams.from_config({**p.to_config(), "unrelated": 1}).loss == p.loss
    assert DecisionParams.from_config({"lr": 3}).lr == 3.0 and isinstance(
        DecisionParams.from_config({"lr": 3}).lr, float
    )
    with pytest.raises(ConfigError, match="'kappa-lam': must be >= 0"):
        DecisionParams.from_config({"kappa-lam": -1.0})
    with pytest.raises(ConfigError, match="'loss': unknown value 'l2'"):
        DecisionParams.from_config({"loss": "l2"})
    with pytest.raises(FrozenInstanceError):
        setattr(p, "lr", 1.0)  # noqa: B010  # a method's parameters do not change mid-run


def test_the_schema_is_the_run_the_methods_parameters_and_the_problems() -> None:
    method_keys = {key for m in METHODS.values() for key in m.params.schema()}
    assert set(METHOD_SCHEMA) == method_keys
    assert set(SCHEMA) == set(RUN_KEYS) | method_keys | PROBLEM_KEYS
    for m in METHODS.values():  # a key shared by two methods (batch-size) means the same in both
        for key, spec in m.params.schema().items():
            assert METHOD_SCHEMA[key] == spec, key
    assert [f.name for f in fields(DecisionParams)] == [k.replace("-", "_") for k in DecisionParams.schema()]


def test_a_loss_says_what_it_needs() -> None:
    """docs/algorithms.md 1.1-1.5: RSPO+ projects, has a calibrated step and anneals; OptNet projects;
    mse->spo+ warms up with MSE and personalizes with SPO+; the others need nothing."""
    assert {n for n, loss in LOSSES.items() if loss.needs_calibration} == {"rspo+", "optnet"}
    assert {n for n, loss in LOSSES.items() if loss.anneals} == {"rspo+"}
    assert (phase_loss("mse->spo+", "warm"), phase_loss("mse->spo+", "personal")) == ("mse", "spo+")
    assert {phase_loss(n, "personal") for n in LOSSES if n != "mse->spo+"} == set(LOSSES) - {"mse->spo+"}
    assert set(DecisionParams.schema()["loss"].choices or ()) == set(LOSSES)
    with pytest.raises(ConfigError, match="needs the per-client calibration"):
        build_strategy(validate({"strategy": "fedavg", "loss": "optnet"}))


def test_hetfed_config_lists_a_methods_keys_and_no_other_methods(capsys: pytest.CaptureFixture[str]) -> None:
    from hetfed.cli import main

    assert main(["config", "--strategy", "pflsa"]) == 0
    listed = {line.split()[0] for line in capsys.readouterr().out.splitlines()}
    assert {"pflsa-beta", "lsa-eta", "num-rounds", "garnet-states"} <= listed
    assert not listed & {"switching-alpha", "loss", "per-client-calibration"}
