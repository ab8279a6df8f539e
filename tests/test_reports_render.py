"""Every committed report in docs/results is exactly what its reproduction renders from the JSON
beside it (so the report's text and numbers come from the committed JSON, and a change to a
report's template or renderer that changes a committed report shows up here)."""

from __future__ import annotations

import difflib
import importlib
import json
from pathlib import Path

import pytest

from hetfed.reproduce.knapsack_study import STUDIES

RESULTS = Path(__file__).resolve().parents[1] / "docs" / "results"

# report name -> the module whose ``markdown(data)`` renders docs/results/<name>.md from <name>.json
RENDERERS = {
    "lp-pilot": "hetfed.reproduce.lp_pilot",
    "dp-knapsack": "hetfed.reproduce.dp_knapsack",
    "energy": "hetfed.reproduce.energy",
    "energy-pilot": "hetfed.reproduce.energy_pilot",
    "pflsa": "hetfed.reproduce.pflsa",
    "shortest-path": "hetfed.reproduce.shortest_path",
    "pflsa-communication": "hetfed.reproduce.pflsa_communication",
    "pflsa-theory": "hetfed.reproduce.pflsa_theory",
    "knapsack": "hetfed.reproduce.knapsack",
    **{f"knapsack-{study}": "hetfed.reproduce.knapsack_study" for study in STUDIES},
    "np-classification": "hetfed.reproduce.switching",
    "fair-classification": "hetfed.reproduce.switching",
    "safe-rl": "hetfed.reproduce.switching",
    "safe-rl-trpo": "hetfed.reproduce.switching",
    "switching-study": "hetfed.reproduce.switching_study",
}


@pytest.mark.parametrize("name", sorted(RENDERERS))
def test_report_renders_from_its_json(name: str) -> None:
    data = json.loads((RESULTS / f"{name}.json").read_text(encoding="utf-8"))
    rendered = importlib.import_module(RENDERERS[name]).markdown(data)
    committed = (RESULTS / f"{name}.md").read_text(encoding="utf-8")
    diff = "".join(difflib.unified_diff(committed.splitlines(True), rendered.splitlines(True), n=1))
    assert rendered == committed, f"docs/results/{name}.md differs from its rendering:\n{diff[:3000]}"
