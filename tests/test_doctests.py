"""Every example in the package's docstrings runs (those that need a file or a viewer say so
with ``+SKIP``)."""

import doctest
import importlib
import pkgutil

import pytest

import napari_slidescope

MODULES = sorted(
    m.name
    for m in pkgutil.walk_packages(napari_slidescope.__path__, "napari_slidescope.")
    if not m.name.endswith("__main__")
)


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples failed in {name}"
