"""Per-client final metrics -> the run's summary: macro averages, pooled ratios, failures."""

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
            if isinstance(v, int | float) and not is_extensive(k)
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
    keys = dict.fromkeys(k for m in per_client.values() for k in m)  # in order: rounds.csv's columns
    return {
        f"{k[: -len('regret-sum')]}pooled-relative-regret": (k, k[: -len("regret-sum")] + "abs-opt-sum")
        for k in keys
        if k.endswith("regret-sum")
    }


def is_extensive(key: str) -> bool:
    """Totals and counts: meaningful summed, not averaged over clients."""
    return key.endswith("-sum") or key == "num-examples"
