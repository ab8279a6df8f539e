"""A round as explicit phases (strategies/base.py, docs/algorithms.md "The round loop"): which
exchanges each method runs in which round, which of them the loop may sum, and that listing the
phases of a round draws nothing from the state (the messages are built only when sent)."""

from __future__ import annotations

from typing import Any

import pytest

from hetfed.config import validate
from hetfed.strategies.registry import build_strategy

# strategy, run config -> per round checked: the phases' names, "+" marking a summed phase
CASES: list[tuple[dict[str, Any], dict[int, list[str]]]] = [
    (
        {"strategy": "fedavg", "num-rounds": 2},
        {0: [], 1: ["train+", "evaluate"], 2: ["train+", "evaluate"]},
    ),
    (
        {"strategy": "fedrspo", "num-rounds": 2, "personal-rounds": 3},
        {0: ["calibrate"], 2: ["train+", "evaluate"], 3: ["personalize", "evaluate"]},
    ),
    (
        {"strategy": "fedrspo", "num-rounds": 2, "per-client-calibration": False},
        {0: ["calibrate", "masked-calibration+"], 1: ["train+", "evaluate"]},
    ),
    (
        {"strategy": "local-only", "num-rounds": 2, "loss": "spo+"},
        {0: ["calibrate"], 1: ["train", "evaluate"], 3: ["personalize", "evaluate"]},
    ),
    (
        {"strategy": "softmax-switching", "problem": "quadratic", "num-rounds": 4, "switching-eval-every": 2},
        {0: ["evaluate"], 1: ["query", "train+", "evaluate"]},
    ),
    (
        {"strategy": "crpo", "problem": "quadratic", "num-rounds": 4, "switching-eval-every": 0},
        {0: [], 4: ["query", "train+", "evaluate"]},
    ),
    ({"strategy": "pflsa", "problem": "garnet"}, {0: [], 1: ["train+", "evaluate"]}),
    ({"strategy": "single-lsa", "problem": "garnet"}, {1: ["train", "evaluate"]}),
]


@pytest.mark.parametrize(("cfg", "expected"), CASES, ids=[c["strategy"] for c, _ in CASES])
def test_each_method_lists_its_rounds_phases(cfg: dict[str, Any], expected: dict[int, list[str]]) -> None:
    strategy = build_strategy(validate(cfg))
    state = repr(strategy.state_dict())
    for server_round, names in expected.items():
        phases = strategy.phases(server_round)
        assert [p.name + ("+" if p.fold_sum is not None else "") for p in phases] == names, server_round
        assert all(
            (p.fold_sum is not None) == strategy.sums(server_round) for p in phases if p.name == "train"
        )
    assert repr(strategy.state_dict()) == state  # listing phases draws no sample, sends nothing
