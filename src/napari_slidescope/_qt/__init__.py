"""The Qt view: dock widgets, the analysis session (background runs) and the launcher.

The only package that imports qtpy, magicgui or superqt (an import-linter contract in
pyproject.toml); the napari glue it wires (reader, layers, jobs) lives in
:mod:`napari_slidescope._napari` and imports napari alone.
"""
