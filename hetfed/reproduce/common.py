"""What every reproduction shares: running many configs in parallel processes, and statistics."""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import os
import shutil
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parents[2] / "docs" / "results"
TEMPLATES = Path(__file__).resolve().parent / "templates"


def default_workers() -> int:
    """One worker process per core (each run uses one torch thread)."""
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)


def add_run_arguments(
    parser: argparse.ArgumentParser,
    name: str,
    *,
    quick: str,
    engines: tuple[str, ...] = ("inline", "simulation", "deployment"),
    seeds: str = "how many of the paper's seeds (max 5)",
) -> None:
    """The options every grid reproduction takes: --seeds, --quick (help ``quick``), --engine,
    --workers, --results-dir (default results/reproduce-``name``) and --out (docs/results)."""
    parser.add_argument("--seeds", type=int, default=5, help=seeds)
    parser.add_argument("--quick", action="store_true", help=quick)
    parser.add_argument("--engine", choices=engines, default="inline")
    parser.add_argument("--workers", type=int, default=default_workers(), help="parallel inline runs")
    parser.add_argument("--results-dir", default=f"results/reproduce-{name}", help="where the runs go")
    parser.add_argument("--out", default=str(OUT), help="where the tables and plots go")


def completed_run(folder: Path, cfg: Mapping[str, Any]) -> dict[str, Any] | None:
    """The summary of a completed run of exactly ``cfg`` in ``folder`` (so an interrupted
    reproduction resumes where it stopped, and a changed config runs again), else None."""
    from hetfed.server.store import RunResult, StoreError

    try:
        run = RunResult.read(folder)
    except StoreError:
        return None
    same = all(run.config.get(key) == value for key, value in cfg.items() if key != "results-dir")
    return run.summary if same and run.completed else None


def _run_one(job: tuple[str, Mapping[str, Any], int, str, str | None]) -> dict[str, Any]:
    import logging

    import torch

    from hetfed.engines.runner import run_experiment
    from hetfed.server.app import app  # noqa: F401  (imports Flower, which sets its logger's level)

    torch.set_num_threads(1)
    engine, cfg, nodes, results_dir, data_path = job
    shutil.rmtree(Path(results_dir) / cfg["run-name"], ignore_errors=True)  # an interrupted or outdated run
    flwr_log = logging.getLogger("flwr")
    level = flwr_log.level
    flwr_log.setLevel(logging.WARNING)  # the parent prints one line per run
    try:
        return run_experiment(
            engine, cfg, nodes=nodes, results_dir=Path(results_dir), echo=lambda _: None, data_path=data_path
        )
    finally:  # a run in the caller's own process (one job, one worker) leaves its logging as it was
        flwr_log.setLevel(level)


def run_many(
    configs: Iterable[Mapping[str, Any]],
    *,
    nodes: int,
    results_dir: Path,
    engine: str = "inline",
    workers: int = 1,
    log: Callable[[str], None] = print,
    describe: Callable[[Mapping[str, Any]], str] = lambda summary: "",
    data_path: str | None = None,
) -> list[dict[str, Any]]:
    """Run every config and return their summaries in order; configs with the same ``run-name``
    must be equal and run once (a study's point may be another table's run).

    Inline runs go to ``workers`` processes; the simulation and deployment engines run one at a
    time (they use every core already). A run of the same config that already completed under
    ``results_dir`` is not run again, so an interrupted reproduction continues where it stopped.
    ``describe(summary)`` adds to the progress line of each finished run; ``data_path`` is each
    node's data (``{partition}`` = its id; inline and simulation).
    """
    if workers < 1:
        raise ValueError(f"--workers: must be >= 1, got {workers}")
    configs = [dict(c) for c in configs]
    todo, done = [], {}
    first: dict[str, int] = {}  # run name -> the index of its first config
    for i, cfg in enumerate(configs):
        j = first.setdefault(cfg["run-name"], i)
        if j != i:
            if cfg != configs[j]:
                raise ValueError(f"two different configs share the run name {cfg['run-name']!r}")
            continue
        summary = completed_run(Path(results_dir) / cfg["run-name"], cfg)
        if summary is None:
            todo.append(i)
        else:
            done[i] = summary
    started = time.time()
    jobs = [(engine, configs[i], nodes, str(results_dir), data_path) for i in todo]
    parallel = workers > 1 and engine == "inline" and len(jobs) > 1
    if parallel:
        pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"))
        results = pool.map(_run_one, jobs)
    else:
        pool, results = None, map(_run_one, jobs)
    try:
        for k, (i, summary) in enumerate(zip(todo, results, strict=True), 1):
            done[i] = summary
            log(
                f"[{time.time() - started:6.0f} s] {k}/{len(todo)} {configs[i]['run-name']} "
                f"({summary['wall-time-s']:.1f} s){describe(summary)}"
            )
    finally:
        if pool is not None:
            pool.shutdown(cancel_futures=True)
    return [done[first[cfg["run-name"]]] for cfg in configs]


def fit_line(x: Any, y: Any) -> dict[str, float]:
    """Least squares ``y = a + c x``: intercept a, slope c and R^2."""
    import numpy as np

    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    design = np.column_stack([np.ones_like(x), x])
    (a, c), *_ = np.linalg.lstsq(design, y, rcond=None)
    resid = y - design @ np.array([a, c])
    total = float(np.sum((y - y.mean()) ** 2))
    return {"a": float(a), "c": float(c), "r2": 1.0 - float(np.sum(resid**2)) / total if total else 1.0}


def mean_std(values: Iterable[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for one value) of the finite values."""
    xs = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    if not xs:
        return math.nan, math.nan
    mean = sum(xs) / len(xs)
    var = sum((x - mean) ** 2 for x in xs) / (len(xs) - 1) if len(xs) > 1 else 0.0
    return mean, math.sqrt(var)


def stat(values: list[float], seeds: list[int]) -> dict[str, Any]:
    """A statistics entry: the per-seed ``values`` and ``seeds``, their ``mean`` and ``std`` (mean_std)."""
    mean, std = mean_std(values)
    return {"values": values, "seeds": seeds, "mean": mean, "std": std}


def fmt(entry: Mapping[str, Any] | None, digits: int = 2, missing: str = "n/a") -> str:
    """``mean ± std`` of a statistics entry, ``missing`` when it is missing or not finite."""
    if not entry or entry.get("mean") is None or not math.isfinite(entry["mean"]):
        return missing
    return f"{entry['mean']:.{digits}f} ± {entry['std']:.{digits}f}"


def write_json(path: Path, obj: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=1, sort_keys=False) + "\n")


def publish(out: Path, name: str, data: Any, render: Callable[[Any], str]) -> Any:
    """Write ``out/name.json`` and ``out/name.md`` = ``render`` of the JSON as written (so that the
    report re-renders from the JSON alone); the JSON's contents as read back."""
    write_json(out / f"{name}.json", data)
    written = json.loads((out / f"{name}.json").read_text(encoding="utf-8"))
    (out / f"{name}.md").write_text(render(written), encoding="utf-8")
    return written


def render(template: str, **context: Any) -> str:
    """The report template ``templates/<template>`` (Jinja2) filled with ``context``; a name the
    template uses but ``context`` lacks is an error, not an empty string. ``fmt`` is a filter:
    ``{{ entry | fmt(3) }}``."""
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,  # Markdown, not HTML
    )
    env.filters["fmt"] = fmt
    return env.get_template(template).render(**context)


def pyplot() -> Any:
    """``matplotlib.pyplot`` on the Agg backend (the reports' figures go to files)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig: Any, path: Path) -> None:
    """Lay ``fig`` out, write it to ``path`` (110 dpi, as every report's figure) and close it."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
