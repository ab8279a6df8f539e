"""``hetfed docker ...``: build the compose federation's images offline (see hetfed/docker_images.py).

``wheelhouse`` collects every wheel the images install, on the host; ``base-image`` builds a
local stand-in for Flower's ``flwr/superexec`` image where it cannot be pulled.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from hetfed.docker_images import BASE_IMAGE, GLIBC, PYTHON_VERSION, SUITE


def cmd_wheelhouse(args: argparse.Namespace) -> int:
    from hetfed.docker_images import collect_wheelhouse

    info = collect_wheelhouse(Path(args.dir), args.python_version, args.glibc, args.torch_index_url)
    print(
        f"wheelhouse {args.dir}: {len(info['wheels'])} wheels for Python {args.python_version} "
        f"(glibc {args.glibc}, {info['arch']})"
    )
    print("build offline with: DOCKER_BUILDKIT=0 docker build --network none -t hetfed-app:local .")
    return 0


def cmd_base_image(args: argparse.Namespace) -> int:
    from hetfed.docker_images import build_base_image

    work = Path(args.work_dir) if args.work_dir else None
    print(build_base_image(Path(args.wheelhouse), args.tag, args.suite, args.mirror, work, args.force))
    return 0


def add_docker_parser(sub: argparse._SubParsersAction) -> None:
    """The ``docker`` subcommand and its actions."""
    docker = sub.add_parser("docker", help="build the compose federation's images offline (air-gapped silos)")
    actions = docker.add_subparsers(dest="action", required=True, metavar="ACTION")

    wheels = actions.add_parser(
        "wheelhouse",
        help="collect every wheel the images install (CPU torch, Flower, hetfed's requirements)",
        description="pip download, on this host, of every wheel the Dockerfile installs, for the image's "
        "Python and platform: the pins of constraints-dev.txt (CPU torch), hetfed's runtime requirements "
        "(Flower without its [simulation] extra) and all their dependencies, qpth without its "
        "dependencies, the build backend. Writes requirements.txt and wheelhouse.json (last: the "
        "wheelhouse is complete). The Dockerfile installs from ./wheelhouse only (--no-index).",
    )
    wheels.add_argument("dir", nargs="?", default="wheelhouse", help="folder (default wheelhouse)")
    wheels.add_argument(
        "--python-version",
        default=PYTHON_VERSION,
        help=f"the base image's Python (default {PYTHON_VERSION})",
    )
    wheels.add_argument(
        "--glibc", default=GLIBC, help=f"the base image's glibc, for manylinux wheels (default {GLIBC})"
    )
    wheels.add_argument(
        "--torch-index-url",
        metavar="URL",
        help="extra index for torch's CPU wheel where pip's own indexes have only the CUDA build",
    )
    wheels.set_defaults(func=cmd_wheelhouse)

    base = actions.add_parser(
        "base-image",
        help=f"build a local stand-in for {BASE_IMAGE} (machines without a registry)",
        description=f"Where {BASE_IMAGE} is absent: debootstrap a minimal Debian, import it as "
        "local/debian:<suite> (kept for later builds), and build on it an image with Flower's "
        "base-image layout (venv /python/venv, user app 49999, /app, entrypoint flower-superexec) "
        "with Flower from the wheelhouse, tagged like Flower's image. Does nothing where it is present.",
    )
    base.add_argument(
        "--wheelhouse", default="wheelhouse", help="from `hetfed docker wheelhouse` (default wheelhouse)"
    )
    base.add_argument("--tag", default=BASE_IMAGE, help=f"(default {BASE_IMAGE})")
    base.add_argument("--suite", default=SUITE, help=f"Debian release (default {SUITE})")
    base.add_argument("--mirror", metavar="URL", help="Debian mirror (default: apt's, from /etc/apt)")
    base.add_argument("--work-dir", metavar="DIR", help="where the rootfs is made (default: a temp folder)")
    base.add_argument("--force", action="store_true", help="build even if the tag is present")
    base.set_defaults(func=cmd_base_image)
