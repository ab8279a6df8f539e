"""A silo's own decision problem (problem ``lp``): its LP file and its samples, no Python needed.

The silo's data folder (node config ``data-path``) holds

* ``problem.lp`` (CPLEX LP format) or ``problem.mps``: variables, constraints and bounds, read with
  HiGHS. The objective's coefficients are ignored (the costs are what is predicted); its sense is
  honoured. Variables are matched to the run config's ``lp-variables`` by name, never by position.
* ``samples.csv``: optional ``id`` (unique) and ``split`` (``train`` / ``val`` / ``test``) columns,
  the ``lp-features`` columns and one ``cost:<variable>`` column per variable. Other columns are
  listed once (the silo's notes) and ignored. Without ``split`` the rows split in file order
  (``lp-train-fraction``, ``lp-val-fraction``, the rest test).

The sense enters in one place, :meth:`LinearProgram.reflect`. ``max_{w in S} c'w = -min_{u in -S} c'u``
with ``u = -w``: a ``Maximize`` silo learns and decides on the reflected set ``-S`` while its costs
keep their meaning, so the shared model predicts the same quantity (e.g. a price) in every silo
(docs/algorithms.md, "A silo's own LP").
"""

from __future__ import annotations

import csv
import functools
import hashlib
import re
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp
import torch

from hetfed.problems.base import DecisionClientData, chronological_split_sizes, standardized_splits
from hetfed.problems.datafile import (
    DataFileError,
    at,
    empty_file,
    finite,
    missing_columns,
    open_csv,
    row_length,
)
from hetfed.problems.polytope import Polytope, PolytopeLabels, quiet_highs

PROBLEM_FILES = ("problem.lp", "problem.mps")
SAMPLES_FILE = "samples.csv"
COST_PREFIX = "cost:"
SPLITS = ("train", "val", "test")
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.\[\]()#$%&~@^-]*$")  # a name both LP and MPS files can hold


class ProblemFileError(DataFileError):
    """A silo's LP/MPS file is unusable; the message names the file, the line or row, the culprit."""


def parse_names(text: str, key: str, variables: bool = False) -> tuple[str, ...]:
    """The comma-separated names of run-config ``key`` (columns of samples.csv; with ``variables``,
    names an LP or MPS file can hold)."""
    names = tuple(part.strip() for part in str(text).split(","))
    if not text.strip() or not all(names):
        raise ValueError(f"run config '{key}': needs comma-separated names, got {text!r}")
    bad = [n for n in names if variables and not _NAME.match(n)]
    if bad:
        raise ValueError(f"run config '{key}': {bad[0]!r} is not a variable name of an LP file")
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ValueError(f"run config '{key}': {twice[0]!r} appears twice")
    return names


@dataclass(frozen=True)
class LinearProgram:
    """A silo's LP as its file states it: ``S`` with coordinates in ``lp-variables`` order, and its sense."""

    path: Path
    sha256: str
    variables: tuple[str, ...]
    maximize: bool
    feasible_set: Polytope  # S as written
    relaxed: tuple[str, ...] = ()  # integer variables relaxed to continuous (lp-relax-integers)

    def reflect(self, w: Any) -> Any:
        """``u = -w`` for a ``Maximize`` file, ``w`` otherwise (its own inverse): the one place the
        objective's sense enters (``max_{w in S} c'w = -min_{u in -S} c'u``)."""
        return -w if self.maximize else w

    @functools.cached_property
    def minimisation_set(self) -> Polytope:
        """The set a silo learns and decides on: ``S`` for ``Minimize``, ``-S = {reflect(w) : w in S}``
        for ``Maximize`` (``min c'u`` over it is the file's ``max c'w``)."""
        s = self.feasible_set
        if not self.maximize:
            return s
        a_ub, a_eq = self.reflect(s.A_ub), self.reflect(s.A_eq)  # A w <= b  <=>  (-A) u <= b
        return Polytope(a_ub, s.b_ub, a_eq, s.b_eq, self.reflect(s.ub), self.reflect(s.lb), labels=s.labels)

    def decisions(self, u: torch.Tensor) -> torch.Tensor:
        """The file's variables ``w`` from minimisers ``u`` over :attr:`minimisation_set`."""
        return self.reflect(u)

    def describe(self) -> dict[str, Any]:
        """What a silo records of its LP (no constraint data): file, sha256, sense, relaxed variables."""
        return {
            "problem-file": str(self.path.resolve()),
            "problem-sha256": self.sha256,
            "sense": "maximize" if self.maximize else "minimize",
            "relaxed-integers": list(self.relaxed),
        }


def file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _without_bom(path: Path, tmp: Path) -> Path:
    """``path``, or a copy in ``tmp`` without its UTF-8 byte-order mark, which HiGHS would read as
    part of the first keyword (an editor on Windows may write one)."""
    data = path.read_bytes()
    if not data.startswith(b"\xef\xbb\xbf"):
        return path
    copy = tmp / f"model{path.suffix}"
    copy.write_bytes(data[3:])
    return copy


def read_lp(path: str | Path, variables: Sequence[str], relax_integers: bool = False) -> LinearProgram:
    """Read ``path`` (``.lp``: CPLEX LP format, ``.mps``) with HiGHS into ``S = {w : rows, bounds}``
    over ``variables`` (matched by name). Refuses, in one line naming the file and the culprit: a
    parse error (HiGHS's message with its line), integer variables unless ``relax_integers``,
    variables missing from either side, an empty or unbounded set."""
    import highspy

    path = Path(path)
    if not path.is_file():
        raise ProblemFileError(f"{path}: no such file")
    h = quiet_highs()
    with tempfile.TemporaryDirectory(prefix="hetfed-highs-") as tmp:
        log = Path(tmp) / "highs.log"
        # HiGHS says what is wrong with a file only in its log: capture it, keep the console quiet.
        h.setOptionValue("log_to_console", False)
        h.setOptionValue("log_file", str(log))
        h.setOptionValue("output_flag", True)
        status = h.readModel(str(_without_bom(path, Path(tmp))))
        h.setOptionValue("output_flag", False)
        text = log.read_text(errors="replace") if log.exists() else ""
    if status == highspy.HighsStatus.kError:
        raise ProblemFileError(_parse_error(path, text))
    lp = h.getLp()
    names = [str(n) for n in lp.col_names_]
    _match_names(path, names, variables)
    _check_integrality(path, lp, names, relax_integers)
    order = np.array([names.index(v) for v in variables])
    n_rows = int(lp.num_row_)
    if lp.a_matrix_.format_ != highspy.MatrixFormat.kColwise:  # HiGHS's readers build it column-wise
        raise ProblemFileError(f"{path}: HiGHS returned a row-wise matrix, which this reader does not expect")
    a = sp.csc_matrix(
        (np.asarray(lp.a_matrix_.value_), np.asarray(lp.a_matrix_.index_), np.asarray(lp.a_matrix_.start_)),
        shape=(n_rows, len(names)),
    )[:, order].toarray()
    lower, upper = np.asarray(lp.row_lower_, dtype=float), np.asarray(lp.row_upper_, dtype=float)
    row_names = [str(n) for n in lp.row_names_] or [f"r{i}" for i in range(n_rows)]
    inf = highspy.kHighsInf
    lower[lower <= -inf], upper[upper >= inf] = -np.inf, np.inf
    eq = np.isfinite(lower) & (lower == upper)
    le, ge = np.isfinite(upper) & ~eq, np.isfinite(lower) & ~eq
    col_lower = np.asarray(lp.col_lower_, dtype=float)[order]
    col_upper = np.asarray(lp.col_upper_, dtype=float)[order]
    col_lower[col_lower <= -inf], col_upper[col_upper >= inf] = -np.inf, np.inf
    labels = PolytopeLabels(
        variables=tuple(variables),
        ub_rows=tuple(
            [row_names[i] for i in np.flatnonzero(le)] + [row_names[i] for i in np.flatnonzero(ge)]
        ),
        eq_rows=tuple(row_names[i] for i in np.flatnonzero(eq)),
    )
    try:
        polytope = Polytope(
            A_ub=np.vstack([a[le], -a[ge]]),
            b_ub=np.concatenate([upper[le], -lower[ge]]),
            A_eq=a[eq],
            b_eq=lower[eq],
            lb=col_lower,
            ub=col_upper,
            labels=labels,
        )
    except ValueError as exc:
        raise ProblemFileError(f"{path}: {_without_repr(str(exc))}") from None
    relaxed = tuple(n for n, kind in zip(names, _kinds(lp), strict=True) if kind != 0)
    return LinearProgram(
        path=path,
        sha256=file_sha256(path),
        variables=tuple(variables),
        maximize=lp.sense_ == highspy.ObjSense.kMaximize,
        feasible_set=polytope,
        relaxed=relaxed,
    )


def _parse_error(path: Path, log: str) -> str:
    """HiGHS's first error in its log, with the line and column it points at, as one line."""
    errors = [line.split("ERROR:", 1)[1].strip() for line in log.splitlines() if "ERROR:" in line]
    where = re.search(r"-->\s*\S*?:(\d+):(\d+)", log)
    note = re.search(r"\|\s*\^+\s*(.+)", log)
    message = errors[0] if errors else "HiGHS could not read it"
    if "not found" in message:
        return f"{path}: HiGHS cannot open it ({message})"
    place = f" line {where[1]}, column {where[2]}" if where else ""
    extra = f" ({note[1].strip()})" if note else ""
    return f"{path}{place}: HiGHS cannot read it: {message}{extra}"


def _match_names(path: Path, names: Sequence[str], variables: Sequence[str]) -> None:
    missing = [v for v in variables if v not in names]
    if missing:
        raise ProblemFileError(
            f"{path}: variable {missing[0]!r} of lp-variables is not in the file"
            + (f" ({len(missing) - 1} more missing)" if len(missing) > 1 else "")
        )
    extra = [n for n in names if n not in variables]
    if extra:
        raise ProblemFileError(
            f"{path}: variable {extra[0]!r} is not in lp-variables"
            + (f" ({len(extra) - 1} more)" if len(extra) > 1 else "")
            + "; every variable of the file must be one of the model's outputs"
        )


def _kinds(lp: Any) -> list[int]:
    """Each column's HighsVarType as an int (0 continuous, 1 integer, 2/3 semi-continuous/-integer)."""
    kinds = [int(k) for k in lp.integrality_]
    return kinds or [0] * int(lp.num_col_)


def _check_integrality(path: Path, lp: Any, names: Sequence[str], relax: bool) -> None:
    kinds = _kinds(lp)
    semi = [n for n, k in zip(names, kinds, strict=True) if k in (2, 3)]
    if semi:
        raise ProblemFileError(f"{path}: variable {semi[0]!r} is semi-continuous; an LP has none")
    integer = [n for n, k in zip(names, kinds, strict=True) if k == 1]
    if integer and not relax:
        raise ProblemFileError(
            f"{path}: variable {integer[0]!r} is integer or binary"
            + (f" ({len(integer) - 1} more)" if len(integer) > 1 else "")
            + "; hetfed learns over LPs: set lp-relax-integers = true to relax them to their bounds"
        )


def _without_repr(message: str) -> str:
    """A Polytope error without the ``Polytope(dim=..., ...)`` that names it (the file does)."""
    return re.sub(r"^Polytope\([^)]*\) is ", "the feasible set is ", message)


# ----------------------------------------------------------------------------- samples.csv
@dataclass(frozen=True)
class Samples:
    """A silo's rows in file order: ids, split labels (or None), raw features and costs."""

    ids: tuple[str, ...]
    split: tuple[str, ...] | None
    x: np.ndarray  # [n, p]
    c: np.ndarray  # [n, d], in the file's sense
    ignored: tuple[str, ...]  # columns that are neither id, split, a feature nor a cost
    rows: tuple[int, ...] = ()  # each sample's row in the file (header = row 1), for messages


def read_samples(path: str | Path, features: Sequence[str], variables: Sequence[str]) -> Samples:
    """Read ``samples.csv``; every problem is one line naming the file, row and column."""
    path = Path(path)
    costs = [COST_PREFIX + v for v in variables]
    try:
        with open_csv(path) as f:
            reader = csv.reader(f)
            header = next(reader, None)
            if header is None:
                raise empty_file(path, "a header row: [id,] [split,] features, cost:<variable> columns")
            header = [h.strip() for h in header]
            twice = sorted({h for h in header if header.count(h) > 1})
            if twice:
                raise DataFileError(f"{at(path, 1, twice[0])}: the header names this column twice")
            missing_columns(path, header, [*features, *costs])
            ids: list[str] = []
            split: list[str] = []
            rows: list[list[float]] = []
            file_rows: list[int] = []
            first_row: dict[str, int] = {}
            for cells in reader:
                row = reader.line_num
                if not cells:
                    continue
                row_length(path, row, len(cells), len(header))
                rec = dict(zip(header, cells, strict=True))
                rows.append([finite(rec[col], path, row, col) for col in (*features, *costs)])
                file_rows.append(row)
                ident = rec["id"].strip() if "id" in rec else str(row)
                if "id" in rec:
                    if not ident:
                        raise DataFileError(f"{at(path, row, 'id')}: empty cell")
                    if ident in first_row:
                        raise DataFileError(
                            f"{path} rows {first_row[ident]} and {row}: duplicated id {ident!r}"
                        )
                first_row[ident] = row
                ids.append(ident)
                if "split" in rec:
                    label = rec["split"].strip()
                    if label not in SPLITS:
                        raise DataFileError(
                            f"{at(path, row, 'split')}: {label!r} is not one of {', '.join(SPLITS)}"
                        )
                    split.append(label)
    except UnicodeDecodeError:
        raise DataFileError(f"{path}: not UTF-8 text") from None
    except csv.Error as exc:
        raise DataFileError(f"{path}: {exc}") from None
    if not rows:
        raise DataFileError(f"{path}: no data rows after the header")
    data = np.array(rows, dtype=np.float64)
    known = {"id", "split", *features, *costs}
    return Samples(
        ids=tuple(ids),
        split=tuple(split) if "split" in header else None,
        x=data[:, : len(features)],
        c=data[:, len(features) :],
        ignored=tuple(h for h in header if h not in known),
        rows=tuple(file_rows),
    )


def split_rows(
    samples: Samples, path: Path, train: float, val: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Row indices of the train, validation and test splits: the ``split`` column's, or file order."""
    n = len(samples.ids)
    if samples.split is None:
        try:
            n_train, n_val, _ = chronological_split_sizes(n, train, val)
        except ValueError as exc:
            raise DataFileError(f"{path}: {exc}") from None
        index = np.arange(n)
        return index[:n_train], index[n_train : n_train + n_val], index[n_train + n_val :]
    labels = np.array(samples.split)
    train_rows, val_rows, test_rows = (np.flatnonzero(labels == s) for s in SPLITS)
    for name, part in zip(SPLITS, (train_rows, val_rows, test_rows), strict=True):
        if len(part) == 0:
            raise DataFileError(f"{path}: too few rows for the splits: no row has split {name!r}")
    return train_rows, val_rows, test_rows


# ----------------------------------------------------------------------------- the silo's folder
def problem_file(folder: Path) -> Path:
    """The folder's ``problem.lp`` or ``problem.mps`` (exactly one)."""
    if not folder.is_dir():
        raise DataFileError(
            f"{folder}: problem 'lp' needs a data-path folder holding problem.lp (or .mps) and samples.csv"
        )
    found = [folder / name for name in PROBLEM_FILES if (folder / name).is_file()]
    if len(found) != 1:
        what = "both problem.lp and problem.mps" if found else "neither problem.lp nor problem.mps"
        raise DataFileError(f"{folder}: holds {what}; give exactly one")
    return found[0]


def load_client(
    folder: str | Path,
    partition_id: int,
    features: Sequence[str],
    variables: Sequence[str],
    relax_integers: bool = False,
    train_fraction: float = 0.5,
    val_fraction: float = 0.1,
) -> DecisionClientData:
    """Silo ``partition_id`` of problem ``lp``: its LP file and samples.csv in ``folder``; features
    z-scored with its training rows' statistics (kept, with the names, for ``hetfed decide``)."""
    folder = Path(folder)
    lp = read_lp(problem_file(folder), variables, relax_integers)
    samples_path = folder / SAMPLES_FILE
    if not samples_path.is_file():
        raise DataFileError(f"{samples_path}: no such file (the silo's features and costs)")
    samples = read_samples(samples_path, features, variables)
    parts = split_rows(samples, samples_path, train_fraction, val_fraction)
    (train, val, test), scaling = standardized_splits(
        [samples.x[p] for p in parts], [samples.c[p] for p in parts]
    )
    notes = [f"{samples_path.name}: ignored columns {', '.join(samples.ignored)}"] if samples.ignored else []
    if lp.relaxed:
        notes.append(
            f"{lp.path.name}: integer variables relaxed (lp-relax-integers): {', '.join(lp.relaxed)}"
        )
    return DecisionClientData(
        name=f"client-{partition_id:02d}-{folder.name}",
        partition_id=partition_id,
        train=train,
        val=val,
        test=test,
        polytope=lp.minimisation_set,
        scaling=scaling,
        feature_names=tuple(features),
        variable_names=tuple(variables),
        source={**lp.describe(), "samples-file": str(samples_path.resolve()), "notes": notes},
    )
