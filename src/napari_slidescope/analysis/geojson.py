"""GeoJSON for QuPath: write polygons as annotations or detections, read them back.

Polygons are ``(N, 2)`` level-0 ``(row, col)`` arrays (see
:mod:`napari_slidescope.analysis.geometry`); GeoJSON files hold ``(x, y)`` =
``(col, row)`` and closed rings with RFC 7946 winding, as QuPath reads and writes them.
"""

from __future__ import annotations

import json
import math
import os
import uuid
from collections.abc import Callable, Iterable, Sequence
from typing import IO, Any, Protocol

import numpy as np

from napari_slidescope._io import atomic_write

__all__ = [
    "polygon_feature",
    "read_geojson",
    "read_geojson_rings",
    "write_features",
    "write_geojson",
]


class _BinaryOut(Protocol):
    """A binary file open for writing (a file, a ``gzip.GzipFile``, ``io.BytesIO``)."""

    def write(self, data: bytes, /) -> int: ...  # noqa: D102


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


# -- many features at once ---------------------------------------------------------------------
#
# ``json.dumps`` of one dict per feature costs ~100 µs a nucleus (102 s per million). The
# functions below write the same text (``json.dumps`` of :func:`polygon_feature`'s dict,
# through :func:`write_features`) from arrays: outlines become text in bulk with numpy,
# measurements are formatted one column at a time, and a feature is a join of ready pieces.

_HEX = np.frombuffer(b"0123456789abcdef", np.uint8)
_DIGITS = np.frombuffer(b"0123456789", np.uint8)


def _ring_order(lens: np.ndarray, reverse: np.ndarray, *, close: np.ndarray | None = None) -> Any:
    """Index the concatenated rings to give each ring (reversed where asked), closed.

    A ring is closed by repeating its (new) first point; `close` (per ring, default all)
    says which rings get the repeat. Returns ``(index, out_lens)``.
    """
    starts = np.cumsum(lens) - lens
    extra = np.ones(len(lens), np.int64) if close is None else close.astype(np.int64)
    out_lens = lens + extra
    total = int(out_lens.sum())
    out_starts = np.cumsum(out_lens) - out_lens
    ring = np.repeat(np.arange(len(lens)), out_lens)
    j = np.arange(total, dtype=np.int64) - out_starts[ring]
    n = lens[ring]
    j = np.where(j >= n, 0, j)  # the closing point: the first one
    src = starts[ring] + np.where(reverse[ring], n - 1 - j, j)
    return src, out_lens


def _signed_areas(xy: np.ndarray, lens: np.ndarray) -> np.ndarray:
    """Shoelace sum of each ring of the concatenated ``(x, y)`` points (open rings)."""
    starts = np.cumsum(lens) - lens
    nxt = np.arange(1, len(xy) + 1)  # each point's successor in its ring
    ends = starts + lens - 1
    nxt[ends[lens > 0]] = starts[lens > 0]
    terms = xy[:, 0] * xy[nxt, 1] - xy[:, 1] * xy[nxt, 0]
    out = np.zeros(len(lens))
    nonempty = lens > 0
    if nonempty.any():
        out[nonempty] = np.add.reduceat(terms, starts[nonempty])
    return out


def _thousandths(values: np.ndarray) -> np.ndarray:
    """``round(v, 3) * 1000`` as int64 for every value, exactly as Python's ``round``.

    numpy rounds ``v * 1000``, whose product may itself be rounded across a half; those
    few values are redone with Python's correctly rounded ``round``.
    """
    scaled = np.abs(values) * 1000.0
    k = np.rint(scaled)
    near = np.abs(np.abs(scaled - np.floor(scaled)) - 0.5) < 1e-6
    out: np.ndarray = k.astype(np.int64)
    for i in np.flatnonzero(near):
        out[i] = int(round(abs(round(float(values[i]), 3)) * 1000))
    return out


def _put_numbers(
    chars: np.ndarray, keep: np.ndarray, row: int, values: np.ndarray, digits: int
) -> int:
    """Write each value as ``repr(round(v, 3))`` into rows ``row ..`` of a char matrix.

    `chars` and `keep` are ``(width, count)``: column ``i`` holds value ``i``, and
    ``chars[keep]`` column by column is its text (``-12.5``, ``3.0``, ``0.125``).
    Takes ``digits + 5`` rows (sign, integer digits, point, three decimals); returns the
    next free row.
    """
    k = _thousandths(values)
    ip, frac = np.divmod(k, 1000)
    if digits < 10:  # int32 divides faster than int64
        ip, frac = ip.astype(np.int32), frac.astype(np.int32)
    chars[row] = ord("-")
    keep[row] = np.signbit(values)
    place = 10 ** np.arange(digits - 1, -1, -1, dtype=ip.dtype)
    chars[row + 1 : row + 1 + digits] = (ip[None, :] // place[:, None]) % 10 + 48
    # leading zeros go, the units digit stays
    keep[row + 1 : row + digits] = ip[None, :] >= place[:-1, None]
    keep[row + digits] = True
    at = row + 1 + digits
    chars[at] = ord(".")
    keep[at] = True
    chars[at + 1 : at + 4] = (frac[None, :] // np.array([[100], [10], [1]], frac.dtype)) % 10 + 48
    # trailing zeros go, the first decimal stays: 3.0, 3.5, 3.25, 3.125
    keep[at + 1] = True
    keep[at + 2] = frac % 100 != 0
    keep[at + 3] = frac % 10 != 0
    return at + 4


def polygon_coordinates_text(rings: Sequence[np.ndarray]) -> list[str]:
    """Return the GeoJSON ``coordinates`` of a one-ring Polygon for each ring, as text.

    Equals ``json.dumps([ring_xy])`` for the closed, RFC 7946-wound, 3-decimal ring
    :func:`polygon_feature` writes for an exterior, for many rings at once (numpy, no
    per-vertex Python).

    Parameters
    ----------
    rings : sequence of (N, 2) ndarray
        Level-0 ``(row, col)`` open rings, N >= 1.

    Returns
    -------
    list of str
        ``"[[[x, y], [x, y], ...]]"`` per ring.
    """
    if not len(rings):
        return []
    lens = np.fromiter((len(r) for r in rings), np.int64, len(rings))
    xy = np.concatenate([np.asarray(r, float).reshape(-1, 2) for r in rings])[:, ::-1]
    reverse = _signed_areas(xy, lens) < 0  # exteriors counter-clockwise
    src, out_lens = _ring_order(lens, reverse)
    pts = xy[src]
    q = len(pts)
    top = float(np.abs(pts).max()) if q else 0.0
    digits = max(1, len(str(int(top) + 1)))
    # one column per point: "[[" (ring start) "[" x ", " y "]" ", " (not last) "]]" (last)
    width = 2 + 1 + (digits + 5) + 2 + (digits + 5) + 1 + 2 + 2
    chars = np.empty((width, q), np.uint8)
    keep = np.ones((width, q), bool)
    out_starts = np.cumsum(out_lens) - out_lens
    first = np.zeros(q, bool)
    first[out_starts] = True
    last = np.zeros(q, bool)
    last[out_starts + out_lens - 1] = True
    chars[0:3] = ord("[")
    keep[0:2] = first
    r = _put_numbers(chars, keep, 3, pts[:, 0], digits)
    chars[r], chars[r + 1] = ord(","), ord(" ")
    r = _put_numbers(chars, keep, r + 2, pts[:, 1], digits)
    chars[r] = ord("]")
    chars[r + 1], chars[r + 2] = ord(","), ord(" ")
    keep[r + 1 : r + 3] = ~last
    chars[r + 3 : r + 5] = ord("]")
    keep[r + 3 : r + 5] = last
    order = np.ascontiguousarray(keep.T)
    blob = np.ascontiguousarray(chars.T)[order].tobytes().decode("ascii")
    ends = np.cumsum(order.sum(axis=1))[out_starts + out_lens - 1]
    begins = np.r_[0, ends[:-1]]
    return [blob[a:b] for a, b in zip(begins.tolist(), ends.tolist(), strict=True)]


def random_uuids(n: int) -> list[str]:
    """`n` random (version 4) UUIDs as text, as ``str(uuid.uuid4())`` gives them."""
    raw = np.frombuffer(os.urandom(16 * n), np.uint8).reshape(n, 16).copy()
    raw[:, 6] = (raw[:, 6] & 0x0F) | 0x40
    raw[:, 8] = (raw[:, 8] & 0x3F) | 0x80
    hexed = np.empty((n, 32), np.uint8)
    hexed[:, 0::2], hexed[:, 1::2] = _HEX[raw >> 4], _HEX[raw & 15]
    out = np.full((n, 36), ord("-"), np.uint8)
    for a, b, o in ((0, 8, 0), (8, 12, 9), (12, 16, 14), (16, 20, 19), (20, 32, 24)):
        out[:, o : o + b - a] = hexed[:, a:b]
    blob = out.tobytes().decode("ascii")
    return [blob[36 * i : 36 * i + 36] for i in range(n)]


#: Formats the rows of finite values as JSON objects: ``(keys, columns, rows)`` -> texts,
#: ``keys`` the ``'"name": '`` prefixes, ``rows`` a boolean row mask or None for all rows.
RowFormatter = Callable[[Sequence[str], Sequence[np.ndarray], np.ndarray | None], list[str]]


def measurements_text(
    columns: dict[str, np.ndarray], *, format_rows: RowFormatter | None = None
) -> list[str]:
    """Each row's ``measurements`` object as JSON text, the finite numbers only.

    Parses to ``{name: float(v) for finite v}`` row by row, as ``json.dumps`` writes it:
    a row of finite numbers is one ``%``-format of a template (``repr`` of each float), a
    row with gaps is joined from its finite fields. `format_rows`, when given, formats the
    rows of finite numbers instead (the pipeline passes Arrow's, which writes the same
    numbers 2.5x faster, ``3`` for ``3.0``).

    Parameters
    ----------
    columns : dict of str to (K,) ndarray
        Numeric columns (booleans and integers are written as floats).
    format_rows : callable, optional
        A :data:`RowFormatter` for the rows without gaps.

    Returns
    -------
    list of str
        ``'{"name": 1.5, ...}'`` per row.
    """
    if not columns:
        return []
    values = [np.asarray(col, dtype=float) for col in columns.values()]
    keys = [json.dumps(name) + ": " for name in columns]
    n = len(values[0])
    finite = np.ones(n, bool)
    for v in values:
        finite &= np.isfinite(v)
    whole = bool(finite.all())
    fast = None if format_rows is None else format_rows(keys, values, None if whole else finite)
    if fast is not None and whole:
        return fast
    template = "{" + ", ".join(k.replace("%", "%%") + "%r" for k in keys) + "}"
    lists = [v.tolist() for v in values]
    if fast is None and whole:
        return [template % row for row in zip(*lists, strict=True)]
    out = [""] * n
    good = np.flatnonzero(finite).tolist()
    if fast is not None:
        for i, text in zip(good, fast, strict=True):
            out[i] = text
    else:
        for i in good:
            out[i] = template % tuple(col[i] for col in lists)
    for i in np.flatnonzero(~finite).tolist():
        fields = (
            k + repr(col[i]) for k, col in zip(keys, lists, strict=True) if math.isfinite(col[i])
        )
        out[i] = "{" + ", ".join(fields) + "}"
    return out


def write_polygon_features(
    fh: _BinaryOut,
    rings: Sequence[np.ndarray],
    *,
    names: Sequence[str],
    colors: dict[str, Sequence[int]],
    object_type: str = "detection",
    measurements: dict[str, np.ndarray] | None = None,
    nuclei: Sequence[np.ndarray | None] | None = None,
    chunk: int = 20000,
    progress: Any = None,
    format_rows: RowFormatter | None = None,
) -> int:
    """Write many polygons as one QuPath GeoJSON FeatureCollection, in bulk.

    The text is what :func:`write_features` writes for the features
    :func:`polygon_feature` makes of the same arguments (random ids), at a small fraction
    of the time: a million nuclei in seconds.

    Parameters
    ----------
    fh : binary file
        Open for writing (a gzip file object gives ``.geojson.gz``).
    rings : sequence of (N, 2) ndarray
        Level-0 ``(row, col)`` open exteriors, one feature each.
    names : sequence of str
        Each feature's classification name.
    colors : dict of str to (int, int, int)
        Colour of each name.
    object_type : str
        QuPath object type of every feature.
    measurements : dict of str to (len(rings),) ndarray, optional
        Numeric columns, one row per feature (non-finite values left out).
    nuclei : sequence of (K, 2) ndarray or None, optional
        A cell's nucleus per feature (``nucleusGeometry``; None or fewer than 3 points:
        none).
    chunk : int
        Features formatted at once (memory grows with it).
    progress : callable, optional
        Called with ``(done, total)`` features after each chunk.
    format_rows : callable, optional
        Formats the measurement rows without gaps (see :func:`measurements_text`).

    Returns
    -------
    int
        Number of features written.
    """
    total = len(rings)
    if len(names) != total or (nuclei is not None and len(nuclei) != total):
        raise ValueError("write_polygon_features: expected one name (and nucleus) per ring")
    classification = {
        name: json.dumps({"name": name, "color": [int(v) for v in colors[name]]})
        for name in set(names)
    }
    # one %-format per feature (ids, outline, nucleus, class, measurements)
    template = (
        ',\n{"type": "Feature", "id": "%s", "geometry": {"type": "Polygon", "coordinates": %s}'
        '%s, "properties": {"objectType": ' + json.dumps(object_type).replace("%", "%%")
        + ', "classification": %s, "isLocked": false'
        + (', "measurements": %s}}' if measurements is not None else "%s}}")
    )  # fmt: skip
    nuc = ', "nucleusGeometry": {"type": "Polygon", "coordinates": %s}'
    fh.write(b'{"type": "FeatureCollection", "features": [')
    for start in range(0, total, chunk):
        stop = min(total, start + chunk)
        coords = polygon_coordinates_text(rings[start:stop])
        ids = random_uuids(stop - start)
        meas: list[str] = [""] * (stop - start)
        if measurements is not None:
            meas = measurements_text(
                {k: np.asarray(v)[start:stop] for k, v in measurements.items()},
                format_rows=format_rows,
            )
        nuc_text: list[str] = [""] * (stop - start)
        if nuclei is not None:
            have = [
                (j, r) for j, r in enumerate(nuclei[start:stop]) if r is not None and len(r) >= 3
            ]
            texts = polygon_coordinates_text([r for _, r in have])
            for (j, _), t in zip(have, texts, strict=True):
                nuc_text[j] = nuc % t
        cls = [classification[n] for n in names[start:stop]]
        text = "".join([template % f for f in zip(ids, coords, nuc_text, cls, meas, strict=True)])
        if start == 0:
            text = text[1:]  # the first feature follows the "[" directly
        # json.dumps escapes every non-ASCII character: the text is ASCII
        fh.write(text.encode("ascii"))
        if progress is not None:
            progress(stop, total)
    fh.write(b"\n]}\n")
    return total
