"""``hetfed docker wheelhouse`` / ``base-image``, checked without a Docker engine or a network:
what the wheelhouse holds and how pip is asked for it, the apt mirror the base image comes from,
the stand-in's layout against Flower's base image, and docs/deployment.md's instructions."""

from __future__ import annotations

import platform
import re
import shlex
import tomllib
from pathlib import Path

import pytest

from hetfed import versions
from hetfed.cli import build_parser
from hetfed.docker_images import (
    BASE_IMAGE,
    QPTH,
    build_requirements,
    check_cpu_only,
    debian_mirror,
    download_command,
    platform_tags,
    read_wheelhouse,
    requirements,
    wheel_command,
)
from tests.conftest import REPO


def test_the_wheelhouse_holds_cpu_torch_flower_and_every_runtime_requirement() -> None:
    import torch

    reqs = requirements()
    assert reqs[0] == f"torch=={torch.__version__.split('+')[0]}"  # constraints-dev.txt's CPU wheel
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    assert reqs[1] == f"flwr=={versions.flower()}"  # the Flower the dev setup tests, not the range's newest
    assert reqs[2:] == [d.replace("flwr[simulation]", "flwr") for d in deps]
    assert f"flwr=={versions.flower()}" in reqs and not [r for r in reqs if "simulation" in r]
    assert build_requirements() == ["setuptools>=68"]
    assert QPTH == "qpth==0.0.18"
    assert "qpth==0.0.18" in (REPO / "Makefile").read_text()  # the same release as the venv's


def test_pip_is_asked_for_the_images_python_and_platform_not_the_hosts(tmp_path: Path) -> None:
    cmd = download_command(tmp_path, ["flwr==1.42.0"], "3.12", "2.36", sources=("--no-index",))
    assert cmd[1:4] == ["-m", "pip", "download"] and "--only-binary=:all:" in cmd
    assert cmd[cmd.index("--python-version") + 1] == "3.12" and "--no-index" in cmd
    platforms = [cmd[i + 1] for i, w in enumerate(cmd) if w == "--platform"]
    assert platforms == platform_tags("2.36") and all(p.endswith(f"_{platform.machine()}") for p in platforms)
    assert platforms[0].startswith("manylinux_2_36_") and platforms[-1].startswith("manylinux1_")
    assert len(platforms) == 20 + 3  # 2.36 down to 2.17, then the legacy names
    assert "--no-deps" not in cmd and cmd[-1] == "flwr==1.42.0"
    assert "--no-deps" in download_command(tmp_path, [QPTH], "3.11", "2.36", no_deps=True)
    built = wheel_command(tmp_path, [QPTH])
    assert built[3:5] == ["wheel", "--quiet"] and "--no-deps" in built and built[-1] == QPTH
    with pytest.raises(ValueError, match="--glibc 2.5"):
        platform_tags("2.5")


def test_a_cuda_torch_is_refused_and_an_incomplete_wheelhouse_is_named(tmp_path: Path) -> None:
    check_cpu_only(["torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl", "numpy-2.4.6.whl"])
    with pytest.raises(RuntimeError, match="CUDA build .*--torch-index-url https://download.pytorch.org"):
        check_cpu_only(["torch-2.13.0-cp311.whl", "nvidia_cublas_cu12-12.8.whl"])
    (tmp_path / "torch.whl").write_text("")
    with pytest.raises(FileNotFoundError, match="not a complete wheelhouse .*hetfed docker wheelhouse"):
        read_wheelhouse(tmp_path)


def test_the_debian_mirror_is_apts_own(tmp_path: Path) -> None:
    (tmp_path / "sources.list.d").mkdir()
    (tmp_path / "sources.list.d" / "debian.sources").write_text(
        "Types: deb\n# http://snapshot.example/archive\nURIs: http://deb.example/debian-security\n"
        "Suites: bookworm-security\nComponents: main\n\n"
        "Types: deb\nURIs: http://deb.example/debian\nSuites: bookworm bookworm-updates\nComponents: main\n"
    )
    assert debian_mirror("bookworm", tmp_path) == "http://deb.example/debian"
    (tmp_path / "sources.list.d" / "debian.sources").unlink()
    (tmp_path / "sources.list").write_text(
        "# deb http://old.example/debian bookworm main\n"
        "deb [signed-by=/k.gpg] http://list.example/debian bookworm main\n"
    )
    assert debian_mirror("bookworm", tmp_path) == "http://list.example/debian"
    with pytest.raises(FileNotFoundError, match="no Debian mirror for trixie .*--mirror URL"):
        debian_mirror("trixie", tmp_path)
    sources = Path("/etc/apt/sources.list.d/debian.sources")
    if sources.exists():  # this machine's: the reference build used its first URIs
        assert debian_mirror("bookworm").startswith("http")


def test_the_stand_in_has_flowers_base_image_layout_and_installs_offline() -> None:
    text = re.sub(r"\\\n\s*", " ", (REPO / "docker" / "base.Dockerfile").read_text())
    steps = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    assert steps[:2] == ["ARG DEBIAN_IMAGE=local/debian:bookworm", "FROM ${DEBIAN_IMAGE}"]
    assert f"ARG FLWR_VERSION={versions.flower()}" in steps
    run = next(s for s in steps if s.startswith("RUN "))
    assert "python3 -m venv /python/venv" in run
    assert '--no-index --find-links /tmp/wheels "flwr==${FLWR_VERSION}"' in run
    assert "groupadd -g 49999 app" in run and "useradd -M -d /app -u 49999 -g app" in run
    assert "chown -R app:app /app /python/venv" in run  # the app image's pip installs as `app`
    env = next(s for s in steps if s.startswith("ENV "))
    assert "PATH=/python/venv/bin:$PATH" in env and "HOME=/app" in env
    assert steps[-3:] == ["WORKDIR /app", "USER app", 'ENTRYPOINT ["flower-superexec"]']
    assert BASE_IMAGE == f"flwr/superexec:{versions.flower()}"


def test_the_docker_commands_and_their_defaults_are_in_the_readme() -> None:
    parser = build_parser()
    args = parser.parse_args(["docker", "wheelhouse"])
    assert (args.dir, args.python_version, args.glibc, args.torch_index_url) == (
        "wheelhouse",
        "3.11",
        "2.36",
        None,
    )
    args = parser.parse_args(["docker", "base-image"])
    assert (args.wheelhouse, args.tag, args.suite, args.force) == (
        "wheelhouse",
        BASE_IMAGE,
        "bookworm",
        False,
    )
    page = (REPO / "docs" / "deployment.md").read_text()
    section = page[page.index("## Docker compose") : page.index("## TLS and node authentication")]
    commands = [shlex.split(c) for c in re.findall(r"^(hetfed docker [^\n#]*)", section, re.M)]
    assert {c[2] for c in commands} == {"wheelhouse", "base-image"}
    for words in ("--no-index", "air-gapped", "Compose v2", "--python-version 3.11", "--glibc 2.36"):
        assert words in section, words
    assert "DOCKER_BUILDKIT=0 docker build --network none -t hetfed-app:local ." in section
