"""Pure array analysis: stain estimation, nuclei segmentation and accuracy metrics.

Only numpy, scipy and scikit-image are used here. Submodules are imported on demand
(``from napari_slidescope.analysis import brightfield_nuclei``); nothing is imported eagerly.
"""
