"""Checks for the data files a silo reads (its node's ``data-path``), with one-line messages.

Every message names the file, and where it applies the row and the column. Rows are numbered
as a spreadsheet shows the file: the header is row 1, the first data row is row 2.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

MAX_LISTED = 5  # missing columns named in a message; the rest are counted


class DataFileError(ValueError):
    """A data file is unusable; the message names the file, the row and the column."""


def open_csv(path: str | Path) -> TextIO:
    """``path`` for ``csv.reader``: UTF-8 with or without a byte-order mark (Excel's "CSV UTF-8"
    writes one; read as text it would glue itself to the first column's name), any line ends."""
    return open(path, newline="", encoding="utf-8-sig")


def at(path: str | Path, row: int | None = None, column: str | None = None) -> str:
    """``file row 7, column 'x'``: where a problem is."""
    parts = [f"{path} row {row}" if row is not None else str(path)]
    if column is not None:
        parts.append(f"column {column!r}")
    return ", ".join(parts)


def missing_columns(path: str | Path, header: Sequence[str], required: Sequence[str]) -> None:
    """Raise if ``header`` lacks any of ``required``: ``missing 3 of 36 columns: a, b, c``."""
    absent = [col for col in required if col not in header]
    if absent:
        listed = ", ".join(absent[:MAX_LISTED])
        more = f", ... ({len(absent) - MAX_LISTED} more)" if len(absent) > MAX_LISTED else ""
        raise DataFileError(f"{path}: missing {len(absent)} of {len(required)} columns: {listed}{more}")


def empty_file(path: str | Path, expected: str) -> DataFileError:
    """The error for a file without a header row."""
    return DataFileError(f"{path}: empty file (expected {expected})")


def row_length(path: str | Path, row: int, cells: int, header: int) -> None:
    """Raise if a row has another number of cells than the header."""
    if cells != header:
        raise DataFileError(f"{at(path, row)}: {cells} cells, the header has {header}")


def finite(text: str, path: str | Path, row: int, column: str) -> float:
    """The cell as a finite float; empty, non-numeric, NaN and Inf cells raise DataFileError."""
    value = text.strip()
    if not value:
        raise DataFileError(f"{at(path, row, column)}: empty cell")
    try:
        number = float(value)
    except ValueError:
        raise DataFileError(f"{at(path, row, column)}: {value!r} is not a number") from None
    if not math.isfinite(number):
        raise DataFileError(f"{at(path, row, column)}: {value!r} is not a finite number")
    return number
