"""Installed versions by import package: Flower's whatever its distribution is called.

Flower's ``flwr`` package is installed by the ``flwr`` distribution or by ``flwr-nightly`` (another
distribution of the same package), so ``importlib.metadata.version("flwr")`` fails on a nightly:
:func:`version` asks for the distribution that provides the package.
"""

from __future__ import annotations

import functools
from importlib import metadata


@functools.cache
def distribution(package: str) -> str:
    """The installed distribution that provides import package ``package`` (``flwr`` -> ``flwr`` or
    ``flwr-nightly``): the one named like it where it is installed, else the one that lists the
    package's files; ``PackageNotFoundError`` where none does."""
    try:
        metadata.distribution(package)
        return package
    except metadata.PackageNotFoundError:
        providers = metadata.packages_distributions().get(package, [])
        if not providers:
            raise
        return str(providers[0])


def version(package: str) -> str:
    """The version of the installed distribution that provides import package ``package``."""
    return metadata.version(distribution(package))


def flower() -> str:
    """Flower's installed version, e.g. ``1.42.0`` or ``1.43.0.dev20261026``."""
    return version("flwr")
