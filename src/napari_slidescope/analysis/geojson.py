"""GeoJSON for QuPath: write polygons as annotations or detections, read them back.

Polygons are ``(N, 2)`` level-0 ``(row, col)`` arrays (see
:mod:`napari_slidescope.analysis.geometry`); GeoJSON files hold ``(x, y)`` =
``(col, row)`` and closed rings with RFC 7946 winding, as QuPath reads and writes them.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterable, Sequence
from typing import IO, Any

import numpy as np

from napari_slidescope._io import atomic_write

__all__ = [
    "polygon_feature",
    "read_geojson",
    "read_geojson_rings",
    "write_features",
    "write_geojson",
]

#: QuPath's default colour of the "Tissue" class is not fixed; this is a readable green.
TISSUE_COLOR = (0, 200, 0)


def _closed_xy(ring: np.ndarray, *, exterior: bool) -> list[list[float]]:
    """Level-0 (row, col) ring -> closed GeoJSON (x, y) ring, RFC 7946 winding."""
    xy = np.asarray(ring, float)[:, ::-1]
    # shoelace in (x, y): positive = counter-clockwise; exteriors CCW, holes CW
    area = float(np.dot(xy[:, 0], np.roll(xy[:, 1], -1)) - np.dot(xy[:, 1], np.roll(xy[:, 0], -1)))
    if (area < 0) == exterior:
        xy = xy[::-1]
    xy = np.vstack([xy, xy[:1]])
    return [[round(float(x), 3), round(float(y), 3)] for x, y in xy]


def write_geojson(
    path: str | os.PathLike[str],
    exteriors: Sequence[np.ndarray],
    interiors: Sequence[Sequence[np.ndarray]] | None = None,
    *,
    name: str = "Tissue",
    color: Sequence[int] = TISSUE_COLOR,
    object_type: str = "annotation",
    measurements: Sequence[dict[str, float]] | None = None,
) -> None:
    """Write polygons as a GeoJSON FeatureCollection that QuPath imports.

    Parameters
    ----------
    path : str or PathLike
        Output ``.geojson`` file.
    exteriors : sequence of (N, 2) ndarray
        Level-0 ``(row, col)`` outer rings, one feature each.
    interiors : sequence of sequence of (K, 2) ndarray, optional
        Holes of each exterior (interior rings).
    name : str
        Classification name (QuPath class), e.g. ``"Tissue"`` or ``"Nucleus"``.
    color : (int, int, int)
        Classification colour, RGB 0-255.
    object_type : {'annotation', 'detection'}
        QuPath object type.
    measurements : sequence of dict, optional
        Per-feature measurements (name -> number), shown by QuPath.
    """
    if interiors is None:
        interiors = [[] for _ in exteriors]
    if len(interiors) != len(exteriors):
        raise ValueError(
            f"interiors: expected one list per exterior ({len(exteriors)}), got {len(interiors)}"
        )
    if measurements is not None and len(measurements) != len(exteriors):
        raise ValueError("measurements: expected one dict per exterior")
    features = [
        polygon_feature(
            ext,
            hls,
            name=name,
            color=color,
            object_type=object_type,
            measurements=None if measurements is None else measurements[i],
        )
        for i, (ext, hls) in enumerate(zip(exteriors, interiors, strict=True))
        if len(ext) >= 3
    ]
    with atomic_write(path, "w", encoding="utf-8") as fh:
        json.dump({"type": "FeatureCollection", "features": features}, fh)


def polygon_feature(
    exterior: np.ndarray,
    interiors: Sequence[np.ndarray] = (),
    *,
    name: str = "Tissue",
    color: Sequence[int] = TISSUE_COLOR,
    object_type: str = "annotation",
    measurements: dict[str, float] | None = None,
    feature_id: str | None = None,
    nucleus: np.ndarray | None = None,
) -> dict[str, Any]:
    """One QuPath GeoJSON ``Feature`` for a polygon (see :func:`write_geojson`).

    Parameters
    ----------
    exterior : (N, 2) ndarray
        Level-0 ``(row, col)`` outer ring, open or closed, N >= 3.
    interiors : sequence of (K, 2) ndarray
        Holes; rings with fewer than 3 points are dropped.
    name, color, object_type, measurements
        As in :func:`write_geojson`; non-finite measurements are left out.
    feature_id : str, optional
        The feature's ``id``; default a random UUID.
    nucleus : (K, 2) ndarray, optional
        A cell's nucleus (level-0 ``(row, col)`` ring): written as QuPath's top-level
        ``nucleusGeometry`` beside the cell's ``geometry`` (use ``object_type="cell"``).

    Returns
    -------
    dict
        A GeoJSON Feature, ready for ``json.dumps``.
    """
    rings = [_closed_xy(exterior, exterior=True)]
    rings += [_closed_xy(h, exterior=False) for h in interiors if len(h) >= 3]
    props: dict[str, Any] = {
        "objectType": object_type,
        "classification": {"name": name, "color": [int(v) for v in color]},
        "isLocked": False,
    }
    if measurements is not None:
        props["measurements"] = {
            k: float(v) for k, v in measurements.items() if np.isfinite(float(v))
        }
    feature: dict[str, Any] = {
        "type": "Feature",
        "id": feature_id or str(uuid.uuid4()),
        "geometry": {"type": "Polygon", "coordinates": rings},
    }
    if nucleus is not None and len(nucleus) >= 3:
        feature["nucleusGeometry"] = {
            "type": "Polygon",
            "coordinates": [_closed_xy(nucleus, exterior=True)],
        }
    feature["properties"] = props
    return feature


def write_features(fh: IO[str], features: Iterable[dict[str, Any]]) -> int:
    """Stream features into an open text file as one GeoJSON FeatureCollection.

    Each feature is serialised on its own, so memory stays that of one feature
    whatever their number (a gzip file object gives a ``.geojson.gz`` QuPath opens).

    Parameters
    ----------
    fh : text file
        Open for writing, e.g. ``gzip.open(path, "wt", encoding="utf-8")``.
    features : iterable of dict
        GeoJSON features (e.g. from :func:`polygon_feature`).

    Returns
    -------
    int
        Number of features written.
    """
    fh.write('{"type": "FeatureCollection", "features": [')
    n = 0
    for feature in features:
        fh.write(("," if n else "") + "\n" + json.dumps(feature))
        n += 1
    fh.write("\n]}\n")
    return n


def read_geojson_rings(
    path: str | os.PathLike[str],
) -> tuple[list[np.ndarray], list[list[np.ndarray]]]:
    """Read the polygons of a GeoJSON file (QuPath export or :func:`write_geojson`).

    Read by :func:`napari_slidescope.analysis.qupath.read_objects`, so a gzip-compressed
    file (``.geojson.gz``) reads as well as a plain one.

    Parameters
    ----------
    path : str or PathLike
        A FeatureCollection, a Feature, a list of features or a bare geometry; Polygon,
        MultiPolygon and GeometryCollection geometries are read (rings of fewer than
        three vertices skipped), other geometries skipped.

    Returns
    -------
    exteriors : list of (N, 2) ndarray of float
        Level-0 ``(row, col)`` open rings.
    interiors : list of list of (K, 2) ndarray of float
        Holes of each exterior.

    Raises
    ------
    ValueError
        If the file is not JSON or not GeoJSON.
    """
    from napari_slidescope.analysis.qupath import read_objects

    exteriors: list[np.ndarray] = []
    interiors: list[list[np.ndarray]] = []
    for obj in read_objects(path):  # the one GeoJSON reader (plain or gzip)
        for exterior, holes in obj.polygons:
            exteriors.append(exterior)
            interiors.append(list(holes))
    return exteriors, interiors


def read_geojson(path: str | os.PathLike[str]) -> list[np.ndarray]:
    """Read the outer rings of the polygons of a GeoJSON file.

    See :func:`read_geojson_rings` (which also returns the holes).

    Returns
    -------
    list of (N, 2) ndarray of float
        Level-0 ``(row, col)`` open rings.
    """
    return read_geojson_rings(path)[0]
