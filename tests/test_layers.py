"""Import layers: no module imports a module of a higher layer (imports inside functions count).

    0  leaves (import no other layer):     the run-config schema (hetfed.config), the methods' typed
                                           parameters (hetfed.params, hetfed.methods) and the
                                           problems' (hetfed.problem_params), Flower records <->
                                           NumPy (hetfed.records), Flower's waits and their
                                           self-test (hetfed.runtime.waits, .internals), a silo's
                                           allow-list of app builds (hetfed.runtime.pinning), a
                                           message's objects in one request (hetfed.runtime.
                                           object_batch: routes and clients over Flower's), the
                                           checks of given paths, the folder lock and key files written
                                           0600 (hetfed.paths), secure aggregation's primitives
                                           (hetfed.secagg), a silo's identity and the federation's
                                           roster (hetfed.silo_identity), the core's one door
                                           into the Flower runtime (hetfed.runtime.seam),
                                           installed versions (hetfed.versions)
    1  problems                            data, feasible sets, models, metrics
    2  client | strategies                 the two sides of a method; neither imports the other
    3  server                              the ServerApp: client pool, round loop, results store
                                           (it never imports the client side)
    4  engines                             inline, simulation and deployment runs, Flower's
                                           processes, the Flower runtime, TLS and node keys, the
                                           audit trail
    5  federation                          local and real-machine federations, the nginx proxy, the
                                           compose files and their Docker images
    6  tools                               the CLI, the dashboard, decide / predict, the
                                           reproductions, bench/

``LAYERS`` below is the one list of each layer's modules and the layers it may import; a module
imports any module of its own layer. Imports under ``if TYPE_CHECKING:`` are annotations only and
do not count. The module-level import graph, deferred imports included, has no circle.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import REPO

BASE = {"hetfed.config", "hetfed.records", "hetfed.runtime.waits", "hetfed.runtime.internals"}
BASE |= {"hetfed.runtime.pinning", "hetfed.runtime.object_batch", "hetfed.paths"}
BASE |= {"hetfed.secagg", "hetfed.silo_identity", "hetfed.runtime.seam"}
BASE |= {"hetfed.params", "hetfed.methods", "hetfed.problem_params", "hetfed.jsonl", "hetfed.versions"}
PACKAGES = ("problems", "client", "strategies", "server", "hetfed", "bench")
# The app's folders, installed as hetfed.problems, hetfed.client, ... (hetfed/__init__.py).
FOLDERS = ("problems", "client", "strategies", "server")


# The house, bottom to top: layer -> (its modules, the layers it may import besides its own). A
# name stands for the module and its submodules; the longest name that matches decides.
LOW = ("base", "problems")
LAYERS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "base": (tuple(sorted(BASE)), ()),
    "problems": (("hetfed.problems",), ("base",)),
    "client": (("hetfed.client",), LOW),
    "strategies": (("hetfed.strategies",), LOW),
    "server": (("hetfed.server",), (*LOW, "strategies")),
    "engines": (
        ("hetfed.engines", "hetfed.runtime", "hetfed.credentials", "hetfed.audit"),
        (*LOW, "client", "strategies", "server"),
    ),
    "federation": (
        ("hetfed.federation", "hetfed.nginx_proxy", "hetfed.compose", "hetfed.docker_images"),
        (*LOW, "client", "strategies", "server", "engines"),
    ),
    "tools": (
        ("hetfed.cli", "hetfed.federation_cli", "hetfed.docker_cli", "hetfed.dashboard", "hetfed.decide")
        + ("hetfed.predict", "hetfed.reproduce", "bench"),
        (*LOW, "client", "strategies", "server", "engines", "federation"),
    ),
}
PACKAGE = "hetfed"  # hetfed/__init__.py finds the app's folders and imports nothing of the project


def layer(module: str) -> str | None:
    """The layer of a project module; None for third-party and standard modules (and the package)."""
    names = [n for ns, _ in LAYERS.values() for n in ns if module == n or module.startswith(n + ".")]
    if not names:
        return None
    longest = max(names, key=len)
    return next(name for name, (ns, _) in LAYERS.items() if longest in ns)


def judge(module: str, target: str) -> str | None:
    """Why ``module`` may not import ``target`` (None: it may)."""
    if target.split(".")[0] in FOLDERS:  # would import a second copy, or fail installed
        return f"imports {target}, not hetfed.{target}"
    # `from hetfed import config` names a base module: judge the module, not the package.
    if target == PACKAGE or target.removeprefix("hetfed.") in FOLDERS:
        return None
    own, other = layer(module), layer(target)
    assert own is not None, f"{module} is in no layer of LAYERS"
    if other is None or other == own or other in LAYERS[own][1]:
        return None
    return (
        f"imports {target} (layer {other}; {own} may import {', '.join(LAYERS[own][1]) or 'no other layer'})"
    )


def imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every import in ``path`` outside ``if TYPE_CHECKING:`` blocks."""
    tree = ast.parse(path.read_text())
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
    found = []
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
            found += [(node.lineno, f"{node.module}.{a.name}") for a in node.names]
    return found


def modules() -> dict[str, Path]:
    """Every project module (installed name, ``hetfed.client.app``) -> its file, each file once."""
    found = {}
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            rel = path.relative_to(REPO)
            if rel.parts[0] == "hetfed" and rel.parts[1] in FOLDERS:
                continue  # hetfed/client -> ../client in a checkout: the folder's files, once
            module = ".".join(rel.with_suffix("").parts).removesuffix(".__init__")
            found[f"hetfed.{module}" if rel.parts[0] in FOLDERS else module] = path
    return found


def violations() -> list[str]:
    out = []
    for module, path in modules().items():
        if module != PACKAGE:
            rel = path.relative_to(REPO)
            out += [f"{rel}:{line} {why}" for line, target in imports(path) if (why := judge(module, target))]
    return out


def import_graph() -> dict[str, set[str]]:
    """Project module -> the project modules it imports, an import inside a function included.

    ``from a.b import c`` is an edge to ``a.b.c`` when that is a module, else to ``a.b`` (the
    longest project module the name starts with); importing ``a.b`` also runs ``a/__init__.py``,
    which is no edge here: a package that imports its own submodules is no circle.
    """
    known = modules()
    graph: dict[str, set[str]] = {}
    for module, path in known.items():
        graph[module] = set()
        for _, target in imports(path):
            parts = target.split(".")
            while parts and ".".join(parts) not in known:
                parts.pop()
            if parts and (found := ".".join(parts)) != module:
                graph[module].add(found)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles: every strongly connected set of more than one module (Tarjan), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = [stack.pop()]
            while component[-1] != v:
                component.append(stack.pop())
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def test_no_import_circle() -> None:
    """No module reaches itself through imports. An import deferred into a function counts: it
    only hides the circle from the interpreter until the call (engines/control_api.py and
    engines/flower.py were one, client/app.py and client/silo_policy.py another)."""
    assert cycles(import_graph()) == []


def test_the_circle_check_sees_a_circle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a", "e"}, "e": set(), "f": {"g"}, "g": {"f"}}
    assert cycles(graph) == [["a", "b", "c"], ["f", "g"]]


def test_no_module_imports_a_higher_layer() -> None:
    assert violations() == []


# The core: the app's folders and the engines. It reaches hetfed/runtime (which changes Flower's
# internals) only through the seam, where each change applies only where its checks pass.
CORE = (*FOLDERS, "hetfed/engines")
SEAM = "hetfed.runtime.seam"


def test_the_core_reaches_the_flower_runtime_only_through_its_seam() -> None:
    reached = [
        f"{path.relative_to(REPO)}:{line} imports {target}"
        for folder in CORE
        for path in sorted((REPO / folder).rglob("*.py"))
        for line, target in imports(path)
        if (target == "hetfed.runtime" or target.startswith("hetfed.runtime."))
        and target != SEAM
        and not target.startswith(SEAM + ".")
    ]
    assert reached == []
    assert any(t == SEAM for _, t in imports(REPO / "server" / "app.py"))  # the check reads real imports


def test_every_module_has_its_layer() -> None:
    assert [m for m in modules() if m != PACKAGE and layer(m) is None] == []


def test_the_rules_refuse_what_the_house_forbids() -> None:
    """The engines never import the federation layer, the server never the client side, a strategy
    never a client, the base nothing above it; a tool imports anything below it."""
    assert judge("hetfed.engines.runner", "hetfed.federation.node_config")
    assert judge("hetfed.engines.runner", "hetfed.cli")
    assert judge("hetfed.server.app", "hetfed.client.app")
    assert judge("hetfed.strategies.fedavg", "hetfed.client.decision")
    assert judge("hetfed.config", "hetfed.problems.registry")
    assert judge("hetfed.runtime.pinning", "hetfed.runtime.supernode")  # base inside runtime/
    assert judge("hetfed.client.app", "client.session")  # the folder's bare name
    assert judge("hetfed.engines.runner", "hetfed.engines.federation_info.FederationInfo") is None
    assert judge("hetfed.federation", "hetfed.engines.flower") is None
    assert judge("hetfed.cli", "hetfed.federation") is None
    assert judge("bench.pflsa", "hetfed.engines.runner") is None
    assert judge("hetfed.server.app", "numpy") is None


def test_the_check_sees_a_violation(tmp_path: Path) -> None:
    """The AST reading catches a lazy import and ignores a TYPE_CHECKING one."""
    path = tmp_path / "m.py"
    path.write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from hetfed.server.pool import ClientPool\n"
        "def f():\n    from hetfed.client.session import ClientSession\n"
    )
    assert [m for _, m in imports(path) if layer(m)] == [
        "hetfed.client.session",
        "hetfed.client.session.ClientSession",
    ]


def test_no_strategy_writes_a_file() -> None:
    """Strategies compute; the server's round loop and store write (server/rounds.py)."""
    writers = {"open", "savez", "savez_compressed", "save", "write_text", "write_bytes", "dump", "mkdir"}
    for path in sorted((REPO / "strategies").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                name = getattr(node.func, "attr", getattr(node.func, "id", ""))
                assert name not in writers, f"{path.name}:{node.lineno} calls {name}"


def test_bench_imports_nothing_from_tests() -> None:
    """bench/ runs from a checkout without the test suite: the references it shares with the tests
    live in bench/ (bench/fedrspo_reference.py, bench/lsa_reference.py), and no script puts tests/ on
    its path to import a module of it by its bare name."""
    tests = {p.stem for p in (REPO / "tests").glob("*.py")} | {"tests"}
    found = []
    for path in sorted((REPO / "bench").rglob("*.py")):
        found += [
            f"{path.relative_to(REPO)}:{line} {m}" for line, m in imports(path) if m.split(".")[0] in tests
        ]
        if '"tests"' in path.read_text():
            found.append(f"{path.relative_to(REPO)} names the folder tests")
    assert found == []
