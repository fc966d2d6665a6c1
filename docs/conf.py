"""Sphinx (with MyST markdown) for the documentation site: `make docs` builds it into results/docs/ with every
warning an error. The reference pages under generated/ are written from the code on every build
(ddlrepro.host.docs_pages), so they cannot drift from what the workflow reads."""

from pathlib import Path

from ddlrepro import __version__
from ddlrepro.host.docs_pages import write_generated

HERE = Path(__file__).resolve().parent
write_generated(HERE.parent, HERE / "generated")

project = "ddlrepro"
author = "the ddlrepro authors"
release = version = __version__
extensions = ["myst_parser"]
source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build"]
myst_heading_anchors = 3  # `[text](page.md#a-heading)` links, as GitHub renders them
myst_enable_extensions = ["colon_fence"]
html_theme = "alabaster"
html_title = f"ddlrepro {release}"
html_theme_options = {
    "description": "Distributed and elastic deep-learning training papers, reproduced",
    "page_width": "1240px",
    "body_max_width": "none",
}
html_static_path = ["_static"]  # alabaster loads _static/custom.css: wide tables scroll inside their box
