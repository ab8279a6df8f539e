"""``hetfed federation up|down|status``: a real local deployment that outlives one command.

``up`` starts a SuperLink and N SuperNodes on 127.0.0.1, each SuperNode its own
process with its own node config (partition, data path, state dir), waits until
all are online, and writes ``federation.json`` (ports, process ids) under the
federation folder; ``down`` stops them by process group.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hetfed.engines.flower import CONNECTION, LocalFlower, stop_process_groups

DEFAULT_DIR = Path(".hetfed") / "federation"


class FederationNotRunning(RuntimeError):
    """No local federation is up in the given folder."""


@dataclass
class FederationInfo:
    """What ``federation.json`` records about a running local federation."""

    root: Path
    link_port: int
    nodes: int
    pids: list[int]

    @classmethod
    def load(cls, root: Path) -> FederationInfo:
        path = Path(root) / "federation.json"
        if not path.exists():
            raise FederationNotRunning(
                f"no local federation is running in {root}; start one with `hetfed federation up --nodes 4`"
            )
        data = json.loads(path.read_text())
        return cls(Path(root).resolve(), int(data["link-port"]), int(data["nodes"]), list(data["pids"]))

    def flower(self) -> LocalFlower:
        """A handle to submit runs to this federation."""
        return LocalFlower(self.root, link_port=self.link_port)


def node_config(
    index: int, nodes: int, root: Path, data_path: str | None, state_dir: str | None
) -> dict[str, Any]:
    """Node ``index``'s config: its partition, and its own data path and state dir.

    ``{partition}`` in ``data_path`` / ``state_dir`` is replaced by the partition id.
    """
    cfg: dict[str, Any] = {"partition-id": index, "num-partitions": nodes}
    if data_path:
        cfg["data-path"] = str(Path(data_path.format(partition=index)).resolve())
    state = state_dir.format(partition=index) if state_dir else str(root / "state" / f"node-{index}")
    cfg["state-dir"] = str(Path(state).resolve())
    return cfg


def federation_up(
    root: Path,
    nodes: int,
    *,
    app_dir: Path,
    data_path: str | None = None,
    state_dir: str | None = None,
    port: int = 0,
) -> FederationInfo:
    """Start a SuperLink (cwd ``app_dir``) and ``nodes`` SuperNodes; wait until all are online."""
    if nodes < 1:
        raise ValueError(f"--nodes must be >= 1, got {nodes}")
    root = Path(root).resolve()
    if (root / "federation.json").exists():
        raise RuntimeError(f"a federation is already up in {root}; run `hetfed federation down` first")
    configs = [node_config(i, nodes, root, data_path, state_dir) for i in range(nodes)]
    for i, cfg in enumerate(configs):  # refuse before starting anything
        if "data-path" in cfg and not Path(cfg["data-path"]).exists():
            raise FileNotFoundError(f"SuperNode {i}: data-path '{cfg['data-path']}' does not exist")
    flower = LocalFlower(root, link_port=port)
    try:
        flower.start_superlink(cwd=app_dir)
        for i, cfg in enumerate(configs):
            flower.start_supernode(i, cfg)
        flower.wait_for_nodes(nodes)
    except BaseException:
        flower.stop()
        raise
    info = FederationInfo(root, flower.link_port, nodes, [p.pid for p in flower.processes.values()])
    (root / "federation.json").write_text(
        json.dumps(
            {
                "link-port": info.link_port,
                "nodes": nodes,
                "pids": info.pids,
                "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                "connection": CONNECTION,
            },
            indent=2,
        )
    )
    return info


def federation_down(root: Path) -> int:
    """Stop every process of the federation in ``root``; returns how many groups were signalled."""
    info = FederationInfo.load(root)
    stop_process_groups(list(reversed(info.pids)))
    (info.root / "federation.json").unlink()
    return len(info.pids)
