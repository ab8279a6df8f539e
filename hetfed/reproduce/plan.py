"""A reproduction as data: its plan file, the runs (jobs) it expands to, and the one runner.

A plan file is ``hetfed/reproduce/plans/<experiment>.toml`` with one schema:

- ``seeds``: a named list of :data:`SEEDS` (``"paper"``, ``"pilot"``) or a list of integers;
- ``nodes``: the federation size of every run (optional; else the experiment says);
- ``[base]``: the run config every run shares; ``[quick]``: what ``--quick`` adds to it
  (both checked against :data:`hetfed.config.SCHEMA`);
- ``[axes]``: the grid's named lists of values (the experiment says what each value sets);
- ``[[runs]]``: runs beyond the axes' product, each a ``table``, ``method``, the ``rows`` axis it
  runs on, its ``config`` overrides and optionally its federation size ``nodes`` and the ``label``
  a report gives it;
- ``[budget]``: the experiment's own parameters that are no run-config keys (horizons, run counts,
  levels), with ``[budget.quick]``: the ones ``--quick`` replaces;
- ``[paper]``: the paper's numbers, as the report quotes them.

A malformed plan raises :class:`PlanError` with one line naming the file, the key and the culprit.
"""

from __future__ import annotations

import argparse
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hetfed.reproduce.common import run_many

PLANS = Path(__file__).resolve().parent / "plans"
SEEDS: dict[str, tuple[int, ...]] = {
    "paper": (42, 69, 1993, 67, 2026),  # the papers' seeds
    "pilot": (42, 43, 44, 45, 46),  # the pilots' and the DP study's (no paper to match)
}
KEYS = ("seeds", "nodes", "base", "quick", "axes", "runs", "budget", "paper")
RUN_KEYS = ("table", "method", "rows", "config")


class PlanError(ValueError):
    """A malformed plan file (the message names the file, the key and the culprit)."""


@dataclass(frozen=True)
class Job:
    """One run of a reproduction: its place in the tables (``key``), its seed, its run config and
    its federation size (``nodes``; None: the size :func:`run_jobs` is given)."""

    key: tuple[str, ...]
    seed: int
    config: dict[str, Any]
    nodes: int | None = None


@dataclass(frozen=True)
class Plan:
    """A parsed plan file (module docs); ``load`` reads and checks one."""

    name: str
    seeds: tuple[int, ...]
    base: dict[str, Any] = field(default_factory=dict)
    quick: dict[str, Any] = field(default_factory=dict)
    axes: dict[str, list[Any]] = field(default_factory=dict)
    runs: tuple[dict[str, Any], ...] = ()
    budget: dict[str, Any] = field(default_factory=dict)
    paper: dict[str, Any] = field(default_factory=dict)
    nodes: int | None = None

    @classmethod
    def load(cls, name: str, path: Path | None = None) -> Plan:
        """The plan ``plans/<name>.toml`` (or ``path``), checked; PlanError on the first flaw."""
        path = path or PLANS / f"{name}.toml"
        try:
            raw = tomllib.loads(path.read_text(encoding="utf-8"))
        except (OSError, tomllib.TOMLDecodeError) as err:
            raise PlanError(f"{path}: {err}") from None
        return cls(name, **_checked(path, raw))

    def config(self, quick: bool, **overrides: Any) -> dict[str, Any]:
        """The base run config (plus ``[quick]`` with ``quick``), then ``overrides``."""
        return {**self.base, **(self.quick if quick else {}), **overrides}

    def budget_for(self, quick: bool) -> dict[str, Any]:
        """``[budget]`` without its ``quick`` table, which replaces some of its values with ``quick``."""
        full = {k: v for k, v in self.budget.items() if k != "quick"}
        return {**full, **(self.budget.get("quick", {}) if quick else {})}

    def chosen_seeds(self, count: int, quick: bool) -> tuple[int, ...]:
        """The first ``count`` (``--seeds``) of the plan's seeds (the first one only with ``quick``);
        ValueError for a count the plan does not have."""
        if not 1 <= count <= len(self.seeds):
            raise ValueError(f"--seeds: must be in 1..{len(self.seeds)}, got {count}")
        return self.seeds[:1] if quick else self.seeds[:count]


def _checked(path: Path, raw: Mapping[str, Any]) -> dict[str, Any]:
    """``raw``'s keys as :class:`Plan`'s fields, each checked (PlanError naming file, key, culprit)."""
    from hetfed.config import ConfigError, validate

    def fail(key: str, problem: str) -> PlanError:
        return PlanError(f"{path}: {key}: {problem}")

    def check_config(key: str, config: Any) -> None:
        if not isinstance(config, dict):
            raise fail(key, f"expected a table, got {config!r}")
        try:
            validate(config)
        except ConfigError as err:  # "run config: unknown key ..." or "run config 'key': ..."
            raise fail(key, str(err).removeprefix("run config").lstrip(": ")) from None

    unknown = [k for k in raw if k not in KEYS]
    if unknown:
        raise fail(unknown[0], f"unknown key (a plan has {', '.join(KEYS)})")
    seeds = raw.get("seeds")
    if isinstance(seeds, str):
        if seeds not in SEEDS:
            raise fail("seeds", f"{seeds!r} names no seed list (known: {', '.join(SEEDS)})")
        seeds = SEEDS[seeds]
    if not isinstance(seeds, list | tuple) or not seeds or not all(type(s) is int for s in seeds):
        raise fail("seeds", f"expected a seed list's name or a non-empty list of integers, got {seeds!r}")
    nodes = raw.get("nodes")
    if nodes is not None and (type(nodes) is not int or nodes < 1):
        raise fail("nodes", f"expected a positive integer, got {nodes!r}")
    for key in ("axes", "budget", "paper"):
        if not isinstance(raw.get(key, {}), dict):
            raise fail(key, f"expected a table, got {raw[key]!r}")
    for key in ("base", "quick"):
        check_config(key, raw.get(key, {}))
    budget = raw.get("budget", {})
    quick_budget = budget.get("quick", {})
    if not isinstance(quick_budget, dict):
        raise fail("budget.quick", f"expected a table, got {quick_budget!r}")
    for key in quick_budget:
        if key not in budget:
            raise fail(f"budget.quick.{key}", "not a key of [budget] (--quick replaces values, adds none)")
    axes = raw.get("axes", {})
    for axis, values in axes.items():
        if not isinstance(values, list) or not values:
            raise fail(f"axes.{axis}", f"expected a non-empty list, got {values!r}")
    runs = raw.get("runs", [])
    if not isinstance(runs, list):
        raise fail("runs", f"expected an array of tables ([[runs]]), got {runs!r}")
    for i, entry in enumerate(runs):
        where = f"runs[{i}]"
        if not isinstance(entry, dict):
            raise fail(where, f"expected a table, got {entry!r}")
        missing = [k for k in RUN_KEYS if k not in entry]
        extra = [k for k in entry if k not in (*RUN_KEYS, "nodes", "label")]
        if missing or extra:
            raise fail(where, f"{'missing' if missing else 'unknown'} key {(missing or extra)[0]!r}")
        if entry["rows"] not in axes:
            raise fail(f"{where}.rows", f"{entry['rows']!r} is not an axis of [axes]")
        check_config(f"{where}.config", entry["config"])
        if not isinstance(entry.get("nodes", 1), int) or entry.get("nodes", 1) < 1:
            raise fail(f"{where}.nodes", f"expected a federation size >= 1, got {entry['nodes']!r}")
    return {
        "seeds": tuple(seeds),
        "base": raw.get("base", {}),
        "quick": raw.get("quick", {}),
        "axes": axes,
        "runs": tuple(runs),
        "budget": budget,
        "paper": raw.get("paper", {}),
        "nodes": nodes,
    }


def run_jobs(
    jobs: list[Job],
    args: argparse.Namespace,
    *,
    nodes: int | None = None,
    data_path: str | None = None,
    describe: Callable[[Mapping[str, Any]], str] = lambda summary: "",
) -> list[dict[str, Any]]:
    """Run ``jobs`` with the command line's ``--engine``, ``--workers`` and ``--results-dir``
    (:func:`hetfed.reproduce.common.run_many`, once per federation size, smallest first: a job's
    ``nodes``, else ``nodes``); their summaries in the jobs' order. A job whose strategy runs on
    some engines only (hetfed.methods ``engines``: the centralized yardstick) runs on its first."""
    from hetfed.methods import METHODS

    groups = []  # per job: (federation size, engine)
    for job in jobs:
        size = job.nodes or nodes
        if size is None:
            raise ValueError(f"run_jobs: {job.config['run-name']} has no federation size")
        method = METHODS.get(str(job.config.get("strategy", "")))
        only = method.engines if method is not None else ()
        groups.append((size, args.engine if not only or args.engine in only else only[0]))
    summaries: list[dict[str, Any]] = [{}] * len(jobs)
    for size, engine in sorted(set(groups)):
        index = [i for i, group in enumerate(groups) if group == (size, engine)]
        done = run_many(
            [jobs[i].config for i in index],
            nodes=size,
            results_dir=Path(args.results_dir),
            engine=engine,
            workers=args.workers,
            describe=describe,
            data_path=data_path,
        )
        for i, summary in zip(index, done, strict=True):
            summaries[i] = summary
    return summaries
