"""The QuPath round trip in napari: open GeoJSON objects aligned with a slide, save layers back.

Opening (:func:`get_geojson_reader`, part of the npe2 reader): a ``.geojson`` /
``.geojson.gz`` that looks like GeoJSON becomes

* ``"<file> annotations"``: a Shapes layer, one polygon per annotation part (holes as
  polygons of their own, ``role = "hole"``), with the name, class and measurements as
  features, outlined in the class colour;
* ``"<file> detections"``: detections and cells rasterised into a label pyramid
  (:class:`~napari_slidescope.pipeline.label_pyramid.LabelPyramid`) shown as a multiscale
  Labels layer (hundreds of thousands of polygons would freeze a Shapes layer), their
  class and measurements as features (hover shows them).

Both take the ``scale`` / ``translate`` of the slide open in the current viewer, so the
objects land on the slide's pixels (QuPath coordinates are level-0 pixels).

Saving (:func:`write_geojson_layers`, an npe2 writer): Shapes and Labels layers written as
QuPath GeoJSON in the slide's level-0 pixels: shapes as annotations, labels as one
detection per label with its features as measurements.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from napari_slidescope._io import atomic_write
from napari_slidescope._napari.jobs import slide_layers
from napari_slidescope._napari.shapes import aligned, from_layer_coords, to_layer_coords
from napari_slidescope._napari.viewport import image_shape0
from napari_slidescope.analysis.geojson import polygon_feature, write_features
from napari_slidescope.analysis.qupath import looks_like_geojson, read_objects

if TYPE_CHECKING:
    from npe2.types import FullLayerData

GEOJSON_SUFFIXES = (".geojson", ".geojson.gz")
#: Block side (level-0 px) in which detections are rasterised, and its margin.
_BLOCK, _MARGIN = 2048, 256


def get_geojson_reader(path: str) -> Callable[[str | list[str]], list[FullLayerData]] | None:
    """Return :func:`read_geojson_layers` when `path` is a GeoJSON file, else None."""
    if not path.lower().endswith(GEOJSON_SUFFIXES) or not os.path.isfile(path):
        return None
    return read_geojson_layers if looks_like_geojson(path) else None


def placement(
    align: dict[str, Any] | None, shape0: tuple[int, int] | None
) -> tuple[dict[str, Any], tuple[int, int] | None]:
    """``align`` and ``shape0`` when given, else those of the current viewer's slide (or none).

    (The GeoParquet reader, :mod:`.parquet`, places its layers the same way.)
    """
    if align is not None:
        return align, shape0

    image = shown_slide_layer()
    return ({}, None) if image is None else (aligned(image), image_shape0(image))


def shown_slide_layer() -> Any:
    """Return the slide of the current viewer (None without a viewer or a slide)."""
    try:
        import napari

        viewer = napari.current_viewer()
        found = slide_layers(viewer) if viewer is not None else []
    except Exception:  # noqa: BLE001 - no viewer: pixels, unaligned
        return None
    return found[0] if found else None


def _stem(path: str) -> str:
    name = Path(path).name
    for suffix in (".gz", ".geojson", ".json"):
        if name.lower().endswith(suffix):
            name = name[: -len(suffix)]
    return name


def read_geojson_layers(
    path: str | list[str],
    *,
    align: dict[str, Any] | None = None,
    shape0: tuple[int, int] | None = None,
) -> list[FullLayerData]:
    """Read QuPath GeoJSON objects as layers aligned with the current slide.

    ``align`` (``scale``, ``translate``, ``units``) and ``shape0`` place the layers instead,
    as for :func:`~napari_slidescope._napari.parquet.read_parquet_layers`.

    Raises
    ------
    ValueError
        If the file is not GeoJSON (naming the file).
    """
    if isinstance(path, list):
        path = path[0]
    objects = read_objects(path)
    align, shape0 = placement(align, shape0)
    stem = _stem(path)
    out: list[FullLayerData] = []
    ann = [o for o in objects if o.object_type not in ("detection", "cell", "tile")]
    det = [o for o in objects if o.object_type in ("detection", "cell", "tile")]
    if ann:
        out.append(annotations_layer(ann, f"{stem} annotations", align))
    if det:
        out.append(detections_layer(det, f"{stem} detections", align, shape0))
    return out


def _features(objects: list[Any], rows: list[int]) -> dict[str, Any]:
    names = sorted({k for o in objects for k in o.measurements})
    feats: dict[str, Any] = {
        "name": np.array([objects[i].name for i in rows], dtype=object),
        "class": np.array([objects[i].class_name for i in rows], dtype=object),
        "object_type": np.array([objects[i].object_type for i in rows], dtype=object),
    }
    for k in names:
        feats[k] = np.array([objects[i].measurements.get(k, np.nan) for i in rows], float)
    return feats


def annotations_layer(objects: list[Any], name: str, align: dict[str, Any]) -> FullLayerData:
    """Annotations as Shapes layer data (holes as polygons with ``role = "hole"``)."""
    data: list[np.ndarray] = []
    rows: list[int] = []
    roles: list[str] = []
    pieces: list[int] = []
    colors: list[list[float]] = []
    piece = -1
    for i, obj in enumerate(objects):
        rgb = np.array(obj.color or (255, 200, 0), float) / 255
        for ext, holes in obj.polygons:
            piece += 1
            for ring, role in [(ext, "annotation"), *((h, "hole") for h in holes)]:
                data.append(to_layer_coords(ring))
                rows.append(i)
                roles.append(role)
                pieces.append(piece)
                colors.append([*rgb, 1.0])
    feats = _features(objects, rows)
    feats["role"] = np.array(roles, dtype=object)
    feats["piece"] = np.array(pieces, dtype=np.int64)
    feats["label"] = np.array(
        [
            (objects[r].name or objects[r].class_name) if role != "hole" else ""
            for r, role in zip(rows, roles, strict=True)
        ],
        dtype=object,
    )
    meta = {
        "name": name,
        "shape_type": "polygon",
        "edge_color": np.array(colors),
        "face_color": "transparent",
        "edge_width": max(2.0, float(np.ptp(np.concatenate(data), axis=0).max()) / 300),
        "features": feats,
        "text": {"string": "{label}", "color": "white", "size": 10, "anchor": "upper_left"},
        **align,
    }
    return (data, meta, "shapes")


def detections_layer(
    objects: list[Any], name: str, align: dict[str, Any], shape0: tuple[int, int] | None
) -> FullLayerData:
    """Rasterise detections and cells into a label pyramid (ids 1..n), features per id."""
    from skimage.draw import polygon as fill

    from napari_slidescope.pipeline.label_pyramid import LabelPyramid

    ext = [p[0] for o in objects for p in o.polygons]
    hi = np.max([e.max(axis=0) for e in ext], axis=0)
    h, w = shape0 if shape0 is not None else (int(math.ceil(hi[0])), int(math.ceil(hi[1])))
    pyramid = LabelPyramid((max(1, h), max(1, w)))
    centre = np.array([o.polygons[0][0].mean(axis=0) for o in objects])
    block = np.floor(centre / _BLOCK).astype(np.int64)
    order = np.lexsort((block[:, 1], block[:, 0]))
    keys = block[order]
    starts = np.flatnonzero(np.r_[True, np.any(keys[1:] != keys[:-1], axis=1)])
    for s, e in zip(starts, np.r_[starts[1:], len(order)], strict=True):
        by, bx = (int(v) for v in keys[s])
        y0, x0 = max(0, by * _BLOCK - _MARGIN), max(0, bx * _BLOCK - _MARGIN)
        y1, x1 = (
            min(pyramid.shape[0], (by + 1) * _BLOCK + _MARGIN),
            min(pyramid.shape[1], (bx + 1) * _BLOCK + _MARGIN),
        )
        if y1 <= y0 or x1 <= x0:
            continue
        canvas = np.zeros((y1 - y0, x1 - x0), np.int32)
        for i in order[s:e]:
            for outer, holes in objects[i].polygons:
                # a mask of the polygon's bounding box, never of the whole block (issue 33:
                # a block-sized mask per object took minutes for 10^5 objects)
                lo = np.maximum(np.floor(outer.min(axis=0)).astype(int) - (y0, x0) - 1, 0)
                hi = np.minimum(np.ceil(outer.max(axis=0)).astype(int) - (y0, x0) + 1, canvas.shape)
                if np.any(hi <= lo):
                    continue
                box = (int(hi[0] - lo[0]), int(hi[1] - lo[1]))
                oy, ox = y0 + int(lo[0]), x0 + int(lo[1])
                mask = np.zeros(box, bool)
                rr, cc = fill(outer[:, 0] - 0.5 - oy, outer[:, 1] - 0.5 - ox, box)
                mask[rr, cc] = True
                for hole in holes:
                    rr, cc = fill(hole[:, 0] - 0.5 - oy, hole[:, 1] - 0.5 - ox, box)
                    mask[rr, cc] = False
                sub = canvas[lo[0] : hi[0], lo[1] : hi[1]]
                sub[mask & (sub == 0)] = i + 1
        pyramid.paste((y0, x0, y1, x1), canvas)
    feats = _features(objects, list(range(len(objects))))
    feats = {"index": np.arange(1, len(objects) + 1), **feats}
    meta = {
        "name": name,
        "multiscale": True,
        "features": feats,
        "opacity": 0.6,
        "metadata": {"slidescope_pyramid": pyramid},
        **align,
    }
    colors = {o.class_name: o.color for o in objects if o.class_name and o.color is not None}
    if colors:  # classified detections (QuPath, or a classified export): class colours
        from napari_slidescope._napari.class_layers import class_colormap

        meta["colormap"] = class_colormap(feats["index"], feats["class"], colors)
        meta["metadata"]["slidescope_classes"] = colors
    if len(pyramid.levels) == 1:  # napari refuses a one-level multiscale list
        meta["multiscale"] = False
        return (pyramid.levels[0], meta, "labels")
    return (pyramid.levels, meta, "labels")


# -- saving --------------------------------------------------------------------------------


def _to_slide_px(layer_to_world: Callable[[np.ndarray], np.ndarray], image: Any) -> Any:
    """Map data coordinates of a layer to the slide's level-0 continuous ``(row, col)``."""
    if image is None:
        return lambda pts: from_layer_coords(layer_to_world(pts))
    s = np.asarray(image.scale, float)[-2:]
    t = np.asarray(image.translate, float)[-2:]
    return lambda pts: (layer_to_world(pts) - t) / s + 0.5


def write_geojson_layers(path: str, layer_data: list[Any]) -> list[str]:
    """npe2 writer: Shapes and Labels layers as one QuPath GeoJSON file (slide level-0 px).

    Shapes become annotations (``role == "hole"`` shapes become holes of their piece),
    Labels become one detection per label, its features row as measurements.
    """
    image = shown_slide_layer()
    feats_out: list[dict[str, Any]] = []
    for data, meta, kind in layer_data:
        scale = np.asarray(meta.get("scale", (1.0, 1.0)), float)[-2:]
        translate = np.asarray(meta.get("translate", (0.0, 0.0)), float)[-2:]

        def to_world(pts: np.ndarray, s: np.ndarray = scale, t: np.ndarray = translate) -> Any:
            return t + s * np.asarray(pts, float)[:, -2:]

        to_px = _to_slide_px(to_world, image)
        cls = str(meta.get("name", kind))
        if kind == "shapes":
            feats_out += _shape_features(data, meta, to_px, cls)
        elif kind == "labels":
            feats_out += _label_features(data, meta, to_px, cls)
    target = Path(path)
    with atomic_write(target, "w") as fh:
        write_features(fh, feats_out)
    return [str(target)]


def _shape_features(data: Any, meta: dict[str, Any], to_px: Any, cls: str) -> list[dict]:
    feats = meta.get("features")
    n = len(data)

    def col(k: str) -> list[Any] | None:
        return list(feats[k]) if feats is not None and k in feats else None

    roles = col("role") or ["annotation"] * n
    pieces = col("piece") or list(range(n))
    names = col("name") or [""] * n
    classes = col("class") or [cls] * n
    out: list[dict] = []
    holes: dict[Any, list[np.ndarray]] = {}
    for i in range(n):
        if roles[i] == "hole":
            holes.setdefault(pieces[i], []).append(to_px(data[i]))
    kinds = list(meta.get("shape_type") or ["polygon"] * n)
    for i in range(n):
        if roles[i] != "hole" and kinds[i] in ("path", "line") and len(data[i]) >= 2:
            # an open stroke (a tissue-regions example): QuPath's line annotation
            f = polygon_feature(np.zeros((3, 2)), name=str(classes[i] or cls))
            xy = np.asarray(to_px(data[i]), float)[:, ::-1]
            f["geometry"] = {"type": "LineString", "coordinates": xy.tolist()}
            out.append(f)
    for i in range(n):
        if roles[i] == "hole" or len(data[i]) < 3 or kinds[i] in ("path", "line"):
            continue
        f = polygon_feature(
            to_px(data[i]), holes.get(pieces[i], []),
            name=str(classes[i] or cls), object_type="annotation",
        )  # fmt: skip
        if names[i]:
            f["properties"]["name"] = str(names[i])
        out.append(f)
    return out


def _label_features(data: Any, meta: dict[str, Any], to_px: Any, cls: str) -> list[dict]:
    from pandas.api.types import is_numeric_dtype

    from napari_slidescope.analysis.geometry import labels_to_polygons

    level0 = data[0] if meta.get("multiscale") else data
    feats = meta.get("features")
    table: dict[int, dict[str, float]] = {}
    if feats is not None and len(feats) and "index" in feats:
        num = [c for c in feats.columns if c != "index" and is_numeric_dtype(feats[c])]
        for row in feats[["index", *num]].itertuples(index=False):
            table[int(row[0])] = {c: float(v) for c, v in zip(num, row[1:], strict=True)}
    h, w = level0.shape[-2:]
    out: list[dict] = []
    seen: set[int] = set()
    for y0 in range(0, h, _BLOCK):
        for x0 in range(0, w, _BLOCK):
            yy0, xx0 = max(0, y0 - _MARGIN), max(0, x0 - _MARGIN)
            lab = np.asarray(
                level0[yy0 : min(h, y0 + _BLOCK + _MARGIN), xx0 : min(w, x0 + _BLOCK + _MARGIN)]
            )
            if not lab.any():
                continue
            uniq, inv = np.unique(lab, return_inverse=True)
            compact = inv.reshape(lab.shape).astype(np.int32)
            if uniq[0] != 0:
                compact += 1
                uniq = np.r_[0, uniq]
            polys, ids = labels_to_polygons(compact, origin=(yy0, xx0))
            for ring, k in zip(polys, uniq[ids], strict=True):
                k = int(k)
                # the block holding the outline's first vertex writes it: each label once
                r0, c0 = ring.min(axis=0)
                if k in seen or not (y0 <= r0 < y0 + _BLOCK and x0 <= c0 < x0 + _BLOCK):
                    continue
                seen.add(k)
                pts = to_px(ring - 0.5)  # label pixel i spans [i - 0.5, i + 0.5] in data
                out.append(
                    polygon_feature(
                        pts,
                        name=cls,
                        object_type="detection",
                        measurements={"label": float(k), **table.get(k, {})},
                    )  # fmt: skip
                )
    return out
