"""Reading pixels out of a level, whatever kind of array a caller holds.

Apart from :mod:`._levels` (the readers) and :mod:`._dask_levels` (the dask arrays over
them, which import dask.array) so that neither has to import the other: this module sits
above both, and imports the dask side only once dask.array is already in the process.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

__all__ = ["read_pixels"]


def read_pixels(region: Any) -> np.ndarray:
    """Return a sliced level as a numpy array, read the fastest way it can be.

    A basic slice of a slide's level (a :class:`~._dask_levels.RegionArray`) is read
    directly, its missing tiles decoded on the module's thread pool, with no dask
    scheduler in the way (and without importing ``distributed``, which dask's scheduler
    lookup does); any other dask array is computed on dask's threaded scheduler; anything
    else goes through ``np.asarray``. dask is not imported here: a process that never
    made a dask array has none to compute.
    """
    if "dask.array" in sys.modules:
        # dask.array is already imported, so _dask_levels (which imports it) costs nothing
        from napari_slidescope.slide._dask_levels import RegionArray

        da = sys.modules["dask.array"]
        if isinstance(region, RegionArray):
            return np.asarray(region)
        if isinstance(region, da.Array):
            return np.asarray(region.compute(scheduler="threads"))
    return np.asarray(region)
