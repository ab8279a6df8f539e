"""hetfed: federated learning across organisations whose problems differ, on Flower.

One installed package: the app's folders server/, client/, strategies/ and problems/ (beside this
one, where the Flower app keeps them) are its subpackages hetfed.server, hetfed.client,
hetfed.strategies and hetfed.problems.
"""

from pathlib import Path as _Path

_FOLDERS = ("server", "client", "strategies", "problems")
# An installed wheel has the folders here (pyproject.toml's package-dir), a git checkout has
# symlinks to them here. A Flower App Bundle has neither (`flwr build` leaves symlinks out), nor
# has a checkout without symlinks: then the app folder, which holds them beside hetfed/, joins
# this package's search path.
_here = _Path(__file__).parent
if any(not (_here / n).is_dir() and (_here.parent / n / "__init__.py").is_file() for n in _FOLDERS):
    __path__.append(str(_here.parent))
del _Path, _here
