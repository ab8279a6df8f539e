"""Status codes of HTTPS requests to a SuperLink or its proxy, as a silo, a rogue host or the host sees them.

``python tests/http_probe.py BASE CA PATH...`` prints ``{path: status code or exception name}``
as JSON; ``/health`` is a GET, every other path a POST with an empty body. Where this folder is
absent (another network namespace, a container), ``python -c SOURCE BASE CA PATH...`` runs it.
A refused connection reads ``ConnectionRefusedError`` (the reason inside urllib's URLError).
"""

from __future__ import annotations

import json
import ssl
import sys
import urllib.error
import urllib.request
from pathlib import Path

# What a silo must not reach: the Control API (start a run, list runs, register a key), the Runtime
# API, and the same through dot segments (resolved before matching) and their encodings.
CLOSED = [
    "/v1/control/start-run",
    "/v1/control/list-runs",
    "/v1/control/register-node",
    "/v1/runtime/acquire-task",
    "/v1/runtime/pull-task-input",
    "/v1/fleet/../control/list-runs",
    "/v1/fleet/%2e%2e/control/start-run",
]


def codes(base: str, ca: str, paths: list[str]) -> dict[str, int | str]:
    """Each path's HTTP status at ``base`` (certificate checked against ``ca``), or why none came."""
    ctx = ssl.create_default_context(cafile=str(ca))
    out: dict[str, int | str] = {}
    for path in paths:
        req = urllib.request.Request(base + path, data=None if path == "/health" else b"")
        try:
            out[path] = urllib.request.urlopen(req, timeout=10, context=ctx).status
        except urllib.error.HTTPError as exc:
            out[path] = exc.code
        except OSError as exc:
            out[path] = type(getattr(exc, "reason", exc)).__name__
    return out


if __name__ == "__main__":
    print(json.dumps(codes(sys.argv[1], sys.argv[2], sys.argv[3:])))

SOURCE = Path(__file__).read_text()
