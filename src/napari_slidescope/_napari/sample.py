"""npe2 sample data: the synthetic H&E slide, opened through the same reader."""

from __future__ import annotations

from napari_slidescope._napari.reader import LayerData, read_slide


def make_sample_slide() -> list[LayerData]:
    """Write the synthetic H&E sample slide once to the cache folder and open it."""
    from napari_slidescope.sample_data import sample_slide_path

    return read_slide(str(sample_slide_path()))
