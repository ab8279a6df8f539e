"""``hetfed decide`` (hetfed/decide.py) on the worked pilot's silos after a real inline run, checked
against independent routes: the predicted costs against a NumPy forward pass of the saved weights on
features standardised with statistics computed here from the training rows; the decisions against
``scipy.optimize.linprog`` on the LP as HiGHS reads it (no hetfed code: columns by name, the sense
applied here); their regret on the test rows against what the client reported in its final evaluate.
"""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import highspy
import numpy as np
import pytest
from scipy.optimize import linprog

from hetfed.decide import state_folder
from hetfed.engines.runner import run_experiment
from hetfed.reproduce import lp_pilot
from tests.conftest import REPO, hetfed_cli

PILOT = REPO / "examples" / "pilot"
SILOS = ("silo-0", "silo-1", "silo-2")
# The pilot's silos state their features and variables in its plan (hetfed/reproduce/plans/lp-pilot.toml).
FEATURES, VARIABLES = (lp_pilot.PLAN.base[key].split(",") for key in ("lp-features", "lp-variables"))
PILOT_RUN = {**lp_pilot.PLAN.base, "loss": "rspo+", "num-rounds": 4, "personal-rounds": 2}


def read_table(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def splits(rows: list[dict[str, str]]) -> dict[str, list[dict[str, str]]]:
    """The rows of each split as docs/pilot.md states the rule: the split column, else 50/10/40 in
    file order."""
    if "split" in rows[0]:
        return {s: [r for r in rows if r["split"] == s] for s in ("train", "val", "test")}
    n_train, n_val = int(0.5 * len(rows)), int(0.1 * len(rows))
    return {"train": rows[:n_train], "val": rows[n_train : n_train + n_val], "test": rows[n_train + n_val :]}


def raw_lp(path: Path) -> dict:
    """The LP as HiGHS reads it, in VARIABLES order, for scipy: A_ub w <= b_ub, A_eq w = b_eq, bounds."""
    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    h.readModel(str(path))
    lp = h.getLp()
    names = list(lp.col_names_)
    order = [names.index(v) for v in VARIABLES]
    a = np.zeros((lp.num_row_, lp.num_col_))
    start, index, value = lp.a_matrix_.start_, lp.a_matrix_.index_, lp.a_matrix_.value_
    for j in range(lp.num_col_):
        for k in range(start[j], start[j + 1]):
            a[index[k], j] = value[k]
    a = a[:, order]
    lo, hi = np.array(lp.row_lower_), np.array(lp.row_upper_)
    big = 1e20
    eq = (lo == hi) & (np.abs(lo) < big)
    le, ge = (hi < big) & ~eq, (lo > -big) & ~eq
    return {
        "A_ub": np.vstack([a[le], -a[ge]]),
        "b_ub": np.concatenate([hi[le], -lo[ge]]),
        "A_eq": a[eq],
        "b_eq": lo[eq],
        "bounds": [(lp.col_lower_[i], lp.col_upper_[i]) for i in order],
        "sign": -1.0 if lp.sense_ == highspy.ObjSense.kMaximize else 1.0,
    }


def best_objective(lp: dict, c: np.ndarray) -> float:
    """``max c'w`` (Maximize) or ``min c'w`` over the LP, by scipy's linprog."""
    res = linprog(
        lp["sign"] * c,
        A_ub=lp["A_ub"],
        b_ub=lp["b_ub"],
        A_eq=lp["A_eq"],
        b_eq=lp["b_eq"],
        bounds=lp["bounds"],
    )
    assert res.status == 0, res.message
    return float(lp["sign"] * res.fun)


def violation(lp: dict, w: np.ndarray) -> float:
    lo = np.array([b[0] for b in lp["bounds"]])
    hi = np.array([b[1] for b in lp["bounds"]])
    parts = [lp["A_ub"] @ w - lp["b_ub"], np.abs(lp["A_eq"] @ w - lp["b_eq"]), lo - w, w - hi]
    return float(max(np.max(p, initial=0.0) for p in parts))


def mlp_forward(arrays: dict[str, np.ndarray], x: np.ndarray) -> np.ndarray:
    hidden = np.maximum(x @ arrays["0.weight"].T + arrays["0.bias"], 0.0)
    return hidden @ arrays["2.weight"].T + arrays["2.bias"]


def write_features(path: Path, rows: list[dict[str, str]]) -> Path:
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["id", *FEATURES])
        for i, r in enumerate(rows):
            writer.writerow([r.get("id", f"test-{i}"), *(r[c] for c in FEATURES)])
    return path


@pytest.fixture(scope="module")
def pilot_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    """The pilot trained inline, each silo's state in its own dir; its data copied (so tests may edit it)."""
    root = tmp_path_factory.mktemp("pilot")
    for i, name in enumerate(SILOS):
        shutil.copytree(PILOT / name, root / "data" / str(i))
    summary = run_experiment(
        "inline",
        {**PILOT_RUN, "run-name": "pilot"},
        nodes=3,
        results_dir=root / "results",
        data_path=str(root / "data" / "{partition}"),
        state_dir=str(root / "state" / "{partition}"),
        echo=lambda *_: None,
    )
    assert summary["status"] == "completed"
    return root, summary


@pytest.mark.parametrize("partition", [0, 1, 2])
def test_decisions_equal_independent_routes_and_the_clients_own_evaluation(
    pilot_run: tuple[Path, dict], partition: int
) -> None:
    root, summary = pilot_run
    data = root / "data" / str(partition)
    rows = splits(read_table(data / "samples.csv"))
    features = write_features(root / f"test-{partition}.csv", rows["test"])
    out = root / "decisions" / f"federated-{partition}.csv"
    run = hetfed_cli(
        "decide",
        "--state-dir",
        str(root / "state" / str(partition)),
        "--run",
        "pilot",
        "--features",
        str(features),
        "--out",
        str(out),
        "--model",
        "federated",
    )
    assert run.returncode == 0, run.stderr
    assert f"{len(rows['test'])} decisions of run pilot (federated model" in run.stdout
    table = read_table(out)
    assert list(table[0]) == ["id", *VARIABLES, *(f"cost:{v}" for v in VARIABLES), "objective"]
    # predicted costs = the saved weights applied to features standardised with the training rows' statistics
    train_x = np.array([[float(r[c]) for c in FEATURES] for r in rows["train"]])
    mean, std = train_x.mean(axis=0), train_x.std(axis=0)
    test_x = np.array([[float(r[c]) for c in FEATURES] for r in rows["test"]])
    state = state_folder(root / "state" / str(partition), "pilot")
    with np.load(state / "federated.npz") as saved:
        expected = mlp_forward(dict(saved), (test_x - mean) / std)
    c_hat = np.array([[float(r[f"cost:{v}"]) for v in VARIABLES] for r in table])
    np.testing.assert_allclose(c_hat, expected, rtol=1e-9, atol=1e-9)
    # decisions: feasible, optimal for the predicted costs (linprog), objective column = c_hat'w
    lp = raw_lp(next(data.glob("problem.*")))
    w = np.array([[float(r[v]) for v in VARIABLES] for r in table])
    for i in range(len(table)):
        assert violation(lp, w[i]) <= 1e-7
        assert c_hat[i] @ w[i] == pytest.approx(best_objective(lp, c_hat[i]), abs=1e-6)
        assert float(table[i]["objective"]) == pytest.approx(c_hat[i] @ w[i], abs=1e-9)
    # their regret on the true test costs is the one the client reported for the federated model
    true_c = np.array([[float(r[f"cost:{v}"]) for v in VARIABLES] for r in rows["test"]])
    optimum = np.array([best_objective(lp, c) for c in true_c])
    regret = lp["sign"] * ((true_c * w).sum(axis=1) - optimum)
    client = next(v for k, v in summary["clients"].items() if k.startswith(f"client-{partition:02d}"))
    assert regret.mean() == pytest.approx(client["fed-absolute-regret"], rel=1e-6, abs=1e-6)
    assert regret.sum() / np.abs(optimum).sum() == pytest.approx(client["fed-relative-regret"], rel=1e-6)
    sidecar = json.loads(out.with_suffix(".json").read_text())
    assert sidecar["run"] == "pilot" and sidecar["model"] == "federated" and sidecar["rows"] == len(table)
    assert sidecar["problem-sha256"] == sidecar["trained-problem-sha256"]
    assert sidecar["sense"] == ("maximize" if partition == 1 else "minimize")


def test_the_deployed_model_is_the_one_the_silo_chose(pilot_run: tuple[Path, dict]) -> None:
    root, summary = pilot_run
    for partition in range(3):
        state = state_folder(root / "state" / str(partition), "pilot")
        chosen = json.loads((state / "deployed.json").read_text())["model"]
        client = next(v for k, v in summary["clients"].items() if k.startswith(f"client-{partition:02d}"))
        assert chosen == ("personal" if client["dep-personal"] else "federated")
        with np.load(state / "deployed.npz") as dep, np.load(state / f"{chosen}.npz") as kept:
            assert all(np.array_equal(dep[k], kept[k]) for k in kept.files)
        manifest = json.loads((state / "manifest.json").read_text())
        assert manifest["features"] == FEATURES and manifest["variables"] == VARIABLES
        assert manifest["method"] == "fedrspo" and manifest["loss"] == "rspo+" and manifest["run"] == "pilot"
        assert manifest["layers"] == ["0.weight:64x8", "0.bias:64", "2.weight:24x64", "2.bias:24"]
    models = json.loads((root / "results" / "pilot" / "models.json").read_text())
    assert models["global"]["features"] == FEATURES and models["global"]["variables"] == VARIABLES


def test_decide_refuses_what_does_not_match_in_one_line(pilot_run: tuple[Path, dict], tmp_path: Path) -> None:
    root, _ = pilot_run
    state = str(root / "state" / "0")
    rows = splits(read_table(root / "data" / "0" / "samples.csv"))["test"][:3]
    good = write_features(tmp_path / "good.csv", rows)
    lacking = tmp_path / "lacking.csv"
    lacking.write_text(
        "\n".join(",".join(line.split(",")[:-1]) for line in good.read_text().splitlines()) + "\n"
    )
    other_lp = tmp_path / "other.lp"
    other_lp.write_text((root / "data" / "0" / "problem.lp").read_text().replace("h24", "h25"))

    def refused(*args: str) -> str:
        out = hetfed_cli("decide", "--state-dir", state, "--out", str(tmp_path / "d.csv"), *args)
        assert out.returncode == 2 and out.stderr.count("\n") == 1, (out.returncode, out.stderr)
        return out.stderr

    assert "missing 1 of 8 columns: gas_last" in refused("--run", "pilot", "--features", str(lacking))
    assert "variable 'h24' of lp-variables is not in the file" in refused(
        "--run", "pilot", "--features", str(good), "--problem", str(other_lp)
    )
    assert "run 'ghost' kept no model here; runs with a kept model there: pilot" in refused(
        "--run", "ghost", "--features", str(good)
    )
    assert not (tmp_path / "d.csv").exists()
    # the LP file the silo trained on changed: refused unless --problem names the file to decide on
    lp_file = root / "data" / "0" / "problem.lp"
    text = lp_file.read_text()
    try:
        lp_file.write_text(text.replace("= 12", "= 11"))
        assert "changed since run 'pilot' trained on it" in refused("--run", "pilot", "--features", str(good))
        out = hetfed_cli(
            "decide",
            "--state-dir",
            state,
            "--run",
            "pilot",
            "--features",
            str(good),
            "--out",
            str(tmp_path / "d.csv"),
            "--problem",
            str(lp_file),
        )
        assert out.returncode == 0, out.stderr
        w = np.array([[float(r[v]) for v in VARIABLES] for r in read_table(tmp_path / "d.csv")])
        np.testing.assert_allclose(w.sum(axis=1), 11.0, atol=1e-7)  # the new quota holds
    finally:
        lp_file.write_text(text)
