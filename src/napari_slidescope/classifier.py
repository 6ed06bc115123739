"""The learned cell classifier's public names (``slidescope batch --classify`` loads from here).

The code lives in :mod:`napari_slidescope.pipeline.cell_forest`; this module is where
:func:`~napari_slidescope.pipeline.cell_classes.load_classification` looks for a loader of
non-rules files.
"""

from napari_slidescope.pipeline.cell_forest import (
    ClassifierFileError,
    ObjectClassifier,
    load_classifier,
    train_classifier,
)

__all__ = ["ClassifierFileError", "ObjectClassifier", "load_classifier", "train_classifier"]
