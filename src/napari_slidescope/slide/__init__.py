"""Opening whole-slide images: the only package that imports tifffile and zarr."""

from napari_slidescope.errors import SlideError
from napari_slidescope.slide._levels import DamageLog, damage_message
from napari_slidescope.slide._pixels import read_pixels
from napari_slidescope.slide.cache import set_cache_bytes, tile_cache
from napari_slidescope.slide.chunking import DEFAULT_CHUNK_BYTES, choose_chunks
from napari_slidescope.slide.level_choice import coarsest_level_not_coarser, nearest_level
from napari_slidescope.slide.probe import SlideProbe, probe
from napari_slidescope.slide.slide import ArraySlide, Slide, open_slide

__all__ = [
    "read_pixels",
    "DEFAULT_CHUNK_BYTES",
    "ArraySlide",
    "DamageLog",
    "Slide",
    "SlideError",
    "SlideProbe",
    "choose_chunks",
    "coarsest_level_not_coarser",
    "damage_message",
    "nearest_level",
    "open_slide",
    "probe",
    "set_cache_bytes",
    "tile_cache",
]
