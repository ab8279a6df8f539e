"""What DP says it protects: local DP releases nothing un-noised (no within-clip bit on the wire)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from flwr.app import Message

from hetfed.engines.inline import node_configs, run_inline

FEDAVG = {"num-rounds": 2, "n-train": 40, "n-test": 30, "local-epochs": 1, "num-items": 10, "fraction": 1.0}


def observed_run(tmp_path: Path, name: str, nodes: int = 4, **cfg: Any) -> tuple[dict, list[Message]]:
    """A real inline run; the train replies as they left the clients."""
    seen: list[Message] = []

    def watch(instruction: Message, reply: Message) -> None:
        if instruction.metadata.message_type == "train":
            seen.append(reply)

    run_config = {**FEDAVG, "results-dir": str(tmp_path), "run-name": name, **cfg}
    summary = run_inline(run_config, node_configs(nodes), observers=[watch])
    return summary, seen


def model_size(run_dir: Path) -> int:
    with np.load(run_dir / "models.npz") as z:
        return sum(z[k].size for k in z.files)


@pytest.mark.parametrize("secure", [False, True])
def test_local_dp_replies_carry_no_within_clip_bit_and_central_ones_do(tmp_path: Path, secure: bool) -> None:
    """Under local DP the server must not learn whether a silo's update was within the clip: neither a
    ``dp-within`` metric in clear nor a bit in the secure sum's vector. Central DP keeps both (the
    server is trusted there, and adaptive clipping sums the bits)."""
    dp = {"dp-clipping-norm": 0.05, "secure-aggregation": secure}
    _, local = observed_run(tmp_path, "local", dp="local", **dp)
    _, central = observed_run(tmp_path, "central", dp="central", **dp)
    assert len(local) == len(central) == 2 * 4
    in_metrics = [
        ["dp-within" in r.content.metric_records["metrics"] for r in replies] for replies in (local, central)
    ]
    size = model_size(tmp_path / "local")
    assert size == model_size(tmp_path / "central")
    if secure:  # nothing in clear; the masked vector is [a x, a] under local DP, [a x, a, bit] under central
        assert not any(in_metrics[0]) and not any(in_metrics[1])
        assert {r.content.array_records["masked"]["y"].numpy().size for r in local} == {size + 1}
        assert {r.content.array_records["masked"]["y"].numpy().size for r in central} == {size + 2}
    else:
        assert not any(in_metrics[0]) and all(in_metrics[1])
    rows = (tmp_path / "local" / "rounds.csv").read_text()
    assert "dp-within" not in rows
