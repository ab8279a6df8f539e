"""bench/superlink_capacity.py's machinery at a tiny size, against a real SuperLink and ServerApp.

Every simulated silo's reply must reach the ServerApp: the final model equals the weighted mean
(by ``num-examples``) of the last round's replies the silos recorded, which no missing or
corrupted reply would give (every silo's reply differs); hetfed's silos move each message's
objects in one request each way and confirm it with them, stock Flower's one request per object and
one confirmation per message.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from bench.superlink_capacity import measure

pytestmark = pytest.mark.deployment
SILOS, ROUNDS = 5, 3


def last_round_mean(record: Path) -> dict[str, np.ndarray]:
    """The num-examples-weighted mean of the last round's recorded replies, by array name."""
    replies = [np.load(record / f"{ROUNDS}-{p}.npz") for p in range(SILOS)]
    weights = np.array([float(r["num_examples"]) for r in replies])
    names = [k.removeprefix("a/") for k in replies[0].files if k.startswith("a/")]
    return {
        n: sum(w * r[f"a/{n}"] for w, r in zip(weights, replies, strict=True)) / weights.sum() for n in names
    }


@pytest.mark.parametrize(
    ("path", "replies"), [("stock", "light"), ("hetfed", "trained"), ("hetfed", "light")]
)
def test_every_silo_reply_reaches_the_serverapp(path: str, replies: str, tmp_path: Path) -> None:
    m = measure(path, SILOS, ROUNDS, record=tmp_path, replies=replies)
    assert m["replies"] == replies
    assert m["silo-error-count"] == 0, m["silo-errors"]
    assert sorted(f.name for f in tmp_path.glob(f"{ROUNDS}-*.npz")) == [
        f"{ROUNDS}-{p}.npz" for p in range(SILOS)
    ]
    expected = last_round_mean(tmp_path)
    # The stock ServerApp saves Flower's arrays in order (arr_0, ...); hetfed's models.npz as global/<name>.
    final = m["final-model"]
    got = {n: final[f"arr_{i}" if path == "stock" else f"global/{n}"] for i, n in enumerate(expected)}
    for name, value in expected.items():
        np.testing.assert_allclose(got[name], value, rtol=0, atol=1e-12, err_msg=name)
    assert m["replies-measured"] == SILOS * (ROUNDS - 2)  # the middle round: one reply per silo
    assert m["superlink-cpu-per-round-s"] > 0 and m["superlink-rss-mb"] > 0
    # Object requests as counted on the wire over the whole run (every silo, every message): hetfed's
    # silos move each message's objects in one request each way (hetfed.runtime.object_batch);
    # Flower's send one per object of the model.
    total = m["fleet-requests-whole-run"]
    # A message is confirmed with its objects' batch (no request of its own), Flower's with one.
    if path == "hetfed":
        assert total["object-pull"] == total["object-push"] == total["pull-message"], total
        assert "confirm" not in total, total
    else:
        assert total["object-pull"] >= 3 * total["pull-message"] and total["object-push"] >= 3, total
        assert total["confirm"] == total["pull-message"], total
