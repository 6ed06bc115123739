"""Open a ``slidescope batch`` result folder (``OUT/<slide>/``) as aligned layers.

The folder is recognised by its ``manifest.json``; its ``tissue.geojson`` becomes a
Shapes layer and its ``nuclei.parquet`` a Labels layer with the measurements as
features. Both sit on the slide's pixels: on the open slide's layer when the viewer
shows the slide the folder was made from, else at the slide's µm scale recorded in
the manifest.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

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
    from napari_slidescope._napari.qupath import (
        read_geojson_layers,
        read_parquet_layers,
        shown_slide_layer,
    )
    from napari_slidescope._napari.shapes import aligned
    from napari_slidescope._napari.viewport import image_shape0

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
            out.append((data, {**kwargs, "name": f"{name} tissue"}, kind))
    if (folder / "nuclei.parquet").is_file():
        out += read_parquet_layers(str(folder / "nuclei.parquet"), align=align, shape0=shape0)
    return out
