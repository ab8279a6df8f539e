"""A silo's files read the same whatever wrote them: a UTF-8 byte-order mark (Excel's "CSV UTF-8"),
CRLF or CR line ends, any quoting: the samples / features CSV (problems `lp`, `tabular`, `decide`,
`predict`), the PJM-layout prices CSV and the LP / MPS files give exactly the canonical file's
values, and no solver banner is printed on the way."""

from __future__ import annotations

import csv
import io
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scipy.optimize import linprog

from hetfed.problems.lp import read_lp, read_samples
from tests.conftest import REPO

PILOT = REPO / "examples" / "pilot" / "silo-0"
BOM = "\ufeff"
QUOTING = {"minimal": csv.QUOTE_MINIMAL, "all": csv.QUOTE_ALL, "non-numeric": csv.QUOTE_NONNUMERIC}


def rewritten(rows: list[list[str]], bom: bool, line_end: str, quoting: str) -> bytes:
    """``rows`` as another program would write them (numbers stay the same text)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator=line_end, quoting=QUOTING[quoting])
    for i, row in enumerate(rows):
        # QUOTE_NONNUMERIC quotes str cells: keep numbers numbers, as a spreadsheet would write them.
        writer.writerow(row if i == 0 or quoting != "non-numeric" else [_number_or_text(c) for c in row])
    return ((BOM if bom else "") + out.getvalue()).encode()


def _number_or_text(cell: str) -> float | str:
    """A plain decimal (``-1.25``) as a float, anything else (ids, split labels) as text."""
    return float(cell) if cell.replace(".", "", 1).lstrip("-").isdigit() else cell


def canonical_rows() -> list[list[str]]:
    with open(PILOT / "samples.csv", newline="") as f:
        return list(csv.reader(f))


def pilot_names() -> tuple[list[str], list[str]]:
    header = canonical_rows()[0]
    features = [h for h in header if h not in ("id", "split") and not h.startswith("cost:")]
    return features, [h.removeprefix("cost:") for h in header if h.startswith("cost:")]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    bom=st.booleans(),
    line_end=st.sampled_from(["\n", "\r\n", "\r"]),
    quoting=st.sampled_from(sorted(QUOTING)),
)
def test_a_samples_file_written_any_way_reads_as_the_canonical_one(
    tmp_path: Path, bom: bool, line_end: str, quoting: str
) -> None:
    features, variables = pilot_names()
    reference = read_samples(PILOT / "samples.csv", features, variables)
    variant = tmp_path / f"samples-{int(bom)}-{len(line_end)}-{quoting}.csv"
    variant.write_bytes(rewritten(canonical_rows(), bom, line_end, quoting))
    got = read_samples(variant, features, variables)
    assert got.ids == reference.ids and got.split == reference.split  # ids, not row numbers
    np.testing.assert_array_equal(got.x, reference.x)
    np.testing.assert_array_equal(got.c, reference.c)
    assert got.ignored == reference.ignored == ()
    assert got.rows == reference.rows or line_end == "\r"  # csv counts a lone CR as a line end too


def test_a_bom_on_a_feature_file_keeps_its_first_column(tmp_path: Path) -> None:
    """The BOM would glue itself to `id` (then every id became a row number) or to a first feature
    (then reported missing)."""
    rows = [r[2:] for r in canonical_rows()]  # no id, no split: a feature first
    features, variables = pilot_names()
    path = tmp_path / "features.csv"
    path.write_bytes(rewritten(rows, bom=True, line_end="\r\n", quoting="minimal"))
    got = read_samples(path, features, variables)
    np.testing.assert_array_equal(got.x, read_samples(PILOT / "samples.csv", features, variables).x)


@pytest.mark.parametrize("line_end", ["\n", "\r\n"])
@pytest.mark.parametrize("bom", [False, True])
@pytest.mark.parametrize("suffix", [".lp", ".mps"])
def test_an_lp_or_mps_file_with_a_bom_or_crlf_gives_the_same_program(
    tmp_path: Path, bom: bool, line_end: str, suffix: str
) -> None:
    _, variables = pilot_names()
    source = PILOT / "problem.lp"
    if suffix == ".mps":  # HiGHS writes the pilot's LP as MPS: the same program in the other format
        source = tmp_path / "canonical.mps"
        _write_mps(PILOT / "problem.lp", source)
    reference = read_lp(source, variables)
    text = source.read_text().replace("\r\n", "\n").replace("\n", line_end)
    variant = tmp_path / f"variant{suffix}"
    variant.write_bytes(((BOM if bom else "") + text).encode())
    got = read_lp(variant, variables)
    assert got.maximize == reference.maximize and got.variables == reference.variables
    for field in ("A_ub", "b_ub", "A_eq", "b_eq", "lb", "ub"):
        np.testing.assert_array_equal(
            getattr(got.feasible_set, field), getattr(reference.feasible_set, field)
        )


def _write_mps(lp: Path, mps: Path) -> None:
    from hetfed.problems.polytope import quiet_highs

    h = quiet_highs()
    h.readModel(str(lp))
    h.writeModel(str(mps))


SILENT_CODE = {
    # read a silo's LP (HiGHS reads the file), then solve on it: the objective of w*(1)
    "read_lp": (
        "from hetfed.problems.lp import read_lp\n"
        f"lp = read_lp({str(PILOT / 'problem.lp')!r}, VARIABLES)\n"
        "print(float(lp.feasible_set.solve_lp(np.ones(len(VARIABLES)), backend='highs').sum()))\n"
    ),
    # a polytope's own HiGHS model first: min -w1 - 2 w2 on {w in [0, 1]^2, w1 + w2 <= 1} is w = (0, 1)
    "solve_lp": (
        "from hetfed.problems.polytope import Polytope\n"
        "S = Polytope(A_ub=[[1.0, 1.0]], b_ub=[1.0], lb=0.0, ub=1.0)\n"
        "print(S.solve_lp(np.array([-1.0, -2.0]), backend='highs').tolist())\n"
    ),
}


@pytest.mark.parametrize("first", sorted(SILENT_CODE))
def test_reading_and_solving_a_silos_lp_prints_no_solver_banner(first: str) -> None:
    """HiGHS prints a banner when a process makes its first instance (before any option can be set);
    `decide` and a silo print none, whichever of hetfed's HiGHS instances comes first."""
    _, variables = pilot_names()
    code = f"import numpy as np\nVARIABLES = {variables!r}\n" + SILENT_CODE[first]
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "HiGHS" not in out.stdout + out.stderr and len(out.stdout.splitlines()) == 1, out.stdout
    if first == "solve_lp":
        assert [abs(v) for v in json.loads(out.stdout)] == [0.0, 1.0]
        return
    fs = read_lp(PILOT / "problem.lp", variables).feasible_set  # the printed value is the LP's (scipy)
    ref = linprog(
        np.ones(len(variables)), fs.A_ub, fs.b_ub, fs.A_eq, fs.b_eq, list(zip(fs.lb, fs.ub, strict=True))
    )
    assert float(out.stdout) == pytest.approx(float(ref.fun), rel=1e-7)
