"""The tifffile / zarr adapter: every call into tifffile and zarr goes through here.

tifffile comes in two generations that users have both:

* tifffile 2026.3.x (what pip resolves on Python 3.11): ``aszarr()`` returns a store whose
  multiscale group carries NGFF-0.1-style ``attrs['multiscales']`` (zarr format 2 layout);
* newer tifffile (Python >= 3.12): a zarr v3 store with NGFF 0.5 metadata under
  ``attrs['ome']['multiscales']``.

:func:`open_levels` hides the difference and returns one zarr array per pyramid level.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import numpy as np
import tifffile
import zarr

from napari_slidescope.slide.errors import SlideError

TIFF_MAGIC = (b"II*\x00", b"MM\x00*", b"II+\x00", b"MM\x00+")

TiffFile = tifffile.TiffFile
TiffPageSeries = tifffile.TiffPageSeries


def has_tiff_magic(path: str | os.PathLike[str]) -> bool:
    """Return True when the file starts with a classic or BigTIFF header (reads 4 bytes)."""
    try:
        with open(path, "rb") as fh:
            return fh.read(4) in TIFF_MAGIC
    except OSError:
        return False


def open_tiff(path: str | os.PathLike[str]) -> tifffile.TiffFile:
    """Open a TIFF file, turning every failure into a :class:`SlideError` naming the file."""
    path = os.fspath(path)
    if os.path.isdir(path):
        raise SlideError(path, "is a directory, not a slide file")
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as fh:
            head = fh.read(4)
    except FileNotFoundError:
        raise SlideError(path, "no such file") from None
    except PermissionError as exc:
        raise SlideError(path, f"cannot be read (permission denied: {exc.strerror})") from exc
    except OSError as exc:
        raise SlideError(path, f"cannot be read ({exc})") from exc
    if size == 0:
        raise SlideError(path, "is empty (0 bytes)")
    if head not in TIFF_MAGIC:
        raise SlideError(path, f"is not a TIFF file (starts with {head!r}, expected a TIFF header)")
    try:
        tif = tifffile.TiffFile(path)
        series = tif.series
    except Exception as exc:  # tifffile raises many types on damaged files
        raise SlideError(path, f"is a damaged or truncated TIFF ({type(exc).__name__}: {exc})") from exc
    if not series:
        tif.close()
        raise SlideError(path, "contains no image")
    return tif


def format_flags(tif: tifffile.TiffFile) -> set[str]:
    """Return tifffile's format flags, e.g. ``{'svs'}``, ``{'ndpi'}``, ``{'ome'}``."""
    return set(tif.flags)


def series_levels(series: tifffile.TiffPageSeries) -> list[tifffile.TiffPageSeries]:
    """Return the pyramid levels of a series, level 0 first."""
    return list(series.levels)


def first_page(series: tifffile.TiffPageSeries) -> Any:
    """Return the key page of a series (holds tags and the native chunk shape)."""
    return series.keyframe


def multiscale_paths(attrs: Mapping[str, Any]) -> list[str] | None:
    """Return the dataset paths of an NGFF multiscale group, level 0 first, or None.

    Understands NGFF 0.5 (``attrs['ome']['multiscales']``, zarr v3 stores) and the older
    layout with ``attrs['multiscales']`` at the top level (zarr format 2 stores).
    """
    meta = attrs.get("ome", attrs)
    if not isinstance(meta, Mapping):
        return None
    multiscales = meta.get("multiscales")
    if not multiscales:
        return None
    datasets = multiscales[0].get("datasets", [])
    paths = [str(d["path"]) for d in datasets if isinstance(d, Mapping) and "path" in d]
    return paths or None


def open_levels(series: tifffile.TiffPageSeries, path: str) -> list[zarr.Array]:
    """Open the zarr arrays of every level of a series (no pixel is decoded)."""
    try:
        store = series.aszarr()
        node = zarr.open(store, mode="r")
    except Exception as exc:
        raise SlideError(path, f"cannot map the image into a zarr store ({exc})") from exc
    if isinstance(node, zarr.Array):
        return [node]
    paths = multiscale_paths(dict(node.attrs)) or sorted(
        node.array_keys(), key=lambda k: -int(np.prod(node[k].shape))
    )
    return [node[p] for p in paths]


def read_page(page: Any) -> np.ndarray:
    """Decode a whole (small) page, e.g. an associated label or macro image."""
    return page.asarray()


def tag_value(page: Any, name: str, default: Any = None) -> Any:
    """Return the value of a TIFF tag by name, or `default`."""
    tag = page.tags.get(name)
    return default if tag is None else tag.value


def decode_error_types() -> tuple[type[BaseException], ...]:
    """Exception types a damaged tile raises while decoding."""
    import imagecodecs

    types: list[type[BaseException]] = [ValueError, RuntimeError, OSError, IndexError]
    for name in dir(imagecodecs):
        obj = getattr(imagecodecs, name)
        if isinstance(obj, type) and issubclass(obj, Exception):
            types.append(obj)
    return tuple(types)
