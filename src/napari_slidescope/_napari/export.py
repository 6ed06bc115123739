"""What the "Slide analysis" widget exports, and where: napari layers to files.

:func:`export_source` picks, on the main thread, what an export of a slide writes: its
tissue outlines, or the nuclei the runs found (the kept result: the runs' own outlines
and table, :meth:`~napari_slidescope._napari.canvases.ResultCanvas.kept_result`; the
label canvas is traced again only for nuclei that came without outlines).
:func:`write_export` writes it through the analysis results' own writers (QuPath GeoJSON,
CSV, GeoParquet) and may run on a worker thread. :func:`export_folder` decides where an
export goes when it is written; :func:`default_export_folder` only proposes a folder and
never writes into it (opening a slide writes nothing next to it).
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from napari_slidescope._io import is_writable_folder
from napari_slidescope._napari.canvases import PyramidCanvas, ResultCanvas
from napari_slidescope._napari.layers import canvas_of
from napari_slidescope._napari.shapes import tissue_export
from napari_slidescope.pipeline.task_table import export_kind

__all__ = [
    "ExportKind",
    "default_export_folder",
    "default_export_path",
    "export_folder",
    "export_result",
    "export_source",
    "export_words",
    "write_export",
]

#: The kinds of export (the task table's exports, whose suffixes and words
#: :func:`default_export_path` and :func:`export_words` read; a type checker's list of them).
ExportKind = Literal["tissue", "nuclei", "csv", "geoparquet"]


def default_export_path(image: Any, kind: ExportKind, folder: str | os.PathLike[str]) -> Path:
    """Return ``FOLDER/<slide stem><suffix>``, the file an export of `kind` goes to."""
    return Path(folder) / f"{Path(image.name).stem}{export_kind(kind)[1].suffix}"


def export_words(kind: str) -> str:
    """Return the export `kind` in words, for messages (``"nuclei CSV"``; the task table's)."""
    return export_kind(kind)[1].words


def export_source(viewer: Any, image: Any, kind: ExportKind) -> Any:
    """Return what an export of `kind` of `image` writes (main thread), or None.

    The layer is the one the task table names for the task that exports `kind`
    (``"<slide> tissue"``, ``"<slide> nuclei"``). A layer of nuclei: a snapshot of its
    canvas (its lists of tables and outlines copied, so a run that goes on adds nothing
    to the export), whose result :func:`write_export` makes on the worker thread; any
    other layer (tissue): its shapes as the user left them (or its result). None when
    there is no such layer.
    """
    spec, _ = export_kind(kind)
    name = spec.layer_name(image.name)
    layer = viewer.layers[name] if name in viewer.layers else None
    if layer is None:
        return None
    canvas = canvas_of(layer)
    if canvas is None:
        # no result canvas behind it: tissue shapes export as the user left them; another
        # layer of that name (nuclei shapes of the user's, a replaced label image) has no
        # result to export (its writer would be the wrong one)
        return tissue_export(layer) if spec.name == "tissue" else None
    return dataclasses.replace(
        canvas,
        regions=list(canvas.regions),
        tables=list(canvas.tables),
        outline_parts=list(canvas.outline_parts),
        cell_outline_parts=list(canvas.cell_outline_parts),
    )


def write_export(
    source: Any,
    kind: ExportKind,
    target: Path,
    *,
    progress: Callable[[int, int], object] | None = None,
) -> Path:
    """Write `source` (from :func:`export_source`) as `kind` to `target`; any thread.

    `progress` is called with ``(done, total)`` rows or features as they are written.

    Raises
    ------
    OSError
        When the file cannot be written (a full disk: nothing written, an earlier file kept).
    ImportError
        GeoParquet without pyarrow (the message names the extra).
    """
    if isinstance(source, ResultCanvas | PyramidCanvas):
        # the runs' own nuclei; a canvas with nuclei that came without outlines is traced
        kept = source.kept_result()
        source = kept if kept is not None else source.to_result()
    _, export = export_kind(kind)
    write = getattr(source, export.method)
    if export.progress:
        write(target, progress=progress)
    else:
        write(target)
    return target


def export_result(viewer: Any, image: Any, kind: ExportKind, target: Path) -> Path | None:
    """Write `image`'s export of `kind` to `target` now, on the calling thread.

    Returns the path written, or None when the viewer holds nothing of that kind for the
    slide (no ``"<slide> tissue"`` / ``"<slide> nuclei"`` layer). The dock writes on a
    worker thread instead (:func:`export_source` then :func:`write_export`).

    Raises
    ------
    OSError
        When the file cannot be written (a full disk: nothing written, an earlier file kept).
    """
    source = export_source(viewer, image, kind)
    if source is None:
        return None
    return write_export(source, kind, target)


def _slide_folder(slide_path: str | None) -> Path:
    return Path(slide_path).parent if slide_path else Path.cwd()


def default_export_folder(slide_path: str | None, *, probe: bool = True) -> tuple[Path, str]:
    """Return the folder exports go to by default, and a note when it is not the slide's.

    The slide's own folder when a file can be written there; else the first writable one
    of the current folder, the home folder and the temporary folder, with a note saying
    so (``""`` when the slide's folder is used).

    Parameters
    ----------
    slide_path : str or None
        The slide (None: the current folder is its folder).
    probe : bool
        Check by creating (and removing) a hidden file
        (:func:`napari_slidescope._io.is_writable_folder`), which changes the folder's
        modification time; False checks the permission bits only and writes nothing,
        what the dock does when a slide is opened (:func:`export_folder` decides for
        real when an export is written).
    """
    own = _slide_folder(slide_path)
    if _writable(own, probe):
        return own, ""
    for other in (Path.cwd(), Path.home(), Path(tempfile.gettempdir())):
        if other != own and _writable(other, probe):
            return other, f"{own} is read-only: exports go to {other}"
    return own, f"{own} is read-only: choose a folder to export to"


def export_folder(chosen: str | os.PathLike[str]) -> tuple[Path, str]:
    """Decide, when exporting, the folder an export goes to: `chosen`, or a fallback.

    `chosen` when a file can be created there now (probed); else as
    :func:`default_export_folder` falls back, with a note saying where the export went.
    """
    folder = Path(chosen)
    if _writable(folder, True):
        return folder, ""
    for other in (Path.cwd(), Path.home(), Path(tempfile.gettempdir())):
        if other != folder and _writable(other, True):
            return other, f"{folder} is read-only: exports go to {other}"
    return folder, f"{folder} is read-only: choose a folder to export to"


def _writable(folder: Path, probe: bool) -> bool:
    if probe:
        return is_writable_folder(folder)
    return folder.is_dir() and os.access(folder, os.W_OK | os.X_OK)
