"""One installed package, hetfed: the app's folders are its subpackages in every layout.

A wheel gets server/, client/, strategies/ and problems/ as hetfed.server, ... through
pyproject.toml's package-dir; a checkout has the symlinks hetfed/server -> ../server, ...; the
app bundle Flower builds leaves symlinks out and hetfed/__init__.py finds the folders beside it.
"""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

from tests.conftest import REPO

FOLDERS = ("server", "client", "strategies", "problems")


def packages_in(folder: Path, name: str) -> set[str]:
    """``name`` and its subpackages: the folders under ``folder`` with an __init__.py (no symlinks)."""
    found = set()
    for dirpath, dirnames, filenames in os.walk(folder):  # does not enter symlinked folders
        dirnames[:] = [d for d in dirnames if d != "__pycache__"]
        if "__init__.py" in filenames:
            rel = Path(dirpath).relative_to(folder)
            found.add(".".join((name, *rel.parts)))
    return found


def test_pyproject_installs_every_package_under_hetfed() -> None:
    setuptools = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    expected = packages_in(REPO / "hetfed", "hetfed")
    for folder in FOLDERS:
        expected |= packages_in(REPO / folder, f"hetfed.{folder}")
    assert sorted(setuptools["packages"]) == sorted(expected)
    assert setuptools["package-dir"] == {f"hetfed.{f}": f for f in FOLDERS}


def test_the_checkout_links_the_folders_into_hetfed() -> None:
    for folder in FOLDERS:
        link = REPO / "hetfed" / folder
        assert link.is_symlink() and os.readlink(link) == f"../{folder}", link


def test_the_app_bundle_has_no_symlinks_and_imports_the_app_from_its_own_folders(tmp_path: Path) -> None:
    from flwr.cli.build import build_fab_from_disk

    fab = zipfile.ZipFile(io.BytesIO(build_fab_from_disk(REPO)))
    names = fab.namelist()
    assert "server/app.py" in names and "hetfed/__init__.py" in names
    assert not [n for n in names if n.startswith(tuple(f"hetfed/{f}/" for f in FOLDERS))]
    # only the code (pyproject.toml's fab-include): no docs, results, benchmarks or tests to hand to
    # a warm worker with every task
    assert {n.split("/")[0] for n in names} == {"hetfed", *FOLDERS, "pyproject.toml", ".info"}
    assert all(n.endswith(".py") for n in names if n.split("/")[0] in ("hetfed", *FOLDERS))
    fab.extractall(tmp_path)
    probe = (
        "import hetfed.server.app, hetfed.client.app, hetfed.strategies.fedavg, hetfed.problems.base\n"
        "import sys\n"
        "print(hetfed.server.app.__file__, hetfed.client.app.__file__)\n"
        f"print(sorted(n for n in sys.modules if n.split('.')[0] in {FOLDERS!r}))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True, check=True
    ).stdout.splitlines()
    assert out[0].split() == [str(tmp_path / "server" / "app.py"), str(tmp_path / "client" / "app.py")]
    assert out[1] == "[]"  # no top-level copies


def test_the_wheel_has_one_top_level_package(tmp_path: Path) -> None:
    """Built from a copy (setuptools builds in the source folder: build/, *.egg-info)."""
    pytest.importorskip("setuptools")
    source = tmp_path / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    for folder in ("hetfed", *FOLDERS):
        shutil.copytree(
            REPO / folder, source / folder, symlinks=True, ignore=shutil.ignore_patterns("__pycache__")
        )
    pip = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q"]
    subprocess.run([*pip, "-w", str(tmp_path), str(source)], check=True, capture_output=True)
    (wheel,) = tmp_path.glob("hetfed-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")} == {"hetfed"}
    for folder in FOLDERS:
        sources = {p.relative_to(REPO / folder).as_posix() for p in (REPO / folder).rglob("*.py")}
        installed = {n.removeprefix(f"hetfed/{folder}/") for n in names if n.startswith(f"hetfed/{folder}/")}
        assert installed == sources, folder
    plans = {p.name for p in (REPO / "hetfed" / "reproduce" / "plans").glob("*.toml")}  # package data
    shipped = {n.removeprefix("hetfed/reproduce/plans/") for n in names if n.endswith(".toml")}
    assert plans and shipped == plans
    templates = {p.name for p in (REPO / "hetfed" / "reproduce" / "templates").glob("*.md")}
    prefix = "hetfed/reproduce/templates/"
    shipped = {n.removeprefix(prefix) for n in names if n.startswith(prefix)}
    assert templates and shipped == templates
