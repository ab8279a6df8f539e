"""Problem ``tabular``: a silo's own table for the constrained classification tasks, and ``hetfed predict``.

Everything the tests compare against is computed here independently, in NumPy: the standardisation
from the training rows of the file, the parity gap and the NP losses from the file's groups and
labels, and the forward pass of the saved ``.npz`` weights.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from hetfed.cli import main
from hetfed.config import validate
from hetfed.decide import state_folder
from hetfed.engines.runner import run_experiment
from hetfed.problems.datafile import DataFileError
from hetfed.problems.registry import get_problem, model_io_names
from hetfed.problems.tabular import load_client, make_model, write_synthetic_silos
from tests.conftest import hetfed_cli

FEATURES = ("x1", "x2", "x3", "x4")


# --- independent NumPy references ---------------------------------------------------------------------
def read_table(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def training_statistics(path: Path, features: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray]:
    """Mean and population std (0 -> 1) of the rows of ``path`` whose split is train."""
    x = np.array([[float(r[c]) for c in features] for r in read_table(path) if r["split"] == "train"])
    std = x.std(axis=0)
    return x.mean(axis=0), np.where(std > 0, std, 1.0)


def forward(weights: dict[str, np.ndarray], x: np.ndarray) -> np.ndarray:
    """The logit of a saved model: ``W x + b``, or ``W2 relu(W1 x + b1) + b2``."""
    if "weight" in weights:
        return (x @ weights["weight"].T + weights["bias"])[:, 0]
    hidden = np.maximum(x @ weights["0.weight"].T + weights["0.bias"], 0.0)
    return (hidden @ weights["2.weight"].T + weights["2.bias"])[:, 0]


def sigmoid(z: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-z))


def numpy_weights(model: torch.nn.Module) -> dict[str, np.ndarray]:
    return {k: v.detach().double().numpy() for k, v in model.state_dict().items()}


def write_rows(path: Path, header: list[str], rows: list[list[Any]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        csv.writer(f, lineterminator="\n").writerows([header, *rows])
    return path


# --- (b) the constraint reads the named column ---------------------------------------------------------
def known_groups(folder: Path) -> dict[str, np.ndarray]:
    """A 12-row file: features x1, x2; label; two 0/1 columns ``grp`` and ``other`` with known,
    different groups; the last 2 rows are test rows."""
    x = np.array(
        [[0.5, 1.0], [1.5, -2.0], [2.0, 0.0], [-1.0, 3.0], [0.0, 0.5], [3.0, 1.0],
         [-2.0, -1.0], [1.0, 2.5], [0.2, -0.3], [2.5, 1.5], [9.0, 9.0], [-9.0, -9.0]]
    )  # fmt: skip
    label = np.array([0, 1, 1, 0, 0, 1, 0, 1, 1, 0, 1, 0])
    grp = np.array([1, 1, 0, 0, 1, 0, 0, 1, 0, 0, 1, 0])
    other = np.array([0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 0, 1])
    split = ["train"] * 10 + ["test"] * 2
    rows = [[f"r{i}", split[i], *x[i], label[i], grp[i], other[i]] for i in range(12)]
    write_rows(folder / "samples.csv", ["id", "split", "x1", "x2", "label", "grp", "other"], rows)
    return {"x": x, "label": label, "grp": grp, "other": other}


def params(folder: Path, **extra: Any) -> dict[str, Any]:
    return {"features": "x1,x2", "group": "grp", "delta": 0.01, "data_dir": str(folder), **extra}


def test_fairness_reads_the_named_group_column(tmp_path: Path) -> None:
    data = known_groups(tmp_path)
    train = slice(0, 10)
    x = data["x"][train]
    x_std = (x - x.mean(axis=0)) / x.std(axis=0)
    gaps = {}
    for column in ("grp", "other"):
        task = load_client(0, 1, 7, **params(tmp_path, group=column))
        model = task.make_model()
        p = sigmoid(forward(numpy_weights(model), x_std))
        s = data[column][train] == 1
        gaps[column] = abs(p[s].mean() - p[~s].mean())
        metrics = task.evaluate(model)
        assert metrics["dp_gap"] == pytest.approx(gaps[column], abs=1e-6)
        assert metrics["g"] == pytest.approx(gaps[column] - 0.01, abs=1e-6)
        whole = task.inner.train  # g on the whole training split, as a batch
        assert float(task.g(model, whole).detach()) == pytest.approx(gaps[column] - 0.01, abs=1e-6)
        y = data["label"][train]
        bce = -np.mean(y * np.log(p) + (1 - y) * np.log(1 - p))
        assert metrics["f"] == pytest.approx(bce, abs=1e-6)
        assert task.about["group"] == column and task.about["constraint"] == "fairness"
    assert abs(gaps["grp"] - gaps["other"]) > 1e-3  # the other column's groups give another gap
    with pytest.raises(DataFileError) as err:  # a group column the file lacks
        load_client(0, 1, 7, **params(tmp_path, group="sex"))
    assert str(err.value) == f"{tmp_path / 'samples.csv'}: missing 1 of 4 columns: sex"
    with pytest.raises(DataFileError) as err:  # a mislabelled group (x1 holds no 0/1 values)
        load_client(0, 1, 7, **params(tmp_path, group="x1"))
    assert str(err.value) == f"{tmp_path / 'samples.csv'} row 2, column 'x1': 0.5 is not 0 or 1"


def test_neyman_pearson_reads_the_label_column(tmp_path: Path) -> None:
    data = known_groups(tmp_path)
    x, y = data["x"][:10], data["label"][:10]
    x_std = (x - x.mean(axis=0)) / x.std(axis=0)
    task = load_client(0, 1, 3, **params(tmp_path, constraint="neyman-pearson", r=0.3, hidden=4))
    model = task.make_model()
    z = forward(numpy_weights(model), x_std)
    metrics = task.evaluate(model)
    assert metrics["f"] == pytest.approx(np.mean(np.log1p(np.exp(z[y == 0]))), abs=1e-6)
    assert metrics["g"] == pytest.approx(np.mean(np.log1p(np.exp(-z[y == 1]))) - 0.3, abs=1e-6)
    assert metrics["miss_rate"] == pytest.approx(np.mean(z[y == 1] <= 0))
    assert task.about["group"] == "" and task.num_examples == 10


def test_the_server_builds_the_model_from_the_run_config_alone() -> None:
    cfg = validate({"problem": "tabular", "tabular-features": "a,b,c", "tabular-group": "g", "seed": 5})
    spec = get_problem("tabular")
    assert spec.family == "constrained" and spec.make_model is not None
    model = spec.make_model(cfg)
    assert [tuple(v.shape) for v in model.state_dict().values()] == [(1, 3), (1,)]
    same = make_model(5, features="a,b,c", group="g")
    assert all(
        torch.equal(a, b)
        for a, b in zip(model.state_dict().values(), same.state_dict().values(), strict=True)
    )
    mlp = spec.make_model({**cfg, "tabular-hidden": 6})
    assert [tuple(v.shape) for v in mlp.state_dict().values()] == [(6, 3), (6,), (1, 6), (1,)]
    assert model_io_names(cfg) == (("a", "b", "c"), ("label",))


# --- (c) refusals: one line each ------------------------------------------------------------------------
def good_rows() -> list[list[Any]]:
    return [[f"r{i}", "train", i * 0.5, (i % 3) - 1.0, i % 2, (i // 2) % 2] for i in range(8)]


HEADER = ["id", "split", "x1", "x2", "label", "grp"]


def edited(row: int, column: str, value: str) -> list[list[Any]]:
    """The good rows with one cell changed (``row`` as the file numbers it: header = 1)."""
    rows = good_rows()
    rows[row - 2][HEADER.index(column)] = value
    return rows


@pytest.mark.parametrize(
    ("header", "rows", "message"),
    [
        (["id", "split", "x1", "label", "grp"], [r[:3] + r[4:] for r in good_rows()],
         "{file}: missing 1 of 4 columns: x2"),
        (["id", "split", "x1", "x2", "grp"], [r[:4] + r[5:] for r in good_rows()],
         "{file}: missing 1 of 4 columns: label"),
        (HEADER, edited(4, "label", "2"), "{file} row 4, column 'label': 2 is not 0 or 1"),
        (HEADER, edited(5, "label", "0.5"), "{file} row 5, column 'label': 0.5 is not 0 or 1"),
        (HEADER, edited(3, "label", ""), "{file} row 3, column 'label': empty cell"),
        (HEADER, edited(6, "x2", "nan"), "{file} row 6, column 'x2': 'nan' is not a finite number"),
        (HEADER, edited(7, "x1", ""), "{file} row 7, column 'x1': empty cell"),
        (HEADER, edited(2, "grp", "yes"), "{file} row 2, column 'grp': 'yes' is not a number"),
        (HEADER, edited(9, "grp", "-1"), "{file} row 9, column 'grp': -1 is not 0 or 1"),
        (HEADER, [[*r[:5], 1] for r in good_rows()],
         "{file}: no training row has column 'grp' = 0; the demographic-parity gap needs both groups"),
        (HEADER, good_rows()[:4], "{file}: too few rows: 4 training rows, problem tabular needs at least 5"),
        (HEADER, [[r[0], "test", *r[2:]] for r in good_rows()],
         "{file}: too few rows: 0 training rows, problem tabular needs at least 5"),
        (HEADER, edited(4, "split", "val"),
         "{file} row 4, column 'split': 'val'; problem tabular has only train and test rows"),
        (HEADER, [], "{file}: no data rows after the header"),
    ],
)  # fmt: skip
def test_each_bad_file_is_refused_in_one_line(
    tmp_path: Path, header: list[str], rows: list[list[Any]], message: str
) -> None:
    path = write_rows(tmp_path / "silo" / "samples.csv", header, rows)
    with pytest.raises(DataFileError) as err:
        load_client(0, 1, 0, **params(path.parent))
    assert str(err.value) == message.format(file=path)
    assert "\n" not in str(err.value)


def test_neyman_pearson_needs_both_classes_in_training(tmp_path: Path) -> None:
    path = write_rows(tmp_path / "samples.csv", HEADER, [[*r[:4], 1, r[5]] for r in good_rows()])
    with pytest.raises(DataFileError) as err:
        load_client(0, 1, 0, **params(tmp_path, constraint="neyman-pearson"))
    assert str(err.value) == (
        f"{path}: no training row has label = 0; f (class-0 loss) and g (class-1 loss) need both classes"
    )
    load_client(0, 1, 0, **params(tmp_path))  # fairness does not need both labels


def test_folder_and_run_config_refusals(tmp_path: Path) -> None:
    with pytest.raises(DataFileError, match=r"samples.csv: no such file"):
        load_client(0, 1, 0, **params(tmp_path))
    with pytest.raises(ValueError, match=r"^problem 'tabular' needs a node data-path"):
        load_client(0, 1, 0, **params(tmp_path, data_dir=None))
    for extra, message in (
        ({"features": ""}, "run config 'tabular-features': needs comma-separated names, got ''"),
        ({"features": "x1,label"}, "run config 'tabular-features': 'label' is not a feature column"),
        ({"features": "x1,x1"}, "run config 'tabular-features': 'x1' appears twice"),
        ({"group": ""}, "run config 'tabular-group': empty; the fairness constraint reads the 0/1 group"),
        ({"group": "a,b"}, "run config 'tabular-group': needs one column name other than id, split, label"),
        ({"test_fraction": 1.0}, "run config 'tabular-test-fraction': out of range, got 1.0"),
    ):
        with pytest.raises(ValueError) as err:
            make_model(0, **params(tmp_path, **extra))
        assert str(err.value).startswith(message), str(err.value)
    make_model(0, **params(tmp_path, group="", constraint="neyman-pearson"))  # NP reads no group


def test_without_a_split_column_the_last_rows_test(tmp_path: Path) -> None:
    rows = [[r[0], *r[2:]] for r in good_rows()] * 2  # 16 rows, ids repeated: give new ones
    rows = [[f"q{i}", *r[1:]] for i, r in enumerate(rows)]
    write_rows(tmp_path / "samples.csv", ["id", "x1", "x2", "label", "grp"], rows)
    task = load_client(0, 1, 0, **params(tmp_path, test_fraction=0.25))
    assert (task.about["train-rows"], task.about["test-rows"]) == (12, 4)
    x = np.array([[float(r[1]), float(r[2])] for r in rows[:12]])
    assert np.allclose(task.scaling.arrays()["mean"], x.mean(axis=0))
    assert np.allclose(task.scaling.arrays()["std"], x.std(axis=0))


# --- (d) a real inline run, then hetfed predict ----------------------------------------------------------
RUN = {
    "problem": "tabular",
    "tabular-features": ",".join(FEATURES),
    "tabular-group": "group",
    "num-rounds": 12,
    "switching-eval-every": 4,
    "switching-eta": 0.5,
    "switching-gamma": 0.5,
    "switching-local-steps": 2,
    "batch-size": 32,
    "num-clients": 3,
}


@pytest.fixture(scope="module")
def federation(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """3 good silos and a 4th whose file has a label 2; one switching run (fairness, logistic) and one
    primal-dual run (Neyman-Pearson, an MLP) over them, each silo's state in ``root/state``."""
    root = tmp_path_factory.mktemp("tabular")
    silos = write_synthetic_silos(root / "data", num_silos=4, rows=150, features=FEATURES, seed=11)
    table = (silos[3] / "samples.csv").read_text().splitlines()
    cells = table[5].split(",")
    cells[6] = "2"  # row 6, column label
    (silos[3] / "samples.csv").write_text("\n".join([*table[:5], ",".join(cells), *table[6:]]) + "\n")
    for name, extra in (
        ("fair", {"strategy": "softmax-switching"}),
        ("np", {"strategy": "primal-dual", "tabular-constraint": "neyman-pearson", "tabular-hidden": 5}),
    ):
        summary = run_experiment(
            "inline",
            {**RUN, **extra, "run-name": name},
            nodes=4,
            results_dir=root / "results",
            data_path=str(root / "data" / "silo-{partition}"),
            state_dir=str(root / "state"),
            echo=lambda _: None,
        )
        assert summary["status"] == "completed"
        assert summary["failed"] == {
            "partition-3": f"{silos[3] / 'samples.csv'} row 6, column 'label': 2 is not 0 or 1"
        }
    yield root


def new_features(path: Path) -> np.ndarray:
    """7 new rows: the features in another order, an id, an extra column; returns x in FEATURES order."""
    x = np.random.default_rng(3).normal(scale=4.0, size=(7, len(FEATURES)))
    order = [3, 0, 2, 1]
    rows = [[f"n{i}", *[repr(float(x[i, j])) for j in order], "extra"] for i in range(7)]
    write_rows(path, ["id", *[FEATURES[j] for j in order], "comment"], rows)
    return x


@pytest.mark.parametrize(
    ("run", "model", "partition"), [("fair", None, 0), ("fair", "last", 2), ("np", None, 1)]
)
def test_predict_equals_a_numpy_forward_pass_of_the_kept_model(
    federation: Path, tmp_path: Path, run: str, model: str | None, partition: int
) -> None:
    x = new_features(tmp_path / "new.csv")
    out = tmp_path / "predictions.csv"
    args = ["--state-dir", str(federation / "state"), "--run", run, "--features", str(tmp_path / "new.csv")]
    args += ["--out", str(out), "--partition", str(partition), *(["--model", model] if model else [])]
    done = hetfed_cli("predict", *args)
    assert done.returncode == 0, done.stderr
    folder = state_folder(federation / "state", run, partition)
    which = model or "average"
    with np.load(folder / f"{which}.npz") as stored:
        weights = {k: stored[k].astype(np.float64) for k in stored.files}
    mean, std = training_statistics(federation / "data" / f"silo-{partition}" / "samples.csv", FEATURES)
    p = sigmoid(forward(weights, (x - mean) / std))
    table = read_table(out)
    assert [r["id"] for r in table] == [f"n{i}" for i in range(7)]
    assert np.allclose([float(r["probability"]) for r in table], p, rtol=1e-12, atol=1e-14)
    assert [int(r["prediction"]) for r in table] == [int(v > 0.5) for v in p]
    sidecar = json.loads(out.with_suffix(".json").read_text())
    assert (sidecar["run"], sidecar["model"], sidecar["rows"]) == (run, which, 7)
    assert sidecar["ignored-columns"] == ["comment"] and sidecar["features"] == list(FEATURES)
    assert sidecar["round"] == RUN["num-rounds"]
    assert f"7 predictions of run {run} ({which} model" in done.stdout


def test_the_silo_keeps_the_runs_final_models_and_its_manifest(federation: Path) -> None:
    with np.load(federation / "results" / "fair" / "models.npz") as final:
        server = {k: final[k] for k in final.files}
    for pid in range(3):
        folder = state_folder(federation / "state", "fair", pid)
        for name in ("last", "average"):
            with np.load(folder / f"{name}.npz") as kept:
                assert all(np.array_equal(kept[k], server[f"{name}/{k}"]) for k in kept.files)
        manifest = json.loads((folder / "manifest.json").read_text())
        assert manifest["method"] == "softmax-switching" and manifest["run"] == "fair"
        assert (manifest["features"], manifest["label"], manifest["group"]) == (
            list(FEATURES),
            "label",
            "group",
        )
        assert manifest["constraint"] == "fairness" and manifest["notes"] == [
            "samples.csv: ignored columns note"
        ]
        mean, std = training_statistics(federation / "data" / f"silo-{pid}" / "samples.csv", FEATURES)
        with np.load(folder / "scaling.npz") as scaling:
            assert np.allclose(scaling["mean"], mean, rtol=1e-12) and np.allclose(
                scaling["std"], std, rtol=1e-12
            )
    assert not list((federation / "state").glob("fair.*-p3"))  # the refused silo kept nothing
    silos = json.loads((federation / "results" / "fair" / "silos.json").read_text())["silos"]
    assert silos["partition-0"]["notes"] == ["samples.csv: ignored columns note"]  # the run records them
    np_manifest = json.loads((state_folder(federation / "state", "np", 0) / "manifest.json").read_text())
    assert (np_manifest["method"], np_manifest["constraint"], np_manifest["group"]) == (
        "primal-dual", "neyman-pearson", ""
    )  # fmt: skip
    assert np_manifest["activation"] == "relu"


def test_predict_refuses_in_one_line(
    federation: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The CLI's own entry point, in this process (the subprocess path is exercised above)."""
    write_rows(tmp_path / "few.csv", ["id", "x1", "x2", "x3"], [["a", 1, 2, 3]])
    common = ["--state-dir", str(federation / "state"), "--out", str(tmp_path / "p.csv")]
    for args, message in (
        (["--run", "fair", "--partition", "0", "--features", str(tmp_path / "few.csv")],
         f"{tmp_path / 'few.csv'}: missing 1 of 4 columns: x4"),
        (["--run", "fair", "--features", str(tmp_path / "few.csv")],
         "run 'fair' has state for several partitions (fair."),
        (["--run", "nope", "--features", str(tmp_path / "few.csv")], "run 'nope' kept no model here"),
    ):  # fmt: skip
        assert main(["predict", *common, *args]) == 2
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("hetfed: error: ") and message in lines[0], lines
    assert not (tmp_path / "p.csv").exists()


def test_predict_defaults_to_the_kept_models_and_refuses_other_problems(
    federation: Path, tmp_path: Path
) -> None:
    import shutil

    from hetfed.decide import DecideError
    from hetfed.predict import predict

    kept = state_folder(federation / "state", "fair", 1)
    state = tmp_path / "state"
    shutil.copytree(kept, state / kept.name)
    kept = state / kept.name
    manifest = json.loads((kept / "manifest.json").read_text())
    (kept / "manifest.json").write_text(json.dumps({**manifest, "models": ["last"]}))
    (kept / "average.npz").unlink()  # a run without an averaged round keeps only the last
    x = new_features(tmp_path / "new.csv")
    sidecar = predict(state, "fair", tmp_path / "new.csv", tmp_path / "p.csv")
    assert sidecar["model"] == "last"
    with np.load(kept / "last.npz") as stored:
        weights = {k: stored[k].astype(np.float64) for k in stored.files}
    mean, std = training_statistics(federation / "data" / "silo-1" / "samples.csv", FEATURES)
    expected = sigmoid(forward(weights, (x - mean) / std))
    assert np.allclose(
        [float(r["probability"]) for r in read_table(tmp_path / "p.csv")], expected, rtol=1e-12
    )
    with pytest.raises(DecideError, match=r"-p1: no average model \(kept: last\)$"):
        predict(state, "fair", tmp_path / "new.csv", tmp_path / "q.csv", model="average")
    (kept / "manifest.json").write_text(json.dumps({**manifest, "problem": "lp"}))
    with pytest.raises(DecideError, match=r"not a silo's own table \(problem 'tabular'\); for problem 'lp'"):
        predict(state, "fair", tmp_path / "new.csv", tmp_path / "q.csv")
