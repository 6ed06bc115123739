"""Open a ``slidescope batch`` result folder (``OUT/<slide>/``) as aligned layers.

The folder is recognised by its ``manifest.json``; its ``tissue.geojson`` becomes a
Shapes layer and its nuclei a multiscale Labels layer with the measurements of
``nuclei.parquet`` as features. Both sit on the slide's pixels: on the open slide's
layer when the viewer shows the slide the folder was made from, else at the slide's µm
scale recorded in the manifest.

The nuclei layer shows the folder's label image (``labels.zarr/labels/nuclei``, OME-NGFF,
:mod:`napari_slidescope.batch.label_image`) as it is on disk: opening costs the features
table only, whatever the number of nuclei, and napari reads the chunks in view. A folder
written before the label image existed has its outlines painted into a temporary label
pyramid once, one tile's row group at a time (never one napari shape per nucleus).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from napari_slidescope._napari.layers import image_read_chunk
from napari_slidescope._napari.qupath import read_geojson_layers, shown_slide_layer
from napari_slidescope._napari.shapes import aligned
from napari_slidescope._napari.viewport import image_shape0
from napari_slidescope.pipeline.task_table import task

if TYPE_CHECKING:
    from npe2.types import FullLayerData


def _manifest(folder: str) -> dict[str, Any] | None:
    path = Path(folder) / "manifest.json"
    if not path.is_file():
        return None
    try:
        m = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(m, dict) or not {"parameters_sha256", "slide_stamp"} <= set(m):
        return None
    return m


def get_batch_folder_reader(path: str) -> Callable[[str | list[str]], list[FullLayerData]] | None:
    """Return :func:`read_batch_folder` for a batch result folder, else None."""
    if not os.path.isdir(path) or _manifest(path) is None:
        return None
    return read_batch_folder


def read_batch_folder(path: str | list[str]) -> list[FullLayerData]:
    """Read a batch result folder's tissue and nuclei as layers aligned with its slide.

    Raises
    ------
    ValueError
        If the folder has no readable manifest (naming the folder).
    """
    if isinstance(path, list):
        path = path[0]
    folder = Path(path)
    m = _manifest(str(folder))
    if m is None:
        raise ValueError(f"{folder}: not a slidescope batch result (no readable manifest.json)")
    name = str(m.get("slide", folder.name))
    info = m.get("slide_info") or {}
    image = shown_slide_layer()
    shape0: tuple[int, int] | None
    shown = None if image is None else (getattr(image, "metadata", None) or {}).get("path")
    if image is not None and shown is not None and Path(shown).name == name:
        align, shape0 = aligned(image), image_shape0(image)
    else:  # the slide is not shown: its pixels at the manifest's µm per pixel
        mpp = info.get("mpp")
        align = {"scale": tuple(float(v) for v in mpp), "units": ("µm", "µm")} if mpp else {}
        s0 = info.get("shape0")
        shape0 = (int(s0[0]), int(s0[1])) if s0 else None
    out: list[FullLayerData] = []
    if (folder / "tissue.geojson").is_file():
        tissue = read_geojson_layers(str(folder / "tissue.geojson"), align=align, shape0=shape0)
        for data, kwargs, kind in tissue:
            out.append((data, {**kwargs, "name": task("tissue").layer_name(name)}, kind))
    from napari_slidescope.batch.label_image import label_image_path

    if (folder / "nuclei.parquet").is_file():
        nuclei = nuclei_layer(
            folder / "nuclei.parquet", task("nuclei").layer_name(name), align, shape0,
            image=image, labels=label_image_path(folder),
        )  # fmt: skip
        if nuclei is not None:
            out.append(nuclei)
    return out


def is_nuclei_parquet(path: str | os.PathLike[str]) -> bool:
    """Tell whether a Parquet file is a ``nuclei.parquet`` of this plugin (id, bbox, WKB)."""
    import pyarrow.parquet as pq

    try:
        names = set(pq.read_schema(path).names)
    except Exception:  # noqa: BLE001 - not Parquet: the caller's reader says so
        return False
    return {"id", "geometry", "bbox_row1", "bbox_col1"} <= names


def nuclei_layer(
    parquet: Path,
    name: str,
    align: dict[str, Any],
    shape0: tuple[int, int] | None,
    *,
    image: Any = None,
    labels: Path | None = None,
) -> FullLayerData | None:
    """Return a ``nuclei.parquet``'s nuclei as multiscale Labels layer data (None without rows).

    The label image at `labels` when there is one, else the Parquet's outlines painted
    into a temporary label pyramid; features are the Parquet's id (``index``),
    measurements and class, read without the outlines.
    """
    import numpy as np
    import pyarrow.parquet as pq

    from napari_slidescope.batch.label_image import parquet_label_pyramid
    from napari_slidescope.pipeline.label_pyramid import LabelPyramid

    schema = pq.read_schema(parquet)
    numeric = [
        f.name
        for f in schema
        if f.name not in ("geometry", "cell_geometry", "tile") and not f.name.startswith("bbox_")
        and str(f.type).startswith(("int", "uint", "float", "double"))
    ]  # fmt: skip
    extra = [c for c in ("class",) if c in schema.names]
    table = pq.read_table(parquet, columns=numeric + extra)
    if table.num_rows == 0:
        return None
    feats: dict[str, Any] = {"index": table.column("id").to_numpy()}
    feats.update({c: table.column(c).to_numpy() for c in numeric if c != "id"})
    for c in extra:
        feats[c] = np.asarray(table.column(c).to_pylist(), dtype=object)
    read_chunk = None
    if image is not None:
        read_chunk = image_read_chunk(image, (1.0, 1.0))
    if labels is not None and labels.is_dir():
        pyramid = LabelPyramid.open(labels, read_chunk=read_chunk)
    else:  # written before the label image: paint the outlines once
        if shape0 is None:
            bounds = pq.read_table(parquet, columns=["bbox_row1", "bbox_col1"])
            shape0 = (
                int(np.ceil(np.max(bounds.column("bbox_row1").to_numpy()))) + 1,
                int(np.ceil(np.max(bounds.column("bbox_col1").to_numpy()))) + 1,
            )
        pyramid = parquet_label_pyramid(parquet, shape0)
        pyramid.read_chunk = read_chunk or pyramid.read_chunk
        for level in pyramid.levels:
            level.chunks = (pyramid.read_chunk, pyramid.read_chunk)
    meta: dict[str, Any] = {
        "name": name,
        "multiscale": len(pyramid.levels) > 1,
        "features": feats,
        "opacity": 0.6,
        "metadata": {"slidescope_pyramid": pyramid, "path": str(parquet)},
        **align,
    }
    data: Any = pyramid.levels if len(pyramid.levels) > 1 else pyramid.levels[0]
    return (data, meta, "labels")
