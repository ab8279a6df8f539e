"""The message contract: a client takes the method from each message, its run config only for its problem.

A client's run config holds :data:`hetfed.config.PROBLEM_KEYS` only (client/session.py refuses a
method key, tests/test_session_cache.py, and every run of the suite goes through that session);
the method's parameters arrive typed in each message (tests/test_method_params.py); clients are
named for what they do, never for a strategy; and no strategy or server module imports client code.
"""

from __future__ import annotations

import ast

from hetfed.client.app import CLIENTS
from hetfed.config import STRATEGIES
from tests.conftest import REPO


def test_clients_are_named_for_what_they_do_not_for_a_strategy() -> None:
    assert not set(CLIENTS) & set(STRATEGIES)


def test_strategies_and_the_server_import_no_client_code() -> None:
    for package in ("strategies", "server"):
        for path in sorted((REPO / package).glob("*.py")):
            tree = ast.parse(path.read_text())
            for node in ast.walk(tree):
                names = (
                    [a.name for a in node.names]
                    if isinstance(node, ast.Import)
                    else [node.module or ""]
                    if isinstance(node, ast.ImportFrom)
                    else []
                )
                tops = [n.removeprefix("hetfed.").split(".")[0] for n in names]
                assert "client" not in tops, (path.name, names)
