"""Sphinx configuration of hetfed's documentation site (``make docs``).

The pages are Markdown, read by MyST-Parser, so they stay readable as files on any Git host;
``docs/_ext/config_reference.py`` writes the run-config reference from hetfed/config.py at build
time. Internal links (pages, their headings, repository files) are resolved by the build, and
``make docs`` turns every warning, an unresolved link included, into an error.
"""

from __future__ import annotations

import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
sys.path[:0] = [str(DOCS / "_ext"), str(DOCS.parent)]  # the extension, and hetfed from this checkout

project = "hetfed"
author = "hetfed maintainers"
copyright = "hetfed maintainers"  # noqa: A001 (Sphinx's name)

extensions = ["myst_parser", "config_reference", "repository_links"]
source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build"]

# GitHub-style anchors for headings down to ####, so a page's [text](page.md#a-heading) links work
# on a Git host and here alike; the build checks each such anchor.
myst_heading_anchors = 4
myst_enable_extensions = ["colon_fence"]

# Every link that is not a page, a heading or a repository file is an http(s) URL and is not
# fetched (the build machines have no internet): `make docs` checks the internal ones only.
nitpicky = True
# Options and commands in the text stay as typed: no "--resume" turned into an en dash.
smartquotes = False

html_theme = "furo"
html_title = "hetfed"
html_static_path: list[str] = []
