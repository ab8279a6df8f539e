"""Property-based fuzzing of what users give hetfed (issue 29): run-config values and `hetfed run`
arguments end in a completed run or one line with exit code 2, no traceback, nothing left behind;
silo files (PJM CSV, the own-problem LP and samples) load or are refused in one line naming the file.

Each test draws a fixed budget of examples (``HETFED_FUZZ_EXAMPLES``, default 25) from a seed that
pytest's header prints (``HETFED_FUZZ_SEED=N`` replays it); a failure also prints the example.
"""

from __future__ import annotations

import json
import math
import os
import random
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
from _pytest.capture import CaptureResult
from hypothesis import HealthCheck, example, given, seed, settings
from hypothesis import strategies as st

from hetfed.cli import main
from hetfed.config import SCHEMA, validate
from hetfed.problems.energy import generate_pjm_like_csv, pjm_samples
from hetfed.problems.registry import get_problem
from hetfed.reproduce.lp_pilot import PLAN as LP_PILOT
from tests.conftest import REPO

SEED = int(os.environ.get("HETFED_FUZZ_SEED") or random.randrange(2**32))  # tests/conftest.py draws it
BUDGET = settings(
    max_examples=int(os.environ.get("HETFED_FUZZ_EXAMPLES", 25)),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    database=None,
    print_blob=True,
)

# A run small enough to complete in a second or two on the inline engine.
SMALL = {"num-rounds": 1, "n-train": 16, "n-val": 4, "n-test": 8, "num-items": 5, "hidden": 8}
SMALL |= {"local-epochs": 1, "personal-rounds": 1, "monitor-size": 2, "batch-size": 8}
# Keys whose every valid value keeps the run small: they get any value. The others (rounds, sizes,
# the problem, the strategy) get only values their check refuses, so no draw starts a long run.
CHEAP = sorted(
    {"seed", "fraction", "lr", "clip-norm", "loss", "rspo-alpha", "calibration-norm", "fixed-lam0"}
    | {"anneal", "kappa-lam", "kappa-lr", "capacity-ratio", "eta-o", "eta-c", "eta-d", "proximal-mu"}
    | {"ditto-mu", "run-name", "checkpoint-every", "audit-traffic", "num-clients", "freeze-tau"}
    | {"coupled-lr", "optnet-backend", "per-client-calibration", "results-dir", "resume", "engine"}
)

NASTY = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70),
    st.integers(min_value=-3, max_value=3),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
    st.text(max_size=12),
    st.sampled_from(["", " ", "x\ny", "{partition}", "../up", "a" * 300, "spo+", "mean", "inline"]),
)


def refused_by_check(key: str, value: Any) -> bool:
    try:
        validate({key: value})
    except ValueError:
        return True
    return False


@st.composite
def run_config_changes(draw: st.DrawFn) -> dict[str, Any]:
    changes: dict[str, Any] = {}
    for _ in range(draw(st.integers(1, 2))):
        key = draw(st.sampled_from(sorted(SCHEMA)))
        value = draw(NASTY)
        if key not in CHEAP and not refused_by_check(key, value):
            continue  # a valid value of a size key could start a long run
        changes[key] = value
    return changes


def toml_value(value: Any) -> str:
    """``--set`` text for ``value``, as TOML (a JSON string is a TOML basic string)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if value != value else ("inf" if value > 0 else "-inf")
    return repr(value)


def one_error_line(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert "Traceback" not in err, err[-3000:]
    errors = [ln for ln in lines if "error:" in ln]
    assert len(errors) == 1, err[-3000:]
    return errors[0]


def completed_or_one_line(code: int, out: CaptureResult[str], folders: list[Path], drawn: Any) -> None:
    """A completed run (exit 0), or a refusal: exit 2, one error line, nothing left in ``folders``."""
    if code == 0:
        assert "status: completed" in out.out, (drawn, out.err[-2000:])
        return
    assert code == 2, (drawn, code, out.err[-3000:])
    one_error_line(out.err)
    assert all(list(folder.iterdir()) == [] for folder in folders), drawn  # nothing left behind


@seed(SEED)
@BUDGET
@given(changes=run_config_changes())
@example(changes={"run-name": ""})  # once ran under the default name, then looked for results/report.md
def test_any_run_config_completes_or_is_one_line(
    tmp_path_factory: pytest.TempPathFactory, capsys: pytest.CaptureFixture[str], changes: dict[str, Any]
) -> None:
    results = tmp_path_factory.mktemp("results")
    sets = [f"{k}={toml_value(v)}" for k, v in {**SMALL, **changes}.items()]
    code = main(
        ["run", "--nodes", "2", "--results-dir", str(results), *[a for s in sets for a in ("--set", s)]]
    )
    completed_or_one_line(code, capsys.readouterr(), [results], changes)


ARGUMENT = st.one_of(
    st.tuples(st.just("--nodes"), st.one_of(st.integers(-5, 3).map(str), st.text(max_size=6))),
    st.tuples(st.just("--timeout"), st.one_of(st.floats(allow_nan=True).map(str), st.text(max_size=6))),
    st.tuples(st.just("--engine"), st.one_of(st.just("inline"), st.text(max_size=8))),
    st.tuples(
        st.sampled_from(["--data-path", "--state-dir", "--resume", "--federation-dir"]), NASTY.map(str)
    ),
    st.tuples(st.just("--set"), st.text(max_size=20)),
)


@seed(SEED)
@BUDGET
@given(arguments=st.lists(ARGUMENT, min_size=1, max_size=3))
def test_any_run_arguments_complete_or_are_one_line(
    tmp_path_factory: pytest.TempPathFactory,
    capsys: pytest.CaptureFixture[str],
    arguments: list[tuple[str, str]],
) -> None:
    """argparse's own refusals (exit 2) print its usage line before their one error line."""
    results, where = tmp_path_factory.mktemp("results"), tmp_path_factory.mktemp("cwd")
    argv = [
        "run",
        "--results-dir",
        str(results),
        *[a for s in SMALL.items() for a in ("--set", f"{s[0]}={s[1]}")],
    ]
    argv += [part for pair in arguments for part in pair]
    before = Path.cwd()
    os.chdir(where)  # relative paths (a --state-dir, a --data-path) land here
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse: a flag without its value, an unknown choice
        code = int(exc.code or 0)
    finally:
        os.chdir(before)
    completed_or_one_line(code, capsys.readouterr(), [results, where], arguments)


def mutate_text(draw: st.DrawFn, text: str) -> str:
    """One of: a cell or token replaced by nasty text, a line removed, a line repeated, the file cut."""
    lines = text.splitlines(keepends=True)
    i = draw(st.integers(0, len(lines) - 1))
    how = draw(st.sampled_from(["cell", "drop", "repeat", "cut"]))
    if how == "drop":
        del lines[i]
    elif how == "repeat":
        lines.insert(i, lines[i])
    elif how == "cut":
        return "".join(lines)[: draw(st.integers(0, len(text)))]
    else:
        parts = re.split(r"([,\s]+)", lines[i])
        j = draw(st.integers(0, len(parts) - 1))
        parts[j] = draw(
            st.one_of(st.sampled_from(["", "nan", "inf", "-1e999", "x", ",", "\n"]), st.text(max_size=5))
        )
        lines[i] = "".join(parts)
    return "".join(lines)


@st.composite
def mutated_silo(draw: st.DrawFn) -> tuple[str, str]:
    name = draw(st.sampled_from(["problem.lp", "samples.csv"]))
    return name, mutate_text(draw, (REPO / "examples" / "pilot" / "silo-0" / name).read_text())


@seed(SEED)
@BUDGET
@given(mutation=mutated_silo())
def test_any_lp_silo_file_loads_or_is_one_line_naming_it(
    tmp_path_factory: pytest.TempPathFactory, mutation: tuple[str, str]
) -> None:
    silo = tmp_path_factory.mktemp("silo")
    for name in ("problem.lp", "samples.csv"):
        shutil.copy(REPO / "examples" / "pilot" / "silo-0" / name, silo / name)
    name, text = mutation
    (silo / name).write_text(text)
    cfg = validate({"problem": "lp", **{k: LP_PILOT.base[k] for k in ("lp-features", "lp-variables")}})
    try:
        get_problem("lp").load_client(cfg, 0, 1, silo)
    except ValueError as exc:  # DataFileError, LP refusals
        message = str(exc)
        assert "\n" not in message and "Traceback" not in message, message
        assert str(silo / name) in message or name in message, (name, message)


@seed(SEED)
@BUDGET
@given(data=st.data())
def test_any_pjm_file_loads_or_is_one_line_naming_it(
    tmp_path_factory: pytest.TempPathFactory, data: st.DataObject
) -> None:
    folder = tmp_path_factory.mktemp("pjm")
    clean = generate_pjm_like_csv(folder / "clean.csv", n_zones=2, n_days=12, seed=1).read_text()
    path = folder / "pjm.csv"
    path.write_text(data.draw(st.composite(lambda draw: mutate_text(draw, clean))()))
    for partition in (0, 1):
        try:
            pjm_samples(path, partition)
        except ValueError as exc:
            assert "\n" not in str(exc), str(exc)
            assert str(path) in str(exc) or "partition_id" in str(exc) or "num_partitions" in str(exc), str(
                exc
            )
