"""Bad silo data (issue 14, item 5): the loaders name the file, row and column of what is wrong, a
bad silo is left out with its reason while enough clients remain, and otherwise one line names
every bad partition.

Rows are numbered as a spreadsheet shows the file: the header is row 1.
"""

from __future__ import annotations

import csv
import gzip
import json
import re
import time
from pathlib import Path

import pytest

from hetfed.engines.inline import node_configs, run_inline
from hetfed.problems.datafile import DataFileError
from hetfed.problems.energy import PJM_COLUMNS, daily_prices, generate_pjm_like_csv, pjm_samples
from hetfed.problems.ercot import GAS_FILE, PRICE_COLUMNS, PRICE_FILE, load_ercot
from hetfed.server.pool import FederationError


# --- PJM layout -------------------------------------------------------------------------------------
def pjm_table(tmp_path: Path, n_zones: int = 2, n_days: int = 20) -> list[list[str]]:
    """A small PJM-layout file's cells, header first."""
    path = generate_pjm_like_csv(tmp_path / "source.csv", n_zones=n_zones, n_days=n_days, seed=0)
    with open(path, newline="") as f:
        return list(csv.reader(f))


def write_csv(path: Path, table: list[list[str]]) -> Path:
    with open(path, "w", newline="") as f:
        csv.writer(f, lineterminator="\n").writerows(table)
    return path


def with_cell(table: list[list[str]], client: str, column: str, value: str) -> tuple[list[list[str]], int]:
    """A copy of ``table`` with ``column`` of the client's first row set to ``value``, and that row."""
    out = [list(r) for r in table]
    at = next(i for i, r in enumerate(out) if i and r[0] == client)
    out[at][out[0].index(column)] = value
    return out, at + 1


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("nan", "'nan' is not a finite number"),
        ("inf", "'inf' is not a finite number"),
        ("-Infinity", "'-Infinity' is not a finite number"),
        ("", "empty cell"),
        ("12,5x", "is not a number"),
    ],
)
def test_pjm_bad_cells_name_file_row_and_column(tmp_path: Path, value: str, problem: str) -> None:
    table, row = with_cell(pjm_table(tmp_path), "1", "total_lmp_7", value)
    path = write_csv(tmp_path / "bad.csv", table)
    with pytest.raises(DataFileError) as err:
        pjm_samples(path, 1)
    message = str(err.value)
    assert message.startswith(f"{path} row {row}, column 'total_lmp_7': ") and problem in message
    assert "\n" not in message
    pjm_samples(path, 0)  # other clients' rows are not read


def test_pjm_bad_feature_and_date_cells(tmp_path: Path) -> None:
    table, row = with_cell(pjm_table(tmp_path), "0", "humidity_mean", "NaN")
    with pytest.raises(DataFileError, match=rf"row {row}, column 'humidity_mean': 'NaN' is not a finite"):
        pjm_samples(write_csv(tmp_path / "a.csv", table), 0)
    table, row = with_cell(pjm_table(tmp_path), "0", "date", "2021-13-01")
    with pytest.raises(DataFileError, match=rf"row {row}, column 'date': '2021-13-01' is not a date"):
        pjm_samples(write_csv(tmp_path / "b.csv", table), 0)
    table, row = with_cell(pjm_table(tmp_path), "1", "client_id", "")
    with pytest.raises(DataFileError, match=rf"row {row}, column 'client_id': empty cell"):
        pjm_samples(write_csv(tmp_path / "c.csv", table), 0)


def test_pjm_missing_columns_are_listed_briefly(tmp_path: Path) -> None:
    table = pjm_table(tmp_path)
    drop = {"humidity_mean", "bess", "total_lmp_3"}
    keep = [i for i, name in enumerate(table[0]) if name not in drop]
    path = write_csv(tmp_path / "few.csv", [[r[i] for i in keep] for r in table])
    with pytest.raises(DataFileError) as err:
        pjm_samples(path, 0)
    assert str(err.value) == f"{path}: missing 3 of 36 columns: total_lmp_3, humidity_mean, bess"
    # a file of another layout: 36 missing, only the first 5 named
    other = write_csv(tmp_path / "other.csv", [["a", "b"], ["1", "2"]])
    with pytest.raises(DataFileError) as err:
        pjm_samples(other, 0)
    message = str(err.value)
    assert message.startswith(f"{other}: missing 36 of 36 columns: client_id, date, total_lmp_0, ")
    assert message.endswith(", ... (31 more)") and len(message) < 200 + len(str(other))


def test_pjm_empty_files_get_a_short_message(tmp_path: Path) -> None:
    empty = tmp_path / "empty.csv"
    empty.write_text("")
    with pytest.raises(DataFileError) as err:
        pjm_samples(empty, 0)
    assert str(err.value) == f"{empty}: empty file (expected a header row with the PJM-layout columns)"
    header_only = write_csv(tmp_path / "header.csv", [list(PJM_COLUMNS)])
    with pytest.raises(DataFileError) as err:
        pjm_samples(header_only, 0)
    assert str(err.value) == f"{header_only}: no data rows after the header"


def test_pjm_a_day_with_missing_hours_names_its_row(tmp_path: Path) -> None:
    table = pjm_table(tmp_path)
    table[5] = table[5][:30]  # the day (row 6) stops after congestion_3
    path = write_csv(tmp_path / "short.csv", table)
    with pytest.raises(DataFileError) as err:
        pjm_samples(path, 0)
    assert str(err.value) == f"{path} row 6: 30 cells, the header has {len(PJM_COLUMNS)}"


def test_pjm_duplicated_dates_name_both_rows(tmp_path: Path) -> None:
    table = pjm_table(tmp_path)
    path = write_csv(tmp_path / "twice.csv", [*table, table[1]])
    with pytest.raises(
        DataFileError, match=rf"{re.escape(str(path))} rows 2 and {len(table) + 1}: duplicated"
    ):
        pjm_samples(path, int(table[1][0]))


# --- ERCOT layout -------------------------------------------------------------------------------------
GAS_LINES = [
    "Henry Hub Natural Gas Spot Price",
    "Day,Henry Hub price",
    "01/20/2021,2.5",
    "01/01/2021,2.4",
    "12/31/2020,2.3",
]


def ercot_dir(tmp_path: Path, rows: list[list[str]] | None = None, days: int = 10) -> Path:
    """A tiny ERCOT folder: one zone, ``days`` complete days of January 2021 (or ``rows`` as given)."""
    folder = tmp_path / "ercot"
    folder.mkdir(parents=True, exist_ok=True)
    if rows is None:
        rows = [list(PRICE_COLUMNS)] + [
            [f"01/{d:02d}/2021", f"{h:02d}:00", "N", "HB_WEST", f"{20 + h + d / 10:.2f}"]
            for d in range(1, days + 1)
            for h in range(1, 25)
        ]
    text = "".join(",".join(r) + "\n" for r in rows)
    (folder / PRICE_FILE).write_bytes(gzip.compress(text.encode()))
    (folder / GAS_FILE).write_bytes(gzip.compress(("\n".join(GAS_LINES) + "\n").encode()))
    return folder


def test_ercot_bad_price_cells_name_file_row_and_column(tmp_path: Path) -> None:
    good = ercot_dir(tmp_path)
    dates, prices = daily_prices(load_ercot(good, points=["HB_WEST"]), "HB_WEST")
    assert prices.shape == (10, 24)
    with gzip.open(good / PRICE_FILE, "rt") as f:
        rows = [line.rstrip("\n").split(",") for line in f]
    for value, problem in (
        ("nan", "'nan' is not a finite number"),
        ("inf", "'inf' is not a finite number"),
        ("", "empty cell"),
    ):
        bad = [list(r) for r in rows]
        bad[30][4] = value
        folder = ercot_dir(tmp_path / value, bad) if value else ercot_dir(tmp_path / "empty", bad)
        with pytest.raises(DataFileError) as err:
            load_ercot(folder, points=["HB_WEST"])
        assert str(err.value) == f"{folder / PRICE_FILE} row 31, column 'price': {problem}"
    bad = [list(r) for r in rows]
    bad[7][1] = "25:00"
    folder = ercot_dir(tmp_path / "hour", bad)
    with pytest.raises(DataFileError, match=r"row 8, column 'hour_ending': '25:00' is not an hour"):
        load_ercot(folder, points=["HB_WEST"])


def test_ercot_missing_columns_and_empty_files(tmp_path: Path) -> None:
    folder = ercot_dir(
        tmp_path, [["delivery_date", "hour_ending", "settlement_point"], ["01/01/2021", "01:00", "X"]]
    )
    with pytest.raises(DataFileError) as err:
        load_ercot(folder)
    assert str(err.value) == f"{folder / PRICE_FILE}: missing 2 of 5 columns: repeated_hour_flag, price"
    folder = ercot_dir(tmp_path / "empty", [])
    with pytest.raises(
        DataFileError, match=r"ercot_dam_spp_2021_2022\.csv\.gz: empty file \(expected the header"
    ):
        load_ercot(folder)


def test_ercot_a_day_with_missing_hours_names_file_and_rows(tmp_path: Path) -> None:
    folder = ercot_dir(tmp_path)
    with gzip.open(folder / PRICE_FILE, "rt") as f:
        rows = [line.rstrip("\n").split(",") for line in f]
    del rows[1 + 24 * 3 + 2 : 1 + 24 * 3 + 5]  # 01/04/2021 loses hours ending 03, 04, 05
    folder = ercot_dir(tmp_path / "holey", rows)
    with pytest.raises(DataFileError) as err:
        daily_prices(load_ercot(folder, points=["HB_WEST"]), "HB_WEST")
    assert str(err.value) == (
        f"{folder / PRICE_FILE} rows 74-94, column 'hour_ending': zone 'HB_WEST' misses more than one hour "
        "on 2021-01-04: 21 of 24 hours"
    )
    twice = [*rows[:10], rows[5], *rows[10:]]  # 01/01/2021 hour ending 05 twice
    folder = ercot_dir(tmp_path / "twice", twice)
    with pytest.raises(
        DataFileError, match=r"rows 6 and 11, column 'hour_ending': zone 'HB_WEST' has duplicated"
    ):
        daily_prices(load_ercot(folder, points=["HB_WEST"]), "HB_WEST")


# --- a federation with bad silos --------------------------------------------------------------------
RUN = {
    "problem": "energy-pjm",
    "strategy": "fedrspo",
    "loss": "rspo+",
    "num-rounds": 2,
    "personal-rounds": 1,
    "local-epochs": 1,
    "fraction": 1.0,
}


def silo_files(tmp_path: Path, bad: dict[int, str]) -> tuple[list[dict], dict[int, int]]:
    """One PJM file per silo (3 clients, 40 days); ``bad`` maps a partition to what breaks its file:
    ``nan`` (a NaN price in its own client's first row) or ``empty`` (an empty file)."""
    table = pjm_table(tmp_path, n_zones=3, n_days=40)
    configs = node_configs(3)
    rows: dict[int, int] = {}
    for pid, config in enumerate(configs):
        path = tmp_path / f"silo-{pid}.csv"
        if bad.get(pid) == "empty":
            path.write_text("")
        elif bad.get(pid) == "nan":
            broken, rows[pid] = with_cell(table, str(pid), "total_lmp_5", "nan")
            write_csv(path, broken)
        else:
            write_csv(path, table)
        config["data-path"] = str(path)
    return configs, rows


def test_a_bad_silo_is_left_out_and_the_run_goes_on(tmp_path: Path) -> None:
    configs, rows = silo_files(tmp_path, {1: "nan"})
    summary = run_inline({**RUN, "num-clients": 2, "results-dir": str(tmp_path), "run-name": "r"}, configs)
    reason = f"{tmp_path / 'silo-1.csv'} row {rows[1]}, column 'total_lmp_5': 'nan' is not a finite number"
    assert summary["status"] == "completed"
    assert sorted(summary["clients"]) == ["zone_00", "zone_02"]
    assert summary["failed"] == {"partition-1": reason}
    on_disk = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert on_disk["failed"] == {"partition-1": reason} and on_disk["aggregate"]["clients-reporting"] == 2
    with open(tmp_path / "r" / "rounds.csv", newline="") as f:
        table = list(csv.DictReader(f))
    left_out = [r for r in table if r["status"] == "failed"]
    assert [(r["round"], r["exchange"], r["partition-id"], r["client"], r["error"]) for r in left_out] == [
        ("0", "query.info", "1", "partition-1", reason)
    ]
    assert {r["client"] for r in table if r["exchange"] == "train"} == {"zone_00", "zone_02"}
    assert "partition-1" in (tmp_path / "r" / "report.md").read_text()


def test_too_few_good_silos_stop_with_every_bad_partition_in_one_line(tmp_path: Path) -> None:
    configs, rows = silo_files(tmp_path, {0: "nan", 2: "empty"})
    started = time.time()
    with pytest.raises(FederationError) as err:  # default num-clients: all 3 partitions
        run_inline({**RUN, "node-wait-timeout": 60.0, "results-dir": str(tmp_path), "run-name": "r"}, configs)
    assert time.time() - started < 30  # no waiting for node-wait-timeout: every partition answered
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith("only 1 of 3 required clients are usable, 2 left out (partition-0: ")
    assert f"partition-0: {tmp_path / 'silo-0.csv'} row {rows[0]}, column 'total_lmp_5': 'nan'" in message
    assert f"partition-2: {tmp_path / 'silo-2.csv'}: empty file" in message
    assert message.endswith("fix their data or lower 'num-clients'")
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert (
        summary["status"] == "failed"
        and "partition-0" in summary["error"]
        and "partition-2" in summary["error"]
    )
    with open(tmp_path / "r" / "rounds.csv", newline="") as f:  # each left-out silo has its row too
        rows = [(r["exchange"], r["client"], r["status"]) for r in csv.DictReader(f)]
    assert rows == [("query.info", "partition-0", "failed"), ("query.info", "partition-2", "failed")]


@pytest.mark.parametrize(
    "wrapped",
    [
        "<class 'hetfed.client.session.SiloDataError'>:<'{}'>",  # SuperNode (deployment), inline engine
        "<class 'flwr.clientapp.client_app.ClientAppException'>:<'\nException ClientAppException occurred. "
        "Message: {}'>",  # Flower's simulation engine
    ],
)
def test_the_server_reads_the_partition_from_a_client_error_on_every_engine(wrapped: str) -> None:
    from hetfed.server.pool import _claim

    message = "partition 2 of 5: /silo/data.csv row 9, column 'bess': empty cell"
    assert _claim(wrapped.format(message)) == (2, 5, "/silo/data.csv row 9, column 'bess': empty cell")
    assert _claim(wrapped.format("node 7: node config needs integer 'partition-id'")) is None
