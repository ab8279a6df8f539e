"""Per-client final metrics -> the run's summary and its readable report."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any


def summarize(
    per_client: Mapping[str, Mapping[str, float]], failed: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """Macro averages (mean over clients of each metric), pooled ratios and failures.

    ``aggregate[m] = (1/J) sum_j m_j`` over the J clients that reported m (sums such as
    ``regret-sum`` and counts are not averaged); ``aggregate[pooled] = sum_j num_j / sum_j den_j``.
    """
    aggregate: dict[str, float] = {}
    names = sorted(
        {
            k
            for m in per_client.values()
            for k, v in m.items()
            if isinstance(v, int | float) and not _is_extensive(k)
        }
    )
    for key in names:
        values = [float(m[key]) for m in per_client.values() if key in m]
        aggregate[key] = sum(values) / len(values)
    for name, (num, den) in pooled_ratios(per_client).items():
        if all(num in m and den in m for m in per_client.values()):
            total = sum(float(m[den]) for m in per_client.values())
            aggregate[name] = sum(float(m[num]) for m in per_client.values()) / total if total else math.nan
    aggregate["clients-reporting"] = len(per_client)
    return {
        "clients": {k: dict(v) for k, v in sorted(per_client.items())},
        "aggregate": aggregate,
        "failed": dict(failed or {}),
    }


def pooled_ratios(per_client: Mapping[str, Mapping[str, float]]) -> dict[str, tuple[str, str]]:
    """``<p>pooled-relative-regret = sum_j <p>regret-sum / sum_j <p>abs-opt-sum`` for every prefix p."""
    keys = {k for m in per_client.values() for k in m}
    return {
        f"{k[: -len('regret-sum')]}pooled-relative-regret": (k, k[: -len("regret-sum")] + "abs-opt-sum")
        for k in keys
        if k.endswith("regret-sum")
    }


def report_markdown(title: str, summary: Mapping[str, Any], columns: list[str] | None = None) -> str:
    """A readable per-client table with the aggregate row, plus failures."""
    clients: Mapping[str, Mapping[str, Any]] = summary.get("clients", {})
    if columns is None:
        seen: list[str] = []
        for m in clients.values():
            seen += [k for k in m if k not in seen]
        columns = [c for c in seen if not _is_extensive(c)][:8]
    lines = [f"# {title}", "", "| client | " + " | ".join(columns) + " |", "|---|" + "---|" * len(columns)]
    for name, m in clients.items():
        lines.append(f"| {name} | " + " | ".join(_fmt(m.get(c)) for c in columns) + " |")
    agg = summary.get("aggregate", {})
    lines.append("| **mean over clients** | " + " | ".join(_fmt(agg.get(c)) for c in columns) + " |")
    extra = {k: v for k, v in agg.items() if k not in columns}
    if extra:
        lines += ["", "Aggregate: " + ", ".join(f"{k} = {_fmt(v)}" for k, v in extra.items())]
    if summary.get("failed"):
        lines += ["", "Failures:"] + [f"- {k}: {v}" for k, v in summary["failed"].items()]
    if len(summary.get("segments", [])) > 1:
        lines += ["", "Segments (the run was resumed):"] + [
            f"- {g['segment']}: {g['engine']}, started {g['started']}, "
            f"{_fmt(g['wall-time-s'])} s, {g['status']}"
            for g in summary["segments"]
        ]
    if summary.get("error"):
        lines += ["", f"Stopped: {summary['error']}"]
    return "\n".join(lines) + "\n"


def _is_extensive(key: str) -> bool:
    """Totals and counts: meaningful summed, not averaged over clients."""
    return key.endswith("-sum") or key == "num-examples"


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return "" if v is None else str(v)
