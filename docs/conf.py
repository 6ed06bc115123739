"""Sphinx configuration: the API reference from the numpydoc docstrings, and the user guide.

Why Sphinx with numpydoc (and not mkdocs with mkdocstrings): the docstrings are written in
the numpydoc convention with Sphinx roles (:func:, :class:, :data:, :mod:), as in napari,
scikit-image and dask, so Sphinx renders them as they are, with no second dialect to keep
in step. The guide pages are Markdown (MyST), so they read the same as the README they came
from. Nothing is fetched while building (no intersphinx: CI reaches only PyPI) and nothing
is executed (no gallery, no notebooks), so the build takes seconds. Build it with::

    python -m sphinx -W --keep-going -b html docs docs/_build/html

``tests/test_docs.py`` runs that command, so a docstring that breaks the build fails the
tests.
"""

from __future__ import annotations

import sys
from pathlib import Path

# Document the package of this checkout, whatever is installed.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import napari_slidescope  # noqa: E402

project = "napari-slidescope"
author = "napari-slidescope developers"
copyright = "napari-slidescope developers, BSD-3-Clause"
release = napari_slidescope.__version__
version = release

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "numpydoc",
    "myst_parser",
]

source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "images", "screenshots.py"]

# autodoc: signatures as written, in source order; type hints stay in the signature
# (numpydoc's Parameters section already gives each type in words).
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_preserve_defaults = True
autosummary_generate = False

# numpydoc: the class pages list their members through autodoc, not a second table.
numpydoc_show_class_members = False
numpydoc_class_members_toctree = False
numpydoc_attributes_as_param_list = False

# MyST: GitHub-style heading anchors so that the guide's links to sections work.
myst_heading_anchors = 3

html_theme = "alabaster"
html_title = f"napari-slidescope {release}"
html_static_path: list[str] = []
