"""Loaded at start-up by the Python programs a fast-tier test starts (tests/tier_guard.py puts this
folder on their PYTHONPATH): installs the fast tier's guard in them too."""

import importlib.util
import os
from pathlib import Path

if os.environ.get("HETFED_TIER_GUARD"):
    _file = Path(__file__).resolve().parents[1] / "tier_guard.py"
    _spec = importlib.util.spec_from_file_location("tier_guard", _file)
    assert _spec is not None and _spec.loader is not None
    _guard = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(_guard)
    _guard.install()
