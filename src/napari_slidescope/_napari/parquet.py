"""The npe2 reader of GeoParquet outlines (``slidescope batch``'s ``nuclei.parquet``, others').

This plugin's own ``nuclei.parquet`` is painted by tile as a label layer (through
:mod:`.batch_results`); any other GeoParquet of polygons becomes detections as a QuPath
GeoJSON's would (through :mod:`.qupath`). Apart from both so that neither imports the other.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from napari_slidescope._napari.batch_results import is_nuclei_parquet, nuclei_layer
from napari_slidescope._napari.qupath import detections_layer, placement
from napari_slidescope.analysis.qupath import QuPathObject

if TYPE_CHECKING:
    from npe2.types import FullLayerData


def get_parquet_reader(path: str) -> Callable[[str | list[str]], list[FullLayerData]] | None:
    """Return :func:`read_parquet_layers` for a GeoParquet of outlines (``slidescope batch``)."""
    if not path.lower().endswith(".parquet") or not os.path.isfile(path):
        return None
    try:
        import pyarrow.parquet as pq

        schema = pq.read_schema(path)
    except Exception:  # noqa: BLE001 - not ours: another reader may take it
        return None
    meta = schema.metadata or {}
    if b"geo" not in meta or "geometry" not in schema.names:
        return None
    return read_parquet_layers


def read_parquet_layers(
    path: str | list[str],
    *,
    align: dict[str, Any] | None = None,
    shape0: tuple[int, int] | None = None,
) -> list[FullLayerData]:
    """Read a ``nuclei.parquet`` (WKB outlines in level-0 ``(x, y)``) as aligned detections.

    ``align`` (``scale``, ``translate``, ``units``) and ``shape0`` place the layer; default
    the current viewer's slide.
    """
    import pyarrow.parquet as pq  # the [batch] extra's, loaded when a Parquet is opened
    import shapely

    if isinstance(path, list):
        path = path[0]
    if is_nuclei_parquet(path):  # this plugin's own: painted by tile, no object per nucleus
        align, shape0 = placement(align, shape0)
        stem = Path(path).parent.name if Path(path).stem == "nuclei" else Path(path).stem
        found = nuclei_layer(Path(path), f"{stem} nuclei", align, shape0)
        return [] if found is None else [found]
    table = pq.read_table(path)
    geoms = shapely.from_wkb(table.column("geometry").to_numpy(zero_copy_only=False))
    numeric = [
        c
        for c in table.column_names
        if c not in ("geometry", "tile") and not c.startswith("bbox_")
        and table.schema.field(c).type.num_fields == 0
        and str(table.schema.field(c).type).startswith(("int", "uint", "float", "double"))
    ]  # fmt: skip
    cols = {c: table.column(c).to_numpy() for c in numeric}
    objects = []
    for k, g in enumerate(geoms):
        parts = list(getattr(g, "geoms", [g]))
        polys = [
            (
                np.asarray(p.exterior.coords, float)[:-1, ::-1],
                [np.asarray(h.coords, float)[:-1, ::-1] for h in p.interiors],
            )
            for p in parts
            if p is not None and not p.is_empty
        ]
        if polys:
            meas = {c: float(cols[c][k]) for c in numeric}
            objects.append(
                QuPathObject("detection", polys, class_name="Nucleus", measurements=meas)
            )
    align, shape0 = placement(align, shape0)
    stem = Path(path).parent.name if Path(path).stem == "nuclei" else Path(path).stem
    return [detections_layer(objects, f"{stem} nuclei", align, shape0)] if objects else []
