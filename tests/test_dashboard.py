"""``hetfed dashboard``: /metrics against the run's files, and the live page in a real headless Chromium.

The run folders are read here independently (csv and json, not through hetfed), so a dashboard
that misreads them fails.
"""

from __future__ import annotations

import csv
import html
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from hetfed.dashboard import RUN_STATUSES, Dashboard, make_server
from hetfed.engines.inline import node_configs, run_inline
from tests.conftest import REPO, cannot_run, hetfed_cli

CFG = {"n-train": 40, "n-test": 30, "local-epochs": 1, "num-items": 10, "fraction": 1.0, "seed": 3}


@pytest.fixture
def serve() -> Iterator[Callable[..., str]]:
    """``serve(results, federation=None)``: a dashboard on a free loopback port; its base URL."""
    servers = []

    def start(results: Path, federation: Path | None = None) -> str:
        server = make_server(Dashboard(results, federation), "127.0.0.1", 0)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}"

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=60) as answer:
        return str(answer.read().decode())


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of a Prometheus text page, by (name, sorted labels), parsed by prometheus_client."""
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_metrics_equal_the_run_files(tmp_path: Path, serve: Callable[..., str]) -> None:
    results = tmp_path / "results"
    configs = node_configs(4)
    configs[1]["fail-round"] = 2  # a failing silo: its round-2 reply is an error row
    summary = run_inline(
        {"strategy": "fedavg", **CFG, "num-rounds": 3, "results-dir": str(results), "run-name": "one"},
        configs,
    )
    assert summary["status"] == "completed"
    (results / "not-a-run").mkdir()  # a folder without run files is not counted
    metrics = samples(get(serve(results) + "/metrics"))

    run = results / "one"
    progress = json.loads((run / "progress.json").read_text())
    with open(run / "rounds.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert metrics[("hetfed_runs", (("status", "completed"),))] == 1
    assert sum(v for (name, _), v in metrics.items() if name == "hetfed_runs") == 1
    for status in RUN_STATUSES:  # every status has its series, 0 included (alert rules need one)
        assert ("hetfed_runs", (("status", status),)) in metrics
    assert metrics[("hetfed_run_rounds_completed", (("run", "one"),))] == progress["round"] == 3
    assert metrics[("hetfed_run_rounds_planned", (("run", "one"),))] == 3
    assert metrics[("hetfed_run_segments_total", (("run", "one"),))] == 1
    assert metrics[("hetfed_run_elapsed_seconds", (("run", "one"),))] == summary["wall-time-s"]
    assert metrics[("hetfed_run_round_seconds", (("run", "one"),))] == pytest.approx(
        progress["elapsed-s"] / 3
    )
    expected = Counter((r["client"], r["exchange"], r["status"]) for r in rows if r["client"] != "server")
    assert ("client-01", "train", "failed") in expected  # the drill happened
    replies = {
        (dict(labels)["client"], dict(labels)["exchange"], dict(labels)["status"]): v
        for (name, labels), v in metrics.items()
        if name == "hetfed_client_replies"
    }
    assert replies == expected
    assert not any(name.startswith("hetfed_supernodes") for name, _ in metrics)  # no federation given

    from hetfed.dashboard import AGGREGATE, read_run

    (chart,) = read_run(run).charts  # decision: each client's validation regret, the mean per round
    regret: dict[str, list[tuple[int, float]]] = {}
    for r in rows:
        if r["exchange"] == "train" and r["status"] == "ok":
            regret.setdefault(r["client"], []).append((int(r["round"]), float(r["val-relative-regret"])))
    by_round = {t: [v for points in regret.values() for u, v in points if u == t] for t in (1, 2, 3)}
    aggregate = chart.series.pop(AGGREGATE)
    assert chart.series == dict(sorted(regret.items()))
    assert [t for t, _ in aggregate] == [1, 2, 3]
    assert [v for _, v in aggregate] == pytest.approx(
        [sum(vs) / len(vs) for vs in by_round.values()], rel=1e-14
    )
    assert chart.failures == ((2, "client-01"),)

    page = get(serve(results) + "/")
    reason = next(r["error"] for r in rows if r["status"] == "failed")
    assert "fault drill" in reason and html.escape(reason) in page  # the reason, on the page
    assert "client-01 failed in round 2</title>" in page  # and its mark on the chart


def test_the_command_serves_the_page_and_metrics(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "hetfed.cli", "dashboard", "--results-dir", str(tmp_path), "--port", "0"],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # hetfed dashboard on http://127.0.0.1:PORT/ (metrics: ...)
        url = line.split()[3]
        assert url.startswith("http://127.0.0.1:"), line
        assert "No runs yet." in get(url)
        # no runs: every status at 0 (the issue of a status absent until its first run), nothing else
        assert samples(get(url + "metrics")) == {("hetfed_runs", (("status", s),)): 0.0 for s in RUN_STATUSES}
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_dashboard_refuses_bad_arguments_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    for args, message in (
        (["--results-dir", str(tmp_path / "file")], "not a folder"),
        (["--port", "70000"], "--port 70000: must be in 0-65535"),
        (["--federation-dir", str(tmp_path)], "no local federation is running"),
    ):
        out = hetfed_cli("dashboard", "--results-dir", str(tmp_path), *args, timeout=60)
        assert out.returncode == 2 and message in out.stderr and len(out.stderr.splitlines()) == 1, out


# --- the page in a real browser ---------------------------------------------------------------


# What the page shows, read in one script: the page swaps its live part every 2 s, so elements
# found one by one could belong to different versions of it.
SNAPSHOT = """
const cells = (sel) => [...document.querySelectorAll(sel)].map(tr => [...tr.children].map(
    c => ({text: c.textContent, value: c.getAttribute("data-value")})));
const s = document.querySelector('section[data-run="live"]');
const online = document.querySelector(".online-count");
const curve = s && s.querySelector('polyline[data-label="aggregate"]');
return {
  online: online && online.dataset.online, nodes: cells("table.nodes tr"),
  run: s && {status: s.querySelector(".status").textContent, round: s.querySelector(".round").textContent,
             k: +s.querySelector(".round").dataset.round, points: curve ? +curve.dataset.points : 0,
             final: cells('section[data-run="live"] table.final tr')},
};
"""


def browser() -> Any:
    """Headless Debian Chromium driven by Selenium (.ci/test-deps installs them); without them
    :func:`cannot_run` (skips; fails under CI=true)."""
    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    try:
        from selenium import webdriver
    except ImportError:
        webdriver = None
    if not (chromium and driver and webdriver is not None):
        cannot_run("needs selenium and Debian's chromium and chromium-driver (apt-get install both)")
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--window-size=1200,2000",
    ):
        options.add_argument(arg)
    return webdriver.Chrome(options=options, service=Service(executable_path=driver))


@pytest.mark.deployment
def test_the_live_page_follows_a_deployment_run(tmp_path: Path, serve: Callable[..., str]) -> None:
    driver = browser()
    fed, results = tmp_path / "fed", tmp_path / "results"
    up = hetfed_cli("federation", "up", "--nodes", "3", "--dir", str(fed), timeout=300)
    assert up.returncode == 0, up.stderr
    run = None
    try:
        url = serve(results, fed)
        driver.get(url + "/")  # before the run: the page must show it appear without a reload
        driver.execute_script("window.loadedOnce = true;")
        page = driver.execute_script(SNAPSHOT)
        assert page["online"] == "3" and page["run"] is None
        assert sorted(row[1]["text"] for row in page["nodes"][1:]) == ["0", "1", "2"]  # the partitions
        command = [
            "run",
            "--engine",
            "deployment",
            "--federation-dir",
            str(fed),
            "--results-dir",
            str(results),
        ]
        command += ["--set=run-name=live", "--set=num-rounds=10", *(f"--set={k}={v}" for k, v in CFG.items())]
        run = subprocess.Popen(
            [sys.executable, "-m", "hetfed.cli", *command],
            cwd=REPO,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        seen: list[int] = []  # the round counter as the page showed it, each change once
        points: list[int] = []  # the aggregate curve's points, likewise
        statuses: set[str] = set()
        end = time.time() + 600
        while run.poll() is None and time.time() < end:
            live = driver.execute_script(SNAPSHOT)["run"]
            if live:
                statuses.add(live["status"])
            if live and live["k"] not in seen:
                seen.append(live["k"])
            if live and live["points"] not in points:
                points.append(live["points"])
            time.sleep(0.2)
        assert run.wait(timeout=60) == 0, run.stderr.read() if run.stderr else ""
        time.sleep(2 * 2 + 1)  # two refreshes: the page has the end of the run
        assert driver.execute_script("return window.loadedOnce === true;")  # never reloaded
        summary = json.loads((results / "live" / "summary.json").read_text())
        live = driver.execute_script(SNAPSHOT)["run"]
        assert live["status"] == summary["status"] == "completed"
        assert live["round"] == "10 of 10"
        assert len(seen) >= 3 and seen == sorted(seen), seen  # it advanced while the run went
        assert "running" in statuses, statuses
        assert len(points) >= 3 and points == sorted(points), points
        columns = [c["text"] for c in live["final"][0][1:]]  # a column per client, and the aggregate
        assert columns == [*sorted(summary["clients"]), "aggregate"]
        shown: dict[str, dict[str, float]] = {c: {} for c in columns}
        for metric, *cells in live["final"][1:]:  # a row per metric
            for column, cell in zip(columns, cells, strict=True):
                if cell["text"]:
                    value = float(cell["value"])  # the exact value
                    assert float(cell["text"]) == pytest.approx(value, rel=5e-4)  # shown to 4 digits
                    shown[column][metric["text"]] = value
        expected = {**summary["clients"], "aggregate": summary["aggregate"]}
        assert shown == {c: {k: v for k, v in m.items() if v is not None} for c, m in expected.items()}
        metrics = samples(get(url + "/metrics"))
        assert metrics[("hetfed_supernodes_online", ())] == 3
        assert metrics[("hetfed_run_rounds_completed", (("run", "live"),))] == 10
        assert grafana_metric_names() <= {name for name, _ in metrics}  # with a federation: every one
        # HETFED_DASHBOARD_SCREENSHOT=docs/dashboard.png remakes the user guide's picture from this run
        shot = Path(os.environ.get("HETFED_DASHBOARD_SCREENSHOT") or tmp_path / "dashboard.png")
        height = driver.execute_script("return Math.ceil(document.body.getBoundingClientRect().bottom) + 16")
        metrics_override = {"width": 1100, "height": height, "deviceScaleFactor": 1, "mobile": False}
        driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", metrics_override)  # the whole page
        assert driver.save_screenshot(str(shot)) and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    finally:
        if run is not None and run.poll() is None:
            run.terminate()
            run.wait(timeout=60)
        driver.quit()
        hetfed_cli("federation", "down", "--dir", str(fed), timeout=120)


@pytest.mark.parametrize(
    "config, panels",
    [
        (  # constrained: f_j, g_j of the evaluate replies; the aggregates are the server's F, G
            {"strategy": "softmax-switching", "problem": "quadratic", "switching-eval-every": 2},
            [("f", "evaluate", "F"), ("g", "evaluate", "G")],
        ),
        ({"strategy": "pflsa", "problem": "garnet"}, [("sq-error", "train", "mean-sq-error")]),  # LSA
    ],
)
def test_the_charts_show_the_familys_main_metric_from_rounds_csv(
    tmp_path: Path, config: dict[str, Any], panels: list[tuple[str, str, str]]
) -> None:
    from hetfed.dashboard import AGGREGATE, read_run

    cfg = {**config, "seed": 4, "num-rounds": 6, "results-dir": str(tmp_path), "run-name": "r"}
    assert run_inline(cfg, node_configs(3))["status"] == "completed"
    with open(tmp_path / "r" / "rounds.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    charts = read_run(tmp_path / "r").charts
    assert len(charts) == len(panels)
    for chart, (metric, exchange, aggregate) in zip(charts, panels, strict=True):
        expected: dict[str, list[tuple[int, float]]] = {}
        for r in rows:
            if r["exchange"] == exchange and r["client"] != "server" and r[metric]:
                expected.setdefault(r["client"], []).append((int(r["round"]), float(r[metric])))
        server = [
            (int(r["round"]), float(r[aggregate])) for r in rows if r["client"] == "server" and r[aggregate]
        ]
        assert len(expected) == 3 and server, (metric, rows[0])
        assert chart.series == {**dict(sorted(expected.items())), AGGREGATE: server}


GRAFANA = REPO / "deploy" / "grafana" / "hetfed-dashboard.json"


def grafana_metric_names() -> set[str]:
    """The metric names deploy/grafana/hetfed-dashboard.json's queries read."""
    exprs = [t["expr"] for panel in json.loads(GRAFANA.read_text())["panels"] for t in panel["targets"]]
    return {name for expr in exprs for name in re.findall(r"\bhetfed_[a-z_]+\b", expr)}


def test_counters_only_grow_across_a_resume_and_grafana_reads_only_exported_metrics(
    tmp_path: Path, serve: Callable[..., str]
) -> None:
    """Prometheus's conventions: a family of ``_total`` samples is a counter, a counter never goes
    down, also when a resume sets the run's rounds back; a gauge (rounds, replies) may. A run that
    died in round 3 and its resume are scraped before and after."""
    from hetfed.client.app import app as client_app
    from tests.test_resume import CFG as RESUMED
    from tests.test_resume import DyingGrid, faulted

    results = tmp_path / "results"
    cfg = {**RESUMED, "results-dir": str(results), "run-name": "crash"}
    faulted(DyingGrid(client_app, node_configs(4), cfg, die_at=4), cfg, ConnectionError)
    url = serve(results) + "/metrics"
    before = list(text_string_to_metric_families(get(url)))
    run_inline({**cfg, "resume": True}, node_configs(4))
    after = list(text_string_to_metric_families(get(url)))
    for families in (before, after):
        for family in families:
            totals = [s.name.endswith("_total") for s in family.samples]
            assert all(totals) == (family.type == "counter") or not family.samples, family.name
    counters = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for families in (before,)
        for family in families
        if family.type == "counter"
        for s in family.samples
    }
    now = samples(get(url))
    assert counters and all(now[key] >= value for key, value in counters.items())
    assert counters[("hetfed_run_segments_total", (("run", "crash"),))] == 1
    assert now[("hetfed_run_segments_total", (("run", "crash"),))] == 2
    # runs by status: every status present, 0 included, before (failed) and after (completed)
    by_status = {dict(labels)["status"]: v for (name, labels), v in now.items() if name == "hetfed_runs"}
    assert by_status == {s: float(s == "completed") for s in RUN_STATUSES}
    # the Grafana dashboard reads only exported names (the SuperNodes' need a federation: the live test)
    names = {name for name, _ in now}
    assert grafana_metric_names() - names == {"hetfed_supernodes_online", "hetfed_supernodes_expected"}
