"""``hetfed dashboard``: a read-only live web page over a results folder (and a federation), and ``/metrics``.

Everything shown is read from the run folders (through :class:`~hetfed.server.store.RunResult`
and the store's ``progress.json`` / ``segments.jsonl``) and, with a federation folder, from the
SuperLink's node list (its Control API asked in this process, as ``hetfed federation status``
asks it). Nothing is written anywhere. The page is server-rendered HTML with the charts as
inline SVG; a few lines of inline script fetch ``/fragment`` every 2 s and swap it in, so the
page follows a run without a reload and without anything from the network (no CDN: it works air-gapped).

- ``/``: the page; ``/fragment``: its live part; ``/metrics``: the Prometheus text format.

Each run's chart is its problem family's main metric per round, each client's and the aggregate's
(:func:`charts`): decision tasks the validation relative regret of the ``train`` replies (aggregate:
the mean over the clients that reported), constrained tasks f_j and g_j of the ``evaluate`` replies
(aggregate: the server's F = max_j f_j and G = max_j g_j, docs/algorithms.md section 2), LSA each
agent's squared error (aggregate: the server's mean, docs/algorithms.md section 3).
"""

from __future__ import annotations

import html
import math
import re
import socket
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from hetfed.paths import flock_holder
from hetfed.problem_params import PROBLEMS
from hetfed.server.store import RunResult, StoreError

AGGREGATE = "aggregate"
REFRESH_S = 2  # how often the page fetches /fragment
NODES_TTL_S = 5.0  # how long one answer of the SuperLink's node list is reused
NODE_ID = re.compile(r"SuperNode ID: (\d+)")  # what a SuperNode logs when it has joined


# --- what a run folder says -------------------------------------------------------------------


@dataclass(frozen=True)
class Chart:
    """One chart: ``metric`` per round, by client (and ``AGGREGATE``), as (round, value) points;
    ``failures`` are the (round, client) replies that failed or were rejected."""

    title: str
    series: dict[str, list[tuple[int, float]]]
    failures: tuple[tuple[int, str], ...] = ()
    level: float | None = None  # a value drawn across (g = 0: feasible below)


@dataclass
class RunView:
    """One run as the dashboard shows it."""

    name: str
    status: str  # completed / failed / interrupted (summary.json), running, stopped (no summary, no writer)
    round: int
    total: int
    elapsed_s: float
    round_s: float  # mean wall time per round of the current (or last) segment; nan before a round
    strategy: str
    problem: str
    segments: list[dict[str, Any]]
    charts: list[Chart]
    failures: list[dict[str, str]]  # failed or rejected replies: round, exchange, client, status, error
    clients: dict[str, dict[str, Any]]  # summary.json's final per-client metrics
    aggregate: dict[str, Any]
    row_status: Counter[tuple[str, str, str]] = field(default_factory=Counter)  # (client, exchange, status)


def read_run(run_dir: Path) -> RunView:
    """The run in ``run_dir`` as it is on disk now; StoreError if it has no files yet."""
    run = RunResult.read(run_dir)
    progress, segments = run.progress, run.segments
    if run.summary:
        status = str(run.summary.get("status", "?"))
    elif flock_holder(run.path / ".writer.lock"):
        status = "running"
    else:
        status = "stopped"
    done = sum(float(s.get("wall-time-s") or 0) for s in segments if "status" in s)
    if run.summary.get("wall-time-s") is not None:
        elapsed = float(run.summary["wall-time-s"])
    elif status == "running" and segments and "started-unix" in segments[-1]:
        elapsed = done + time.time() - float(segments[-1]["started-unix"])
    else:
        elapsed = done + float(progress.get("elapsed-s") or 0)
    rounds = int(progress.get("round", 0))
    first = int(segments[-1].get("first-round", 1)) if segments else 1
    in_segment = rounds - first + 1
    segment_s = progress.get("elapsed-s") if progress.get("segment") == len(segments) else None
    round_s = float(segment_s) / in_segment if segment_s is not None and in_segment > 0 else math.nan
    failures = [
        {k: r.get(k, "") for k in ("round", "exchange", "client", "status", "error")}
        for r in run.rows
        if r.get("status", "ok") != "ok"
    ]
    return RunView(
        name=run.path.name,
        status=status,
        round=rounds,
        total=int(progress.get("total") or run.config.get("num-rounds") or 0),
        elapsed_s=elapsed,
        round_s=round_s,
        strategy=str(run.config.get("strategy", "")),
        problem=str(run.config.get("problem", "")),
        segments=segments,
        charts=charts(run),
        failures=failures,
        clients=dict(run.summary.get("clients") or {}),
        aggregate=dict(run.summary.get("aggregate") or {}),
        row_status=Counter(
            (r["client"], r["exchange"], r.get("status", "")) for r in run.rows if r["client"] != "server"
        ),
    )


def read_runs(results_dir: Path) -> list[RunView]:
    """Every run under ``results_dir``, newest first (by its config.json or rounds.csv)."""
    found = []
    for path in sorted(p for p in results_dir.glob("*/") if p.is_dir() and not p.name.startswith(".")):
        try:
            found.append((_mtime(path), read_run(path)))
        except StoreError:
            continue  # a folder that is not (yet) a run
        except (OSError, ValueError, TypeError, KeyError):
            continue  # a file caught as it is replaced or appended to: the next look reads it
    return [view for _, view in sorted(found, key=lambda f: -f[0])]


def _mtime(path: Path) -> float:
    """When the run last wrote a file (its config.json, rounds.csv, ...)."""
    return max((f.stat().st_mtime for f in path.glob("*.*") if not f.name.startswith(".")), default=0.0)


def charts(run: RunResult) -> list[Chart]:
    """The run's main metric per round, each client's and the aggregate's (see the module docstring)."""
    problem = PROBLEMS.get(str(run.config.get("problem", "")))
    family = problem.family if problem else "decision"
    failed = tuple(
        sorted(
            {
                (int(r["round"]), r["client"])
                for r in run.rows
                if r["client"] != "server" and r["status"] != "ok"
            }
        )
    )
    if family == "constrained":
        found = [
            _chart(run, "f (aggregate: F = max over clients)", "f", "evaluate", "F", failed),
            _chart(
                run,
                "g (aggregate: G = max over clients; feasible at or below 0)",
                "g",
                "evaluate",
                "G",
                failed,
            ),
        ]
        return [found[0], Chart(found[1].title, found[1].series, failed, level=0.0)]
    if family == "lsa":
        return [_chart(run, "squared error", "sq-error", "train", "mean-sq-error", failed)]
    return [_chart(run, "validation relative regret", "val-relative-regret", "train", None, failed)]


def _chart(
    run: RunResult,
    title: str,
    metric: str,
    exchange: str,
    server: str | None,
    failed: tuple[tuple[int, str], ...],
) -> Chart:
    """Each client's ``metric`` in its ``exchange`` replies per round; the aggregate is the server
    row's ``server`` metric, or (None) the mean over the clients that reported in the round."""
    series: dict[str, list[tuple[int, float]]] = {}
    for t, client, value in run.values(metric, exchange):
        if client != "server" and math.isfinite(value):
            series.setdefault(client, []).append((t, value))
    if server is not None:
        aggregate = [(t, v) for t, _, v in run.values(server, client="server") if math.isfinite(v)]
    else:
        by_round: dict[int, list[float]] = {}
        for points in series.values():
            for t, v in points:
                by_round.setdefault(t, []).append(v)
        aggregate = [(t, sum(vs) / len(vs)) for t, vs in sorted(by_round.items())]
    return Chart(
        title, {**dict(sorted(series.items())), AGGREGATE: aggregate} if aggregate else series, failed
    )


# --- the federation ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Node:
    """One SuperNode as the SuperLink lists it; ``partition`` where this host started it (None: unknown)."""

    node_id: str
    status: str  # online, offline, registered, unregistered
    partition: int | None
    since: str  # when it came online (online) or went offline (offline)


@dataclass(frozen=True)
class FederationView:
    address: str
    expected: int
    nodes: tuple[Node, ...]
    error: str = ""  # why the SuperLink could not be asked ('' = it answered)

    @property
    def online(self) -> int:
        return sum(n.status == "online" for n in self.nodes)


def read_federation(federation_dir: Path) -> FederationView:
    """The SuperNodes the SuperLink of ``federation_dir`` knows (``hetfed federation status``'s source).

    The SuperLink does not know partitions; a SuperNode that ``hetfed federation up`` started here
    logged its node id in ``supernode-<partition>.log``, which gives its partition.
    """
    from hetfed.engines.errors import FlowerProcessError
    from hetfed.engines.federation_info import FederationInfo, FederationNotRunning

    try:
        info = FederationInfo.load(federation_dir)
    except FederationNotRunning as exc:
        return FederationView("", 0, (), str(exc))
    flower = info.flower()
    try:
        with flower.control() as control:  # in this process: no flwr CLI process per look
            answer = control.nodes()
    except (FlowerProcessError, OSError) as exc:
        return FederationView(
            flower.address, info.nodes, (), f"the SuperLink did not answer: {exc}".splitlines()[0]
        )
    partitions = {}
    for index in range(info.nodes):
        try:
            ids = NODE_ID.findall((info.root / f"supernode-{index}.log").read_text(errors="replace"))
        except OSError:
            continue
        if ids:
            partitions[ids[-1]] = index  # a restarted SuperNode logs its new id last
    nodes = tuple(
        Node(
            str(n.node_id),
            n.status,
            partitions.get(str(n.node_id)),
            n.last_activated_at if n.status == "online" else n.last_deactivated_at,
        )
        for n in answer
        if n.status != "unregistered"
    )
    return FederationView(flower.address, info.nodes, nodes)


# --- the dashboard ------------------------------------------------------------------------------


class Dashboard:
    """The page, its live fragment and ``/metrics`` over ``results_dir`` (and ``federation_dir``)."""

    def __init__(self, results_dir: Path, federation_dir: Path | None = None) -> None:
        self.results_dir = Path(results_dir)
        self.federation_dir = federation_dir
        self._nodes: tuple[float, FederationView] | None = None  # (when asked, the answer)
        self._asking = threading.Lock()  # held while a thread asks the SuperLink

    def federation(self) -> FederationView | None:
        """The federation's nodes as last asked (None without a folder). An answer older than
        ``NODES_TTL_S`` is renewed in a thread: a slow SuperLink never holds up the page."""
        if self.federation_dir is None:
            return None
        if self._nodes is None:  # the first request waits for the first answer
            with self._asking:
                if self._nodes is None:
                    self._nodes = (time.time(), read_federation(self.federation_dir))
        elif time.time() - self._nodes[0] > NODES_TTL_S and self._asking.acquire(blocking=False):
            threading.Thread(target=self._renew, args=(self.federation_dir,), daemon=True).start()
        return self._nodes[1]

    def _renew(self, federation_dir: Path) -> None:
        try:
            self._nodes = (time.time(), read_federation(federation_dir))
        finally:
            self._asking.release()

    def page(self) -> str:
        return PAGE.format(refresh_ms=REFRESH_S * 1000, fragment=self.fragment())

    def fragment(self) -> str:
        runs = read_runs(self.results_dir)
        parts = [
            f'<p class="muted">updated {time.strftime("%H:%M:%S")} &middot; {_e(str(self.results_dir))}</p>'
        ]
        federation = self.federation()
        if federation is not None:
            parts.append(_federation_html(federation))
        parts += [_run_html(r) for r in runs] or ["<p>No runs yet.</p>"]
        return "\n".join(parts)

    def metrics(self) -> bytes:
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_Metrics(self))
        return generate_latest(registry)


# What a run's status can be on the page and in /metrics: its summary's, else whether a process holds its
# writer lock. Every one is exported, 0 included, so an alert on a status has a series from the start.
RUN_STATUSES = ("running", "completed", "failed", "interrupted", "stopped")


class _Metrics(Collector):
    """The Prometheus metrics, read from the files at each scrape (Prometheus's conventions: a
    counter only grows and is named ``_total``; a gauge, which a resume may set back, is not)."""

    def __init__(self, dashboard: Dashboard) -> None:
        self.dashboard = dashboard

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        runs = read_runs(self.dashboard.results_dir)
        by_status = GaugeMetricFamily(
            "hetfed_runs", "Runs in the results folder, by status", labels=["status"]
        )
        counts = Counter(r.status for r in runs)
        for status in (*RUN_STATUSES, *sorted(set(counts) - set(RUN_STATUSES))):
            by_status.add_metric([status], counts[status])
        yield by_status
        segments = CounterMetricFamily(
            "hetfed_run_segments", "Segments a run has started (its first start, each resume)", labels=["run"]
        )
        for r in runs:
            segments.add_metric([r.name], len(r.segments))
        yield segments
        per_run = {
            "hetfed_run_rounds_completed": (
                "Rounds the run has completed (progress.json)",
                lambda r: r.round,
            ),
            "hetfed_run_rounds_planned": ("Rounds the run is to do", lambda r: r.total),
            "hetfed_run_elapsed_seconds": (
                "Wall time of the run so far, all segments",
                lambda r: r.elapsed_s,
            ),
            "hetfed_run_round_seconds": (
                "Mean wall time per round of the run's current or last segment",
                lambda r: r.round_s,
            ),
        }
        for name, (doc, value) in per_run.items():
            family = GaugeMetricFamily(name, doc, labels=["run"])
            for r in runs:
                family.add_metric([r.name], float(value(r)))
            yield family
        rows = GaugeMetricFamily(
            "hetfed_client_replies",
            "A client's rows in rounds.csv, by exchange and status (ok, failed, rejected, ...)",
            labels=["run", "client", "exchange", "status"],
        )
        for r in runs:
            for (client, exchange, status), count in sorted(r.row_status.items()):
                rows.add_metric([r.name, client, exchange, status], count)
        yield rows
        federation = self.dashboard.federation()
        if federation is not None:
            yield GaugeMetricFamily("hetfed_supernodes_online", "SuperNodes online", value=federation.online)
            yield GaugeMetricFamily(
                "hetfed_supernodes_expected", "SuperNodes the federation expects", value=federation.expected
            )


def make_server(dashboard: Dashboard, host: str = "127.0.0.1", port: int = 0) -> ThreadingHTTPServer:
    """An HTTP server for ``dashboard`` (port 0: a free one); call ``serve_forever``."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            routes: dict[str, tuple[Callable[[], str | bytes], str]] = {
                "/": (dashboard.page, "text/html; charset=utf-8"),
                "/fragment": (dashboard.fragment, "text/html; charset=utf-8"),
                "/metrics": (dashboard.metrics, "text/plain; version=0.0.4; charset=utf-8"),
            }
            path = self.path.split("?", 1)[0]
            if path not in routes:
                self.send_error(404)
                return
            make, kind = routes[path]
            body = make()
            data = body if isinstance(body, bytes) else body.encode()
            self.send_response(200)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(data)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (http.server's name)
            pass  # a request every 2 s per open page: no line each

    class Server(ThreadingHTTPServer):
        address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
        daemon_threads = True  # an open page's pending request does not hold up the exit

        def handle_error(self, request: Any, client_address: Any) -> None:
            if not isinstance(sys.exc_info()[1], ConnectionError):  # a closed page is no error
                super().handle_error(request, client_address)

    return Server((host.strip("[]"), port), Handler)


# --- HTML ---------------------------------------------------------------------------------------

PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22")

PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>hetfed dashboard</title>
<style>
body {{ font: 14px system-ui, sans-serif; margin: 1.2em; color: #222; }}
h1 {{ font-size: 1.3em; }} h2 {{ font-size: 1.1em; margin: 0 0 .3em; }}
section {{ border: 1px solid #ccc; border-radius: 6px; padding: .7em 1em; margin: .8em 0; }}
table {{ border-collapse: collapse; margin: .4em 0; }}
td, th {{ border: 1px solid #ddd; padding: 2px 8px; text-align: right; }}
td:first-child, th:first-child {{ text-align: left; }}
.muted {{ color: #777; }} .completed, .online {{ color: #2a7; }} .running {{ color: #27c; }}
.failed, .rejected, .offline, .stopped, .interrupted {{ color: #c33; }}
.scroll {{ overflow-x: auto; }}
svg {{ background: #fafafa; margin: .3em 1em .3em 0; }}
</style></head>
<body><h1>hetfed dashboard</h1><div id="live">{fragment}</div>
<script>
setInterval(async () => {{
  try {{
    const r = await fetch("fragment", {{cache: "no-store"}});
    if (r.ok) document.getElementById("live").innerHTML = await r.text();
  }} catch (e) {{}}
}}, {refresh_ms});
</script></body></html>
"""


def _e(text: str) -> str:
    return html.escape(text, quote=True)


def _num(value: Any) -> str:
    """A number's cell: 4 significant digits shown, the exact value in ``data-value``."""
    if value is None:  # not finite (summary.json writes NaN as null)
        return "<td></td>"
    if isinstance(value, bool) or not isinstance(value, int | float):
        return f"<td>{_e(str(value))}</td>"
    return f'<td data-value="{value!r}">{value:.4g}</td>'


def _table(header: Iterable[str], rows: Iterable[Iterable[str]], cls: str) -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in header)
    body = "".join(f"<tr>{''.join(r)}</tr>" for r in rows)
    return f'<div class="scroll"><table class="{cls}"><tr>{head}</tr>{body}</table></div>'


def _federation_html(f: FederationView) -> str:
    if not f.address:
        return f'<section class="federation"><h2>Federation</h2><p class="failed">{_e(f.error)}</p></section>'
    note = f'<p class="failed">{_e(f.error)}</p>' if f.error else ""
    rows = [
        [
            f"<td>{_e(n.node_id)}</td>",
            f"<td>{'' if n.partition is None else n.partition}</td>",
            f'<td class="{_e(n.status)}">{_e(n.status)}</td>',
            f"<td>{_e(n.since)}</td>",
        ]
        for n in sorted(f.nodes, key=lambda n: (n.partition is None, n.partition or 0, n.node_id))
    ]
    return (
        f'<section class="federation"><h2>Federation: SuperLink {_e(f.address)}</h2>'
        f'<p><span class="online-count" data-online="{f.online}">{f.online}</span> of {f.expected} '
        f"SuperNodes online</p>{note}"
        f"{_table(['node id', 'partition', 'status', 'since / last seen'], rows, 'nodes')}</section>"
    )


def _run_html(r: RunView) -> str:
    segments = _table(
        ["segment", "engine", "started", "first round", "status", "wall time (s)"],
        (
            [f"<td>{s.get('segment')}</td>"]
            + [f"<td>{_e(str(s.get(k, '')))}</td>" for k in ("engine", "started", "first-round", "status")]
            + [_num(s["wall-time-s"]) if s.get("wall-time-s") is not None else "<td></td>"]
            for s in r.segments
        ),
        "segments",
    )
    failures = (
        "<h3>Failed and rejected replies</h3>"
        + _table(
            ["round", "exchange", "client", "status", "reason"],
            ([f'<td class="{_e(f["status"])}">{_e(f[k])}</td>' for k in f] for f in r.failures),
            "failures",
        )
        if r.failures
        else ""
    )
    final = ""
    if r.clients or r.aggregate:  # a row per metric (runs have many), a column per client
        columns = {**dict(sorted(r.clients.items())), AGGREGATE: r.aggregate}
        metrics = dict.fromkeys(k for values in columns.values() for k in values)
        rows = [
            [f"<td>{_e(k)}</td>"] + [_num(v[k]) if k in v else "<td></td>" for v in columns.values()]
            for k in metrics
        ]
        final = "<h3>Final metrics (summary.json)</h3>" + _table(["metric", *columns], rows, "final")
    round_s = "" if math.isnan(r.round_s) else f" &middot; {r.round_s:.2f} s per round"
    return (
        f'<section class="run" data-run="{_e(r.name)}"><h2>{_e(r.name)}: {_e(r.strategy)} on {_e(r.problem)} '
        f'<span class="status {_e(r.status)}">{_e(r.status)}</span></h2>'
        f'<p>round <span class="round" data-round="{r.round}" data-total="{r.total}">'
        f"{r.round} of {r.total}</span>"
        f' &middot; elapsed <span class="elapsed">{r.elapsed_s:.1f}</span> s{round_s}</p>'
        f"{''.join(_svg(c) for c in r.charts)}{failures}{final}"
        f"<details><summary>segments ({len(r.segments)})</summary>{segments}</details></section>"
    )


def _svg(chart: Chart, width: int = 560, height: int = 220) -> str:
    """A line chart: x = round, y = value; the aggregate thick and black, failures as red x at the bottom."""
    left, right, top, bottom = 52, 110, 22, 28
    points = [p for s in chart.series.values() for p in s]
    rounds = [t for t, _ in points] + [t for t, _ in chart.failures]
    values = [v for _, v in points] + ([chart.level] if chart.level is not None else [])
    title = f'<text x="{left}" y="14" font-size="12">{_e(chart.title)}</text>'
    if not rounds:
        empty = f'<text x="{left}" y="40">no rounds yet</text>'
        return f'<svg width="{width}" height="60" class="chart">{title}{empty}</svg>'
    x0, x1 = min(rounds), max(max(rounds), min(rounds) + 1)
    y0, y1 = (min(values), max(values)) if values else (0.0, 1.0)
    if y1 - y0 < 1e-12 * max(1.0, abs(y1)):
        y0, y1 = y0 - 0.5, y1 + 0.5

    def x(t: float) -> float:
        return left + (t - x0) / (x1 - x0) * (width - left - right)

    def y(v: float) -> float:
        return top + (y1 - v) / (y1 - y0) * (height - top - bottom)

    out = [f'<svg width="{width}" height="{height}" class="chart" data-title="{_e(chart.title)}">', title]
    out.append(
        f'<rect x="{left}" y="{top}" width="{width - left - right}" height="{height - top - bottom}" '
        'fill="none" stroke="#bbb"/>'
    )
    for v in (y0, (y0 + y1) / 2, y1):
        out.append(f'<text x="{left - 4}" y="{y(v) + 4:.1f}" font-size="10" text-anchor="end">{v:.3g}</text>')
    step = max(1, math.ceil((x1 - x0) / 10))  # at most about 10 round labels
    for t in range(x0, x1 + 1, step):
        out.append(f'<text x="{x(t):.1f}" y="{height - 10}" font-size="10" text-anchor="middle">{t}</text>')
    out.append(f'<text x="{(left + width - right) / 2}" y="{height - 1}" font-size="10">round</text>')
    if chart.level is not None:
        out.append(
            f'<line x1="{left}" x2="{width - right}" y1="{y(chart.level):.1f}" y2="{y(chart.level):.1f}" '
            'stroke="#999" stroke-dasharray="4 3"/>'
        )
    for i, (label, series) in enumerate(chart.series.items()):
        color, stroke = ("#000", 2.5) if label == AGGREGATE else (PALETTE[i % len(PALETTE)], 1.2)
        coords = " ".join(f"{x(t):.1f},{y(v):.1f}" for t, v in series)
        out.append(
            f'<polyline class="series" data-label="{_e(label)}" data-points="{len(series)}" '
            f'points="{coords}" '
            f'fill="none" stroke="{color}" stroke-width="{stroke}"><title>{_e(label)}</title></polyline>'
        )
        if len(series) == 1:  # a single round is a dot, not an invisible line
            (t, v) = series[0]
            out.append(f'<circle cx="{x(t):.1f}" cy="{y(v):.1f}" r="2.5" fill="{color}"/>')
        out.append(
            f'<text x="{width - right + 6}" y="{top + 10 + 12 * i}" font-size="10" fill="{color}">'
            f"{_e(label)}</text>"
        )
    for t, client in chart.failures:
        cx, cy = x(t), height - bottom - 4
        out.append(
            f'<text class="failure" x="{cx:.1f}" y="{cy:.1f}" font-size="11" fill="#c00" '
            'text-anchor="middle">'
            f"x<title>{_e(client)} failed in round {t}</title></text>"
        )
    out.append("</svg>")
    return "".join(out)
