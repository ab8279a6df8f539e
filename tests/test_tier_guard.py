"""The tiers and their guard (tests/conftest.py, tests/tier_guard.py): a fast-tier test that starts a
federation, Docker, a network namespace or a browser is an error naming the test and the program,
also when the code swallows the refusal or a Python program it started tried; the full tier and the
one smoke run start what they need. Played by pytest on probe tests in a sandbox holding copies of
the real conftest and guard, whose programs are stand-ins (nothing real starts even if the guard
failed)."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from tests import tier_guard
from tests.conftest import SLOW

HERE = Path(__file__).resolve().parent


@pytest.mark.parametrize(
    ("argv", "what"),
    [
        (["/venv/bin/flower-superlink", "--insecure"], "a SuperLink (flower-superlink)"),
        (["/venv/bin/hetfed-supernode", "--runtime", "warm"], "a SuperNode (hetfed-supernode)"),
        (
            ["/usr/bin/python3", "/venv/bin/flower-superexec", "--plugin-type", "clientapp"],
            "a SuperExec (flower-superexec)",
        ),
        ([sys.executable, "-m", "hetfed.runtime.superlink", "--insecure"], "a SuperLink"),
        (["docker", "compose", "up", "-d"], "Docker (docker)"),
        (["sudo", "-E", "dockerd", "--host", "unix:///x.sock"], "Docker (dockerd)"),
        (["sh", "-c", "docker ps -q | wc -l"], "Docker (docker)"),
        (["env", "A=1", "chromium", "--headless"], "a browser (chromium)"),
        (["/usr/bin/chromedriver", "--port=0"], "a browser (chromedriver)"),
        (["/x/playwright/driver/node", "cli.js", "run-driver"], "a browser (node)"),
        (["ip", "netns", "add", "hetfed-1"], "a network namespace (ip)"),
        (["ip", "-n", "sw", "link", "add", "p0", "type", "veth"], "a network namespace (ip)"),
        (["unshare", "--net", "true"], "a network namespace (unshare)"),
        (["ip", "-j", "addr"], None),
        (["flwr", "run", ".", "local"], None),
        ([sys.executable, "-m", "hetfed.cli", "run", "--engine", "inline"], None),
        (["nginx", "-c", "/tmp/nginx.conf"], None),
        (["ps", "-o", "stat=", "-g", "12"], None),
        (["timeout", "5", "true"], None),
    ],
)
def test_classify_names_the_programs_of_the_full_tier(argv: list[str], what: str | None) -> None:
    assert tier_guard.classify(argv) == what


PROBES = """
import subprocess, sys
import pytest

def test_fast_starts_docker():
    subprocess.run(["docker", "ps"], check=True)

def test_fast_swallows_the_refusal():
    try:
        subprocess.run(["flower-superlink", "--insecure"])
    except Exception:
        pass

def test_fast_child_python_makes_a_namespace():
    code = "import subprocess; subprocess.run(['ip', 'netns', 'add', 'x'])"
    subprocess.run([sys.executable, "-c", code])

@pytest.fixture(scope="module")
def supernode():
    subprocess.run(["hetfed-supernode"], check=True)

def test_fast_with_a_fixture_that_starts_a_supernode(supernode):
    pass

def test_fast_and_harmless():
    subprocess.run(["ip", "addr"], check=True)

@pytest.mark.deployment
def test_full_tier_starts_docker():
    subprocess.run(["docker", "ps"], check=True)

@pytest.mark.smoke
@pytest.mark.deployment
def test_the_smoke_run_starts_a_superlink():
    subprocess.run(["flower-superlink"], check=True)
"""


def sandbox(tmp_path: Path, probes: str) -> tuple[Path, dict[str, str]]:
    """tmp_path/run/tests: the real conftest and guard with ``probes``; tmp_path/bin: stand-ins
    named as the programs, which append their command lines to tmp_path/ran. The environment
    carries no guard of this (fast-tier) test, so the sandbox's own does the guarding."""
    run, bin_ = tmp_path / "run", tmp_path / "bin"
    (run / "tests").mkdir(parents=True)
    bin_.mkdir()
    for name in ("conftest.py", "tier_guard.py"):
        shutil.copy(HERE / name, run / "tests" / name)
    shutil.copytree(HERE / "tier_guard_site", run / "tests" / "tier_guard_site")
    (run / "tests" / "test_probes.py").write_text(probes)
    for program in ("docker", "flower-superlink", "hetfed-supernode", "ip"):
        (bin_ / program).write_text(f'#!/bin/sh\necho "$(basename "$0") $*" >> {tmp_path / "ran"}\n')
        (bin_ / program).chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in (tier_guard.RECORD_ENV, tier_guard.TEST_ENV)}
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != str(tier_guard.SITE)]
    env.update(PATH=f"{bin_}{os.pathsep}{env['PATH']}", PYTHONPATH=os.pathsep.join(paths))
    return run, env


def test_the_guard_errs_on_fast_tests_that_start_the_full_tiers_programs(tmp_path: Path) -> None:
    run, env = sandbox(tmp_path, PROBES)
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:xdist", "-W", "ignore",
         "--junitxml", str(tmp_path / "junit.xml"), "tests/test_probes.py"],
        cwd=run, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode == 1, out.stdout + out.stderr
    problems: dict[str, list[str]] = {}
    for case in ET.parse(tmp_path / "junit.xml").iter("testcase"):
        for bad in (*case.iter("failure"), *case.iter("error")):
            problems.setdefault(case.get("name", ""), []).append(bad.get("message", ""))
    assert sorted(problems) == [
        "test_fast_child_python_makes_a_namespace",
        "test_fast_starts_docker",
        "test_fast_swallows_the_refusal",
        "test_fast_with_a_fixture_that_starts_a_supernode",
    ], out.stdout
    for name, what in [
        ("test_fast_starts_docker", "Docker (docker): docker ps"),
        ("test_fast_swallows_the_refusal", "a SuperLink (flower-superlink): flower-superlink --insecure"),
        ("test_fast_child_python_makes_a_namespace", "a network namespace (ip): ip netns add x"),
        ("test_fast_with_a_fixture_that_starts_a_supernode", "a SuperNode (hetfed-supernode)"),
    ]:
        # the teardown's error names the test and the program, whatever the call did
        error = f"tests/test_probes.py::{name} is in the fast tier and tried to start {what}"
        assert any(error in m for m in problems[name])
    # nothing refused ran; the full tier's and the smoke run's programs and harmless ones did
    ran = sorted(line.strip() for line in (tmp_path / "ran").read_text().splitlines())
    assert ran == ["docker ps", "flower-superlink", "ip addr"]


def test_one_smoke_run_at_most(tmp_path: Path) -> None:
    smoke = (
        "import pytest\n\n@pytest.mark.smoke\ndef test_a(): pass\n\n@pytest.mark.smoke\ndef test_b(): pass\n"
    )
    run, env = sandbox(tmp_path, smoke)
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:xdist", "-W", "ignore",
         "--co", "tests"],
        cwd=run, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode == pytest.ExitCode.USAGE_ERROR
    both = "tests/test_probes.py::test_a, tests/test_probes.py::test_b"
    assert f"one smoke run in the fast tier, not 2: {both}" in out.stderr


def test_every_slow_entry_names_a_test_file_and_its_tests() -> None:
    """A renamed file or test would otherwise drop silently into the fast tier."""
    for name, tests in SLOW.items():
        assert (HERE / name).is_file(), f"tests/conftest.py SLOW: no tests/{name}"
        defined = {
            n.name for n in ast.walk(ast.parse((HERE / name).read_text())) if isinstance(n, ast.FunctionDef)
        }
        assert not set(tests) - defined, f"tests/conftest.py SLOW: {name} has no {set(tests) - defined}"
