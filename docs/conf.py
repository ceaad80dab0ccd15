"""Sphinx configuration: Markdown pages (MyST), docstrings (autodoc + napoleon), and three
local extensions that generate what must not drift (docs/_ext): the flag tables from the live
argparse parser, the results tables from results/*.json, the API reference from
``remat_kit.__all__``. Built with warnings as errors (tests/test_docs.py):

    sphinx-build -W --keep-going -b html docs docs/_build/html
"""

import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
sys.path.insert(0, str(DOCS / "_ext"))

project = "remat-kit"
author = "the remat-kit authors"
copyright = "2026, the remat-kit authors"

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "api_reference",
    "cli_flags",
    "results_tables",
    "captured",
]
source_suffix = {".md": "markdown"}
exclude_patterns = ["_build", "_output", "capture.py", "README.md"]
myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3

napoleon_google_docstring = True
napoleon_numpy_docstring = False
autodoc_member_order = "bysource"
autodoc_typehints = "description"
nitpicky = False

html_theme = "furo"
html_title = "remat-kit"
