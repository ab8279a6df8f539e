"""Reading hetfed runs back for the reproductions: a stage's regret from a summary, the per-round
validation curves and freeze rounds (from the run's rounds, hetfed.server.store.RunResult), and
runs' curves as plots."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any


def cell(summary: Mapping[str, Any], stage: str) -> float:
    """Relative regret (%) of a run's ``fed``, ``per`` or ``interp`` model (mean over clients)."""
    value = summary["aggregate"].get(f"{stage}-relative-regret")
    return 100 * value if value is not None else float("nan")


def curves(run_dir: Path) -> dict[str, Any]:
    """Per-round validation regret (warm start, then personalization) and per-client freeze statistics."""
    from hetfed.server.store import RunResult

    run = RunResult.read(run_dir)
    warm: dict[int, list[float]] = {}
    for t, _, value in run.values("val-relative-regret", "train"):
        warm.setdefault(t, []).append(100 * value)
    personal: dict[int, list[float]] = {}
    for by_round in run.local_rounds("val-relative-regret").values():
        for t, value in by_round.items():
            personal.setdefault(t, []).append(100 * value)
    return {
        "warm": {t: sum(v) / len(v) for t, v in sorted(warm.items())},
        "personal": {t: sum(v) / len(v) for t, v in sorted(personal.items())},
        "freeze": run.local_rounds("freeze-stat"),
    }


def frozen_at(run_dir: Path) -> dict[str, int]:
    """Per client of a run: the personalization round at which it froze (0 = never)."""
    from hetfed.server.store import RunResult

    frozen = RunResult.read(run_dir).by_client("frozen-at", "train.personalize", 0)
    return {client: int(t) for client, t in frozen.items()}


def plot_warm_then_personal(ax: Any, run_dir: Path, label: str) -> None:
    """One run's mean validation regret per round on ``ax``: the warm-start rounds, then the
    personalization rounds after a dotted line."""
    c = curves(run_dir)
    warm = list(c["warm"].items())
    per = [(len(warm) + t, v) for t, v in c["personal"].items()]
    xs, ys = zip(*(warm + per), strict=True)
    ax.plot(xs, ys, marker=".", label=label)
    ax.axvline(len(warm) + 0.5, color="grey", ls=":", lw=1)


def plot_rounds(path: Path, runs: list[tuple[Path, str]], ylabel: str, title: str) -> None:
    """A figure (log scale) of :func:`plot_warm_then_personal` for each ``(run_dir, label)`` of ``runs``."""
    from hetfed.reproduce.common import pyplot, save_figure

    fig, ax = pyplot().subplots(figsize=(7, 4))
    for run_dir, label in runs:
        plot_warm_then_personal(ax, run_dir, label)
    ax.set(xlabel="round (warm start, then personalization)", ylabel=ylabel, title=title, yscale="log")
    ax.legend()
    save_figure(fig, path)
