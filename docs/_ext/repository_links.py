"""Links from a page to a Markdown file of the repository outside docs/ (an example's README).

The pages link to repository files by their relative path, so the links work where the Markdown is
read as files (a Git host, an editor). MyST makes a link to a file that exists a download, but it
takes a link to any ``.md`` file for a page of the site and warns when the file lies outside
docs/ (``examples/pilot/README.md``). Here such a link becomes a download of that file, as for
any other repository file; a link to a file that does not exist stays as it was, and MyST's
warning fails ``make docs``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from docutils import nodes
from sphinx import addnodes


def outside_file(app: Any, node: addnodes.pending_xref) -> Path | None:
    """The existing Markdown file outside the site's sources that a MyST page link names, if any."""
    if node.get("refdomain") != "doc" or node.get("reftype") != "myst":
        return None
    target = str(node["reftarget"])
    if target in app.env.found_docs or not os.path.isabs(target):
        return None  # a page of the site, or a path MyST already resolved against docs/
    for suffix in app.config.source_suffix:
        path = Path(target + suffix)
        if path.is_file() and not path.resolve().is_relative_to(Path(app.srcdir).resolve()):
            return path
    return None


def as_downloads(app: Any, doctree: nodes.document) -> None:
    """``doctree-read``, before Sphinx collects downloads: links to outside Markdown files become
    downloads of them (the path relative to the linking page, as Sphinx resolves downloads)."""
    here = Path(app.env.doc2path(app.env.docname)).parent
    for node in list(doctree.findall(addnodes.pending_xref)):
        path = outside_file(app, node)
        if path is not None:
            link = addnodes.download_reference(
                refdomain=None,
                reftarget=os.path.relpath(path, here),
                refdoc=node.get("refdoc"),
                reftype="myst",
                refexplicit=node.get("refexplicit"),
            )
            link += node.children
            node.replace_self(link)


def setup(app: Any) -> dict[str, Any]:
    app.connect("doctree-read", as_downloads, priority=400)  # Sphinx's collectors run at 500
    return {"parallel_read_safe": True, "parallel_write_safe": True}
