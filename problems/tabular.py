"""A silo's own table for the constrained classification tasks (problem ``tabular``; docs/algorithms.md 2).

The silo's data folder (node config ``data-path``) holds ``samples.csv`` with

* optional ``id`` (unique) and ``split`` (``train`` / ``test``) columns; without ``split`` the last
  ``tabular-test-fraction`` of the rows (file order) are the test rows, the others train;
* the feature columns named by run-config key ``tabular-features`` (the model's inputs);
* a ``label`` column (0 or 1);
* with ``tabular-constraint = fairness``, the 0/1 group column named by ``tabular-group``
  (1 = protected). It may also be a feature. Other columns are listed once and ignored.

The features are z-scored with the silo's training rows' statistics
(:class:`hetfed.problems.base.Standardization`, kept in the silo's state for ``hetfed predict``). The model
is the logit ``z(x)`` of ``P(label = 1 | x)``: logistic regression (``tabular-hidden = 0``) or an MLP
``p -> hidden (ReLU) -> 1``, built from the run config alone (the server needs no silo's data). With
``pi(x) = sigmoid(z(x))`` and silo i's training rows,

* ``fairness``: ``f_i = mean BCE(z(x), y)``, ``g_i = |mean_{s=1} pi(x) - mean_{s=0} pi(x)| - delta``
  (problems/fair_classification.py: ``bce``, ``parity_gap``, ``FairClassificationTask.g``);
* ``neyman-pearson``: ``f_i = mean_{y=0} log(1 + exp(z))``, ``g_i = mean_{y=1} log(1 + exp(-z)) - r``
  (problems/np_classification.py: ``benign_loss``, ``malignant_loss``, ``NPClassificationTask.g``).

A silo's task is the existing task of that constraint on its own rows (:attr:`TabularTask.inner`:
the same batches, f, g and evaluation), with this problem's model. Every refusal of a file is one line
naming the file, and where it applies the row and the column.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hetfed.problems.base import Standardization
from hetfed.problems.constrained import check_partition, parse_params, seeded_model
from hetfed.problems.datafile import DataFileError, at
from hetfed.problems.fair_classification import FairBatch, FairClassificationTask, FairConfig
from hetfed.problems.lp import SAMPLES_FILE, Samples, file_sha256, parse_names, read_samples
from hetfed.problems.np_classification import NPBatch, NPClassificationTask, NPConfig

LABEL = "label"
CONSTRAINTS = ("fairness", "neyman-pearson")
SPLITS = ("train", "test")
RESERVED = ("id", "split", LABEL)  # columns that cannot be features
MIN_TRAIN_ROWS = 5  # fewer training rows estimate neither the standardisation nor f_i, g_i


@dataclass(frozen=True)
class TabularConfig:
    """The ``tabular-*`` run-config keys (hyphens become underscores) and the node's ``data-path``."""

    features: str = ""
    constraint: str = "fairness"
    group: str = ""
    delta: float = 0.05
    r: float = 0.2
    hidden: int = 0
    test_fraction: float = 0.2
    data_dir: str | None = None

    def __post_init__(self) -> None:
        names = self.feature_names  # parses tabular-features: one line naming the key
        reserved = [n for n in names if n in RESERVED]
        if reserved:
            raise ValueError(f"run config 'tabular-features': {reserved[0]!r} is not a feature column")
        if self.constraint not in CONSTRAINTS:
            raise ValueError(
                f"run config 'tabular-constraint': unknown value {self.constraint!r}; choose one of "
                f"{list(CONSTRAINTS)}"
            )
        if self.constraint == "fairness":
            if not self.group.strip():
                raise ValueError(
                    "run config 'tabular-group': empty; the fairness constraint reads the 0/1 group column "
                    "it names"
                )
            group = parse_names(self.group, "tabular-group")
            if len(group) != 1 or group[0] in RESERVED:
                raise ValueError(
                    f"run config 'tabular-group': needs one column name other than {', '.join(RESERVED)}, "
                    f"got {self.group!r}"
                )
        for key, value, ok in (
            ("tabular-delta", self.delta, self.delta >= 0),
            ("tabular-r", self.r, self.r >= 0),
            ("tabular-hidden", self.hidden, isinstance(self.hidden, int) and self.hidden >= 0),
            ("tabular-test-fraction", self.test_fraction, 0 <= self.test_fraction < 1),
        ):
            if not ok:
                raise ValueError(f"run config '{key}': out of range, got {value!r}")

    @property
    def feature_names(self) -> tuple[str, ...]:
        return parse_names(self.features, "tabular-features")

    @property
    def group_column(self) -> str:
        """The group column the constraint reads ("" for neyman-pearson)."""
        return self.group.strip() if self.constraint == "fairness" else ""


# ----------------------------------------------------------------------------- the model
def build_model(num_features: int, hidden: int) -> torch.nn.Module:
    """The logit ``z(x)``: ``Linear(p, 1)`` (hidden = 0) or ``p -> hidden (ReLU) -> 1`` (float32,
    PyTorch's default initialisation)."""
    if hidden == 0:
        return torch.nn.Linear(num_features, 1)
    return torch.nn.Sequential(
        torch.nn.Linear(num_features, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 1)
    )


def make_model(seed: int, **params: Any) -> torch.nn.Module:
    """The shared model from the run config alone (``len(tabular-features)`` inputs, ``tabular-hidden``)."""
    config = parse_params(TabularConfig, params)
    return seeded_model(lambda: build_model(len(config.feature_names), config.hidden), seed)


def model_from_arrays(arrays: Mapping[str, np.ndarray]) -> torch.nn.Module:
    """The model of :func:`build_model` holding ``arrays`` (its state dict as NumPy, e.g. a silo's kept
    ``.npz``), in float64; the sizes come from the shapes."""
    if "weight" in arrays:
        num_features, hidden = int(arrays["weight"].shape[1]), 0
    else:
        hidden, num_features = (int(n) for n in arrays["0.weight"].shape)
    model = build_model(num_features, hidden).double()
    model.load_state_dict({k: torch.from_numpy(np.asarray(v, dtype=np.float64)) for k, v in arrays.items()})
    return model.eval()


# ----------------------------------------------------------------------------- the silo's task
@dataclass
class TabularTask:
    """Silo ``partition_id``'s task: the existing task of its constraint (``inner``) on its rows.

    ``scaling`` standardised its features; ``about`` is what its manifest records (plain JSON).
    """

    name: str
    partition_id: int
    seed: int
    config: TabularConfig
    scaling: Standardization
    inner: FairClassificationTask | NPClassificationTask
    num_examples: int
    about: dict[str, Any] = field(default_factory=dict)

    def make_model(self) -> torch.nn.Module:
        return make_model(self.seed, **{f.name: getattr(self.config, f.name) for f in fields(self.config)})

    def sample_batch(self, rng: np.random.Generator, size: int, model: torch.nn.Module | None = None) -> Any:
        return self.inner.sample_batch(rng, size, model)

    def f(self, model: torch.nn.Module, batch: Any) -> torch.Tensor:
        return self.inner.f(model, batch)

    def g(self, model: torch.nn.Module, batch: Any) -> torch.Tensor:
        return self.inner.g(model, batch)

    def evaluate(self, model: torch.nn.Module) -> dict[str, float]:
        """The inner task's metrics: f, g on the training rows, ``test_``-prefixed on the test rows (NaN
        for a test split without the rows a metric needs)."""
        return self.inner.evaluate(model)


def split_indices(samples: Samples, path: Path, test_fraction: float) -> tuple[np.ndarray, np.ndarray]:
    """Train and test row indices: the ``split`` column's (train / test), else file order (the last
    ``floor(test_fraction n)`` rows test)."""
    n = len(samples.ids)
    if samples.split is None:
        n_train = n - math.floor(test_fraction * n)
        return np.arange(n_train), np.arange(n_train, n)
    labels = np.array(samples.split)
    other = np.flatnonzero(~np.isin(labels, SPLITS))
    if other.size:
        i = int(other[0])
        raise DataFileError(
            f"{at(path, samples.rows[i], 'split')}: {samples.split[i]!r}; problem tabular has only train "
            "and test rows"
        )
    return np.flatnonzero(labels == "train"), np.flatnonzero(labels == "test")


def binary_column(values: np.ndarray, samples: Samples, path: Path, column: str) -> np.ndarray:
    """``values`` as a bool array, or the first cell that is neither 0 nor 1 (file, row, column)."""
    bad = np.flatnonzero((values != 0) & (values != 1))
    if bad.size:
        i = int(bad[0])
        raise DataFileError(f"{at(path, samples.rows[i], column)}: {values[i]:g} is not 0 or 1")
    return values == 1


def _both(flags: np.ndarray, path: Path, what: str, role: str) -> None:
    """Refuse training rows that lack the 0s or the 1s of ``what``, which ``role`` needs."""
    for value in (0, 1):
        if not np.any(flags == bool(value)):
            raise DataFileError(f"{path}: no training row has {what} {value}; {role}")


def load_client(partition_id: int, num_partitions: int, seed: int, **params: Any) -> TabularTask:
    """Silo ``partition_id``: ``samples.csv`` in its ``data_dir`` (the node's data-path)."""
    check_partition(partition_id, num_partitions)
    config = parse_params(TabularConfig, params)
    if not config.data_dir:
        raise ValueError("problem 'tabular' needs a node data-path: a folder with samples.csv")
    folder = Path(config.data_dir)
    path = folder / SAMPLES_FILE
    if not folder.is_dir():
        raise DataFileError(f"{folder}: problem 'tabular' needs a data-path folder holding {SAMPLES_FILE}")
    if not path.is_file():
        raise DataFileError(f"{path}: no such file (the silo's features, label and group)")
    features, group = config.feature_names, config.group_column
    columns = [*features, LABEL, *([group] if group and group not in features else [])]
    samples = read_samples(path, columns, ())  # every cell a finite number: one line naming row, column
    values = {name: samples.x[:, j] for j, name in enumerate(columns)}
    y = binary_column(values[LABEL], samples, path, LABEL)
    s = binary_column(values[group], samples, path, group) if group else None
    train, test = split_indices(samples, path, config.test_fraction)
    if len(train) < MIN_TRAIN_ROWS:
        raise DataFileError(
            f"{path}: too few rows: {len(train)} training rows, problem tabular needs at least "
            f"{MIN_TRAIN_ROWS}"
        )
    x_raw = samples.x[:, : len(features)]
    scaling = Standardization.fit(x_raw[train])
    x = scaling.apply(x_raw).float()
    name = f"client-{partition_id:02d}-{folder.name}"
    inner: FairClassificationTask | NPClassificationTask
    if s is not None:
        _both(s[train], path, f"column {group!r} =", "the demographic-parity gap needs both groups")

        def fair(rows: np.ndarray) -> FairBatch:
            index = torch.from_numpy(rows)
            return FairBatch(x[index], torch.from_numpy(y[rows]).float(), torch.from_numpy(s[rows]))

        # FairConfig's Adult keys (hidden, split_by, protected) are unused here: only delta enters g.
        inner = FairClassificationTask(
            name, partition_id, seed, FairConfig(delta=config.delta), fair(train), fair(test)
        )
    else:
        _both(y[train], path, f"{LABEL} =", "f (class-0 loss) and g (class-1 loss) need both classes")

        def np_batch(rows: np.ndarray) -> NPBatch:
            return NPBatch(x[torch.from_numpy(rows[~y[rows]])], x[torch.from_numpy(rows[y[rows]])])

        inner = NPClassificationTask(
            name, partition_id, seed, NPConfig(r=config.r), train, test, np_batch(train), np_batch(test)
        )
    about = {
        "problem": "tabular",
        "features": list(features),
        "label": LABEL,
        "group": group,
        "constraint": config.constraint,
        "bound": config.delta if s is not None else config.r,  # delta (fairness) or r (neyman-pearson)
        "hidden": config.hidden,
        "output": "logit of P(label = 1)",
        "samples-file": str(path.resolve()),
        "samples-sha256": file_sha256(path),
        "train-rows": len(train),
        "test-rows": len(test),
        "notes": [f"{path.name}: ignored columns {', '.join(samples.ignored)}"] if samples.ignored else [],
    }
    return TabularTask(name, partition_id, seed, config, scaling, inner, len(train), about)


# ----------------------------------------------------------------------------- synthetic silos
def write_synthetic_silos(
    out: str | Path,
    num_silos: int = 3,
    rows: int = 200,
    features: Sequence[str] = ("x1", "x2", "x3", "x4"),
    seed: int = 0,
) -> list[Path]:
    """Silo folders ``out/silo-<k>/samples.csv`` from a seeded logistic model (an example and tests).

    Silo k's features are ``N(mu_k, diag(sigma_k^2))`` (its own location and scale); its group
    ``s ~ Bernoulli(0.3 + 0.1 k)``, and ``label ~ Bernoulli(sigmoid(beta'z + 1.5 s - 0.5))`` with
    ``z`` the features centred and scaled by the silo's own mu_k, sigma_k: the label depends on the
    group, so an unconstrained model has a parity gap. Columns: id, split (last 20% test), the
    features, label, group, and a ``note`` column (ignored by the loader).
    """
    rng = np.random.default_rng(seed)
    beta = rng.normal(size=len(features))
    folders = []
    for k in range(num_silos):
        mu, sigma = rng.normal(scale=3.0, size=len(features)), rng.uniform(0.5, 4.0, size=len(features))
        z = rng.normal(size=(rows, len(features)))
        group = rng.random(rows) < 0.3 + 0.1 * (k % 5)
        label = rng.random(rows) < 1 / (1 + np.exp(-(z @ beta + 1.5 * group - 0.5)))
        x = mu + sigma * z
        folder = Path(out) / f"silo-{k}"
        folder.mkdir(parents=True, exist_ok=True)
        n_test = rows // 5
        lines = ["id,split," + ",".join(features) + ",label,group,note"]
        for i in range(rows):
            split = "test" if i >= rows - n_test else "train"
            cells = ",".join(f"{v:.6f}" for v in x[i])
            lines.append(f"s{k}-{i:04d},{split},{cells},{int(label[i])},{int(group[i])},row {i}")
        (folder / SAMPLES_FILE).write_text("\n".join(lines) + "\n")
        folders.append(folder)
    return folders
