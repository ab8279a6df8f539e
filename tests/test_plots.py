"""rounds.png in every run folder: drawn when a segment ends, and what it draws is the run's files.

The curves are read back from the drawn figure (server/plots.py ``draw``) and compared with
rounds.csv / local-rounds.csv parsed here with the csv module, independently of RunResult.
"""

from __future__ import annotations

import csv
import json
import logging
import struct
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
from flwr.common.constant import SUPERLINK_NODE_ID
from flwr.supercore.task_identity import TaskIdentity

from hetfed.client.app import app as client_app
from hetfed.engines.inline import InlineGrid, node_configs, run_inline
from hetfed.server.app import run_server
from hetfed.server.plots import AGGREGATE, Panel, draw

DECISION = {"strategy": "fedrspo", "num-rounds": 3, "n-train": 40, "n-test": 30, "local-epochs": 1,
            "num-items": 10, "personal-rounds": 3, "fraction": 1.0, "seed": 4}  # fmt: skip
CONSTRAINED = {"strategy": "softmax-switching", "problem": "quadratic", "seed": 3, "num-rounds": 6,
               "switching-m": 2, "switching-eval-every": 2}  # fmt: skip
LSA = {"strategy": "fedlsa", "problem": "garnet", "num-rounds": 6, "seed": 2}


def table(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def expected(rows: list[dict[str, str]], metric: str, exchange: str, server: str | None) -> dict:
    """Each client's (rounds, values) of ``metric`` in its ok ``exchange`` rows; the aggregate: the
    server rows' ``server`` metric, or the mean over the clients of each round."""
    per: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for r in rows:
        if r["exchange"] == exchange and r["client"] != "server" and r["status"] == "ok" and r.get(metric):
            per[r["client"]].append((float(r["round"]), float(r[metric])))
    out = {c: np.array(sorted(v)).T for c, v in per.items()}
    if server:
        agg = [
            (float(r["round"]), float(r[server])) for r in rows if r["client"] == "server" and r.get(server)
        ]
    else:
        by_round: dict[float, list[float]] = defaultdict(list)
        for v in per.values():
            for t, x in v:
                by_round[t].append(x)
        agg = [(t, float(np.mean(xs))) for t, xs in sorted(by_round.items())]
    out[AGGREGATE] = np.array(sorted(agg)).T
    return out


def assert_curves(panel: Panel, want: dict) -> None:
    assert sorted(panel.curves) == sorted(want), panel.title
    for label, (x, y) in panel.curves.items():
        np.testing.assert_array_equal(x, want[label][0], err_msg=f"{panel.title}: {label}")
        np.testing.assert_allclose(y, want[label][1], rtol=1e-12, err_msg=f"{panel.title}: {label}")


def failures(rows: list[dict[str, str]]) -> tuple[tuple[int, str], ...]:
    return tuple(
        sorted(
            {(int(r["round"]), r["client"]) for r in rows if r["client"] != "server" and r["status"] != "ok"}
        )
    )


def assert_png(path: Path) -> None:
    """A PNG that decodes, of a sensible size, not blank."""
    from matplotlib.image import imread

    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    assert 600 <= width <= 2000 and 300 <= height <= 3000, (width, height)
    assert 10_000 < len(data) < 1_000_000
    pixels = imread(path)
    assert pixels.shape[:2] == (height, width) and pixels.std() > 0.05


def test_a_decision_run_draws_each_clients_regret_and_its_failures(tmp_path: Path) -> None:
    configs = node_configs(4)
    configs[1]["fail-round"] = 2  # a fault drill: partition 1 fails its round-2 train
    summary = run_inline({**DECISION, "results-dir": str(tmp_path), "run-name": "d"}, configs)
    assert summary["status"] == "completed"
    folder = tmp_path / "d"
    assert_png(folder / "rounds.png")
    rows = table(folder / "rounds.csv")
    rounds, personal = draw(folder)
    assert_curves(rounds, expected(rows, "val-relative-regret", "train", None))
    assert failures(rows) == rounds.failures == ((2, "client-01"),)
    local: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for r in table(folder / "local-rounds.csv"):
        local[r["client"]].append((float(r["local-round"]), float(r["val-relative-regret"])))
    assert_curves(personal, {c: np.array(sorted(v)).T for c, v in local.items()})
    assert personal.failures == () and len(local) == 4 and all(len(v) == 3 for v in local.values())


def test_a_constrained_run_draws_f_and_g_with_the_servers_worst_client(tmp_path: Path) -> None:
    run_inline({**CONSTRAINED, "results-dir": str(tmp_path), "run-name": "c"}, node_configs(3))
    folder = tmp_path / "c"
    assert_png(folder / "rounds.png")
    rows = table(folder / "rounds.csv")
    f, g = draw(folder)
    assert_curves(f, expected(rows, "f", "evaluate", "F"))
    assert_curves(g, expected(rows, "g", "evaluate", "G"))
    assert list(f.curves[AGGREGATE][0]) == [0, 2, 4, 6]  # the evaluated rounds
    # The server's F is the worst client's f (an independent check of what the aggregate is).
    worst = np.max([f.curves[c][1] for c in f.curves if c != AGGREGATE], axis=0)
    np.testing.assert_allclose(f.curves[AGGREGATE][1], worst)
    assert g.level == 0.0


def test_an_lsa_run_draws_each_agents_error_and_the_mean(tmp_path: Path) -> None:
    run_inline({**LSA, "results-dir": str(tmp_path), "run-name": "l"}, node_configs(3))
    folder = tmp_path / "l"
    assert_png(folder / "rounds.png")
    (panel,) = draw(folder)
    assert_curves(panel, expected(table(folder / "rounds.csv"), "sq-error", "train", "mean-sq-error"))
    assert list(panel.curves[AGGREGATE][0]) == [1, 2, 3, 4, 5, 6]


def test_an_interrupted_run_has_its_picture_and_the_resume_redraws_every_round(tmp_path: Path) -> None:
    class DyingGrid(InlineGrid):
        """The link dies at the 4th push: discovery, round 1, round 2, then round 3 fails."""

        pushes = 0

        def push_messages(self, messages):
            self.pushes += 1
            if self.pushes == 4:
                raise ConnectionError("SuperLink unavailable")
            return super().push_messages(messages)

    cfg = {**LSA, "results-dir": str(tmp_path), "run-name": "r"}
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, SUPERLINK_NODE_ID, 1
    with pytest.raises(ConnectionError):
        run_server(DyingGrid(client_app, node_configs(3), cfg), cfg)
    folder = tmp_path / "r"
    assert_png(folder / "rounds.png")
    assert list(draw(folder)[0].curves[AGGREGATE][0]) == [1, 2]
    first = (folder / "rounds.png").read_bytes()
    run_inline({**cfg, "resume": True}, node_configs(3))
    assert (folder / "rounds.png").read_bytes() != first
    (panel,) = draw(folder)
    assert_curves(panel, expected(table(folder / "rounds.csv"), "sq-error", "train", "mean-sq-error"))
    assert list(panel.curves[AGGREGATE][0]) == [1, 2, 3, 4, 5, 6]


def test_a_picture_that_cannot_be_drawn_never_fails_the_run(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "x" / "rounds.png").mkdir(parents=True)  # a folder where the picture should go
    with caplog.at_level(logging.WARNING, logger="flwr"):
        summary = run_inline(
            {**LSA, "num-rounds": 2, "results-dir": str(tmp_path), "run-name": "x"}, node_configs(2)
        )
    assert summary["status"] == "completed"
    assert json.loads((tmp_path / "x" / "summary.json").read_text())["status"] == "completed"
    said = [r.getMessage() for r in caplog.records if "rounds.png not drawn" in r.getMessage()]
    assert len(said) == 1 and "\n" not in said[0] and "[x]" in said[0], said
