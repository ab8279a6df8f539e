"""A warm worker imports Flower without FastAPI, pydantic and requests, and loses nothing by it.

Each check runs in a fresh interpreter (this one has FastAPI loaded already): it imports the worker
as ``python -m hetfed.runtime.worker`` does and compares what Flower's modules hold with the real
packages, loaded afterwards.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

CHECK = """
import asyncio, json, sys
import hetfed.runtime.worker
import flwr.supercore.error.catalog as catalog
import flwr.supercore.error.http as http
import flwr.supercore.utils as utils

out = {"after-worker": sorted(m for m in ("fastapi", "pydantic", "requests") if m in sys.modules)}
# requests, loaded by Flower's own module on first use:
error = utils.requests.RequestException
out["requests-error"] = f"{error.__module__}.{error.__name__}"
out["after-requests"] = sorted(m for m in ("fastapi", "pydantic", "requests") if m in sys.modules)

from starlette.requests import Request
scope = {"type": "http", "method": "GET", "path": "/", "headers": [], "query_string": b""}
reply = asyncio.run(http.http_exception_handler(Request(scope), http.HTTPException(404, "no such run")))
out["handler"] = [reply.status_code, reply.body.decode()]

import fastapi, fastapi.exception_handlers, fastapi.responses, requests  # the real packages, now
out["real"] = hasattr(fastapi, "FastAPI") and hasattr(requests, "post")
out["same"] = {
    "status": catalog.status is fastapi.status and http.status is fastapi.status,
    "Request": http.Request is fastapi.Request,
    "Response": http.Response is fastapi.Response,
    "JSONResponse": http.JSONResponse is fastapi.responses.JSONResponse,
    "HTTPException": issubclass(fastapi.HTTPException, http.HTTPException),
    "requests": utils.requests.post is requests.post,
}
real = asyncio.run(fastapi.exception_handlers.http_exception_handler(
    Request(scope), fastapi.HTTPException(404, "no such run")))
out["real-handler"] = [real.status_code, real.body.decode()]
out["codes"] = {str(k): str(v) for k, v in catalog.API_ERROR_MAP.items()}
print(json.dumps(out))
"""

# Flower's error catalog with the real FastAPI, for comparison with the one the worker built.
CATALOG = """
import json
import flwr.supercore.error.catalog as catalog
print(json.dumps({str(k): str(v) for k, v in catalog.API_ERROR_MAP.items()}))
"""


def fresh_python(script: str) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_worker_imports_flower_without_fastapi_pydantic_or_requests() -> None:
    out = fresh_python(CHECK)
    assert out["after-worker"] == []
    # Flower's module loads requests when it uses it, and only requests.
    assert out["requests-error"] == "requests.exceptions.RequestException"
    assert out["after-requests"] == ["requests"]
    # The deferred error handler answers as FastAPI's own does.
    assert out["handler"] == out["real-handler"] == [404, '{"detail":"no such run"}']
    assert out["real"] is True  # a later import gets the real packages, not the stand-ins
    assert out["same"] == dict.fromkeys(out["same"], True), out["same"]


def test_flowers_error_catalog_is_the_same_with_the_stand_ins() -> None:
    assert fresh_python(CHECK)["codes"] == fresh_python(CATALOG)
