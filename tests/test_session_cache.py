"""hetfed.client.session's per-process caches: the validated run config, and each partition's data."""

from __future__ import annotations

from pathlib import Path

import pytest
from flwr.app import Context, RecordDict

from hetfed.client.session import ClientSession, _load
from hetfed.config import PROBLEM_KEYS, ConfigError
from hetfed.engines.inline import node_configs, run_inline


def context(run_config: dict) -> Context:
    nodes = {"partition-id": 0, "num-partitions": 1}
    return Context(run_id=1, node_id=1, node_config=nodes, state=RecordDict(), run_config=run_config)


def test_every_inline_partition_loads_its_data_once(tmp_path: Path) -> None:
    """12 partitions in one process: one load each, however many messages (the cache holds them all)."""
    _load.cache_clear()
    cfg = {
        "strategy": "pflsa",
        "problem": "garnet",
        "num-rounds": 3,
        "results-dir": str(tmp_path),
        "run-name": "r",
    }
    run_inline(cfg, node_configs(12))
    info = _load.cache_info()
    assert info.misses == 12
    assert info.hits == 12 * (1 + 3 + 1) - 12  # discovery, 3 rounds, final evaluate


def test_sessions_share_the_validation_but_not_the_config_dict() -> None:
    ctx = context({"strategy": "pflsa", "problem": "garnet", "garnet-dim": 4})
    first = ClientSession.from_context(ctx)
    first.cfg["garnet-dim"] = 99  # a client that scribbles on its config must not change the next one's
    second = ClientSession.from_context(ctx)
    assert second.cfg["garnet-dim"] == 4 and second.cfg["garnet-states"] == 10  # defaults filled in
    assert second.cfg_json == first.cfg_json


def test_a_client_sees_only_the_problem_keys_of_its_run_config() -> None:
    """The method's values come in the message: reading one from the run config is an error."""
    ctx = context({"strategy": "pflsa", "problem": "garnet", "lsa-eta": 0.5, "lsa-batch": 3})
    session = ClientSession.from_context(ctx)
    assert set(session.cfg) == PROBLEM_KEYS and session.cfg["problem"] == "garnet"
    for method_key in ("lsa-eta", "lsa-batch", "strategy", "loss", "num-rounds"):
        with pytest.raises(KeyError, match=f"'{method_key}' is not a problem key.*message"):
            session.cfg[method_key]
    # Runs that differ in the method only share the data cache entry.
    other = ClientSession.from_context(context({"strategy": "fedlsa", "problem": "garnet", "lsa-eta": 0.1}))
    assert other.cfg_json == session.cfg_json


def test_a_bad_run_config_is_refused_on_every_message() -> None:
    ctx = context({"lsa-eta": -1.0})
    for _ in range(2):  # an exception is never cached as a result
        with pytest.raises(ConfigError, match="'lsa-eta': must be > 0"):
            ClientSession.from_context(ctx)
