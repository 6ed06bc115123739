"""What the "Slide analysis" widget exports, and where: napari layers to files.

:func:`export_result` writes a slide's tissue outlines or nuclei (QuPath GeoJSON) or its
nuclei table (CSV) through the analysis results' own writers; :func:`default_export_folder`
says where exports go when the user has not chosen.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any, Literal

from napari_slidescope._napari.layers import canvas_of
from napari_slidescope._napari.shapes import tissue_export

__all__ = ["ExportKind", "default_export_folder", "default_export_path", "export_result"]

ExportKind = Literal["tissue", "nuclei", "csv"]
#: File-name ending of each kind of export, after the slide's name.
SUFFIXES: dict[str, str] = {
    "tissue": "_tissue.geojson",
    "nuclei": "_nuclei.geojson",
    "csv": "_nuclei.csv",
}


def default_export_path(image: Any, kind: ExportKind, folder: str | os.PathLike[str]) -> Path:
    """Return ``FOLDER/<slide stem><suffix>``, the file an export of `kind` goes to."""
    return Path(folder) / f"{Path(image.name).stem}{SUFFIXES[kind]}"


def export_result(viewer: Any, image: Any, kind: ExportKind, target: Path) -> Path | None:
    """Write `image`'s ``"tissue"`` (GeoJSON), ``"nuclei"`` (GeoJSON) or ``"csv"`` to `target`.

    Returns the path written, or None when the viewer holds nothing of that kind for the
    slide (no ``"<slide> tissue"`` / ``"<slide> nuclei"`` layer).

    Raises
    ------
    OSError
        When the file cannot be written (a full disk: nothing written, an earlier file kept).
    """
    result: Any = None
    if kind == "tissue":
        name = f"{image.name} tissue"
        layer = viewer.layers[name] if name in viewer.layers else None
        result = tissue_export(layer) if layer is not None else None
    else:
        name = f"{image.name} nuclei"
        layer = viewer.layers[name] if name in viewer.layers else None
        canvas = canvas_of(layer) if layer is not None else None
        result = canvas.to_result() if canvas is not None else None
    if result is None:
        return None
    if kind == "csv":
        result.to_csv(target)
    else:
        result.to_geojson(target)
    return target


def default_export_folder(slide_path: str | None) -> tuple[Path, str]:
    """Return the folder exports go to by default, and a note when it is not the slide's.

    The slide's own folder when a file can be written there (see
    :func:`napari_slidescope._io.is_writable_folder`); else the first writable one of
    the current folder, the home folder and the temporary folder, with a note saying
    so (``""`` when the slide's folder is used).
    """
    from napari_slidescope._io import is_writable_folder

    own = Path(slide_path).parent if slide_path else Path.cwd()
    if is_writable_folder(own):
        return own, ""
    for other in (Path.cwd(), Path.home(), Path(tempfile.gettempdir())):
        if is_writable_folder(other):
            return other, f"{own} is read-only: exports go to {other}"
    return own, f"{own} is read-only: choose a folder to export to"
