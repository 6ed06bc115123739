"""Result layers: tissue and nuclei painted into Labels layers aligned with the slide.

Geometry. A result raster has an ``origin`` (level-0 ``(y, x)`` of the top-left corner
of its pixel ``[0, 0]``, level-0 pixel ``i`` spanning ``[i, i + 1)``) and a
``downsample`` (level-0 pixels per raster pixel). napari centres image pixel ``i`` on
data coordinate ``i``, so a raster drawn over an image layer with ``scale`` ``s`` and
``translate`` ``t`` gets ``scale = s * downsample`` and
``translate = t + s * (origin + downsample / 2 - 1 / 2)``; for level-0 rasters this is
``t + s * origin``.

Nuclei accumulate on the canvases of :mod:`napari_slidescope._napari.canvases` (numpy
alone: a dense raster, or a label pyramid on disk shown as a multiscale Labels layer); tiles
are mapped onto the canvas grid on the worker thread (``tile_patch``), and the main thread
only pastes patches here and refreshes the changed part of the texture (:func:`paint_patch`),
through napari's private partial-refresh API.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import Any

import numpy as np

from napari_slidescope._napari.canvases import (
    MAX_CANVAS_PIXELS,
    Area,
    Pair,
    Patch,
    PyramidCanvas,
    ResultCanvas,
    pyramid_outlines,
    tile_patch,
)
from napari_slidescope._napari.shapes import show_tissue as _show_tissue
from napari_slidescope._napari.viewport import image_shape0
from napari_slidescope._types import Box
from napari_slidescope.analysis.resample import resample_nearest
from napari_slidescope.pipeline.task_table import task

__all__ = [
    "MAX_CANVAS_PIXELS",
    "NUCLEI_CONTOUR",
    "NUCLEI_OPACITY",
    "Area",
    "Patch",
    "PyramidCanvas",
    "ResultCanvas",
    "aligned_transform",
    "canvas_of",
    "cells_canvas_of",
    "cells_layers_of",
    "image_read_chunk",
    "paint_cells",
    "paint_patch",
    "prepare_cells_layer",
    "prepare_nuclei_layer",
    "pyramid_outlines",
    "show_tissue",
    "tile_patch",
]

#: Nuclei are drawn as outlines one screen pixel wide, as QuPath draws detections: the
#: chromatin stays visible under them. Filled is one click away (the layer controls'
#: "contour" box to 0).
NUCLEI_CONTOUR = 1
#: Opacity of the nuclei layers (outlines: nearly opaque, a thin line must show).
NUCLEI_OPACITY = 0.8

_CANVASES: weakref.WeakKeyDictionary[Any, ResultCanvas | PyramidCanvas] = (
    weakref.WeakKeyDictionary()
)
#: Cells layers -> the nuclei canvas whose ``cells`` they show.
_CELL_CANVASES: weakref.WeakKeyDictionary[Any, ResultCanvas | PyramidCanvas] = (
    weakref.WeakKeyDictionary()
)


def aligned_transform(image: Any, origin: Sequence[float], downsample: Sequence[float]) -> tuple:
    """``(scale, translate)`` that draw a raster exactly over `image` in world coordinates."""
    s = np.asarray(image.scale, float)[-2:]
    t = np.asarray(image.translate, float)[-2:]
    o, d = np.asarray(origin, float), np.asarray(downsample, float)
    return tuple(s * d), tuple(t + s * (o + d / 2 - 0.5))


def canvas_of(layer: Any) -> ResultCanvas | PyramidCanvas | None:
    """Return the canvas behind a nuclei layer (None if its data was replaced)."""
    canvas = _CANVASES.get(layer)
    if canvas is None:
        return None
    if isinstance(canvas, PyramidCanvas):
        same = bool(layer.multiscale) and layer.data[0] is canvas.data[0]
        return canvas if same else None
    return canvas if layer.data is canvas.data else None


def cells_canvas_of(layer: Any) -> ResultCanvas | PyramidCanvas | None:
    """Return the nuclei canvas whose cells a cells layer shows (None if its data was replaced)."""
    canvas = _CELL_CANVASES.get(layer)
    if canvas is None or canvas.cells is None:
        return None
    if isinstance(canvas, PyramidCanvas):
        same = bool(layer.multiscale) and layer.data[0] is canvas.cell_data[0]
        return canvas if same else None
    return canvas if layer.data is canvas.cells else None


def cells_layers_of(canvas: ResultCanvas | PyramidCanvas | None) -> list[Any]:
    """Return the cells layers that show the cells of `canvas` (a nuclei layer's canvas)."""
    if canvas is None or canvas.cells is None:
        return []
    return [ly for ly, c in list(_CELL_CANVASES.items()) if c is canvas and cells_canvas_of(ly)]


def prepare_nuclei_layer(
    viewer: Any,
    image: Any,
    region: Box,
    downsample: Pair,
    *,
    mode: str = "add",
    pyramid: bool | None = None,
    polygon: np.ndarray | None = None,
    cells: bool = False,
) -> tuple[Any, ResultCanvas | PyramidCanvas, list[Area], int]:
    """Create or grow ``"<image> nuclei"`` for a run over `region` (main thread).

    Parameters
    ----------
    mode : {"add", "replace"}
        Add to the nuclei already found (skipping duplicates), or start afresh.
    pyramid : bool, optional
        Draw on a :class:`PyramidCanvas` (a multiscale layer); by default only when the
        region is larger than a dense canvas may be. Once a pyramid, always a pyramid.
    polygon : (K, 2) ndarray, optional
        The level-0 ``(row, col)`` ring of a polygon region (`region` is its bounding
        box): the polygon, not the box, is recorded as analysed.
    cells : bool
        The run grows cells: the canvas keeps a cells raster (or pyramid) beside its
        nuclei, on the same grid (:func:`prepare_cells_layer` shows it).

    Returns
    -------
    layer, canvas, covered, id_offset
        What :func:`tile_patch` needs: the regions analysed before and the ids used.
    """
    name = task("nuclei").layer_name(image.name)
    mpp = (float(image.scale[-2]), float(image.scale[-1]))
    layer = viewer.layers[name] if name in viewer.layers else None
    old = canvas_of(layer) if layer is not None and mode == "add" else None
    if pyramid and old is not None and not isinstance(old, PyramidCanvas):
        canvas = None
    else:  # any grid works (tiles are resampled onto it)
        canvas = old.grown(region) if old is not None else None
    if canvas is None:
        y0, x0, y1, x1 = region
        if pyramid is None:
            pyramid = (y1 - y0) / downsample[0] * (x1 - x0) / downsample[1] > MAX_CANVAS_PIXELS
        if old is None and not pyramid:
            canvas = ResultCanvas.for_region(region, downsample, mpp)
        else:  # a whole slide, or more than a dense canvas holds: a pyramid on disk
            canvas = PyramidCanvas.for_slide(
                image_shape0(image), downsample, mpp,
                read_chunk=image_read_chunk(image, downsample),
            )  # fmt: skip
            if isinstance(old, ResultCanvas):
                _copy_into(canvas, old)
    if cells and canvas.cells is None:
        _add_cells(canvas)
    covered, offset = list(canvas.regions), canvas.next_id
    if polygon is not None:
        canvas.regions.append(np.array(polygon, float))
    else:
        canvas.regions.append(tuple(int(v) for v in region))  # type: ignore[arg-type]
    scale, translate = aligned_transform(image, canvas.origin, canvas.downsample)
    multiscale = isinstance(canvas, PyramidCanvas)
    if layer is not None and bool(layer.multiscale) != multiscale:
        index = viewer.layers.index(layer)  # napari cannot switch a layer to multiscale
        viewer.layers.remove(layer)
        layer = viewer.add_labels(
            canvas.data, name=name, scale=scale, translate=translate, opacity=NUCLEI_OPACITY,
            multiscale=multiscale, **_units(image),
        )  # fmt: skip
        layer.contour = NUCLEI_CONTOUR
        viewer.layers.move(viewer.layers.index(layer), index)
        set_features(layer, canvas)
    elif layer is None:
        layer = viewer.add_labels(
            canvas.data, name=name, scale=scale, translate=translate, opacity=NUCLEI_OPACITY,
            multiscale=multiscale, **_units(image),
        )  # fmt: skip
        layer.contour = NUCLEI_CONTOUR
    else:  # each assignment re-slices the layer: only make those that change something
        if not np.allclose(layer.scale, scale) or not np.allclose(layer.translate, translate):
            layer.scale, layer.translate = scale, translate
        if canvas is not old:
            layer.data = canvas.data
            set_features(layer, canvas)
        elif not multiscale:
            layer.data = canvas.data
    _CANVASES[layer] = canvas
    return layer, canvas, covered, offset


def image_read_chunk(image: Any, downsample: Pair) -> int | None:
    """Side, in pixels of a `downsample` grid, of the image layer's level-0 chunks.

    A label pyramid that advertises this grid is re-sliced by napari at the same camera
    moves as the image (napari loads whole chunks and re-slices only when the view leaves
    them), instead of at other moves in between. None when the image has no regular
    chunks (e.g. a numpy array).
    """
    data = image.data[0] if image.multiscale else image.data
    chunks = getattr(data, "chunksize", None) or getattr(data, "chunks", None)
    if not chunks or len(chunks) < 2:
        return None
    side = chunks[-3] if image.rgb else chunks[-2]
    if not isinstance(side, int | np.integer):  # dask's per-chunk sizes: take the first
        side = side[0]
    return max(1, round(int(side) / downsample[0]))


def _add_cells(canvas: ResultCanvas | PyramidCanvas) -> None:
    """Give a canvas an empty cells store on its grid (a raster, or a second pyramid)."""
    if isinstance(canvas, PyramidCanvas):
        from napari_slidescope.pipeline.label_pyramid import LabelPyramid

        own = canvas.pyramid
        canvas.cells = LabelPyramid(own.shape, chunk=own.chunk, read_chunk=own.read_chunk)
    else:
        canvas.cells = np.zeros_like(canvas.data)


def _copy_into(pyramid: PyramidCanvas, old: ResultCanvas) -> None:
    """Move a dense canvas's nuclei (and cells), table and regions onto a pyramid (main thread)."""
    grid: dict[str, Any] = {
        "src_origin": old.origin,
        "src_downsample": old.downsample,
        "dst_origin": pyramid.origin,
        "dst_downsample": pyramid.downsample,
        "dst_shape": pyramid.shape,
    }
    out = resample_nearest(old.data, **grid)
    if out is not None:
        pyramid.pyramid.paste(out[0], out[1])
    if old.cells is not None:
        _add_cells(pyramid)
        out = resample_nearest(old.cells, **grid)
        if out is not None:
            pyramid.cells.paste(out[0], out[1])
    pyramid.regions = list(old.regions)
    pyramid.tables = list(old.tables)
    pyramid.outline_parts = list(old.outline_parts)
    pyramid.cell_outline_parts = list(old.cell_outline_parts)
    pyramid.traced = old.traced
    pyramid.next_id = old.next_id
    pyramid.identity = old.identity


def paint_patch(layer: Any, canvas: ResultCanvas | PyramidCanvas, patch: Patch) -> None:
    """Paste a patch where the canvas is still empty and refresh only that part (main thread).

    A :class:`PyramidCanvas` patch is on disk already: its table is kept, and the part of
    the displayed tile it covers is read back and uploaded.
    """
    if isinstance(canvas, PyramidCanvas) or patch.labels is None:
        canvas.keep(patch)
        if isinstance(canvas, PyramidCanvas):
            _refresh_pyramid_box(layer, canvas, patch.box)
        return
    y0, x0, y1, x1 = patch.box
    dst = canvas.data[y0:y1, x0:x1]
    new = (patch.labels > 0) & (dst == 0)
    canvas.keep(patch)
    if not new.any():
        return
    dst[new] = patch.labels[new]
    drawn = canvas.drawn() if canvas.drawn is not None else None
    if drawn is not layer:  # a new raster or layer: upload it whole once, then in parts
        canvas.drawn = weakref.ref(layer)
        layer.refresh()
    else:
        _refresh_box(layer, (slice(y0, y1), slice(x0, x1)))


def prepare_cells_layer(viewer: Any, image: Any, canvas: ResultCanvas | PyramidCanvas) -> Any:
    """Show the cells of a nuclei canvas as ``"<image> cells"`` (main thread).

    The layer lies exactly over the nuclei layer (same grid: same ``scale`` and
    ``translate``; a multiscale layer when the canvas is a pyramid), its ids are the
    nuclei's, drawn as outlines (``contour=1``). A canvas without cells removes a cells
    layer an earlier run of the viewer drew (it would show cells of other nuclei) and
    returns None.
    """
    name = f"{image.name} cells"
    layer = viewer.layers[name] if name in viewer.layers else None
    if canvas.cells is None:
        if layer is not None and layer in _CELL_CANVASES:
            viewer.layers.remove(layer)
        return None
    data = canvas.cell_data
    scale, translate = aligned_transform(image, canvas.origin, canvas.downsample)
    multiscale = isinstance(canvas, PyramidCanvas)
    if layer is not None and bool(layer.multiscale) != multiscale:
        viewer.layers.remove(layer)  # napari cannot switch a layer to multiscale
        layer = None
    if layer is None:
        layer = viewer.add_labels(
            data, name=name, scale=scale, translate=translate, opacity=0.8,
            multiscale=multiscale, **_units(image),
        )  # fmt: skip
        nuclei = task("nuclei").layer_name(image.name)
        if nuclei in viewer.layers:  # just above the nuclei
            at = viewer.layers.index(nuclei) + 1
            viewer.layers.move(viewer.layers.index(layer), at)
    else:
        if not np.allclose(layer.scale, scale) or not np.allclose(layer.translate, translate):
            layer.scale, layer.translate = scale, translate
        if (layer.data[0] if multiscale else layer.data) is not (data[0] if multiscale else data):
            layer.data = data
    layer.contour = 1
    _CELL_CANVASES[layer] = canvas
    return layer


def paint_cells(canvas: ResultCanvas | PyramidCanvas, patch: Patch) -> bool:
    """Paste a patch's cells where the canvas's cells are still empty (main thread).

    Returns True when pixels changed (the caller refreshes the cells layer once for all
    the patches it painted). Cells of a :class:`PyramidCanvas` are on disk already (the
    worker pasted them): True when the patch has nuclei.
    """
    if canvas.cells is None:
        return False
    if isinstance(canvas, PyramidCanvas):
        return bool(patch.table and "id" in patch.table and patch.table["id"].size)
    if patch.cells is None:
        return False
    y0, x0, y1, x1 = patch.box
    dst = canvas.cells[y0:y1, x0:x1]
    new = (patch.cells > 0) & (dst == 0)
    if not new.any():
        return False
    dst[new] = patch.cells[new]
    return True


def _refresh_pyramid_box(layer: Any, canvas: PyramidCanvas, box: Box) -> None:
    """Upload the part of a multiscale layer's displayed tile that a patch changed.

    napari shows a multiscale layer as one tile of its current level (the visible part,
    ``_slice.tile_to_data`` gives its corner); the changed box is read back from the
    pyramid at that level and sent as napari's own partial update (``labels_update``).
    Same private napari API as :func:`_refresh_box`, with the same fallback (a full
    ``refresh()``) when anything does not match.
    """
    try:
        if not layer.loaded:
            raise ValueError("no 2D slice to patch")
        level = int(layer.data_level)
        sl = layer._slice
        f = 2**level
        scale = np.asarray(sl.tile_to_data.scale, float)[-2:]
        if not np.allclose(scale, f):
            raise ValueError("the displayed tile is not at the layer's level")
        cy, cx = (int(round(v)) for v in np.asarray(sl.tile_to_data.translate)[-2:] / f)
        raw, view = sl.image.raw, sl.image.view
        if raw.ndim != 2 or raw.shape != view.shape:
            raise ValueError("displayed slice is not a 2D tile")
        half = f // 2
        y0, x0, y1, x1 = box
        r0 = max(-(-(y0 - half) // f), cy)
        c0 = max(-(-(x0 - half) // f), cx)
        r1 = min(-(-(y1 - half) // f), cy + raw.shape[0])
        c1 = min(-(-(x1 - half) // f), cx + raw.shape[1])
        if r1 <= r0 or c1 <= c0:
            return  # not on screen: the next slice reads it from the pyramid
        values = canvas.pyramid.read(level, (r0, c0, r1, c1))
        tsl = (slice(r0 - cy, r1 - cy), slice(c0 - cx, c1 - cx))
        raw[tsl] = values
        colors = np.ascontiguousarray(_texture(layer, raw, tsl, values))
        view[tsl] = colors
        layer.events.labels_update(data=colors, offset=(r0 - cy, c0 - cx))
    except (AttributeError, ValueError, TypeError, IndexError):
        layer.refresh()


def _texture(layer: Any, raw: np.ndarray, sl: tuple[slice, slice], values: np.ndarray) -> Any:
    """Return the texture of box `sl` of the displayed slice `raw` (`values` are its labels).

    Filled labels map their values through the colormap; outlines (``contour > 0``, the
    default of nuclei layers) are traced again in the box the way napari's own partial
    refresh does (``Labels._raw_to_displayed`` with a ``data_slice``).
    """
    if layer.contour:
        return layer._raw_to_displayed(raw, data_slice=sl)
    return layer.colormap._data_to_texture(values)


def _refresh_box(layer: Any, sl: tuple[slice, slice]) -> None:
    """Upload only the changed part of a Labels texture; full refresh where that fails.

    The same event napari's own painting emits (``labels_update`` with the texture
    values of the box), sent with a private copy of the values, without undo history.
    Private napari API (``_slice.image.view``, ``colormap._data_to_texture``), checked
    against napari 0.9.2 (``Labels._partial_labels_refresh``); anything missing or
    mismatched falls back to the public ``refresh()`` (slower: the whole texture).
    """
    try:
        if not layer.loaded:  # as napari's own partial refresh: no slice to patch yet
            raise ValueError("the layer's slice is not loaded")
        view = layer._slice.image.view
        if view.shape != layer.data.shape or layer.data.ndim != 2:
            raise ValueError("displayed slice is not the whole 2D raster")
        raw = layer._slice.image.raw
        if layer.contour and (raw.shape != view.shape or not np.shares_memory(raw, layer.data)):
            raise ValueError("outlines need the displayed raw slice to be the layer's data")
        colors = np.ascontiguousarray(_texture(layer, raw, sl, layer.data[sl]))
        view[sl] = colors
        layer.events.labels_update(data=colors, offset=(sl[0].start, sl[1].start))
    except (AttributeError, ValueError, TypeError, IndexError):
        layer.refresh()


#: Position columns, shown as whole numbers (level-0 pixels and µm) under the table's names.
_POSITIONS = ("centroid_row", "centroid_col", "centroid_y_um", "centroid_x_um")


def set_features(layer: Any, canvas: ResultCanvas | PyramidCanvas) -> None:
    """Attach the nuclei table as the layer's ``features`` (hover shows measurements).

    The columns are named as in the table, the CSV and the GeoJSON (``centroid_row`` is
    in level-0 pixels); positions are whole numbers (never ``1.97e+03``) and other values
    keep three decimals.
    """
    table = canvas.table()
    columns: dict[str, np.ndarray] = {}
    for key, values in table.items():
        if key == "id":
            continue
        values = np.asarray(values)
        if key in _POSITIONS:
            columns[key] = np.rint(values).astype(np.int64)
        else:
            columns[key] = np.round(values, 3)
    layer.features = {"index": np.asarray(table["id"]), **columns}


def _units(image: Any) -> dict[str, Any]:
    units = getattr(image, "units", None)
    return {} if units is None else {"units": tuple(units)[-2:]}


def show_tissue(viewer: Any, image: Any, result: Any) -> Any:
    """Show a ``TissueResult`` as ``"<image> tissue"`` (see :func:`.shapes.show_tissue`)."""
    return _show_tissue(viewer, image, result)
