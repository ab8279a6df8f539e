"""The run's readable report: a per-client table with the aggregate row, failures and segments."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hetfed.strategies.result_summary import is_extensive


def report_markdown(title: str, summary: Mapping[str, Any], columns: list[str] | None = None) -> str:
    """A readable per-client table with the aggregate row, plus failures."""
    clients: Mapping[str, Mapping[str, Any]] = summary.get("clients", {})
    if columns is None:
        seen: list[str] = []
        for m in clients.values():
            seen += [k for k in m if k not in seen]
        columns = [c for c in seen if not is_extensive(c)][:8]
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
    for key, what in (("failed-rounds", "Failed in rounds"), ("state-lost", "Lost its state in rounds")):
        if summary.get(key):
            lines += ["", f"{what} (rounds.csv has each reason):"]
            lines += [f"- {k}: {', '.join(map(str, v))}" for k, v in summary[key].items()]
    if privacy := summary.get("privacy"):
        lines += ["", "Privacy: " + privacy_line(privacy)]
    if len(summary.get("segments", [])) > 1:
        lines += ["", "Segments (the run was resumed):"] + [
            f"- {g['segment']}: {g['engine']}, started {g['started']}, "
            f"{_fmt(g['wall-time-s'])} s, {g['status']}"
            for g in summary["segments"]
        ]
    if summary.get("error"):
        lines += ["", f"Stopped: {summary['error']}"]
    return "\n".join(lines) + "\n"


def privacy_line(privacy: Mapping[str, Any]) -> str:
    """What protected the updates (summary.json ``privacy``), in one line."""
    parts = ["secure aggregation" if privacy.get("secure-aggregation") else "no secure aggregation"]
    if privacy.get("dp", "off") != "off":
        redone = privacy.get("redone-releases", 0)
        releases = f"{privacy['releases']} rounds"
        if redone:  # a round redone on resume: the server received its noised updates twice
            releases = f"{privacy['releases']} releases ({redone} of rounds redone after a stop)"
        parts.append(
            f"{privacy['dp']} DP, epsilon {_fmt(privacy['epsilon'])} at delta {_fmt(privacy['delta'])} after "
            f"{releases} (noise multiplier {_fmt(privacy['noise-multiplier'])}, "
            f"{privacy['clients-per-round']} of {privacy['clients']} clients per round"
            + (f", {relation} neighbours" if (relation := privacy.get("neighbouring-relation")) else "")
            + (f", {sample} sample" if (sample := privacy.get("sampling", {}).get("dp-sampling")) else "")
            + ")"
        )
    return "; ".join(parts)


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return "" if v is None else str(v)
