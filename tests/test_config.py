"""The run-config schema: pyproject agrees with it; bad values are refused with the key named."""

from __future__ import annotations

import pytest

from hetfed.config import SCHEMA, ConfigError, parse_assignments, pyproject_config, to_toml, validate
from tests.conftest import REPO


def test_pyproject_config_is_the_schema() -> None:
    table = pyproject_config(REPO / "pyproject.toml")
    assert table == {name: key.default for name, key in SCHEMA.items()}
    for name, value in table.items():  # same types, so flwr --run-config overrides type-check alike
        assert type(value) is SCHEMA[name].kind, name


def test_validate_fills_defaults_and_converts_int_to_float() -> None:
    cfg = validate({"eta-o": 1, "seed": 7})
    assert cfg["eta-o"] == 1.0 and isinstance(cfg["eta-o"], float)
    assert cfg["seed"] == 7 and cfg["num-rounds"] == SCHEMA["num-rounds"].default


@pytest.mark.parametrize(
    ("config", "culprit"),
    [
        ({"num-roundz": 3}, "num-roundz"),
        ({"num-rounds": "3"}, "num-rounds"),
        ({"num-rounds": 2.5}, "num-rounds"),
        ({"num-rounds": True}, "num-rounds"),
        ({"num-rounds": 0}, "num-rounds"),
        ({"fraction": 0.0}, "fraction"),
        ({"fraction": 1.5}, "fraction"),
        ({"lr": float("nan")}, "lr"),
        ({"strategy": "fedsgd"}, "strategy"),
        ({"problem": "tsp"}, "problem"),
    ],
)
def test_validate_names_the_culprit(config: dict, culprit: str) -> None:
    with pytest.raises(ConfigError, match=f"'{culprit}'") as err:
        validate(config)
    assert "\n" not in str(err.value)


def test_unknown_key_suggests_the_close_one() -> None:
    with pytest.raises(ConfigError, match="did you mean 'num-rounds'"):
        validate({"num-round": 3})


def test_parse_assignments_types_values() -> None:
    got = parse_assignments(
        ["num-rounds=3", "lr=0.01", "problem=knapsack", "audit-traffic=true", "run-name='a.b'", "eta-o=1"]
    )
    assert got == {
        "num-rounds": 3,
        "lr": 0.01,
        "problem": "knapsack",
        "audit-traffic": True,
        "run-name": "a.b",
        "eta-o": 1.0,
    }
    for bad, culprit in (["nope=1"], "nope"), (["num-rounds=x"], "num-rounds"), (["num-rounds"], "key=value"):
        with pytest.raises(ConfigError, match=culprit):
            parse_assignments(bad)


def test_toml_round_trip() -> None:
    import tomllib

    values = {"run-name": 'we"ird\\name', "lr": 0.5, "seed": 3, "audit-traffic": False}
    assert tomllib.loads(to_toml(values)) == values


def test_the_problems_parameter_defaults_are_the_run_configs() -> None:
    """A problem built from the default run config is the problem its parameter class describes."""
    from hetfed.problems.knapsack import KnapsackParams
    from hetfed.problems.shortest_path import ShortestPathParams

    assert KnapsackParams.from_config(validate({"problem": "knapsack"})) == KnapsackParams()
    assert ShortestPathParams.from_config(validate({"problem": "shortest-path"})) == ShortestPathParams()


def test_the_problem_keys_are_the_registered_problems_parameters() -> None:
    """PROBLEM_SCHEMA and the choices of ``problem`` come from PROBLEMS (hetfed/problem_params.py); a
    key two problems share (n-train: knapsack, shortest path) means the same in both."""
    from hetfed.config import PROBLEM_SCHEMA, PROBLEMS, SIMULATED_NODE_KEYS

    assert list(SCHEMA["problem"].choices or ()) == list(PROBLEMS)
    declared = [(key, spec) for p in PROBLEMS.values() for key, spec in p.params.schema().items()]
    assert set(PROBLEM_SCHEMA) == {key for key, _ in declared} | set(SIMULATED_NODE_KEYS)
    for key, spec in declared:
        assert PROBLEM_SCHEMA[key] == spec, key
    assert {"n-train", "num-features"} <= set(PROBLEMS["shortest-path"].params.schema())


@pytest.mark.parametrize(
    ("config", "line"),
    [
        (
            {"dp-noise-multiplier": 2.0},
            "run config 'dp-noise-multiplier': set while dp = off; set dp = central or local, or drop it",
        ),
        (
            {"dp": "off", "dp-clipping-norm": 0.5, "dp-epsilon": 3.0},
            "run config 'dp-clipping-norm': set while dp = off; set dp = central or local, or drop it",
        ),
        (
            {"dp-epsilon": 3.0},
            "run config 'dp-epsilon': set while dp = off; set dp = central or local, or drop it",
        ),
        (
            {"dp-sampling": "secret"},
            "run config 'dp-sampling': set while dp = off; set dp = central or local, or drop it",
        ),
        (
            {"dp": "local", "dp-sampling": "secret"},
            "run config 'dp-sampling': a secret sample amplifies only against those who cannot see it, and "
            "local DP's adversary is the server, which sees every release; use dp-sampling = public",
        ),
        (
            {"dp": "local", "dp-clipping": "adaptive"},
            "run config 'dp-clipping': adaptive clipping needs each client's within-clip bit, which "
            "local DP does not release; use dp-clipping = fixed, or dp = central",
        ),
        (
            {"dp": "central", "strategy": "fedrspo", "per-client-calibration": False},
            "run config 'per-client-calibration': false shares the mean of the clients' calibration "
            "(lam0_j, lr0_j, computed from their data) without noise, outside the DP accountant; keep it "
            "true under dp",
        ),
    ],
)
def test_dp_keys_that_would_not_take_effect_are_refused_in_one_line(config: dict, line: str) -> None:
    with pytest.raises(ConfigError) as err:
        validate(config)
    assert str(err.value) == line


def test_dp_keys_at_their_defaults_pass_without_dp() -> None:
    """The ServerApp sees the merged run config: every dp-* key at its default means "not given"."""
    defaults = {name: key.default for name, key in SCHEMA.items() if name.startswith("dp")}
    assert validate(defaults)["dp"] == "off"
    assert validate({"dp": "central", "dp-noise-multiplier": 2.0})["dp-noise-multiplier"] == 2.0
    assert validate({"dp": "central", "dp-clipping": "adaptive"})["dp-clipping"] == "adaptive"
    # Shared calibration is refused under DP only where the method calibrates (FedRSPO+), and without DP.
    assert validate({"dp": "central", "per-client-calibration": False})["strategy"] == "fedavg"
    assert not validate({"strategy": "fedrspo", "per-client-calibration": False})["per-client-calibration"]
