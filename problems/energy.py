"""Energy purchasing: each client buys D_j hours of energy a day at the cheapest predicted hours.

Decision (the daily-quota set of docs/algorithms.md 1.2): ``min_w c'w  s.t.  sum_h w_h = D_j,
0 <= w_h <= 1`` with ``c`` the 24 hourly prices of the target day, predicted from features known
the day before. Prices stay in $/MWh (no scaling), so regrets are in $/MWh x hours bought ($ per
MW of flat purchase).

Two data sources, one sample per client-day, chronological 50/10/40 train/val/test split per client,
features z-scored with the client's own training statistics:

* **ERCOT (real)**: day-ahead prices 2021-2022 at 13 hubs / load zones (the silos, ``ERCOT_ZONES``),
  via :mod:`hetfed.problems.ercot`. Features (``FEATURE_NAMES``) use only days before the target day.
* **PJM layout (the paper's)**: ``client_id,date,total_lmp_0..23,congestion_0..23,<8 weather and
  calendar features>,bess,client_name`` with ``D_j = bess``; real PJM data is brought by the user,
  :func:`generate_pjm_like_csv` writes a synthetic file in that layout.
"""

from __future__ import annotations

import csv
import dataclasses
import functools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import date, timedelta
from pathlib import Path

import numpy as np
import torch

from hetfed.config import ConfigError
from hetfed.problems.base import (
    DecisionClientData,
    DecisionSplit,
    Standardization,
    chronological_split_sizes,
    standardized_splits,
)
from hetfed.problems.datafile import (
    DataFileError,
    at,
    empty_file,
    finite,
    missing_columns,
    open_csv,
    row_length,
)
from hetfed.problems.ercot import ErcotData, load_ercot

HOURS = 24
HISTORY_DAYS = 7  # trailing window of the price features; the first sample is day 8 of the data
SPLIT = (0.5, 0.1)  # train and validation shares; the test set takes the rest (0.4)

# The 13 silos in a fixed order. HB_BUSAVG and HB_HUBAVG (averages of other points) are not silos.
ERCOT_ZONES: tuple[str, ...] = (
    "HB_HOUSTON",
    "HB_NORTH",
    "HB_PAN",
    "HB_SOUTH",
    "HB_WEST",
    "LZ_AEN",
    "LZ_CPS",
    "LZ_HOUSTON",
    "LZ_LCRA",
    "LZ_NORTH",
    "LZ_RAYBN",
    "LZ_SOUTH",
    "LZ_WEST",
)

_PRICE_HOURS = (4, 8, 12, 16, 20, 24)  # hours ending whose previous-day prices are features
FEATURE_NAMES: tuple[str, ...] = (
    "prev_mean",
    "prev_max",
    "prev_min",
    "prev_std",
    *(f"prev_he{h:02d}" for h in _PRICE_HOURS),
    "week_mean",
    "week_max",
    "week_min",
    "week_std",
    "last_week_same_day_mean",
    "dow_sin",
    "dow_cos",
    "month_sin",
    "month_cos",
    "off_peak_day",
    "gas_last",
)
_SQUASH_SCALE = 10.0  # $/MWh: asinh(p / 10) is linear within +-$10 and logarithmic beyond

PJM_FEATURES: tuple[str, ...] = (
    "temp_c_mean",
    "temp_c_min",
    "temp_c_max",
    "humidity_mean",
    "wind_speed_mean",
    "solar_irradiance_mean",
    "solar_irradiance_max",
    "day_of_week",
)
_PJM_LMP = tuple(f"total_lmp_{h}" for h in range(HOURS))
_PJM_CONGESTION = tuple(f"congestion_{h}" for h in range(HOURS))
PJM_COLUMNS: tuple[str, ...] = (
    "client_id",
    "date",
    *_PJM_LMP,
    *_PJM_CONGESTION,
    *PJM_FEATURES,
    "bess",
    "client_name",
)
_PJM_REQUIRED = ("client_id", "date", *_PJM_LMP, *PJM_FEATURES, "bess", "client_name")  # 36 columns read


@dataclass(frozen=True)
class ClientSamples:
    """One client's samples in date order, before splitting: raw features and next-day prices."""

    name: str
    quota: float  # D_j, hours bought per day
    dates: np.ndarray  # datetime64[D] target days, increasing
    x: np.ndarray  # [n, p] raw features, known before the target day
    c: np.ndarray  # [n, 24] the target day's hourly prices, $/MWh

    def __post_init__(self) -> None:
        n = len(self.dates)
        if self.x.ndim != 2 or len(self.x) != n or self.c.shape != (n, HOURS):
            raise ValueError(
                f"ClientSamples needs x [n, p] and c [n, {HOURS}] for n = {n} dates; "
                f"got {self.x.shape} and {self.c.shape}"
            )

    def to_client_data(self, partition_id: int, dtype: torch.dtype = torch.float64) -> DecisionClientData:
        """Chronological 50/10/40 splits (x z-scored on train) and the polytope {0<=w<=1, sum w = quota}."""
        from hetfed.problems.polytope import QuotaPolytope  # lazy: the polytope module pulls in the solvers

        (train, val, test), scaling = _splits(self.x, self.c, dtype)
        polytope = QuotaPolytope(HOURS, self.quota)
        return DecisionClientData(self.name, partition_id, train, val, test, polytope, scaling)


# ----------------------------------------------------------------------------- quotas, calendar
def zone_quota(zone: str) -> int:
    """Hours bought per day by an ERCOT zone: ``D_k = 4 + (5 k mod 9)``, k = the zone's index in ERCOT_ZONES.

    Gives 4, 9, 5, 10, 6, 11, 7, 12, 8, 4, 9, 5, 10: every value 4..12 among the first nine zones, and
    neighbouring zones (often similar prices) get quite different quotas. Fixed per zone, whatever
    subset of zones runs.
    """
    if zone not in ERCOT_ZONES:
        raise ValueError(f"zone {zone!r} is not one of ERCOT_ZONES {ERCOT_ZONES}")
    return 4 + (5 * ERCOT_ZONES.index(zone)) % 9


def nerc_holidays(year: int) -> list[date]:
    """NERC off-peak holidays of ``year`` (New Year, Memorial, Independence, Labor, Thanksgiving, Christmas).

    A fixed-date holiday on a Sunday moves to Monday; on a Saturday it stays (NERC rule).
    """

    def observed(day: date) -> date:
        return day + timedelta(days=1) if day.weekday() == 6 else day

    def nth_weekday(month: int, weekday: int, n: int) -> date:
        first = date(year, month, 1)
        return first + timedelta(days=(weekday - first.weekday()) % 7 + 7 * (n - 1))

    last_monday_may = date(year, 5, 31) - timedelta(days=date(year, 5, 31).weekday())
    return [
        observed(date(year, 1, 1)),
        last_monday_may,
        observed(date(year, 7, 4)),
        nth_weekday(9, 0, 1),
        nth_weekday(11, 3, 4),
        observed(date(year, 12, 25)),
    ]


def _weekday(dates: np.ndarray) -> np.ndarray:
    """Monday = 0 (1970-01-01 was a Thursday)."""
    return (dates.astype("datetime64[D]").astype(np.int64) + 3) % 7


def off_peak_day(dates: np.ndarray) -> np.ndarray:
    """1.0 on weekends and NERC holidays, else 0.0."""
    years = range(int(str(dates.min())[:4]), int(str(dates.max())[:4]) + 1)
    holidays = np.array([d for y in years for d in nerc_holidays(y)], dtype="datetime64[D]")
    return ((_weekday(dates) >= 5) | np.isin(dates, holidays)).astype(np.float64)


# ----------------------------------------------------------------------------- ERCOT samples
def daily_prices(data: ErcotData, zone: str) -> tuple[np.ndarray, np.ndarray]:
    """One settlement point's prices as dates [n_days] and prices [n_days, 24] ($/MWh), every day present.

    DST: on the autumn day the two copies of hour ending 02 (flag N and Y) are averaged; on the
    spring-forward day the skipped hour ending 03 is filled with the mean of hours 02 and 04
    (linear interpolation; any single missing hour is filled this way, at the day's edge with the
    nearest hour). More than one missing hour, a missing day or a duplicated row raise ValueError.
    """
    rows = data.point == zone
    if not rows.any():
        raise ValueError(f"zone {zone!r} has no rows in the data (points: {data.points})")
    when, hour, price = data.date[rows], data.hour_ending[rows] - 1, data.price[rows]
    repeated = data.repeated[rows]
    first = when.min()
    day = (when - first).astype(np.int64)
    n_days = int(day.max()) + 1
    total, count, firsts = np.zeros((n_days, HOURS)), np.zeros((n_days, HOURS)), np.zeros((n_days, HOURS))
    np.add.at(total, (day, hour), price)
    np.add.at(count, (day, hour), 1)
    np.add.at(firsts, (day, hour), ~repeated)
    dates = first + np.arange(n_days)
    line = data.row[rows] if data.row is not None else None
    twice = (firsts > 1) | (count > 2)
    if twice.any():
        d, h = np.argwhere(twice)[0]
        where = _rows_of(data.source, line, (day == d) & (hour == h), " and ")
        raise DataFileError(
            f"{where}zone {zone!r} has duplicated hours on {dates[d]} "
            f"(hour ending {h + 1:02d}){_more(twice.any(axis=1).sum())}"
        )
    missing = count == 0
    short = missing.sum(axis=1) > 1
    if short.any():
        d = int(np.flatnonzero(short)[0])
        where = _rows_of(data.source, line, day == d, "-")
        raise DataFileError(
            f"{where}zone {zone!r} misses more than one hour on {dates[d]}: "
            f"{HOURS - int(missing[d].sum())} of {HOURS} hours{_more(short.sum())}"
        )
    prices = np.divide(total, count, out=np.zeros_like(total), where=~missing)
    hours = np.arange(HOURS)
    for d in np.flatnonzero(missing.any(axis=1)):
        have = ~missing[d]
        prices[d, missing[d]] = np.interp(hours[missing[d]], hours[have], prices[d, have])
    return dates, prices


def _rows_of(source: str, line: np.ndarray | None, mask: np.ndarray, joint: str) -> str:
    """``file rows 5-28, column 'hour_ending': `` for the rows under ``mask`` (or the file alone)."""
    if not source:
        return ""
    if line is None or not mask.any():
        return f"{source}: "
    lo, hi = int(line[mask].min()), int(line[mask].max())
    rows = f"row {lo}" if lo == hi else f"rows {lo}{joint}{hi}"
    return f"{source} {rows}, column 'hour_ending': "


def _more(days: int) -> str:
    return f" (and {days - 1} more days)" if days > 1 else ""


def day_ahead_features(
    dates: np.ndarray, prices: np.ndarray, gas_date: np.ndarray, gas_price: np.ndarray
) -> np.ndarray:
    """Features [n_days - 7, len(FEATURE_NAMES)] of the target days ``dates[7:]``, from earlier days only.

    Price features are ``asinh(p / 10)`` of: the previous day's mean, max, min, std and prices at hours
    ending 4, 8, ..., 24; the trailing 7 days' mean, max, min, std (168 hourly prices); the mean of the
    same weekday a week earlier. Calendar of the target day: sin/cos of weekday (2 pi dow / 7) and month
    (2 pi (m - 1) / 12), off-peak flag (weekend or NERC holiday). Gas: Henry Hub $/MMBtu of the last
    trading day strictly before the target day. The asinh keeps the $9,000 storm hours from swamping the
    z-scoring while staying monotone and defined for negative prices.
    """
    if len(dates) <= HISTORY_DAYS or prices.shape != (len(dates), HOURS):
        raise ValueError(
            f"prices must be [n_days, {HOURS}] with n_days > {HISTORY_DAYS}; "
            f"got {prices.shape} for {len(dates)} dates"
        )
    targets = dates[HISTORY_DAYS:]
    prev = prices[HISTORY_DAYS - 1 : -1]
    week = np.lib.stride_tricks.sliding_window_view(prices[:-1], HISTORY_DAYS, axis=0)  # [m, 24, 7]
    week = week.reshape(len(targets), -1)
    price_stats = np.column_stack(
        [
            prev.mean(1),
            prev.max(1),
            prev.min(1),
            prev.std(1),
            prev[:, [h - 1 for h in _PRICE_HOURS]],
            week.mean(1),
            week.max(1),
            week.min(1),
            week.std(1),
            prices[:-HISTORY_DAYS].mean(1),
        ]
    )
    gas_index = np.searchsorted(gas_date, targets, side="left") - 1
    if (gas_index < 0).any():
        raise ValueError(f"no gas price before {targets[gas_index < 0][0]}")
    dow, month = _weekday(targets), targets.astype("datetime64[M]").astype(np.int64) % 12
    calendar = np.column_stack(
        [
            np.sin(2 * np.pi * dow / 7),
            np.cos(2 * np.pi * dow / 7),
            np.sin(2 * np.pi * month / 12),
            np.cos(2 * np.pi * month / 12),
            off_peak_day(targets),
        ]
    )
    return np.column_stack([np.arcsinh(price_stats / _SQUASH_SCALE), calendar, gas_price[gas_index]])


def zone_samples(data: ErcotData, zone: str) -> ClientSamples:
    """One ERCOT zone's samples: target days from the 8th day on, FEATURE_NAMES, prices in $/MWh."""
    dates, prices = daily_prices(data, zone)
    x = day_ahead_features(dates, prices, data.gas_date, data.gas_price)
    return ClientSamples(zone, zone_quota(zone), dates[HISTORY_DAYS:], x, prices[HISTORY_DAYS:])


# ----------------------------------------------------------------------------- splits, clients
def split_sizes(n: int) -> tuple[int, int, int]:
    """Chronological split sizes: floor(0.5 n) train, floor(0.1 n) validation, the rest test."""
    return chronological_split_sizes(n, *SPLIT)


def split_and_standardize(
    x: np.ndarray, c: np.ndarray, dtype: torch.dtype = torch.float64
) -> tuple[DecisionSplit, DecisionSplit, DecisionSplit]:
    """Train/val/test splits of time-ordered samples; x z-scored with the training rows' mean and std."""
    return _splits(x, c, dtype)[0]


def _splits(
    x: np.ndarray, c: np.ndarray, dtype: torch.dtype
) -> tuple[tuple[DecisionSplit, DecisionSplit, DecisionSplit], Standardization]:
    n_train, n_val, _ = split_sizes(len(x))
    cut = (slice(0, n_train), slice(n_train, n_train + n_val), slice(n_train + n_val, None))
    return standardized_splits([x[s] for s in cut], [c[s] for s in cut], dtype)


def _zone_of(partition_id: int, num_partitions: int, zones: Sequence[str] | None) -> str:
    pool = tuple(zones) if zones is not None else ERCOT_ZONES
    unknown = [z for z in pool if z not in ERCOT_ZONES]
    if unknown or len(set(pool)) != len(pool):
        raise ValueError(f"zones must be distinct names from ERCOT_ZONES {ERCOT_ZONES}; got {list(pool)}")
    if not 1 <= num_partitions <= len(pool):
        raise ValueError(f"num_partitions must be in 1..{len(pool)} (zones available); got {num_partitions}")
    if not 0 <= partition_id < num_partitions:
        raise ValueError(f"partition_id must be in 0..{num_partitions - 1}; got {partition_id}")
    return pool[partition_id]


def load_client(
    partition_id: int,
    num_partitions: int,
    data_path: str | Path | None = None,
    zones: Sequence[str] | None = None,
    seed: int = 0,
    dtype: torch.dtype = torch.float64,
) -> DecisionClientData:
    """Client ``partition_id`` of the ERCOT task: zone ``(zones or ERCOT_ZONES)[partition_id]``.

    Runs use the first ``num_partitions`` zones. Reads only that zone's rows from ``data_path``
    (a directory as made by :func:`hetfed.problems.ercot.fetch_ercot`; None fetches into the cache).
    ``seed`` is accepted for the common ``load_client`` signature; the real data involve no randomness.
    """
    del seed
    zone = _zone_of(partition_id, num_partitions, zones)
    return zone_samples(load_ercot(data_path, points=[zone]), zone).to_client_data(partition_id, dtype)


# ----------------------------------------------------------------------------- PJM layout
def _id_key(client_id: str) -> tuple[int, int, str]:
    """Numeric ids sort as numbers, others as text, numbers first."""
    return (0, int(client_id), "") if client_id.lstrip("-").isdigit() else (1, 0, client_id)


def load_pjm_client(
    path: str | Path, partition_id: int, num_partitions: int | None = None, dtype: torch.dtype = torch.float64
) -> DecisionClientData:
    """Client ``partition_id`` of a PJM-layout CSV (see :func:`pjm_samples`), split and standardised."""
    return pjm_samples(path, partition_id, num_partitions).to_client_data(partition_id, dtype)


def pjm_samples(path: str | Path, partition_id: int, num_partitions: int | None = None) -> ClientSamples:
    """The ``partition_id``-th client_id (in sorted order) of a CSV in the PJM layout.

    Samples are that client's rows ordered by date: x = PJM_FEATURES (8), c = total_lmp_0..23 ($/MWh),
    quota D_j = bess (one value per client). Rows of other clients are not kept (the ids are read
    in a first pass). ``num_partitions`` (default: all clients in the file) must not exceed the count.
    The file is checked as it is read (:mod:`hetfed.problems.datafile`): an empty file, missing columns and
    rows of another length than the header are refused, and so is every empty, non-numeric, NaN or
    Inf cell of the client's rows, each with the file, row and column in one line.
    """
    path = Path(path)
    seen: set[str] = set()
    for row, rec in _pjm_records(path):
        if not rec["client_id"].strip():
            raise DataFileError(f"{at(path, row, 'client_id')}: empty cell")
        seen.add(rec["client_id"])
    ids = sorted(seen, key=_id_key)
    if not ids:
        raise DataFileError(f"{path}: no data rows after the header")
    n_parts = len(ids) if num_partitions is None else num_partitions
    if not 1 <= n_parts <= len(ids):
        raise ValueError(f"num_partitions must be in 1..{len(ids)} (clients in {path}); got {num_partitions}")
    if not 0 <= partition_id < n_parts:
        raise ValueError(f"partition_id must be in 0..{n_parts - 1}; got {partition_id}")
    client = ids[partition_id]
    records = [(row, rec) for row, rec in _pjm_records(path) if rec["client_id"] == client]
    first_row: dict[date, int] = {}
    days, x, c, bess, names = [], [], [], set(), set()
    for row, rec in records:
        try:
            day = date.fromisoformat(rec["date"].strip())
        except ValueError:
            where = at(path, row, "date")
            raise DataFileError(f"{where}: {rec['date']!r} is not a date (YYYY-MM-DD)") from None
        if day in first_row:
            raise DataFileError(
                f"{path} rows {first_row[day]} and {row}: duplicated dates "
                f"({day} twice for client_id {client!r})"
            )
        first_row[day] = row
        days.append(day)
        x.append([finite(rec[col], path, row, col) for col in PJM_FEATURES])
        c.append([finite(rec[col], path, row, col) for col in _PJM_LMP])
        bess.add(finite(rec["bess"], path, row, "bess"))
        names.add(rec["client_name"])
    if len(bess) != 1 or len(names) != 1:
        raise DataFileError(
            f"{path}: client_id {client!r} must have one bess and one client_name; "
            f"got bess {sorted(bess)}, names {sorted(names)}"
        )
    (quota,), (name,) = bess, names
    if not 0 < quota <= HOURS:
        raise DataFileError(f"{path}: bess of client_id {client!r} must be in (0, {HOURS}]; got {quota}")
    in_order = sorted(first_row)
    for before, after in zip(in_order, in_order[1:], strict=False):
        if after - before > timedelta(days=1):  # the splits and the paper's study assume every day
            raise DataFileError(
                f"{path}: client_id {client!r} has no row for {before + timedelta(days=1)} (rows "
                f"{first_row[before]} ({before}) and {first_row[after]} ({after})); every day from the "
                "first to the last must be present"
            )
    order = np.argsort(np.array(days, dtype="datetime64[D]"), kind="stable")
    return ClientSamples(
        name, quota, np.array(days, dtype="datetime64[D]")[order], np.array(x)[order], np.array(c)[order]
    )


def _pjm_records(path: Path) -> Iterator[tuple[int, dict[str, str]]]:
    """(row number, cells by column) of every data row of a PJM-layout CSV; the header is row 1.

    Raises DataFileError for an empty file, missing PJM columns and a row whose length differs from
    the header's (a day needs all its 24 hourly prices).
    """
    row = 1
    try:
        with open_csv(path) as f:
            reader = csv.reader(f)
            header = next(reader, None)
            if header is None:
                raise empty_file(path, "a header row with the PJM-layout columns")
            missing_columns(path, header, _PJM_REQUIRED)
            for cells in reader:
                row = reader.line_num
                if not cells:
                    continue  # a blank line
                row_length(path, row, len(cells), len(header))
                yield row, dict(zip(header, cells, strict=True))
    except UnicodeDecodeError:
        raise DataFileError(f"{at(path, row)}: not UTF-8 text") from None
    except csv.Error as exc:
        raise DataFileError(f"{at(path, row)}: {exc}") from None


def _bump(hours: np.ndarray, centre: np.ndarray | float, width: float) -> np.ndarray:
    return np.exp(-0.5 * ((hours - centre) / width) ** 2)


def generate_pjm_like_csv(
    path: str | Path, n_zones: int = 19, n_days: int = 730, seed: int = 0, start: str = "2021-01-01"
) -> Path:
    """Write a synthetic data set in the PJM layout (PJM_COLUMNS) and return its path.

    Weather: a seasonal temperature cycle plus a regional AR(1) anomaly (phi 0.8) shared by all zones,
    zone offsets, cloud-driven humidity and solar, gamma-distributed wind. Energy price of zone z, day
    d, hour h: ``base_z * gas_d * (1 + 0.03 dd + 0.0015 dd^2) * (1 - 0.015 wind) * weekend`` (dd =
    |temp_mean - 18|, heating and cooling load; weekend 0.85) times a daily shape with a morning and
    a zone-specific evening peak minus a solar midday dip, with 4% noise. Region-wide spikes (x3-x10 on
    3-5 evening hours) are likelier on extreme-temperature days; congestion is zone-specific noise
    scaled by the level. total_lmp = energy + congestion. bess (hours bought) is drawn from 4..12.
    """
    if n_zones < 1 or n_days < 10:
        raise ValueError(f"need n_zones >= 1 and n_days >= 10; got n_zones={n_zones}, n_days={n_days}")
    rng = np.random.default_rng(seed)
    dates = np.datetime64(start, "D") + np.arange(n_days)
    doy = (dates - dates.astype("datetime64[Y]")).astype(np.int64)
    season = np.sin(2 * np.pi * (doy - 110) / 365.25)  # +1 in late July, -1 in late January
    anomaly = np.zeros(n_days)
    for d in range(1, n_days):
        anomaly[d] = 0.8 * anomaly[d - 1] + rng.normal(0, 1.8)
    shape_zd = (n_zones, n_days)
    temp_mean = 12 + 13 * season + anomaly + rng.normal(0, 2, (n_zones, 1)) + rng.normal(0, 1, shape_zd)
    spread = np.clip(10 + 2 * season + rng.normal(0, 2, shape_zd), 3, 20)
    cloud = rng.beta(2, 3, shape_zd)
    humidity = np.clip(45 + 40 * cloud + rng.normal(0, 5, shape_zd), 15, 100)
    wind = rng.gamma(2.0, 2.0, shape_zd) * rng.uniform(0.7, 1.4, (n_zones, 1))
    solar_max = (600 + 300 * season) * (1 - 0.75 * cloud)
    solar_mean = solar_max * (0.28 + 0.04 * season)

    dow = _weekday(dates)
    gas = np.exp(np.cumsum(rng.normal(0, 0.02, n_days)))  # shared fuel-cost random walk
    degree = np.abs(temp_mean - 18)
    level = (
        rng.uniform(25, 45, (n_zones, 1))
        * gas
        * (1 + 0.03 * degree + 0.0015 * degree**2)
        * (1 - 0.015 * wind)
        * np.where(dow >= 5, 0.85, 1.0)
    )
    hours = np.arange(HOURS)
    evening = rng.uniform(16, 19, (n_zones, 1, 1))
    shape = (
        0.75
        + rng.uniform(0.15, 0.35, (n_zones, 1, 1)) * _bump(hours, 8, 2.0)
        + rng.uniform(0.4, 0.9, (n_zones, 1, 1)) * _bump(hours, evening, 2.5)
        - 0.2 * (solar_mean / 300)[..., None] * _bump(hours, 13, 2.5)
    )
    energy = level[..., None] * shape * (1 + rng.normal(0, 0.04, (n_zones, n_days, HOURS)))
    spike_days = rng.random(n_days) < 0.01 + 0.002 * np.maximum(degree.mean(0) - 8, 0) ** 2
    for day in np.flatnonzero(spike_days):
        first = rng.integers(15, 20)
        energy[:, day, first : first + rng.integers(3, 6)] *= rng.uniform(3, 10, (n_zones, 1))
    congestion_scale = rng.uniform(0.3, 1.5, (n_zones, 1, 1))
    congestion = level[..., None] * congestion_scale * rng.normal(0, 0.12, (n_zones, n_days, HOURS))
    total = energy + congestion
    bess = rng.integers(4, 13, n_zones)

    path = Path(path)
    with open(path, "w", newline="") as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow(PJM_COLUMNS)
        for d in range(n_days):
            for z in range(n_zones):
                t, half = temp_mean[z, d], spread[z, d] / 2
                numbers = (
                    *total[z, d],
                    *congestion[z, d],
                    t,
                    t - half,
                    t + half,
                    humidity[z, d],
                    wind[z, d],
                    solar_mean[z, d],
                    solar_max[z, d],
                )
                writer.writerow(
                    [
                        z,
                        str(dates[d]),
                        *(f"{v:.2f}" for v in numbers),
                        int(dow[d]),
                        int(bess[z]),
                        f"zone_{z:02d}",
                    ]
                )
    return path


# --- the run's zones and training window (run config energy-*, read by problems/registry.py) ---------
# Winter Storm Uri: the run of target days whose ERCOT day-ahead mean price exceeded $70/MWh in every zone
# (up to ~$9,000/MWh); `energy-exclude-storm` drops them from the training split.
STORM_DAYS = (np.datetime64("2021-02-12"), np.datetime64("2021-02-20"))


def parse_zones(text: str) -> tuple[str, ...]:
    """The ERCOT zones named in ``energy-zones`` (comma-separated), or all of ERCOT_ZONES when empty."""
    text = text.strip()
    if not text:
        return ERCOT_ZONES
    zones = tuple(z.strip() for z in text.split(","))
    unknown = [z for z in zones if z not in ERCOT_ZONES]
    if unknown or len(set(zones)) != len(zones):
        raise ConfigError(
            f"run config 'energy-zones': expected distinct names from {list(ERCOT_ZONES)}, "
            f"got {list(zones)}" + (f" (unknown: {unknown})" if unknown else " (repeated names)")
        )
    return zones


def restrict_training(data: DecisionClientData, keep: np.ndarray) -> DecisionClientData:
    """``data`` with only the training rows where ``keep`` is true (features keep the z-scoring of
    the whole training split; validation and test splits unchanged)."""
    if keep.all():
        return data
    if not keep.any():
        raise ValueError(f"{data.name}: no training days left after the energy-* training options")
    index = torch.from_numpy(np.flatnonzero(keep))
    return dataclasses.replace(data, train=DecisionSplit(data.train.x[index], data.train.c[index]))


def last_days(n: int, days: int) -> np.ndarray:
    """Mask of the last ``days`` of ``n`` chronological rows (``days = 0``: all)."""
    keep = np.ones(n, dtype=bool)
    if days:
        keep[: max(0, n - days)] = False
    return keep


@functools.lru_cache(maxsize=64)
def ercot_zone_client(
    zone: str, pid: int, path: str, exclude_storm: bool, train_days: int, quota: int = 0
) -> DecisionClientData:
    """Client ``pid``'s data for ERCOT zone ``zone`` read from ``path`` (empty: the cache), its training
    split cut to the last ``train_days`` days (0: all) and, with ``exclude_storm``, without STORM_DAYS;
    ``quota`` hours a day instead of the zone's own D_j (0: :func:`zone_quota`).
    Cached per process on these options (not the run name): the CSV scan costs ~1 s per zone."""
    samples = zone_samples(load_ercot(path or None, points=[zone]), zone)
    if quota:
        samples = dataclasses.replace(samples, quota=quota)
    data = samples.to_client_data(pid)
    train_dates = samples.dates[: len(data.train)]
    keep = last_days(len(data.train), train_days)
    if exclude_storm:
        keep &= (train_dates < STORM_DAYS[0]) | (train_dates > STORM_DAYS[1])
    return restrict_training(data, keep)
