"""Cheap sniffing of a file: what a reader needs to decide whether to claim it."""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from napari_slidescope.slide import _tiff
from napari_slidescope.slide.formats import detect_format

__all__ = ["SlideProbe", "probe"]


@dataclass(frozen=True)
class SlideProbe:
    """What :func:`probe` learnt about a file without decoding a pixel.

    Attributes
    ----------
    format : str
        ``"svs"``, ``"ndpi"``, ``"ome"``, ``"qptiff"``, ``"scn"``, ``"bif"``,
        ``"philips"`` or ``"generic"``.
    levels : int
        Pyramid levels of the first image series.
    tiled : bool
        Whether that series' level 0 is stored in tiles.
    nbytes : int
        Decoded bytes of that series' level 0.
    damage : str or None
        What is wrong with the file's structure (e.g. it is truncated), or None.
    """

    format: str
    levels: int
    tiled: bool
    nbytes: int
    damage: str | None = None

    @property
    def is_vendor_slide(self) -> bool:
        """True for the whole-slide dialects (everything but OME and generic TIFF)."""
        return self.format not in ("ome", "generic")


def probe(path: str | os.PathLike[str]) -> SlideProbe:
    """Tell what a TIFF file is, reading its header and directories only.

    The work is bounded like :func:`~napari_slidescope.slide.open_slide`'s checks (a
    path that is not a regular file is refused before it is opened; the directory walk
    has limits), so a hostile file cannot make it hang.

    Parameters
    ----------
    path : str or PathLike
        The file.

    Returns
    -------
    SlideProbe

    Raises
    ------
    SlideError
        If the file is missing, not a regular file, not a TIFF, or damaged.

    Examples
    --------
    >>> probe("CMU-1.svs")  # doctest: +SKIP
    SlideProbe(format='svs', levels=3, tiled=True, nbytes=4541352000)
    """
    tif, layout, _notes = _tiff.open_tiff(path, on_error="blank")
    with tif:
        series = tif.series[0]
        page = _tiff.first_page(series)
        return SlideProbe(
            format=detect_format(tif),
            levels=len(_tiff.series_levels(series)),
            tiled=bool(page.is_tiled),
            nbytes=int(np.prod(series.shape, dtype=np.int64)) * np.dtype(series.dtype).itemsize,
            damage=None if layout.truncated is None else f"truncated: {layout.truncated}",
        )
