"""Packages a warm worker's Flower imports name but never use, loaded only if used (~16 MB a silo).

Flower 1.42's client-side modules import two packages for code a ClientApp worker never runs:
FastAPI, for the HTTP error translation a SuperLink or SuperNode server installs
(``flwr.supercore.error``; FastAPI's package loads pydantic and its routing, ~13 MB resident),
and requests, for a download helper of the CLI (``flwr.supercore.utils``, ~5.5 MB). While the
worker imports Flower, :func:`deferring_unused_packages` puts a :class:`Deferred` module under each
name. Its attributes load the real package on first access, except the few names Flower binds at
import time, which are given as Starlette's own objects: FastAPI re-exports them
(``fastapi.status`` *is* ``starlette.status``, ``fastapi.Request`` *is*
``starlette.requests.Request``, ...). The one that is not the same object is ``HTTPException``
(FastAPI's subclasses Starlette's, which stands in): Flower subclasses and catches it only in the
server's error translation, which a worker does not serve. On leaving, the stand-ins leave
``sys.modules``, so any later ``import fastapi`` (an app's own) gets the real package; the module
objects Flower kept keep loading it on first use.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType
from typing import Any


class Deferred(ModuleType):
    """Stands in for module ``name``: ``preset`` attributes as given, any other from the real module."""

    def __init__(self, name: str, preset: dict[str, Any]) -> None:
        super().__init__(name)
        self.__dict__.update(preset)
        self.__path__: list[str] = []  # a package, so that its submodules can be stood in for too

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__"):  # the import system's probes (__file__, ...) load nothing
            raise AttributeError(attr)
        return getattr(load(self.__name__), attr)


def load(name: str) -> ModuleType:
    """The real module ``name``, imported now if only a stand-in is in ``sys.modules``."""
    module = sys.modules.get(name)
    if isinstance(module, Deferred) or module is None:
        top = name.split(".")[0]
        for key in [k for k in sys.modules if k == top or k.startswith(top + ".")]:
            if isinstance(sys.modules[key], Deferred):
                del sys.modules[key]
        module = importlib.import_module(name)
    return module


def stand_ins() -> dict[str, Deferred]:
    """The stand-ins for FastAPI (with the names Flower binds at import time) and requests."""
    from starlette import status
    from starlette.exceptions import HTTPException
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response

    async def http_exception_handler(request: Request, exc: HTTPException) -> Response:
        handler = load("fastapi.exception_handlers").http_exception_handler
        return await handler(request, exc)

    return {
        "fastapi": Deferred(
            "fastapi",
            {"status": status, "Request": Request, "Response": Response, "HTTPException": HTTPException},
        ),
        "fastapi.exception_handlers": Deferred(
            "fastapi.exception_handlers", {"http_exception_handler": http_exception_handler}
        ),
        "fastapi.responses": Deferred(
            "fastapi.responses", {"JSONResponse": JSONResponse, "Response": Response}
        ),
        "requests": Deferred("requests", {}),
    }


@contextmanager
def deferring_unused_packages() -> Iterator[None]:
    """Import Flower inside: FastAPI and requests are loaded only if something uses them."""
    loaded_before = set(sys.modules)  # a package already loaded (this process serves HTTP) stays
    placed = {n: m for n, m in stand_ins().items() if n.split(".")[0] not in loaded_before}
    sys.modules.update(placed)
    try:
        yield
    finally:
        for name, module in placed.items():
            if sys.modules.get(name) is module:
                del sys.modules[name]
