"""Sphinx configuration of forge_nb's docs: MyST pages, the executed example notebooks, the API and magics.

Why Sphinx with myst-nb: it is what the PyTorch projects forge_nb builds on use (torchforge, monarch and
torchtitan build Sphinx sites), autodoc turns the docstrings into the API reference, and myst-nb renders
notebooks that were executed elsewhere with their outputs (``nb_execution_mode = "off"``: the docs build
never runs a notebook; ``scripts/docs_notebooks.py`` executes them and saves them under ``notebooks/``).
mkdocs-material with mkdocs-jupyter was the other candidate; its API reference (mkdocstrings) and its notebook
plugin are two more projects beside the generator, where Sphinx does both with its own autodoc and one plugin.
"""

from __future__ import annotations

import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
sys.path.insert(0, str(DOCS / "_ext"))
sys.path.insert(0, str(DOCS.parent))

project = "forge_nb"
author = "forge_nb contributors"
copyright = "forge_nb contributors"  # noqa: A001  (Sphinx's name)

extensions = [
    "myst_nb",
    "sphinx.ext.autodoc",
    "forge_docs",
]

exclude_patterns = ["_build", "README.md", "**/.ipynb_checkpoints"]
suppress_warnings = ["mystnb.unknown_mime_type"]

# Notebooks: rendered from their saved outputs, never executed here.
nb_execution_mode = "off"
nb_output_stderr = "show"
nb_render_markdown_format = "myst"  # a markdown output's links are checked like the pages'
nb_ipywidgets_js: dict[str, dict[str, str]] = {}  # widget outputs are notes (scripts/docs_notebooks.py): no widget JS
myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3

# API reference: the docstrings of forge_nb's public front, in the order of the source.
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_default_options = {"show-inheritance": False}

html_theme = "pydata_sphinx_theme"
html_title = "forge_nb"
html_static_path: list[str] = []
html_theme_options = {
    "navigation_with_keys": False,
    "show_toc_level": 2,
    "secondary_sidebar_items": ["page-toc"],
    "footer_start": [],
    "footer_end": [],
}
html_show_sourcelink = False
# Pages without a section of their own get no left column (it would hold an empty "Section Navigation").
html_sidebars = {"index": [], "getting-started": []}
