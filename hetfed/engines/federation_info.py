"""A running federation as its folder's ``federation.json`` records it: where its SuperLink is and how to
reach it. ``hetfed federation up`` and the hosts' commands (:mod:`hetfed.federation`) write it; the
deployment engine (:mod:`hetfed.engines.runner`), the dashboard and ``hetfed federation status`` read it.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hetfed.credentials import TlsFiles
from hetfed.engines.flower import CONNECTION, LocalFlower

DEFAULT_DIR = Path(".hetfed") / "federation"


class FederationNotRunning(RuntimeError):
    """No local federation is up in the given folder."""


@dataclass
class FederationInfo:
    """What ``federation.json`` records about a federation's SuperLink."""

    root: Path
    link_port: int
    nodes: int
    pids: list[int]
    host: str = "127.0.0.1"
    tls_dir: Path | None = None
    node_auth: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def load(cls, root: Path) -> FederationInfo:
        path = Path(root) / "federation.json"
        if not path.exists():
            raise FederationNotRunning(
                f"no local federation is running in {root}; start one with `hetfed federation up --nodes 4`"
            )
        data = json.loads(path.read_text())
        return cls(
            Path(root).resolve(),
            int(data["link-port"]),
            int(data["nodes"]),
            list(data["pids"]),
            host=data.get("host", "127.0.0.1"),
            tls_dir=Path(data["tls-dir"]) if data.get("tls-dir") else None,
            node_auth=bool(data.get("node-auth", False)),
            extra={
                k: data[k]
                for k in ("role", "superlink-pid", "public-address", "proxy", "state-dirs")
                if k in data
            },
        )

    def save(self) -> None:
        """Write ``federation.json``."""
        data = {
            "link-port": self.link_port,
            "host": self.host,
            "nodes": self.nodes,
            "pids": self.pids,
            "tls-dir": str(self.tls_dir) if self.tls_dir else "",
            "node-auth": self.node_auth,
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "connection": CONNECTION,
            **self.extra,
        }
        (self.root / "federation.json").write_text(json.dumps(data, indent=2))

    def flower(self) -> LocalFlower:
        """A handle to submit runs to this federation and query it (TLS verified with its CA)."""
        tls = TlsFiles.from_dir(self.tls_dir) if self.tls_dir else None
        return LocalFlower(
            self.root, link_port=self.link_port, host=self.host, tls=tls, node_auth=self.node_auth
        )
