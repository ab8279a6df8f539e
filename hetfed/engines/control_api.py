"""The SuperLink's Control API asked in this process, with Flower's own client: run status, online nodes.

``flwr ls`` / ``flwr supernode ls`` start a Python process each, ~0.8 s of CPU for the CLI's
imports; a run watched every second or two spent ~40% of a core of a 2-core machine on them
(issue 33). This makes the calls those commands make (flwr/cli/ls.py ``ListRuns``,
flwr/cli/supernode/ls.py ``ListNodes``, flwr/cli/stop.py ``StopRun``) with the same
``ControlHttpClient`` on the same connection: the named SuperLink connection of
``$FLWR_HOME/config.toml`` (address, and ``root-certificates`` or ``insecure``), read with
Flower's parser, and the CLI's request headers (client ``cli``, runtime version), which the
SuperLink checks.

Not covered: account authentication (``flwr login`` tokens); hetfed's SuperLinks do not enable it.
"""

from __future__ import annotations

import ssl
import tomllib
from pathlib import Path
from types import TracebackType

import httpx
from flwr.cli.cli_client_interceptor import CliClientHttpInterceptor
from flwr.cli.flower_config import parse_superlink_connection
from flwr.proto.control_pb2 import ListNodesRequest, ListRunsRequest, StopRunRequest
from flwr.proto.node_pb2 import NodeInfo
from flwr.proto.run_pb2 import Run
from flwr.supercore.control import ControlHttpClient
from flwr.supercore.interceptors.http.runtime_version import RuntimeVersionHttpInterceptor

from hetfed.engines.errors import FlowerProcessError


class ControlApiError(FlowerProcessError):
    """The Control API did not answer (refused, timed out, an error status or a bad reply)."""


class ControlApi:
    """A Control API client for connection ``name`` of ``flwr_home/config.toml``; close it after use.

    ``timeout`` bounds every call (seconds): a watcher must get back to its liveness check.
    """

    def __init__(self, flwr_home: Path, name: str, timeout: float = 10) -> None:
        config = Path(flwr_home) / "config.toml"
        try:
            conn_dict = tomllib.loads(config.read_text())["superlink"][name]
        except (OSError, tomllib.TOMLDecodeError, KeyError, TypeError) as exc:
            raise ControlApiError(f"no SuperLink connection {name!r} in {config}: {exc}") from None
        conn = parse_superlink_connection(conn_dict, name)
        if not conn.address:
            raise ControlApiError(f"SuperLink connection {name!r} in {config} has no address")
        self.address = conn.address
        # As ProtobufClient.from_server_address (flwr's CLI), which has no timeout parameter.
        verify: ssl.SSLContext | bool = False
        if not conn.insecure:
            verify = ssl.create_default_context(cafile=conn.root_certificates)  # None: system CAs
        self._client = ControlHttpClient(
            f"{'http' if conn.insecure else 'https'}://{conn.address}",
            interceptors=[CliClientHttpInterceptor(), RuntimeVersionHttpInterceptor("flwr CLI")],
            verify=verify,
            timeout=timeout,
        )

    def runs(self, run_id: int | str | None = None) -> dict[int, Run]:
        """The SuperLink's runs by id (``flwr ls``): all, or only ``run_id`` (empty if unknown)."""
        request = ListRunsRequest() if run_id is None else ListRunsRequest(run_id=int(run_id))
        try:
            return dict(self._client.ListRuns(request).run_dict)
        except (httpx.HTTPError, ValueError) as exc:
            which = "" if run_id is None else f" for run {run_id}"
            raise ControlApiError(f"ListRuns{which} at {self.address}: {_reason(exc)}") from None

    def unfinished_runs(self) -> dict[str, tuple[int, str]]:
        """Runs not finished yet, by the ``run-name`` of their run config: (Flower run id, status)."""
        out = {}
        for run_id, run in self.runs().items():
            status = run_status_text(run)
            name = run.override_config["run-name"].string if "run-name" in run.override_config else ""
            if name and not status.startswith("finished"):
                out[name] = (int(run_id), status)
        return out

    def nodes(self) -> list[NodeInfo]:
        """The SuperNodes the SuperLink knows (``flwr supernode ls``): id, status, name, public key."""
        try:
            return list(self._client.ListNodes(ListNodesRequest()).nodes_info)
        except (httpx.HTTPError, ValueError) as exc:
            raise ControlApiError(f"ListNodes at {self.address}: {_reason(exc)}") from None

    def run_status(self, run_id: int | str) -> str:
        """``pending``, ``starting``, ``running`` or ``finished:completed|failed|stopped``, as ``flwr ls``."""
        run = self.runs(run_id).get(int(run_id))
        return "unknown" if run is None else run_status_text(run)

    def online_nodes(self) -> int:
        """How many SuperNodes the SuperLink counts ``online`` (``flwr supernode ls``'s status)."""
        return sum(node.status == "online" for node in self.nodes())

    def stop_run(self, run_id: int | str) -> bool:
        """Ask the SuperLink to stop the run (``flwr stop``); whether it says it did."""
        try:
            return bool(self._client.StopRun(StopRunRequest(run_id=int(run_id))).success)
        except (httpx.HTTPError, ValueError) as exc:
            raise ControlApiError(f"StopRun for run {run_id} at {self.address}: {_reason(exc)}") from None

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> ControlApi:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def run_status_text(run: Run) -> str:
    """A run's status as ``flwr ls`` prints it: ``status`` or ``status:sub-status``."""
    return f"{run.status.status}:{run.status.sub_status}" if run.status.sub_status else run.status.status


def _reason(exc: Exception) -> str:
    """One line: the HTTP status and Flower's error text, or the transport error."""
    if isinstance(exc, httpx.HTTPStatusError):
        return f"HTTP {exc.response.status_code} {exc.response.text.strip()[:300]}"
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
