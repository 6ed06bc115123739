"""npe2 sample data: the synthetic H&E slide, opened through the same reader."""

from __future__ import annotations

from typing import TYPE_CHECKING

from napari_slidescope._napari.reader import read_slide

if TYPE_CHECKING:
    from npe2.types import FullLayerData


def make_sample_slide() -> list[FullLayerData]:
    """Write the synthetic H&E sample slide once to the cache folder and open it."""
    from napari_slidescope.sample_data import sample_slide_path

    return read_slide(str(sample_slide_path()))
