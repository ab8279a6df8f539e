"""``rounds.png``: a run's main metric per round, each client's and the aggregate's, failures marked.

Drawn from the run's files (read through :class:`~hetfed.server.store.RunResult`) whenever a
segment ends (server/app.py ``finish_segment``): every run folder, on every engine, completed,
failed, interrupted or resumed, has the picture of all its rounds so far. The main metric is the
problem family's:

- decision: each client's validation relative regret in its ``train`` replies; the aggregate is
  the mean over the clients that reported in the round. FedRSPO+'s personalization (one reply
  covering the local rounds t = 1..T, docs/algorithms.md section 1.5) gets a second panel.
- constrained: each client's f_j and g_j at the evaluated rounds (``evaluate``); the aggregate is
  the server's F = max_j f_j and G = max_j g_j (docs/algorithms.md section 2), g = 0 drawn across.
- lsa: each agent's squared error in its ``train`` replies and the server's mean squared error
  (docs/algorithms.md section 3).

A client's failed or rejected reply is an x at its round on the bottom edge of each round panel.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from hetfed.problems.registry import get_problem
from hetfed.server.store import RunResult

FILE = "rounds.png"
AGGREGATE = "aggregate"  # the label of the aggregate's curve (clients are named client-00, ...)
FAILED = "_failed:"  # a failure marker's label: "_" keeps it out of the legend, the client follows
LEGEND_CLIENTS = 12  # with more clients, the legend leaves them out (their colours repeat anyway)

Curves = dict[str, tuple[np.ndarray, np.ndarray]]


@dataclass(frozen=True)
class Panel:
    """One chart: its curves by label (a client's name or ``AGGREGATE``) as (x, y), the failed or
    rejected replies it marks as (round, client), and a level drawn across (None: none)."""

    title: str
    xlabel: str
    curves: Curves
    failures: tuple[tuple[int, str], ...] = ()
    level: float | None = None


def panels(run: RunResult) -> list[Panel]:
    """What ``rounds.png`` shows of ``run``: the panels of its problem family's main metric."""
    family = get_problem(str(run.config.get("problem", ""))).family
    failed = sorted(
        {
            (int(r["round"]), r["client"])
            for r in run.rows
            if r["client"] != "server" and r.get("status") != "ok"
        }
    )
    if family == "decision":
        found = [_round_panel(run, "validation relative regret", "val-relative-regret", "train", None)]
        local = run.local_rounds("val-relative-regret")
        if local:
            curves = {c: (np.array(list(v), float), np.array(list(v.values()))) for c, v in local.items()}
            found.append(Panel("personalization: validation relative regret", "local round", curves))
    elif family == "constrained":
        found = [
            _round_panel(run, "f (aggregate: F = max over clients)", "f", "evaluate", "F"),
            _round_panel(
                run, "g (aggregate: G = max over clients; feasible at or below 0)", "g", "evaluate", "G"
            ),
        ]
        found[1] = dataclasses.replace(found[1], level=0.0)
    else:
        found = [_round_panel(run, "squared error", "sq-error", "train", "mean-sq-error")]
    # The rounds' panels mark the failures; a personalization panel counts local rounds, not rounds.
    return [dataclasses.replace(p, failures=tuple(failed)) if p.xlabel == "round" else p for p in found]


def draw(run_dir: str | Path) -> list[Panel]:
    """Write ``run_dir/rounds.png``; returns the panels as drawn (read back from the figure's lines)."""
    # A Figure on the Agg canvas, no pyplot: no global backend or figure registry in the ServerApp.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    run = RunResult.read(run_dir)
    shown = [p for p in panels(run) if p.curves or p.failures]
    height = 3.6 * max(1, len(shown))
    fig = Figure(figsize=(9, height), dpi=100)
    # Fixed margins, in inches for any number of panels (a constrained layout costs ~0.6 s a picture).
    fig.subplots_adjust(left=0.09, right=0.98, top=1 - 0.8 / height, bottom=0.5 / height, hspace=0.45)
    FigureCanvasAgg(fig)
    status = run.summary.get("status", "running")
    fig.suptitle(f"{run.path.name}: {run.config.get('strategy')} on {run.config.get('problem')} ({status})")
    if not shown:
        fig.text(0.5, 0.5, "no round recorded yet", ha="center", va="center")
    clients = sorted(
        {c for p in shown for c in p.curves if c != AGGREGATE} | {c for p in shown for _, c in p.failures}
    )
    colors = {c: f"C{i % 10}" for i, c in enumerate(clients)}
    drawn = [_draw_panel(fig.add_subplot(len(shown), 1, i + 1), p, colors) for i, p in enumerate(shown)]
    tmp = run.path / f".{FILE}.tmp"
    fig.savefig(tmp, format="png")
    tmp.replace(run.path / FILE)
    return drawn


def draw_or_say(run_dir: str | Path, say: Callable[[str], None]) -> None:
    """:func:`draw` at the end of a segment: a picture that cannot be drawn never fails the run."""
    try:
        draw(run_dir)
    except Exception as exc:  # the results are written; the picture is extra
        say(f"{FILE} not drawn: {type(exc).__name__}: {exc}")


def _round_panel(run: RunResult, title: str, metric: str, exchange: str, server: str | None) -> Panel:
    """Each client's ``metric`` in its ``exchange`` replies per round; the aggregate is the server
    row's metric ``server``, or (None) the mean over the clients that reported in the round."""
    rounds, clients, table = run.series(metric, exchange)
    curves: Curves = {}
    for j, client in enumerate(clients):
        seen = np.isfinite(table[:, j])
        curves[client] = (rounds[seen].astype(float), table[seen, j])
    if server is not None:
        found = sorted((t, v) for t, _, v in run.values(server, "round", client="server"))
        if found:
            curves[AGGREGATE] = (np.array([t for t, _ in found], float), np.array([v for _, v in found]))
    elif clients:
        reported = np.isfinite(table).any(axis=1)
        curves[AGGREGATE] = (rounds[reported].astype(float), np.nanmean(table[reported], axis=1))
    return Panel(f"{title} [{metric}, {exchange} replies]", "round", curves)


def _draw_panel(ax: Any, panel: Panel, colors: dict[str, str]) -> Panel:
    """Draw ``panel`` on ``ax``; returns it as the axes hold it (:func:`_read_back`)."""
    from matplotlib.ticker import MaxNLocator
    from matplotlib.transforms import blended_transform_factory

    for label, (x, y) in panel.curves.items():
        if label == AGGREGATE:  # dashed: the client it equals (F = max_j f_j) shows through
            ax.plot(x, y, color="black", lw=2, ls="--", marker="o", ms=3, label=label, zorder=3)
        else:
            ax.plot(x, y, color=colors[label], lw=1, marker=".", ms=4, alpha=0.8, label=label)
    if panel.level is not None:
        ax.axhline(panel.level, color="grey", lw=0.8, ls=":")
    at_bottom = blended_transform_factory(ax.transData, ax.transAxes)  # x: the round; y: the axes' edge
    for t, client in panel.failures:
        ax.plot([t], [0.03], transform=at_bottom, marker="x", ms=9, mew=2, ls="", color=colors[client],
                label=FAILED + client)  # fmt: skip
    if panel.failures:
        ax.plot([], [], marker="x", mew=2, ls="", color="grey", label="failed or rejected reply")
    ys = [y[np.isfinite(y)] for _, y in panel.curves.values()]
    values = np.concatenate(ys) if ys else np.array([])
    if values.size and values.min() > 0 and values.max() > 10 * values.min():  # errors falling by decades
        ax.set_yscale("log")
    ax.set_title(panel.title, fontsize=10)
    ax.set_xlabel(panel.xlabel)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(alpha=0.3)
    handles, labels = ax.get_legend_handles_labels()
    if len(colors) > LEGEND_CLIENTS:
        keep = [i for i, label in enumerate(labels) if label not in colors]
        handles, labels = [handles[i] for i in keep], [labels[i] for i in keep]
    ax.legend(handles, labels, fontsize=7, ncol=1 + len(labels) // 8)
    return _read_back(panel, ax.get_lines())


def _read_back(panel: Panel, lines: Any) -> Panel:
    """The panel as the axes hold it: each curve's data and each failure marker's round and client."""
    curves: Curves = {}
    failures = []
    for line in lines:
        label = str(line.get_label())
        x, y = np.asarray(line.get_xdata(), float), np.asarray(line.get_ydata(), float)
        if label.startswith(FAILED):
            failures.append((int(x[0]), label[len(FAILED) :]))
        elif not label.startswith("_") and x.size:
            curves[label] = (x, y)
    return dataclasses.replace(panel, curves=curves, failures=tuple(sorted(failures)))
