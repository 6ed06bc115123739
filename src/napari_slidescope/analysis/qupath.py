"""QuPath GeoJSON objects: annotations, detections and cells with names, classes and measurements.

QuPath exports a ``FeatureCollection`` (or a bare list of features) whose features carry
``properties.objectType`` (``annotation``, ``detection``, ``cell``), an optional
``name``, a ``classification`` ``{name, color}`` and ``measurements`` (an object
``{name: value}`` since v0.4, a list of ``{name, value}`` before). Coordinates are
full-resolution pixels ``(x, y)``; files may be gzip-compressed (``.geojson.gz``).
Polygons come back as level-0 ``(row, col)`` rings (pixel ``i`` spans ``[i, i + 1)``).
"""

from __future__ import annotations

import gzip
import json
import os
import re
from dataclasses import dataclass, field
from typing import IO, Any

import numpy as np

__all__ = ["QuPathObject", "looks_like_geojson", "read_objects"]

_GEOJSON_HINT = re.compile(
    rb'"type"\s*:\s*"(FeatureCollection|Feature|Polygon|MultiPolygon|GeometryCollection)"'
)


@dataclass
class QuPathObject:
    """One feature of a QuPath GeoJSON file.

    Attributes
    ----------
    object_type : str
        ``"annotation"``, ``"detection"`` or ``"cell"`` (``"annotation"`` when absent).
    polygons : list of (exterior, holes)
        Level-0 ``(row, col)`` rings: one entry per polygon (a MultiPolygon gives several).
    name, class_name : str
        The object's name and classification ("" when absent).
    color : (int, int, int) or None
        The classification colour (or the object's own), RGB 0-255.
    measurements : dict of str to float
    nucleus : list of (exterior, holes)
        A cell's ``nucleusGeometry``.
    """

    object_type: str
    polygons: list[tuple[np.ndarray, list[np.ndarray]]]
    name: str = ""
    class_name: str = ""
    color: tuple[int, int, int] | None = None
    measurements: dict[str, float] = field(default_factory=dict)
    nucleus: list[tuple[np.ndarray, list[np.ndarray]]] = field(default_factory=list)


def _open(path: str | os.PathLike[str]) -> IO[bytes]:
    with open(path, "rb") as fh:
        magic = fh.read(2)
    if magic == b"\x1f\x8b":
        return gzip.open(path, "rb")  # type: ignore[return-value]
    return open(path, "rb")


def looks_like_geojson(path: str | os.PathLike[str], *, head: int = 65536) -> bool:
    """Return True when the file's first bytes look like GeoJSON (plain or gzip); never raises.

    Reads at most `head` (decompressed) bytes: a JSON object or array that names a GeoJSON
    ``type`` (FeatureCollection, Feature, Polygon, ...).
    """
    try:
        with _open(path) as fh:
            text = fh.read(head)
    except (OSError, EOFError, gzip.BadGzipFile):
        return False
    start = text.lstrip()[:1]
    return start in (b"{", b"[") and _GEOJSON_HINT.search(text) is not None


def _ring(coords: Any) -> np.ndarray:
    xy = np.asarray(coords, float).reshape(-1, 2)
    if len(xy) > 1 and np.array_equal(xy[0], xy[-1]):
        xy = xy[:-1]
    return np.ascontiguousarray(xy[:, ::-1])


def _polygons(geom: Any) -> list[tuple[np.ndarray, list[np.ndarray]]]:
    if not isinstance(geom, dict):
        return []
    kind, coords = geom.get("type"), geom.get("coordinates")
    if kind == "GeometryCollection":
        return [p for g in geom.get("geometries") or [] for p in _polygons(g)]
    parts = [coords] if kind == "Polygon" else list(coords or []) if kind == "MultiPolygon" else []
    out = []
    for poly in parts:
        if poly and len(poly[0]) >= 3:
            out.append((_ring(poly[0]), [_ring(h) for h in poly[1:] if len(h) >= 3]))
    return out


def _measurements(raw: Any) -> dict[str, float]:
    items = raw.items() if isinstance(raw, dict) else []
    if isinstance(raw, list):  # QuPath < 0.4: [{"name": ..., "value": ...}]
        items = [(m.get("name"), m.get("value")) for m in raw if isinstance(m, dict)]
    out = {}
    for k, v in items:
        try:
            out[str(k)] = float(v)
        except (TypeError, ValueError):
            continue
    return out


def _color(raw: Any) -> tuple[int, int, int] | None:
    if isinstance(raw, list | tuple) and len(raw) >= 3:
        return (int(raw[0]), int(raw[1]), int(raw[2]))
    if isinstance(raw, int):  # QuPath < 0.4: packed ARGB
        return ((raw >> 16) & 255, (raw >> 8) & 255, raw & 255)
    return None


def read_objects(path: str | os.PathLike[str]) -> list[QuPathObject]:
    """Read the polygon objects of a QuPath (or any) GeoJSON file, plain or gzip.

    Parameters
    ----------
    path : str or PathLike
        A FeatureCollection, a Feature, a list of features, or a bare geometry.
        Features without a Polygon / MultiPolygon geometry are skipped.

    Returns
    -------
    list of QuPathObject

    Raises
    ------
    ValueError
        If the file is not JSON, or not GeoJSON (the message names the file).
    """
    try:
        with _open(path) as fh:
            doc = json.load(fh)
    except (json.JSONDecodeError, UnicodeDecodeError, EOFError, gzip.BadGzipFile) as exc:
        raise ValueError(f"{os.fspath(path)}: not a GeoJSON file ({exc})") from exc
    if isinstance(doc, dict) and doc.get("type") == "FeatureCollection":
        feats = doc.get("features") or []
    elif isinstance(doc, dict) and doc.get("type") == "Feature":
        feats = [doc]
    elif isinstance(doc, dict) and "coordinates" in doc:
        feats = [{"type": "Feature", "geometry": doc}]
    elif isinstance(doc, list):
        feats = [f if "geometry" in f else {"geometry": f} for f in doc if isinstance(f, dict)]
    else:
        raise ValueError(
            f"{os.fspath(path)}: expected a GeoJSON FeatureCollection, Feature or list of "
            f"features, got a JSON {type(doc).__name__}"
        )
    out = []
    for feat in feats:
        polys = _polygons(feat.get("geometry"))
        if not polys:
            continue
        props = feat.get("properties") or {}
        cls = props.get("classification") or {}
        out.append(
            QuPathObject(
                object_type=str(props.get("objectType") or "annotation"),
                polygons=polys,
                name=str(props.get("name") or ""),
                class_name=str(cls.get("name") or "") if isinstance(cls, dict) else "",
                color=_color(cls.get("color") if isinstance(cls, dict) else None)
                or _color(props.get("color")),
                measurements=_measurements(props.get("measurements")),
                nucleus=_polygons(feat.get("nucleusGeometry")),
            )
        )
    return out
