"""The message contract: a client takes the method from each message, its run config only for its problem.

Statically, over the source: no client module reads the strategy's name or a method key from its
run config (``self.cfg`` holds :data:`hetfed.config.PROBLEM_KEYS` only), every method value a
client handler reads from its settings is one its strategies send (``client_settings``), and no
strategy or server module imports client code. Dynamically: a client session refuses a method
key (tests/test_session_cache.py), and every run of the suite goes through that session.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from client.app import CLIENTS
from hetfed.config import PROBLEM_KEYS, STRATEGIES, validate
from strategies.registry import METHODS, build_strategy, strategy_class
from tests.conftest import REPO

PROBLEM_OF = {"decision": "knapsack", "constrained": "quadratic", "lsa": "garnet"}


def reads(source: str, pattern: str) -> set[str]:
    """String keys subscripted on the names matched by ``pattern`` (e.g. ``self\\.cfg``)."""
    return set(re.findall(pattern + r'\["([a-z0-9+-]+)"\]', source))


def settings_sent(handler: str) -> set[str]:
    """The keys every strategy served by ``handler`` puts in each message's ConfigRecord."""
    sent: list[set[str]] = []
    for name in METHODS:
        cls = strategy_class(name)
        if cls.client_handler != handler:
            continue
        cfg = validate({"strategy": name, "problem": PROBLEM_OF[cls.family]})
        sent.append(set(build_strategy(cfg).client_settings()))
    assert sent, f"no strategy uses client {handler!r}"
    return set.intersection(*sent)


def test_no_client_module_reads_the_strategy_or_a_method_key_from_its_run_config() -> None:
    for path in sorted((REPO / "client").glob("*.py")):
        source = path.read_text()
        run_config_keys = reads(source, r"self\.cfg") | reads(source, r"session\.cfg")
        assert run_config_keys <= PROBLEM_KEYS, (path.name, sorted(run_config_keys - PROBLEM_KEYS))
        assert '["strategy"]' not in source and "'strategy'" not in source, path.name
    assert not set(CLIENTS) & set(STRATEGIES)  # clients are named for what they do, not for a strategy


def test_every_method_value_a_client_reads_is_sent_by_each_of_its_strategies() -> None:
    for handler, target in CLIENTS.items():
        module_name, class_name = target.split(":")
        source = Path(REPO, *module_name.split(".")).with_suffix(".py").read_text()
        # self.settings[...] everywhere; a bare `cfg[...]` in the decision client is its settings
        # (train_personalize, interp_dffl, the loss builders), never the run config (`self.cfg`).
        read = reads(source, r"self\.settings") | reads(source, r"(?<![.\w])cfg")
        missing = read - settings_sent(handler)
        assert not missing, f"{class_name} reads {sorted(missing)} that its strategies do not send"


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
                assert not any(n == "client" or n.startswith("client.") for n in names), (path.name, names)
