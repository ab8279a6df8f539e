"""Problem ``lp`` (a silo's own LP file and samples.csv, problems/lp.py): the reader against hand-built
polytopes of the same sets, and every refusal as one line naming the file, the line or row and the
culprit, with the silo left out of a real (inline) run while the others go on.
"""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import highspy
import numpy as np
import pytest
import torch
from scipy.optimize import linprog

from hetfed.engines.inline import node_configs, run_inline
from hetfed.problems.datafile import DataFileError
from hetfed.problems.lp import load_client, read_lp, read_samples
from hetfed.problems.polytope import Polytope

# x + 2y + 3z over {x + y + z <= 10, x - y >= -2, x + z = 4, 0 <= x <= 5, y >= 0, -1 <= z <= 3}, with
# the variables first appearing in the order y, z, x (HiGHS numbers them so).
MAXIMIZE_LP = """\\ scrambled: HiGHS sees y first
Maximize
 obj: 2 y + 3 z + x
Subject To
 c2: - y + x >= -2
 c1: z + x + y <= 10
 eq: z + x = 4
Bounds
 0 <= x <= 5
 -1 <= z <= 3
End
"""
# The same set written by hand, coordinates (x, y, z), every row as "<=" or "=".
HAND_A_UB = np.array([[1.0, 1.0, 1.0], [-1.0, 1.0, 0.0]])
HAND_B_UB = np.array([10.0, 2.0])
HAND_A_EQ = np.array([[1.0, 0.0, 1.0]])
HAND_B_EQ = np.array([4.0])
HAND_LB, HAND_UB = np.array([0.0, 0.0, -1.0]), np.array([5.0, np.inf, 3.0])

# A free variable bounded only by its rows: -2 <= a - b, a + b <= 3, a - b <= 1, b in [0, 2], a free.
FREE_LP = """Minimize
 obj: a + b
Subject To
 r1: a - b >= -2
 r2: a + b <= 3
 r3: a - b <= 1
Bounds
 a free
 0 <= b <= 2
End
"""


def canonical(A: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Rows of ``[A | b]`` in a fixed order (a set does not depend on the order of its rows)."""
    rows = np.hstack([A, b[:, None]]) if len(b) else np.zeros((0, A.shape[1] + 1))
    return rows[np.lexsort(rows.T[::-1])]


def assert_same_set(read: Polytope, hand: Polytope) -> None:
    for (a1, b1), (a2, b2) in (
        ((read.A_ub, read.b_ub), (hand.A_ub, hand.b_ub)),
        ((read.A_eq, read.b_eq), (hand.A_eq, hand.b_eq)),
    ):
        np.testing.assert_array_equal(canonical(a1, b1), canonical(a2, b2))
    np.testing.assert_array_equal(read.lb, hand.lb)
    np.testing.assert_array_equal(read.ub, hand.ub)
    costs = torch.from_numpy(np.random.default_rng(0).normal(size=(20, read.dim)))
    np.testing.assert_allclose(read.solve_lp(costs), hand.solve_lp(costs), atol=1e-9)
    np.testing.assert_allclose(read.project(3 * costs), hand.project(3 * costs), atol=1e-9)


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def mps_twin(lp_file: Path) -> Path:
    """The same model written by HiGHS as MPS."""
    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    h.readModel(str(lp_file))
    out = lp_file.with_suffix(".mps")
    h.writeModel(str(out))
    return out


def test_a_maximize_file_with_scrambled_variables_equals_the_hand_built_set(tmp_path: Path) -> None:
    lp = read_lp(write(tmp_path / "p.lp", MAXIMIZE_LP), ["x", "y", "z"])
    hand = Polytope(HAND_A_UB, HAND_B_UB, HAND_A_EQ, HAND_B_EQ, HAND_LB, HAND_UB)
    assert lp.maximize and lp.variables == ("x", "y", "z")
    assert_same_set(lp.feasible_set, hand)
    # The set a Maximize silo learns on is the reflection -S, and its minimisers map back to S's maximisers.
    assert_same_set(
        lp.minimisation_set, Polytope(-HAND_A_UB, HAND_B_UB, -HAND_A_EQ, HAND_B_EQ, -HAND_UB, -HAND_LB)
    )
    c = torch.tensor([[1.0, 2.0, 3.0], [-1.0, 0.5, -2.0]], dtype=torch.float64)
    w = lp.decisions(lp.minimisation_set.solve_lp(c))
    for ci, wi in zip(c.numpy(), w.numpy(), strict=True):
        best = linprog(
            -ci,
            A_ub=HAND_A_UB,
            b_ub=HAND_B_UB,
            A_eq=HAND_A_EQ,
            b_eq=HAND_B_EQ,
            bounds=list(zip(HAND_LB, HAND_UB, strict=True)),
        )
        assert ci @ wi == pytest.approx(-best.fun, abs=1e-9)
    # Another order of lp-variables permutes the coordinates, never the set.
    again = read_lp(tmp_path / "p.lp", ["z", "x", "y"])
    perm = [2, 0, 1]
    hand_zxy = Polytope(
        HAND_A_UB[:, perm], HAND_B_UB, HAND_A_EQ[:, perm], HAND_B_EQ, HAND_LB[perm], HAND_UB[perm]
    )
    assert_same_set(again.feasible_set, hand_zxy)


def test_a_free_variable_bounded_by_rows_and_an_mps_twin(tmp_path: Path) -> None:
    lp_file = write(tmp_path / "free.lp", FREE_LP)
    lp = read_lp(lp_file, ["a", "b"])
    hand = Polytope(
        A_ub=[[-1.0, 1.0], [1.0, 1.0], [1.0, -1.0]], b_ub=[2.0, 3.0, 1.0], lb=[-np.inf, 0.0], ub=[np.inf, 2.0]
    )
    assert not lp.maximize and lp.minimisation_set is lp.feasible_set
    assert_same_set(lp.feasible_set, hand)
    np.testing.assert_allclose(lp.feasible_set.bounding_box()[0], [-2.0, 0.0], atol=1e-9)
    for text in (FREE_LP, MAXIMIZE_LP):
        source = write(tmp_path / "twin" / f"m{len(text)}.lp", text)
        names = ["a", "b"] if text is FREE_LP else ["x", "y", "z"]
        from_lp, from_mps = read_lp(source, names), read_lp(mps_twin(source), names)
        assert from_mps.maximize == from_lp.maximize
        assert_same_set(from_mps.feasible_set, from_lp.feasible_set)


def test_the_pilot_files_read_by_name(tmp_path: Path) -> None:
    """The worked pilot's three files: silo-1 writes its variables in a scrambled order (HiGHS's column
    order is not h01..h24) and is a Maximize file, silo-2 is MPS; all read onto h01..h24."""
    pilot = Path(__file__).resolve().parents[1] / "examples" / "pilot"
    names = [f"h{h:02d}" for h in range(1, 25)]
    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    h.readModel(str(pilot / "silo-1" / "problem.lp"))
    assert list(h.getLp().col_names_) != names  # position would be wrong
    b = read_lp(pilot / "silo-1" / "problem.lp", names)
    assert b.maximize
    # silo-1's fuel row reads as sum(w) <= 30 and its ramp rows keep the right neighbours
    fuel = b.feasible_set.A_ub[np.isclose(b.feasible_set.b_ub, 30.0)]
    np.testing.assert_array_equal(fuel, np.ones((1, 24)))
    ramps = b.feasible_set.A_ub[np.isclose(b.feasible_set.b_ub, 0.6)]
    assert all(sorted(np.flatnonzero(r)) in ([i, i + 1] for i in range(23)) for r in ramps)
    c = read_lp(pilot / "silo-2" / "problem.mps", names)
    assert not c.maximize and c.feasible_set.A_eq.shape[0] == 1


# --- refusals --------------------------------------------------------------------------------------
FEATURES = ["f1", "f2"]
VARIABLES = ["x", "y"]
GOOD_LP = """Minimize
 obj: x + y
Subject To
 cap: x + y <= 1.5
Bounds
 0 <= x <= 1
 0 <= y <= 1
End
"""


def samples_table(n: int = 30, seed: int = 0) -> list[list[str]]:
    """A small samples.csv: id, the two features, costs that depend on them."""
    rng = np.random.default_rng(seed)
    rows = [["id", *FEATURES, "cost:x", "cost:y"]]
    for i in range(n):
        f = rng.normal(size=2)
        rows.append([f"d{i:03d}", *(f"{v:.4f}" for v in f), f"{f[0] - 0.5:.4f}", f"{f[1] * 0.7 - 0.2:.4f}"])
    return rows


def silo(
    folder: Path, table: list[list[str]] | None = None, lp_text: str = GOOD_LP, name: str = "problem.lp"
) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(lp_text)
    with open(folder / "samples.csv", "w", newline="") as f:
        csv.writer(f, lineterminator="\n").writerows(table or samples_table())
    return folder


def changed(table: list[list[str]], row: int, column: str, value: str) -> list[list[str]]:
    out = [list(r) for r in table]
    out[row - 1][out[0].index(column)] = value
    return out


def without(table: list[list[str]], column: str) -> list[list[str]]:
    k = table[0].index(column)
    return [r[:k] + r[k + 1 :] for r in table]


BAD_LP = {
    "parse error": (
        GOOD_LP.replace("cap: x + y <= 1.5", "cap: x + y <= 1.5 z"),
        r"problem\.lp line 4, column \d+: HiGHS cannot read it: .*unexpected variable on the right-hand side",
    ),
    "unbounded": (
        GOOD_LP.replace(" 0 <= y <= 1\n", " y >= 0\n").replace("cap: x + y <= 1.5", "cap: x - y <= 1.5"),
        r"problem\.lp: the feasible set is unbounded: variable 'y' can go to \+inf",
    ),
    "integer": (
        GOOD_LP.replace("End", "General\n y\nEnd"),
        r"problem\.lp: variable 'y' is integer or binary; .*set lp-relax-integers = true",
    ),
    "empty set": (
        GOOD_LP.replace("End", "Subject To\n low: x + y >= 1.8\nEnd"),
        r"problem\.lp: the feasible set is empty: .*row 'cap', row 'low' cannot all hold",
    ),
    "missing variable": (
        GOOD_LP.replace("x + y <= 1.5", "x <= 1.5")
        .replace("obj: x + y", "obj: x")
        .replace(" 0 <= y <= 1\n", ""),
        r"problem\.lp: variable 'y' of lp-variables is not in the file",
    ),
    "extra variable": (
        GOOD_LP.replace("x + y <= 1.5", "x + y + z <= 1.5").replace("End", " 0 <= z <= 1\nEnd"),
        r"problem\.lp: variable 'z' is not in lp-variables",
    ),
}
BAD_SAMPLES = {
    "missing cost column": (lambda t: without(t, "cost:y"), r"samples\.csv: missing 1 of 4 columns: cost:y"),
    "missing feature": (lambda t: without(t, "f2"), r"samples\.csv: missing 1 of 4 columns: f2"),
    "nan": (
        lambda t: changed(t, 5, "f1", "nan"),
        r"samples\.csv row 5, column 'f1': 'nan' is not a finite number",
    ),
    "inf": (
        lambda t: changed(t, 6, "cost:x", "-inf"),
        r"samples\.csv row 6, column 'cost:x': '-inf' is not a finite",
    ),
    "empty cell": (lambda t: changed(t, 7, "cost:y", ""), r"samples\.csv row 7, column 'cost:y': empty cell"),
    "duplicate id": (
        lambda t: changed(t, 9, "id", "d002"),
        r"samples\.csv rows 4 and 9: duplicated id 'd002'",
    ),
    "too few rows": (lambda t: t[:5], r"samples\.csv: 4 rows are too few for a 0.5/0.1/0.4"),
    "split without val": (
        lambda t: [[*t[0], "split"]] + [[*r, "train" if i < 20 else "test"] for i, r in enumerate(t[1:])],
        r"samples\.csv: too few rows for the splits: no row has split 'val'",
    ),
    "bad split": (
        lambda t: [[*t[0], "split"]] + [[*r, "training" if i == 3 else "train"] for i, r in enumerate(t[1:])],
        r"samples\.csv row 5, column 'split': 'training' is not one of train, val, test",
    ),
}
RUN = {
    "problem": "lp",
    "lp-features": ",".join(FEATURES),
    "lp-variables": ",".join(VARIABLES),
    "strategy": "fedavg",
    "loss": "spo+",
    "num-rounds": 1,
    "local-epochs": 1,
    "hidden": 4,
    "num-clients": 2,
}


def bad_silo(case: str, folder: Path) -> Path:
    """The silo folder of refusal ``case`` (a key of BAD_LP or BAD_SAMPLES)."""
    if case in BAD_LP:
        return silo(folder, lp_text=BAD_LP[case][0])
    edit = BAD_SAMPLES[case][0]
    return silo(folder, edit(samples_table()))  # type: ignore[operator]


assert not set(BAD_LP) & set(BAD_SAMPLES)  # one name, one case


@pytest.mark.parametrize("case", sorted(BAD_LP) + sorted(BAD_SAMPLES))
def test_a_bad_silo_file_is_one_line_and_its_silo_is_left_out_of_a_run(tmp_path: Path, case: str) -> None:
    message = (BAD_LP.get(case) or BAD_SAMPLES[case])[1]
    with pytest.raises(DataFileError) as err:
        load_client(bad_silo(case, tmp_path / "alone"), 0, FEATURES, VARIABLES)
    assert "\n" not in str(err.value)
    assert re.search(message, str(err.value)), str(err.value)
    # A real inline run of three silos whose partition 1 has that file: the other two go on.
    folders = [silo(tmp_path / "silo-0", samples_table(seed=0)), bad_silo(case, tmp_path / "silo-1")]
    folders.append(silo(tmp_path / "silo-2", samples_table(seed=2)))
    configs = node_configs(3)
    for c, folder in zip(configs, folders, strict=True):
        c["data-path"] = str(folder)
    summary = run_inline({**RUN, "results-dir": str(tmp_path / "results"), "run-name": "r"}, configs)
    assert summary["status"] == "completed" and summary["aggregate"]["clients-reporting"] == 2
    assert re.search(message, summary["failed"]["partition-1"]), summary["failed"]


def test_integers_are_relaxed_only_when_asked_and_the_run_records_it(tmp_path: Path) -> None:
    text = GOOD_LP.replace("End", "Binary\n x\nEnd").replace(" 0 <= x <= 1\n", "")
    lp = read_lp(write(tmp_path / "int.lp", text), VARIABLES, relax_integers=True)
    assert lp.relaxed == ("x",)
    np.testing.assert_array_equal(lp.feasible_set.lb, [0.0, 0.0])
    np.testing.assert_array_equal(lp.feasible_set.ub, [1.0, 1.0])  # binary -> [0, 1]
    commented = [[*r, "comment" if i == 0 else "seen"] for i, r in enumerate(samples_table(seed=0))]
    folders = [
        silo(tmp_path / "s0", commented, lp_text=text),
        silo(tmp_path / "s1", samples_table(seed=1), lp_text=text),
    ]
    configs = node_configs(2)
    for c, folder in zip(configs, folders, strict=True):
        c["data-path"] = str(folder)
    summary = run_inline(
        {**RUN, "lp-relax-integers": True, "results-dir": str(tmp_path / "results"), "run-name": "r"}, configs
    )
    assert summary["status"] == "completed" and summary["aggregate"]["clients-reporting"] == 2
    silos = json.loads((tmp_path / "results" / "r" / "silos.json").read_text())["silos"]
    assert silos["partition-0"]["notes"] == [
        "samples.csv: ignored columns comment",
        "problem.lp: integer variables relaxed (lp-relax-integers): x",
    ]
    assert silos["partition-1"]["notes"] == ["problem.lp: integer variables relaxed (lp-relax-integers): x"]
    config = json.loads((tmp_path / "results" / "r" / "config.json").read_text())["config"]
    assert config["lp-relax-integers"] is True


def test_samples_read_columns_by_name_and_list_the_rest(tmp_path: Path) -> None:
    table = samples_table(8)
    shuffled = [[r[4], r[2], "extra", r[0], r[3], r[1]] for r in table]
    shuffled[0][2] = "note"
    path = tmp_path / "s.csv"
    with open(path, "w", newline="") as f:
        csv.writer(f).writerows(shuffled)
    s = read_samples(path, FEATURES, VARIABLES)
    expected = np.array([[float(v) for v in r[1:]] for r in table[1:]])
    np.testing.assert_array_equal(s.x, expected[:, :2])
    np.testing.assert_array_equal(s.c, expected[:, 2:])
    assert s.ids == tuple(r[0] for r in table[1:]) and s.ignored == ("note",) and s.split is None


@pytest.mark.parametrize(
    "method",
    [{"strategy": "fedrspo", "loss": loss} for loss in ("mse", "spo+", "rspo+", "pfyl", "dpo", "mse->spo+")]
    + [{"strategy": "fedrspo", "loss": "optnet", "optnet-backend": "qpth"}]  # "exact" is for structured sets
    + [
        {"strategy": "fedavg", "loss": "spo+", "proximal-mu": 0.1},  # FedProx
        {"strategy": "fedrspo", "loss": "rspo+", "ditto-mu": 0.1, "personal-rounds": 0},  # Ditto
        {"strategy": "fedrspo", "loss": "spo+", "interp-dffl": True, "interp-local-epochs": 2},
        {"strategy": "local-only", "loss": "rspo+"},
    ],
    ids=lambda m: "-".join(f"{v}" for v in m.values()),
)
def test_every_decision_method_and_loss_runs_on_silos_own_lps(tmp_path: Path, method: dict) -> None:
    """Two silos with different LP files (one Maximize, with an equality row): each method completes
    and every silo's deployed regret is a real, non-negative number."""
    maximize = GOOD_LP.replace("Minimize", "Maximize").replace("End", "Subject To\n tie: x - y = 0.1\nEnd")
    folders = [
        silo(tmp_path / "s0", samples_table(seed=0)),
        silo(tmp_path / "s1", samples_table(seed=1), maximize),
    ]
    configs = node_configs(2)
    for c, folder in zip(configs, folders, strict=True):
        c["data-path"] = str(folder)
    cfg = {**RUN, "num-clients": 0, "personal-rounds": 1, "results-dir": str(tmp_path / "r"), "run-name": "m"}
    summary = run_inline({**cfg, **method}, configs)
    assert summary["status"] == "completed" and summary["aggregate"]["clients-reporting"] == 2
    for metrics in summary["clients"].values():
        regret = [v for k, v in metrics.items() if k.endswith("-absolute-regret")]
        assert regret and all(np.isfinite(r) and r >= -1e-9 for r in regret), metrics
