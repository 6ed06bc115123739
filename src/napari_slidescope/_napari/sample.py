"""npe2 sample data: synthetic slides, written once to the cache folder, opened by the reader."""

from __future__ import annotations

from typing import TYPE_CHECKING

from napari_slidescope._napari.reader import read_slide

if TYPE_CHECKING:
    from npe2.types import FullLayerData


def make_sample_slide() -> list[FullLayerData]:
    """Write the synthetic H&E sample slide once to the cache folder and open it."""
    from napari_slidescope.sample_data import sample_slide_path

    return read_slide(str(sample_slide_path()))


def make_ki67_sample() -> list[FullLayerData]:
    """Write the synthetic Ki-67 (H-DAB) sample slide once to the cache folder and open it."""
    from napari_slidescope.sample_data import SAMPLE_VERSION, cache_dir

    path = cache_dir() / f"slidescope-ki67-v{SAMPLE_VERSION}.svs"
    if not path.exists():
        from napari_slidescope.sample_cells import write_ki67_sample

        write_ki67_sample(path)
    return read_slide(str(path))


def make_multiplex_sample() -> list[FullLayerData]:
    """Write the synthetic multiplex sample (DAPI, CD3, CD8, PanCK, Ki67) once and open it."""
    from napari_slidescope.sample_data import SAMPLE_VERSION, cache_dir

    path = cache_dir() / f"slidescope-multiplex-v{SAMPLE_VERSION}.ome.tif"
    if not path.exists():
        from napari_slidescope.sample_cells import write_multiplex_sample

        write_multiplex_sample(path)
    return read_slide(str(path))
