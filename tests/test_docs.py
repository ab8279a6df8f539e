"""The documentation cannot rot silently.

* ``docs/algorithms.md`` names, beside every equation, the ``path/file.py: name`` that computes
  it; every such reference must name a file of the repository and a function or class defined
  in it (``Class.method`` for a method), found by parsing the file with ``ast``.
"""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
ALGORITHMS = ROOT / "docs" / "algorithms.md"

# `client/losses.py: rspo_plus_loss`, `problems/polytope.py: KnapsackPolytope.radius`
REFERENCE = re.compile(r"([A-Za-z0-9_./-]+\.py): ([A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*)")


@cache
def definitions(path: Path) -> frozenset[str]:
    """Every function and class of ``path``, dotted by nesting (``Class.method``)."""
    names: set[str] = set()

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                name = prefix + child.name
                names.add(name)
                visit(child, name + ".")

    visit(ast.parse(path.read_text(encoding="utf-8"), filename=str(path)), "")
    return frozenset(names)


def references(text: str) -> list[tuple[str, str]]:
    return [(m.group(1), m.group(2)) for m in REFERENCE.finditer(text)]


def test_algorithms_md_references_name_existing_functions() -> None:
    refs = references(ALGORITHMS.read_text(encoding="utf-8"))
    assert len(refs) >= 80, (
        f"docs/algorithms.md should tie its equations to code; found {len(refs)} references"
    )
    broken = []
    for file, name in refs:
        path = ROOT / file
        if not path.is_file():
            broken.append(f"{file}: {name} (no file {file})")
        elif name not in definitions(path):
            broken.append(f"{file}: {name} (no function or class {name!r} in {file})")
    assert not broken, "docs/algorithms.md names code that does not exist:\n" + "\n".join(broken)


def test_algorithms_md_covers_the_three_methods_and_their_pieces() -> None:
    refs = {f"{file}: {name}" for file, name in references(ALGORITHMS.read_text(encoding="utf-8"))}
    for expected in (
        "client/losses.py: rspo_plus_loss",
        "client/losses.py: spo_plus_loss",
        "client/losses.py: mse_loss",
        "client/losses.py: pfyl_loss",
        "client/losses.py: dpo_loss",
        "client/losses.py: optnet_loss",
        "client/decision_client.py: calibrate",
        "client/decision_client.py: DecisionClient.train_personalize",
        "problems/metrics.py: qp_lp_gap",
        "strategies/fedavg.py: FedAvg.aggregate_train",
        "strategies/softmax_switching.py: masked_softmax",
        "strategies/softmax_switching.py: weighted_step",
        "client/lsa.py: PFLSAClient.step",
        "strategies/fedlsa.py: FedLSA",
        "client/lsa.py: SCAFFLSAClient",
    ):
        assert expected in refs, f"docs/algorithms.md does not point to {expected}"


def test_the_reference_checker_catches_a_stale_name(tmp_path: Path) -> None:
    """The checker itself: a renamed function or a missing file is reported."""
    (tmp_path / "m.py").write_text("class A:\n    def f(self):\n        pass\n\ndef g():\n    pass\n")
    assert definitions(tmp_path / "m.py") == {"A", "A.f", "g"}
    assert references("see `m.py: A.f` and (m.py: g), not m.py:g") == [("m.py", "A.f"), ("m.py", "g")]


@pytest.mark.parametrize("doc", ["README.md", "docs/results/knapsack.md"])
def test_no_link_to_a_missing_algorithms_file(doc: str) -> None:
    """The README once pointed to an ALGORITHMS.md that is not in the repository."""
    text = (ROOT / doc).read_text(encoding="utf-8")
    for target in re.findall(r"\]\(([^)#]+)", text):
        if not target.startswith(("http://", "https://")):
            assert (ROOT / Path(doc).parent / target).exists(), f"{doc} links to a missing {target}"
    if doc == "README.md":
        assert "docs/algorithms.md" in text
