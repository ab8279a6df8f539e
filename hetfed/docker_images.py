"""``hetfed docker ...``: the compose federation's images, built without a registry or a package index.

``wheelhouse``: every wheel the images install, collected on the host by ``pip download``
for the image's Python and platform (CPU torch, Flower, hetfed's runtime requirements and
their dependencies, qpth without its dependencies, the build backend). The Dockerfile installs
from it only (``pip install --no-index --find-links``), so the build needs no network: the
way to build for air-gapped silos.

``base-image``: a local stand-in for ``flwr/superexec:<flwr>`` (Flower's base-image layout:
venv ``/python/venv`` on PATH, user ``app`` uid/gid 49999, ``/app``, entrypoint
``flower-superexec``) on a debootstrap'ed Debian, for machines that cannot pull Flower's image.
It does nothing where that image is present.
"""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

from hetfed import versions

REPO = Path(__file__).resolve().parents[1]
FLWR_VERSION = versions.flower()
BASE_IMAGE = f"flwr/superexec:{FLWR_VERSION}"
PYTHON_VERSION = "3.11"  # Debian 12's python3, and the CPU torch wheel's cp311
GLIBC = "2.36"  # Debian 12's; Ubuntu 24.04 (Flower's images) has 2.39
QPTH = "qpth==0.0.18"  # declares numpy<2: installed without its dependencies (as in the Makefile)
SUITE = "bookworm"
# nginx-light: the reverse proxy of docker-compose.tls.yml's SuperLink (hetfed/nginx_proxy.py).
DEBIAN_PACKAGES = "python3,python3-venv,python3-pip,ca-certificates,nginx-light"
PACKAGES_LABEL = "org.hetfed.debian-packages"  # on the imported Debian, inherited by images built on it
STAND_IN_LABEL = "org.hetfed.stand-in"  # docker/base.Dockerfile's
MARKER = "wheelhouse.json"  # written last: a wheelhouse without it is incomplete
CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def _pyproject(repo: Path) -> dict:
    path = repo / "pyproject.toml"
    if not path.is_file():
        raise FileNotFoundError(f"no pyproject.toml in {repo}: hetfed docker runs from a hetfed checkout")
    return tomllib.loads(path.read_text())


def requirements(repo: Path = REPO) -> list[str]:
    """What the images install from the wheelhouse: the pins of constraints-dev.txt that are runtime
    requirements (the CPU torch; not the dev tools), then hetfed's runtime requirements with
    Flower's [simulation] extra dropped (Ray is unused)."""
    deps = [d.replace("flwr[simulation]", "flwr") for d in _pyproject(repo)["project"]["dependencies"]]
    runtime = {_name(d) for d in deps}
    pins = [
        ln.split("#")[0].strip()
        for ln in (repo / "constraints-dev.txt").read_text().splitlines()
        if ln.split("#")[0].strip() and _name(ln) in runtime
    ]
    return pins + deps


def _name(requirement: str) -> str:
    """The package name of a requirement line (``torch==2.13.0`` -> ``torch``)."""
    return re.split(r"[<>=!~\[;\s]", requirement.strip(), maxsplit=1)[0].lower()


def build_requirements(repo: Path = REPO) -> list[str]:
    """The build backend ``pip install .`` needs in the image (pyproject's [build-system] requires)."""
    return list(_pyproject(repo)["build-system"]["requires"])


def platform_tags(glibc: str = GLIBC, arch: str | None = None) -> list[str]:
    """Every manylinux tag a system with this glibc runs (pip does not expand ``manylinux_2_x``)."""
    arch = arch or platform.machine()
    major, minor = (int(p) for p in glibc.split("."))
    if major != 2 or minor < 17:
        raise ValueError(f"--glibc {glibc}: must be 2.17 or newer")
    tags = [f"manylinux_2_{m}_{arch}" for m in range(minor, 16, -1)]
    return tags + [f"manylinux2014_{arch}", f"manylinux2010_{arch}", f"manylinux1_{arch}"]


def download_command(
    dest: Path,
    packages: list[str],
    python_version: str,
    glibc: str,
    *,
    no_deps: bool = False,
    sources: tuple[str, ...] = (),
) -> list[str]:
    """``pip download`` of binary wheels for the image's Python and platform (not the host's);
    ``sources`` are extra pip options saying where from (``--extra-index-url``, ``--no-index``)."""
    cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--dest", str(dest), "--only-binary=:all:"]
    cmd += ["--python-version", python_version, "--implementation", "cp", *sources]
    for tag in platform_tags(glibc):
        cmd += ["--platform", tag]
    return cmd + ["--no-deps"] * no_deps + packages


def wheel_command(dest: Path, packages: list[str]) -> list[str]:
    """``pip wheel`` of pure-Python packages that have only a source release, without dependencies."""
    return [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--wheel-dir", str(dest), *packages]


def collect_wheelhouse(
    dest: Path,
    python_version: str = PYTHON_VERSION,
    glibc: str = GLIBC,
    torch_index_url: str | None = None,
    repo: Path = REPO,
) -> dict:
    """Download every wheel the images need into ``dest``; write requirements.txt and the marker."""
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    (dest / MARKER).unlink(missing_ok=True)
    reqs = requirements(repo)
    extra = ("--extra-index-url", torch_index_url) if torch_index_url else ()
    main = download_command(dest, reqs + build_requirements(repo), python_version, glibc, sources=extra)
    _run(main, "pip download of the image's requirements")
    # qpth has no wheel on PyPI: built here, pure Python (py3-none-any), without its dependencies.
    _run(wheel_command(dest, [QPTH]), f"pip wheel of {QPTH}")
    names = sorted(p.name for p in dest.iterdir() if p.suffix == ".whl")
    check_cpu_only(names)
    (dest / "requirements.txt").write_text(
        f"# Written by `hetfed docker wheelhouse` (Python {python_version}, glibc {glibc}); "
        "the Dockerfile installs these from this folder only.\n" + "".join(f"{r}\n" for r in reqs)
    )
    info = {
        "python-version": python_version,
        "glibc": glibc,
        "arch": platform.machine(),
        "requirements": reqs,
        "no-deps": [QPTH],
        "wheels": names,
    }
    (dest / MARKER).write_text(json.dumps(info, indent=1) + "\n")
    return info


def check_cpu_only(wheels: list[str]) -> None:
    """Refuse a wheelhouse with torch's CUDA build (its nvidia-* and triton wheels are gigabytes)."""
    cuda = [n for n in wheels if n.lower().startswith(("nvidia_", "nvidia-", "triton-"))]
    if cuda:
        raise RuntimeError(
            f"the wheelhouse got torch's CUDA build ({cuda[0]}): rerun with --torch-index-url {CPU_INDEX}"
        )


def read_wheelhouse(path: Path) -> dict:
    """The marker of a complete wheelhouse (an error if ``path`` is none)."""
    marker = Path(path) / MARKER
    if not marker.is_file():
        raise FileNotFoundError(
            f"{path} is not a complete wheelhouse (no {MARKER}): run hetfed docker wheelhouse"
        )
    return json.loads(marker.read_text())


def debian_mirror(suite: str = SUITE, apt_dir: Path = Path("/etc/apt")) -> str:
    """The mirror apt uses for ``suite`` (deb822 ``*.sources`` first, then ``sources.list``)."""
    for path in sorted((apt_dir / "sources.list.d").glob("*.sources")):
        for stanza in path.read_text().split("\n\n"):
            fields = {}
            for line in stanza.splitlines():
                if ":" in line and not line.startswith(("#", " ")):
                    key, value = line.split(":", 1)
                    fields[key.strip().lower()] = value.split()
            if (
                suite in fields.get("suites", [])
                and "deb" in fields.get("types", ["deb"])
                and fields.get("uris")
            ):
                return fields["uris"][0]
    lists = [apt_dir / "sources.list", *sorted((apt_dir / "sources.list.d").glob("*.list"))]
    for path in (p for p in lists if p.is_file()):
        for line in path.read_text().splitlines():
            words = [w for w in line.split("#")[0].split() if not w.startswith("[")]
            if len(words) >= 3 and words[0] == "deb" and words[2] == suite:
                return words[1]
    raise FileNotFoundError(f"no Debian mirror for {suite} in {apt_dir}: pass --mirror URL")


def image_labels(tag: str, env: dict[str, str] | None = None) -> dict[str, str] | None:
    """The labels of image ``tag`` ({} if it has none), or None if the engine does not have it."""
    out = subprocess.run(
        ["docker", "image", "inspect", "--format", "{{json .Config.Labels}}", tag],
        capture_output=True,
        text=True,
        env=env,
    )
    return (json.loads(out.stdout) or {}) if out.returncode == 0 else None


def base_image_current(tag: str = BASE_IMAGE, env: dict[str, str] | None = None) -> bool:
    """Whether ``tag`` is present and, if it is our stand-in, built on today's Debian package set."""
    labels = image_labels(tag, env)
    if labels is None:
        return False
    return STAND_IN_LABEL not in labels or labels.get(PACKAGES_LABEL) == DEBIAN_PACKAGES


def build_base_image(
    wheelhouse: Path,
    tag: str = BASE_IMAGE,
    suite: str = SUITE,
    mirror: str | None = None,
    work_dir: Path | None = None,
    force: bool = False,
    env: dict[str, str] | None = None,
) -> str:
    """Build the stand-in for Flower's image unless ``tag`` is present; returns what was done.

    A stand-in built on another Debian package set (an older hetfed's) is rebuilt.
    """
    if base_image_current(tag, env) and not force:
        return f"{tag} is present: nothing to build"
    info = read_wheelhouse(wheelhouse)
    debian = f"local/debian:{suite}"
    if work_dir:
        Path(work_dir).mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="hetfed-base-", dir=work_dir))
    try:
        if (image_labels(debian, env) or {}).get(PACKAGES_LABEL) != DEBIAN_PACKAGES:
            debootstrap = shutil.which("debootstrap") or "/usr/sbin/debootstrap"
            if not Path(debootstrap).exists():
                raise FileNotFoundError("debootstrap not found: apt-get install debootstrap")
            rootfs = work / "rootfs"
            mirror = mirror or debian_mirror(suite)
            _run(
                [
                    debootstrap,
                    "--variant=minbase",
                    f"--include={DEBIAN_PACKAGES}",
                    suite,
                    str(rootfs),
                    mirror,
                ],
                f"debootstrap {suite} from {mirror}",
            )
            tar = subprocess.Popen(
                ["tar", "-C", str(rootfs), "--numeric-owner", "-c", "."], stdout=subprocess.PIPE
            )
            imported = subprocess.run(
                ["docker", "import", "--change", f"LABEL {PACKAGES_LABEL}={DEBIAN_PACKAGES}", "-", debian],
                stdin=tar.stdout,
                capture_output=True,
                env=env,
            )
            tar.stdout.close()  # type: ignore[union-attr]
            if tar.wait() or imported.returncode:
                raise RuntimeError(
                    f"docker import of the {suite} rootfs failed: {imported.stderr.decode().strip()}"
                )
            shutil.rmtree(rootfs)
        context = work / "context"
        context.mkdir()
        shutil.copy(REPO / "docker" / "base.Dockerfile", context / "Dockerfile")
        # Flower and its dependencies only, out of the wheelhouse (torch stays out of the base image).
        local = ("--no-index", "--find-links", str(Path(wheelhouse).resolve()))
        flwr = [f"{versions.distribution('flwr')}=={FLWR_VERSION}"]  # flwr, or flwr-nightly
        closure = download_command(
            context / "wheels", flwr, info["python-version"], info["glibc"], sources=local
        )
        _run(closure, "collecting Flower's wheels from the wheelhouse")
        build = ["docker", "build", "--network", "none", "--build-arg", f"DEBIAN_IMAGE={debian}"]
        build += ["--build-arg", f"FLWR_VERSION={FLWR_VERSION}", "-t", tag, str(context)]
        _run(build, f"docker build of {tag}", env=dict(env or os.environ, DOCKER_BUILDKIT="0"))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return f"built {tag} (a local stand-in with Flower's base-image layout, on Debian {suite})"


def _run(cmd: list[str], what: str, env: dict[str, str] | None = None) -> None:
    """Run ``cmd``; its output goes to the terminal; a failure is one line naming ``what``."""
    if subprocess.run(cmd, env=env).returncode:
        raise RuntimeError(f"{what} failed (command: {' '.join(cmd[:6])} ...)")
