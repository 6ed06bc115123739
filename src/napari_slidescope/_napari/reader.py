"""The npe2 reader: a thin layer over :func:`napari_slidescope.open_slide`.

A slide opened here stays open while a layer of the viewer shows it: when the last
layer showing a slide's levels (every channel of a multichannel slide, duplicates) is
removed from the viewer, the slide is closed, which empties its part of the shared
decoded-tile cache (:mod:`napari_slidescope.slide.cache`). Result layers hold their
own rasters, never the slide's levels, so they do not keep it open.

napari imports this module to ask whether it reads a path: the slide package (tifffile,
numpy) and the readers of result files are imported inside the functions that need them,
so asking stays cheap (a few ms).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from napari_slidescope._napari.open_slides import SLIDE_KEY, close_with_layers, remember_source

if TYPE_CHECKING:
    from collections.abc import Callable

    from npe2.types import FullLayerData

    #: What :func:`get_reader` returns: npe2's reader function, of this plugin's layers.
    ReaderFunction = Callable[[str | list[str]], list[FullLayerData]]

#: Tiled TIFFs whose level 0 decodes to more than this are too large to load eagerly.
EAGER_LIMIT_BYTES = 256 * 2**20


def get_reader(path: str | list[str]) -> ReaderFunction | None:
    """Return :func:`read_slide` when `path` is a slide this plugin should open, else None.

    A ``.geojson`` / ``.geojson.gz`` that looks like GeoJSON (QuPath objects) gets
    :func:`~napari_slidescope._napari.qupath.read_geojson_layers`; other JSON gets None.
    A folder ``slidescope batch`` wrote for a slide (with its ``manifest.json``) gets
    :func:`~napari_slidescope._napari.batch_results.read_batch_folder`; a folder of DICOM
    WSI instances or an OME-Zarr image gets :func:`read_slide`, as do the files only
    OpenSlide reads (``.mrxs``, ``.vms``...) and DICOM instance files (``.dcm``).

    Sniffs cheaply (the TIFF header and IFDs, never pixels) and never raises. Ordinary
    small single-image TIFFs are left to napari's builtin reader. A file behind a
    slide-only extension (``.svs``, ``.ndpi``, ...) is always taken, even when its bytes
    are damaged, so the user gets this plugin's error naming the file and the problem
    instead of "no reader found".
    """
    if isinstance(path, list):
        if len(path) != 1:
            return None
        path = path[0]
    try:
        if _is_url(path):  # claimed by name: sniffing would cost round trips
            return read_slide if _wants_url(path) else None
        if os.path.isdir(path):  # a `slidescope batch` result folder, OUT/<slide>/
            from napari_slidescope._napari.batch_results import get_batch_folder_reader

            batch = get_batch_folder_reader(os.fspath(path))
            if batch is not None:
                return batch
            return read_slide if _is_slide_folder(os.fspath(path)) else None
        if os.fspath(path).lower().endswith((".geojson", ".geojson.gz")):
            from napari_slidescope._napari.qupath import get_geojson_reader

            return get_geojson_reader(os.fspath(path))
        if os.fspath(path).lower().endswith(".parquet"):
            from napari_slidescope._napari.parquet import get_parquet_reader

            return get_parquet_reader(os.fspath(path))
        return read_slide if _wants(os.fspath(path)) else None
    except Exception:  # a sniffer must never raise
        return None


def _is_slide_folder(path: str) -> bool:
    """Tell whether `path` is a folder of DICOM WSI instances or an OME-Zarr image."""
    from napari_slidescope.slide import SlideError
    from napari_slidescope.slide._registry import choose_backend
    from napari_slidescope.slide.source import resolve

    try:
        return choose_backend(resolve(path)) in ("dicom", "ome-zarr")
    except SlideError:
        # a .zarr folder that is not readable is still ours: open_slide names the problem
        return path.lower().rstrip("/").endswith(".zarr")


def _is_url(path: Any) -> bool:
    from napari_slidescope.slide.source import is_url

    return is_url(path)


def slide_suffixes() -> tuple[str, ...]:
    """Every slide file ending the reader takes (:mod:`napari_slidescope.slide.formats`).

    Files behind a generic TIFF ending (``TIFF_SUFFIXES``) are sniffed; any other is
    always taken, so that a damaged slide gets this plugin's error.
    """
    from napari_slidescope.slide.formats import DICOM_SUFFIX, OPENSLIDE_SUFFIXES, SLIDE_SUFFIXES

    return (*SLIDE_SUFFIXES, *OPENSLIDE_SUFFIXES, DICOM_SUFFIX)


def _wants_url(url: str) -> bool:
    """Tell whether a URL's path ends like a slide or a TIFF (its query string aside)."""
    from napari_slidescope.slide.source import redact

    name = redact(url).lower().rstrip("/")
    if name.startswith("dicomweb+"):  # a DICOMweb series
        return True
    return name.endswith((*slide_suffixes(), ".zarr"))


def _wants(path: str) -> bool:
    from napari_slidescope.slide import SlideError, probe
    from napari_slidescope.slide.formats import TIFF_SUFFIXES

    lower = path.lower()
    if not lower.endswith(slide_suffixes()):
        return False
    if not lower.endswith(TIFF_SUFFIXES):
        # a slide-only ending (.svs, .mrxs, .dcm...): claimed even when damaged or not a
        # regular file, so open_slide's error shows
        return not os.path.isdir(path)
    try:
        info = probe(path)
    except SlideError:
        # a damaged TIFF: claim it, so the user reads what is wrong instead of pixels
        # another reader makes up (tifffile shows missing tiles as black)
        return _has_tiff_magic(path)
    if info.is_vendor_slide or info.levels > 1 or info.damage is not None:
        return True
    return info.tiled and info.nbytes > EAGER_LIMIT_BYTES


def _has_tiff_magic(path: str) -> bool:
    try:
        with open(path, "rb") as fh:
            return fh.read(4) in (b"II*\x00", b"MM\x00*", b"II+\x00", b"MM\x00+")
    except OSError:
        return False


def read_slide(
    path: str | list[str], *, storage_options: dict[str, Any] | None = None
) -> list[FullLayerData]:
    """Open a slide as one multiscale image layer (lazy dask levels, calibrated in µm).

    `path` may be a URL (``https://``, ``s3://``...); `storage_options` go to its fsspec
    filesystem (napari's own open passes none: credentials then come from the
    environment and the backend's config files).

    A damaged tile reads as blank, never silently: in a viewer it is outlined in a
    ``"<slide> damaged tiles"`` Shapes layer and a warning notification names the file,
    level and tiles (:mod:`napari_slidescope._napari.damage`); outside one, a
    :class:`~napari_slidescope.SlidescopeWarning` does.

    Raises
    ------
    SlideError
        Naming the file (or the URL without credentials) and the problem, if it cannot
        be opened.
    """
    from napari_slidescope.slide import open_slide

    if isinstance(path, list):
        path = path[0]
    slide = open_slide(path, on_error="blank", storage_options=storage_options)
    _watch_damage(slide)  # before any pixel is read
    data = layer_data(slide)
    remember_source(slide)
    close_with_layers(slide)
    return [data]


def add_slide_layers(
    viewer: Any, path: str, *, storage_options: dict[str, Any] | None = None
) -> list[Any]:
    """Add a slide's layers to `viewer` through :func:`read_slide`; return them."""
    layers: list[Any] = []
    for data, kwargs, _ in read_slide(path, storage_options=storage_options):
        added = viewer.add_image(data, **kwargs)
        layers += added if isinstance(added, list) else [added]
    return layers


def _watch_damage(slide: Any) -> None:
    """In a viewer, outline damaged tiles and notify (else the library warns)."""
    import napari

    viewer = napari.current_viewer()
    if viewer is not None:
        from napari_slidescope._qt.damage import watch

        watch(viewer, slide)


def layer_data(slide: Any) -> FullLayerData:
    """Build napari layer data for an open slide."""
    import numpy as np

    levels = list(slide.levels)
    data: Any = levels if len(levels) > 1 else levels[0]
    meta = dict(slide.metadata)
    kwargs: dict[str, Any] = {
        "name": slide.path.name,
        "multiscale": len(levels) > 1,
        "metadata": {
            "slidescope": meta,
            "path": str(slide.path),
            SLIDE_KEY: getattr(slide, "_owner", None),
        },
    }
    if slide.mpp is not None:
        kwargs["scale"] = tuple(slide.mpp)
        kwargs["units"] = ("µm", "µm")
    dtype = np.dtype(levels[0].dtype)
    brightfield = slide.axes == "YXS" and not getattr(slide, "fluorescence", False)
    limits: list[float]
    if brightfield and dtype == np.uint8:
        limits = [0.0, 255.0]
    else:  # fluorescence, any dtype: statistics over the smallest level only, never level 0
        limits = _percentile_limits(np.asarray(levels[-1]))
    if slide.axes == "YXS":
        kwargs["rgb"] = True
        kwargs["contrast_limits"] = limits
    elif slide.axes == "CYX":
        n = levels[0].shape[0]
        small = np.asarray(levels[-1])
        kwargs["channel_axis"] = 0
        kwargs["name"] = [f"{slide.path.name} [{c}]" for c in slide.channel_names]
        kwargs["contrast_limits"] = [_percentile_limits(small[c]) for c in range(n)]
        kwargs["blending"] = "additive"
        if len(slide.channel_colors) == n:
            kwargs["colormap"] = [
                _colormap(c, name)
                for c, name in zip(slide.channel_colors, slide.channel_names, strict=True)
            ]
    else:
        kwargs["rgb"] = False
        kwargs["contrast_limits"] = limits
    return (data, kwargs, "image")


def _percentile_limits(pixels: Any) -> list[float]:
    """Contrast limits from the 0.1st and 99.9th percentiles (a dim channel fills the range)."""
    import numpy as np

    lo, hi = (float(v) for v in np.percentile(pixels, [0.1, 99.9]))
    return [lo, hi if hi > lo else lo + 1.0]


def _colormap(rgb: tuple[float, float, float], name: str) -> Any:
    from napari.utils.colormaps import Colormap

    return Colormap([[0, 0, 0, 1], [*rgb, 1]], name=f"slidescope {name}")
