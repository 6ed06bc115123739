"""Polygons in Shapes layers aligned with a slide: tissue outlines, and back to level-0 px.

Geometry. Polygons inside the project are level-0 ``(row, col)`` rings in continuous
pixel coordinates (pixel ``i`` spans ``[i, i + 1)``, as GeoJSON/QuPath ``(x, y)`` do);
napari centres image pixel ``i`` on data coordinate ``i``. A Shapes layer drawn over a
slide layer therefore takes the slide's ``scale`` and ``translate`` and holds the rings
shifted by half a pixel: ``data = ring - 0.5`` (:func:`to_layer_coords`), so that world
coordinates are ``translate + scale * (ring - 0.5)``, exactly where the slide's pixels
are.

napari polygons have no holes: a tissue piece's holes are polygons of their own with
``role = "hole"`` and the ``piece`` they belong to, drawn with the same outline.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from napari_slidescope.analysis.geojson import write_geojson
from napari_slidescope.pipeline.task_table import task

__all__ = [
    "ShapesExport",
    "from_layer_coords",
    "selected_polygon",
    "layer_polygons",
    "ring_area",
    "show_tissue",
    "smooth_ring",
    "tissue_export",
    "to_layer_coords",
]

#: Outline and label colour of tissue (a readable green).
TISSUE_EDGE = "#1abf59"

Pair = tuple[float, float]


def to_layer_coords(ring: np.ndarray) -> np.ndarray:
    """Map a level-0 ``(row, col)`` ring to data coordinates of a layer aligned with the slide."""
    return np.asarray(ring, float) - 0.5


def from_layer_coords(vertices: np.ndarray) -> np.ndarray:
    """Map data coordinates of an aligned layer to a level-0 ``(row, col)`` ring."""
    return np.asarray(vertices, float)[:, -2:] + 0.5


def aligned(image: Any) -> dict[str, Any]:
    """``scale``, ``translate`` (and ``units``) that put a layer's data on `image`'s pixels."""
    out: dict[str, Any] = {
        "scale": tuple(float(v) for v in np.asarray(image.scale)[-2:]),
        "translate": tuple(float(v) for v in np.asarray(image.translate)[-2:]),
    }
    units = getattr(image, "units", None)
    if units is not None:
        out["units"] = tuple(units)[-2:]
    return out


def smooth_ring(ring: np.ndarray, iterations: int = 2) -> np.ndarray:
    """Chaikin corner cutting of a closed ring (the staircase of a mask outline rounds off).

    Each pass replaces every edge ``p -> q`` by the points at 1/4 and 3/4 of it; the ring
    stays within the original one's convex hull and moves by at most a quarter edge.
    """
    pts = np.asarray(ring, float)
    for _ in range(iterations):
        if len(pts) < 3:
            break
        nxt = np.roll(pts, -1, axis=0)
        pts = np.stack([0.75 * pts + 0.25 * nxt, 0.25 * pts + 0.75 * nxt], axis=1).reshape(-1, 2)
    return pts


def ring_area(ring: np.ndarray) -> float:
    """Unsigned shoelace area of a ring (its units squared)."""
    r = np.asarray(ring, float)
    if len(r) < 3:
        return 0.0
    y, x = r[:, 0], r[:, 1]
    return float(abs(np.dot(x, np.roll(y, -1)) - np.dot(y, np.roll(x, -1))) / 2)


def _areas_um2(
    rings: Sequence[np.ndarray], roles: Sequence[str], pieces: Sequence[int], mpp: Pair
) -> np.ndarray:
    """Area of each tissue piece (outer ring less its holes) in µm², holes 0."""
    px = float(mpp[0]) * float(mpp[1])
    area = np.array([ring_area(r) * px for r in rings])
    out = np.where(np.asarray(roles) == "tissue", area, 0.0)
    for i, (role, piece) in enumerate(zip(roles, pieces, strict=True)):
        if role == "hole":
            owner = [
                j
                for j, (r, p) in enumerate(zip(roles, pieces, strict=True))
                if r == "tissue" and p == piece
            ]
            for j in owner:
                out[j] -= area[i]
    return out


def show_tissue(viewer: Any, image: Any, result: Any, *, smooth: int = 2) -> Any:
    """Show a ``TissueResult`` as ``"<image> tissue"``: outlines with their area (Shapes).

    Each tissue piece is a polygon (its holes polygons of their own), smoothed by
    :func:`smooth_ring`, aligned with `image`; its area (µm², holes deducted) is a
    feature and shown as text in mm². An older ``"<image> tissue"`` layer is replaced.
    Deleting or editing shapes changes what :func:`tissue_export` writes.
    """
    name = task("tissue").layer_name(image.name)
    rings, roles, pieces = [], [], []
    for k, (ext, holes) in enumerate(zip(result.polygons, result.holes, strict=True)):
        for ring, role in [(ext, "tissue"), *((h, "hole") for h in holes)]:
            if len(ring) >= 3:
                rings.append(smooth_ring(ring, smooth))
                roles.append(role)
                pieces.append(k)
    mpp = (float(image.scale[-2]), float(image.scale[-1]))
    features = {
        "role": np.asarray(roles, dtype=object),
        "piece": np.asarray(pieces, dtype=np.int64),
        "area_um2": _areas_um2(rings, roles, pieces, mpp),
        "area_label": np.full(len(rings), "", dtype=object),
    }
    style = {
        "edge_color": TISSUE_EDGE,
        "face_color": "transparent",
        "edge_width": max(2.0, 2.0 * float(result.downsample[0]) / 8),
    }
    text = {"string": "{area_label}", "color": TISSUE_EDGE, "size": 10, "anchor": "upper_left"}
    layer = viewer.layers[name] if name in viewer.layers else None
    if layer is not None and "slidescope_tissue" in layer.metadata:
        # replaced in place: removing a layer costs napari a full garbage collection and
        # a new visual, which would block the event loop while a run is going on
        layer.metadata["slidescope_updating"] = True
        try:
            layer.selected_data = set(range(layer.nshapes))
            layer.remove_selected()
            for key, value in aligned(image).items():
                setattr(layer, key, value)
            if rings:
                layer.add([to_layer_coords(r) for r in rings], shape_type="polygon", **style)
        finally:
            layer.metadata.pop("slidescope_updating", None)
        layer.features = features
        if rings:
            layer.text = text
    else:
        if name in viewer.layers:
            viewer.layers.remove(name)
        layer = viewer.add_shapes(
            [to_layer_coords(r) for r in rings],
            shape_type="polygon",
            name=name,
            features=features,
            text=text if rings else None,
            **style,
            **aligned(image),
        )
        layer.events.data.connect(lambda event, layer=layer: _on_data(layer, event))
    _label_areas(layer)
    layer.metadata["slidescope_tissue"] = result
    layer.metadata["slidescope_mpp"] = mpp
    return layer


def _label_areas(layer: Any) -> None:
    feats = layer.features
    if len(feats) == 0 or "area_um2" not in feats:
        return
    labels = [
        f"{a / 1e6:.3g} mm²" if role == "tissue" else ""
        for a, role in zip(feats["area_um2"], feats["role"], strict=True)
    ]
    feats["area_label"] = labels
    layer.features = feats


def _on_data(layer: Any, event: Any) -> None:
    """Keep the areas right after the user edits, adds or deletes shapes."""
    if getattr(event, "action", None) not in ("added", "removed", "changed"):
        return
    if layer.metadata.get("slidescope_updating"):  # show_tissue sets the features itself
        return
    feats = layer.features.copy()
    if len(feats) != len(layer.data) or "role" not in feats:
        return
    roles = ["tissue" if not isinstance(r, str) else r for r in feats["role"]]
    pieces = [int(p) if p == p else -1 - i for i, p in enumerate(feats["piece"])]
    rings = [from_layer_coords(v) for v in layer.data]
    mpp = layer.metadata.get("slidescope_mpp", (1.0, 1.0))
    feats["role"], feats["piece"] = roles, pieces
    feats["area_um2"] = _areas_um2(rings, roles, pieces, mpp)
    layer.features = feats
    _label_areas(layer)


def layer_polygons(layer: Any) -> tuple[list[np.ndarray], list[list[np.ndarray]], list[int]]:
    """Polygons of a Shapes layer aligned with a slide, as level-0 rings with holes.

    Shapes with feature ``role == "hole"`` become holes of the shape of the same
    ``piece``; every other polygon, rectangle or ellipse is an exterior.

    Returns
    -------
    exteriors, interiors, index
        Level-0 ``(row, col)`` rings, the holes of each, and the shape index of each.
    """
    feats = layer.features
    roles = list(feats["role"]) if "role" in feats else ["tissue"] * len(layer.data)
    pieces = list(feats["piece"]) if "piece" in feats else list(range(len(layer.data)))
    exteriors: list[np.ndarray] = []
    interiors: list[list[np.ndarray]] = []
    index: list[int] = []
    owner: dict[Any, int] = {}
    for i, (verts, kind) in enumerate(zip(layer.data, layer.shape_type, strict=True)):
        if kind not in ("polygon", "rectangle", "ellipse") or roles[i] == "hole":
            continue
        owner[pieces[i]] = len(exteriors)
        exteriors.append(from_layer_coords(verts))
        interiors.append([])
        index.append(i)
    for i, verts in enumerate(layer.data):
        if roles[i] == "hole" and pieces[i] in owner:
            interiors[owner[pieces[i]]].append(from_layer_coords(verts))
    return exteriors, interiors, index


class ShapesExport:
    """What a Shapes layer shows, written as QuPath GeoJSON (annotations)."""

    def __init__(self, layer: Any, *, name: str = "Tissue") -> None:
        self.exteriors, self.interiors, self.index = layer_polygons(layer)
        self.name = name
        feats = layer.features
        self.measurements = None
        if "area_um2" in feats:
            self.measurements = [
                {"Area µm^2": float(feats["area_um2"].iloc[i])} for i in self.index
            ]

    def to_geojson(self, path: str | os.PathLike[str]) -> Path:
        """Write one annotation per exterior (holes as interior rings); return the path."""
        write_geojson(
            path, self.exteriors, self.interiors, name=self.name, measurements=self.measurements
        )
        return Path(path)


def tissue_export(layer: Any) -> Any:
    """Return what to export for a tissue layer: its shapes as the user left them, or None."""
    from napari.layers import Shapes

    if isinstance(layer, Shapes):
        return ShapesExport(layer) if len(layer.data) else None
    return layer.metadata.get("slidescope_tissue")


def selected_polygon(viewer: Any, image: Any) -> np.ndarray:
    """Return the selected shape as a level-0 ``(row, col)`` polygon of `image`'s slide.

    The first selected shape of the active Shapes layer (else of the topmost Shapes layer
    with a selection), mapped through world coordinates, so shapes drawn in napari and
    imported QuPath annotations both work whatever their layer's scale.

    Raises
    ------
    ValueError
        If no shape is selected.
    """
    from napari.layers import Shapes

    active = viewer.layers.selection.active
    layers = [active] if isinstance(active, Shapes) and active.selected_data else []
    layers += [ly for ly in reversed(viewer.layers) if isinstance(ly, Shapes) and ly.selected_data]
    if not layers:
        raise ValueError("no shape selected: select a polygon in a Shapes layer first")
    layer = layers[0]
    verts = np.asarray(layer.data[min(layer.selected_data)], float)
    world = np.array([layer.data_to_world(v) for v in verts], float)[:, -2:]
    s = np.asarray(image.scale, float)[-2:]
    t = np.asarray(image.translate, float)[-2:]
    return (world - t) / s + 0.5
