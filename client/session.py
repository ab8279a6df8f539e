"""What one ClientApp invocation knows: its problem config, its partition, its data, its state.

A node learns which private partition it holds from its node config
(``partition-id``, ``num-partitions``, optional ``data-path`` and ``state-dir``),
never from the server. Of the run config a client sees only the problem's keys
(:data:`hetfed.config.PROBLEM_KEYS`): the method's values arrive in each message.
Data are loaded once per process, problem config and partition.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flwr.app import ConfigRecord, ConfigRecordValues, Context

from hetfed.client.state import ClientState, run_key
from hetfed.config import PROBLEM_KEYS, validate
from hetfed.problems.registry import get_problem


class NodeConfigError(ValueError):
    """A node's configuration (partition, data path) is unusable; the message names the node.

    Once the partition is known, messages start with ``partition <i> of <n>: ``, which the
    server reads to leave that partition out (hetfed.server.pool).
    """


class SiloDataError(NodeConfigError):
    """This partition's data could not be loaded; the message names the partition and the file."""


class ProblemConfig(dict[str, Any]):
    """The problem keys of a validated run config; reading any other key is an error that says
    where the value comes from instead (the message)."""

    def __missing__(self, key: str) -> Any:
        raise KeyError(
            f"{key!r} is not a problem key of the run config: a client handler takes the method's "
            "values from the message's ConfigRecord (the strategy's client_settings)"
        )


@dataclass
class ClientSession:
    """The validated view of one ClientApp call."""

    cfg: ProblemConfig
    partition_id: int
    num_partitions: int
    data_path: Path | None
    state_dir: Path | None
    node_id: int
    cfg_json: str = ""  # the problem config as sorted JSON: the per-process data cache's key
    opened: dict[str, ClientState] = field(default_factory=dict)  # this message's run states

    @classmethod
    def from_context(cls, context: Context) -> ClientSession:
        cfg, cfg_json = _validated(tuple(sorted(context.run_config.items())))
        nc = context.node_config
        where = f"node {context.node_id}"
        try:
            pid, n = int(nc["partition-id"]), int(nc["num-partitions"])
        except (KeyError, TypeError, ValueError):
            raise NodeConfigError(
                f"{where}: node config needs integer 'partition-id' and 'num-partitions', got {dict(nc)}"
            ) from None
        if not 0 <= pid < n:
            raise NodeConfigError(f"{where}: partition-id {pid} is outside [0, num-partitions={n})")
        data_path = node_path(nc.get("data-path") or cfg["node-data-path"], pid)
        if data_path is not None and not data_path.exists():
            raise NodeConfigError(f"partition {pid} of {n}: data-path '{data_path}' does not exist")
        state_dir = node_path(nc.get("state-dir") or cfg["node-state-dir"], pid)
        return cls(ProblemConfig(cfg), pid, n, data_path, state_dir, context.node_id, cfg_json)

    def data(self) -> Any:
        """This partition's private data (cached per process); a failure names the partition."""
        cfg_json = self.cfg_json or json.dumps(self.cfg, sort_keys=True)
        return _load_named(cfg_json, self.partition_id, self.num_partitions, self.data_path)

    def state(self, context: Context, config: Mapping[str, ConfigRecordValues]) -> ClientState:
        """This client's persistent state for the run the message's config names (``run-name``,
        ``run-id``: client/state.py ``run_key``), opened once per message."""
        name, run_id = str(config["run-name"]), str(config.get("run-id", ""))
        key = run_key(name, run_id, self.partition_id)
        if key not in self.opened:
            about = {"run-name": name, "run-id": run_id, "partition-id": self.partition_id}
            self.opened[key] = ClientState(context, key, self.state_dir, about)
        return self.opened[key]

    def state_report(self, context: Context, config: Mapping[str, ConfigRecordValues]) -> ConfigRecord | None:
        """What the server learns of this client's state (``client-state`` in the reply): whether it
        holds state for the run now (``kept``), and ``lost``: why the state the server expects
        (``state-expected``: the client kept state in an earlier round) is not here. None when
        the message opened no state and none was expected."""
        expected = bool(config.get("state-expected", False))
        if not self.opened and not expected:
            return None
        state = next(iter(self.opened.values())) if self.opened else self.state(context, config)
        lost = state.note
        if expected and not state.found:
            # The silo's paths stay on the silo: the server learns only that the state is gone.
            where = "in its state-dir" if self.state_dir else "in the SuperNode's memory (no state-dir)"
            lost = (
                f"partition {self.partition_id} holds no state of run {str(config.get('run-name', '?'))} "
                f"{where}: it was lost (a restart without state-dir, a wiped or another state dir)"
            )
        return ConfigRecord({"kept": state.kept, "lost": lost})


def load_partition(
    run_config: Mapping[str, Any], partition_id: int, num_partitions: int, data_path: Path | None
) -> Any:
    """Partition ``partition_id``'s data as a node of ``run_config`` with ``data_path`` loads it, into
    the same per-process cache: ``hetfed run`` checks every silo's data this way before it starts
    an inline or simulation run. SiloDataError names the partition."""
    _, cfg_json = _validated(tuple(sorted(run_config.items())))
    return _load_named(cfg_json, partition_id, num_partitions, data_path)


def _load_named(cfg_json: str, partition_id: int, num_partitions: int, data_path: Path | None) -> Any:
    try:
        return _load(cfg_json, partition_id, num_partitions, str(data_path) if data_path else "")
    except Exception as exc:  # any loader: bad file, bad partition, missing download
        what = str(exc) if isinstance(exc, ValueError | OSError) else f"{type(exc).__name__}: {exc}"
        raise SiloDataError(f"partition {partition_id} of {num_partitions}: {what}") from exc


def node_path(value: Any, partition_id: int) -> Path | None:
    """A node's path from its node config or, for a simulated node, the run config's pattern."""
    return Path(str(value).replace("{partition}", str(partition_id))) if value else None


@functools.lru_cache(maxsize=16)
def _validated(run_config: tuple[tuple[str, Any], ...]) -> tuple[dict[str, Any], str]:
    """The problem keys of the validated run config and their JSON, once per process and config
    (every message of a run carries the same run config; validating it costs as much as a small
    client's whole step)."""
    cfg = {k: v for k, v in validate(dict(run_config)).items() if k in PROBLEM_KEYS}
    return cfg, json.dumps(cfg, sort_keys=True)


# One entry per (config, partition): the inline engine hosts every partition in one process, and a
# cache smaller than the node count would reload every client's data on every message.
@functools.lru_cache(maxsize=256)
def _load(cfg_json: str, partition_id: int, num_partitions: int, data_path: str) -> Any:
    cfg = ProblemConfig(json.loads(cfg_json))
    spec = get_problem(cfg["problem"])
    return spec.load_client(cfg, partition_id, num_partitions, Path(data_path) if data_path else None)
