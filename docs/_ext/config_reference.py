"""The run-config reference, written from hetfed/config.py when the site is built.

Every run-config key is declared once, as a :class:`hetfed.params.Key` (the run's keys in
hetfed/config.py, each method's and problem's as fields of its parameters dataclass, hetfed/methods
and hetfed/problem_params.py). :func:`markdown` renders them as tables, one row per key (its type,
default, range or choices, who reads it and its help), grouped as hetfed/config.py groups them; the
Sphinx extension puts that text where docs/config-reference.md has :data:`MARKER`, so the page can
never list a key that no longer exists or miss a new one (tests/test_docs.py checks every key of
``SCHEMA`` is there).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from hetfed.config import (
    METHODS,
    PRIVACY_KEYS,
    PROBLEMS,
    ROBUST_KEYS,
    RUN_KEYS,
    SCHEMA,
    SIMULATED_NODE_KEYS,
    TRACKING_KEYS,
)
from hetfed.params import Key

MARKER = "<!-- run-config keys: written here by docs/_ext/config_reference.py -->"
PAGE = "config-reference"


def escaped(text: str) -> str:
    """Text as it reads, not as Markdown: every character Markdown could take as markup escaped,
    but a help's `code` (backticks in pairs) stays code, as typed."""
    parts = text.split("`") if text.count("`") % 2 == 0 else [text]
    return "`".join(
        part if i % 2 else re.sub(r"([\\`*_{}\[\]<>()#+!|~])", r"\\\1", part) for i, part in enumerate(parts)
    )


def code(value: object) -> str:
    """A value as TOML writes it (the form of ``--set key=value`` and pyproject.toml), in code."""
    if isinstance(value, bool):
        text = "true" if value else "false"
    elif isinstance(value, str):
        text = f'"{value}"'
    else:
        text = repr(value)
    return f"`{text}`"


def allowed(key: Key) -> str:
    """The values a key accepts: its choices, else its range (inclusive unless stated)."""
    if key.choices is not None:
        return ", ".join(code(c) for c in key.choices)
    if key.kind is bool:
        return "`true`, `false`"
    low = None if key.low is None else f"{'>' if key.low_open else '>='} {key.low:g}"
    high = None if key.high is None else f"<= {key.high:g}"
    return " and ".join(filter(None, (low, high))) or "any"


def table(keys: Mapping[str, Key], readers: Mapping[str, list[str]] | None = None) -> str:
    """One row per key; with ``readers``, a column naming what reads each key."""
    columns = ["key", "type", "default", "values", *(["read by"] if readers else []), "meaning"]
    rows = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for name, key in keys.items():
        cells = [f"`{name}`", key.kind.__name__, code(key.default), allowed(key)]
        if readers:
            cells.append(", ".join(f"`{r}`" for r in readers[name]))
        rows.append("| " + " | ".join([*cells, escaped(key.help)]) + " |")
    return "\n".join(rows)


def read_by(registry: Mapping[str, Any]) -> tuple[dict[str, Key], dict[str, list[str]]]:
    """Every key of a registry's parameters (a method's or a problem's), and which entries read it."""
    keys: dict[str, Key] = {}
    readers: dict[str, list[str]] = {}
    for entry, spec in registry.items():
        for name, key in spec.params.schema().items():
            keys.setdefault(name, key)
            readers.setdefault(name, []).append(entry)
    return keys, readers


def sections() -> Iterable[tuple[str, str, str]]:
    """(heading, what the keys are, table) in hetfed/config.py's groups."""
    grouped = PRIVACY_KEYS | ROBUST_KEYS | TRACKING_KEYS
    run = {k: v for k, v in RUN_KEYS.items() if k not in grouped}
    method_keys, strategies = read_by(METHODS)
    problem_keys, problems = read_by(PROBLEMS)
    yield "The run", "What every method, problem and engine reads.", table(run)
    yield (
        "Private updates",
        "Secure aggregation and differential privacy of the summed rounds "
        "([Security and privacy](security.md#private-updates-secure-aggregation-and-differential-privacy)).",
        table(PRIVACY_KEYS),
    )
    yield (
        "Robust aggregation",
        "A summed round's rule in plain mode "
        "([Security and privacy](security.md#robust-aggregation-against-a-bad-silo-plain-mode)).",
        table(ROBUST_KEYS),
    )
    yield (
        "Experiment tracking",
        "[MLflow](user-guide.md#experiment-tracking-mlflow).",
        table(TRACKING_KEYS),
    )
    yield (
        "Methods",
        "The parameters of each strategy (hetfed/methods), sent to its clients in every message; "
        "`read by` names the strategies (run-config `strategy`) whose parameters hold the key.",
        table(method_keys, strategies),
    )
    yield (
        "Problems",
        "What a ClientApp reads from its run config to make or load its data (hetfed/problem_params.py); "
        "`read by` names the problems (run-config `problem`).",
        table(problem_keys, problems),
    )
    yield (
        "Simulated nodes",
        "Set by `hetfed run --engine simulation` from `--data-path` and `--state-dir`.",
        table(SIMULATED_NODE_KEYS),
    )


def markdown() -> str:
    """Every run-config key, in tables by group; a key of SCHEMA in no group is an error."""
    parts = []
    listed: set[str] = set()
    for heading, about, rows in sections():
        parts.append(f"## {heading}\n\n{about}\n\n{rows}\n")
        listed |= set(re.findall(r"^\| `([^`]+)`", rows, re.M))
    if missing := sorted(set(SCHEMA) - listed):
        raise ValueError(f"run-config keys in no group of docs/_ext/config_reference.py: {missing}")
    return "\n".join(parts)


def fill_in(app: Any, docname: str, source: list[str]) -> None:
    """Sphinx ``source-read``: the reference page gets the tables where its marker stands."""
    if docname == PAGE:
        if MARKER not in source[0]:
            raise ValueError(f"docs/{PAGE}.md has no line {MARKER!r} for the generated tables")
        source[0] = source[0].replace(MARKER, markdown())


def setup(app: Any) -> dict[str, Any]:
    app.connect("source-read", fill_in)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
