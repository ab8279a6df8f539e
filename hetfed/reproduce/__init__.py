"""``hetfed reproduce <experiment>``: the papers' experiments, with tables in docs/results/.

Each experiment is a module of this package with ``add_arguments(parser)`` (its own options) and
``run(args) -> int``; :data:`EXPERIMENTS` maps the command-line name to the module.
"""

from __future__ import annotations

EXPERIMENTS = {
    "knapsack": "hetfed.reproduce.knapsack",
    "knapsack-study": "hetfed.reproduce.knapsack_study",
    "energy": "hetfed.reproduce.energy",
    "energy-pilot": "hetfed.reproduce.energy_pilot",
    "shortest-path": "hetfed.reproduce.shortest_path",
    "np-classification": "hetfed.reproduce.switching",
    "fair-classification": "hetfed.reproduce.switching",
    "safe-rl": "hetfed.reproduce.switching",
    "safe-rl-trpo": "hetfed.reproduce.switching",
    "switching-study": "hetfed.reproduce.switching_study",
    "pflsa": "hetfed.reproduce.pflsa",
    "pflsa-communication": "hetfed.reproduce.pflsa_communication",
    "pflsa-theory": "hetfed.reproduce.pflsa_theory",
    "lp-pilot": "hetfed.reproduce.lp_pilot",
    "dp-knapsack": "hetfed.reproduce.dp_knapsack",
}
