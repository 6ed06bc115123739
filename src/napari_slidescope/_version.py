"""The package's version, in a module of its own.

The package ``__init__`` re-exports it as ``napari_slidescope.__version__``; modules that
stamp outputs with it (batch manifests, label images, result files) import it from here,
so none of them has to import the package ``__init__`` (which names them lazily) and no
import circle runs through the root. pyproject's ``version`` must say the same.
"""

__version__ = "0.1.0"
