"""The backend protocol: what a slide backend hands to :class:`~.slide.Slide`.

A backend (DICOM WSI through wsidicom, OME-Zarr through zarr, OpenSlide-only formats
through OpenSlide) opens a slide and returns a :class:`BackendSlide`: one native-chunk
reader per pyramid level (the same protocol the TIFF adapter implements, so levels get the
same dask chunk budget, decoded-tile cache and parallel reads as every other slide), the
metadata in a :class:`~.formats.FormatInfo`, loaders of the associated images and a
``close``. This module is a leaf: backends import it and nothing of each other, and the
registry (:mod:`._registry`) that chooses among them imports them.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from napari_slidescope.errors import SlideError
from napari_slidescope.slide.formats import FormatInfo


@dataclass
class BackendSlide:
    """An opened non-TIFF slide, as a backend hands it to :class:`~.slide.Slide`.

    Attributes
    ----------
    info : FormatInfo
        Format name, calibration (and where it came from), channels, properties.
    levels : list of NativeChunks
        Native-chunk readers, level 0 first; each one's shape is in `axes` order.
    axes : {"YXS", "CYX", "YX"}
    associated : dict of str to callable
        Label, overview (macro), thumbnail...: each decoded when first asked for.
    close : callable
        Releases what the backend holds open.
    notes : list of str
        What was left out or ignored (the Slide warns once with them).
    """

    info: FormatInfo
    levels: list[Any]
    axes: str
    associated: dict[str, Callable[[], np.ndarray]] = field(default_factory=dict)
    close: Callable[[], None] = lambda: None
    notes: list[str] = field(default_factory=list)


def missing_extra(path: str | os.PathLike[str], what: str, extra: str) -> SlideError:
    """Return the error for a slide whose backend's optional packages are not installed."""
    return SlideError(
        path,
        f"is {what}; reading it needs the optional packages of the [{extra}] extra: "
        f"pip install 'napari-slidescope[{extra}]'",
    )
