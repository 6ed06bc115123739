"""Moved to :mod:`napari_slidescope.segmenters.instanseg`; ``python -m`` here still installs.

``python -m napari_slidescope.pipeline.instanseg install SOURCE`` is the same command as
``python -m napari_slidescope.segmenters.instanseg install SOURCE``.
"""

import sys

from napari_slidescope.segmenters.instanseg import (
    MODELS,
    InstanSegSegmenter,
    install_model,
    install_models,
    missing_reason,
    model_folder,
    models_dir,
)
from napari_slidescope.segmenters.instanseg import main as _main

__all__ = [
    "MODELS",
    "InstanSegSegmenter",
    "install_model",
    "install_models",
    "main",
    "missing_reason",
    "model_folder",
    "models_dir",
]


def main(argv: list[str] | None = None) -> int:
    """Run the install command (see :func:`napari_slidescope.segmenters.instanseg.main`)."""
    return _main(argv, prog="python -m napari_slidescope.pipeline.instanseg")


if __name__ == "__main__":
    sys.exit(main())
