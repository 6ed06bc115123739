"""The slide backends' registry: which backend opens a path, and opening it with that one.

:func:`choose_backend` decides, from a cheap look at the path, which backend opens it;
:func:`open_source` hands the path to that backend's module, which returns a
:class:`~._backend.BackendSlide`. The TIFF family stays with the tifffile path in
:mod:`.slide`. A new backend is a module that imports :mod:`._backend` (and the slide
package's leaves), one name in :data:`BACKENDS`, and a branch in each function here.
The backends defer their heavy packages (wsidicom, zarr, openslide) to the first open,
so importing them here costs little.
"""

from __future__ import annotations

from pathlib import Path

from napari_slidescope.errors import SlideError
from napari_slidescope.slide import _dicom, _ngff, _openslide
from napari_slidescope.slide._backend import BackendSlide
from napari_slidescope.slide.formats import OPENSLIDE_SUFFIXES
from napari_slidescope.slide.source import DICOMWEB_SCHEMES, Source

#: Backends :func:`open_slide` accepts by name (``backend=``); None chooses from the path.
BACKENDS = ("tifffile", "dicom", "ome-zarr", "openslide")

#: Extensions only OpenSlide reads (MIRAX, Hamamatsu VMS/VMU, Sakura, Zeiss...).
OPENSLIDE_EXTENSIONS = OPENSLIDE_SUFFIXES

#: Files in a folder looked at for the DICOM preamble before the folder is called "not DICOM".
_DICOM_SNIFF_FILES = 64


def _is_dicom_file(path: Path) -> bool:
    try:
        with open(path, "rb") as fh:
            head = fh.read(132)
    except OSError:
        return False
    return head[128:132] == b"DICM"


def _is_zarr_group(path: Path) -> bool:
    return any((path / name).is_file() for name in (".zgroup", ".zattrs", "zarr.json"))


def choose_backend(source: Source, backend: str | None = None) -> str:
    """Return the backend that opens `source`: one of :data:`BACKENDS`.

    Looks at the path only (its kind, extension, a folder's marker files, a file's first
    132 bytes), never at pixels. A URL whose name ends in a TIFF-family extension is
    decided without a request; other URLs cost one or two small requests (does a zarr
    marker or a folder of ``.dcm`` objects lie there).

    Parameters
    ----------
    source : Source
        A resolved local path or URL (:func:`~napari_slidescope.slide.source.resolve`).
    backend : str, optional
        Force a backend (e.g. ``"openslide"`` for a TIFF slide OpenSlide also reads).

    Raises
    ------
    SlideError
        If `source` is a folder that holds neither an OME-Zarr image nor DICOM instances.
    ValueError
        If `backend` is not one of :data:`BACKENDS`.
    """
    if backend is not None:
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS} or None, got {backend!r}")
        return backend
    if source.protocol in DICOMWEB_SCHEMES:
        return "dicom"
    lower = source.name.lower().rstrip("/")
    if lower.endswith(".zarr"):
        return "ome-zarr"
    if lower.endswith(OPENSLIDE_EXTENSIONS):
        return "openslide"
    if lower.endswith(".dcm"):
        return "dicom"
    if lower.endswith(TIFF_EXTENSIONS):
        return "tifffile"
    if source.is_remote:
        return _choose_remote(source)
    p = Path(source.target)
    if p.is_dir():
        if _is_zarr_group(p):
            return "ome-zarr"
        files = sorted(f for f in p.iterdir() if f.is_file())
        dcm = [f for f in files if f.suffix.lower() == ".dcm"]
        if any(_is_dicom_file(f) for f in (dcm or files)[:_DICOM_SNIFF_FILES]):
            return "dicom"
        raise SlideError(p, _NOT_A_SLIDE_FOLDER)
    if p.is_file() and _is_dicom_file(p):
        return "dicom"
    return "tifffile"


_NOT_A_SLIDE_FOLDER = (
    "is a directory with no DICOM instance of a slide (no file with the DICM preamble) "
    "and no OME-Zarr image (no .zattrs / .zgroup / zarr.json)"
)

#: Names that are TIFF-family slides: never ask a server what they are.
TIFF_EXTENSIONS = (".svs", ".ndpi", ".tif", ".tiff", ".qptiff", ".scn", ".bif", ".btf")


def _choose_remote(source: Source) -> str:
    """Sniff a URL without a TIFF-family name: an OME-Zarr group, a DICOM folder, else TIFF."""
    fs, root = source.filesystem()
    root = root.rstrip("/")
    try:
        if any(fs.exists(f"{root}/{m}") for m in ("zarr.json", ".zattrs", ".zgroup")):
            return "ome-zarr"
        if fs.isdir(root):
            names = [str(n) for n in fs.ls(root, detail=False)]
            if any(n.lower().endswith(".dcm") for n in names):
                return "dicom"
            raise SlideError(source.display, _NOT_A_SLIDE_FOLDER)
    except SlideError:
        raise
    except Exception:  # the TIFF path reports what is wrong with the URL
        return "tifffile"
    return "tifffile"


def open_source(kind: str, source: Source, *, timeout: float | None = None) -> BackendSlide:
    """Open `source` with the non-TIFF backend `kind` (see :func:`choose_backend`).

    `timeout` bounds each request of a DICOMweb series (other backends use fsspec's).
    """
    if source.protocol in DICOMWEB_SCHEMES and kind != "dicom":
        raise SlideError(source.display, f"is a DICOMweb series: the {kind} backend cannot read it")
    if kind == "dicom":
        return _dicom.open_dicom(source, timeout=timeout)
    if kind == "ome-zarr":
        return _ngff.open_ngff(source)
    if kind == "openslide":
        if source.is_remote:
            raise SlideError(
                source.display, "OpenSlide reads local files only: copy the slide to a disk"
            )
        return _openslide.open_openslide(source.target)
    raise ValueError(f"no backend {kind!r}")
