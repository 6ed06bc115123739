"""What a batch run is asked to do, and how a slide file is recognised on resume."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from napari_slidescope._version import __version__
from napari_slidescope.options import NucleiOptions, RegionsOptions, TilesOptions, TissueOptions
from napari_slidescope.pipeline.task_table import TASK_NAMES, TASK_TABLE, task, with_needs

if TYPE_CHECKING:
    from napari_slidescope.slide.source import Source
from napari_slidescope.slide.formats import DICOM_SUFFIX, OPENSLIDE_SUFFIXES, SLIDE_SUFFIXES

__all__ = [
    "SLIDE_EXTENSIONS",
    "TASKS",
    "BatchParams",
    "SlideStamp",
    "check_writable",
    "find_slides",
    "output_names",
    "stamp_slide",
]

#: File name endings searched for in folders: the slide files the reader opens (DICOM
#: instances are found by their folder, see ``_FOLDER_SLIDE_MARKERS``).
SLIDE_EXTENSIONS = SLIDE_SUFFIXES + OPENSLIDE_SUFFIXES
#: Files that make the folder holding them one slide (an OME-Zarr image, DICOM instances).
_FOLDER_SLIDE_MARKERS = (".zattrs", ".zgroup", "zarr.json")
#: Tasks a batch can run, in the order they run (the task table's,
#: :mod:`napari_slidescope.pipeline.task_table`).
TASKS = TASK_NAMES
#: What a batch runs unless told otherwise: the tasks that need no file of the user's.
DEFAULT_TASKS = ("tissue", "nuclei")
#: Bytes of a slide's start hashed to recognise it (with its size and modification time).
HEAD_BYTES = 2**20


@dataclass(frozen=True)
class BatchParams:
    """The parameters of a batch run; their digest decides what ``resume`` may keep.

    The analysis options are the options model's
    (:class:`~napari_slidescope.options.TissueOptions`,
    :class:`~napari_slidescope.options.NucleiOptions`): their defaults, bounds and
    messages are defined there once, and the tasks hand them on to
    :func:`~napari_slidescope.pipeline.tissue.detect_tissue` and
    :func:`~napari_slidescope.pipeline.nuclei.prepare_nuclei` as they are.

    Attributes
    ----------
    tasks : tuple of str
        Subset of :data:`TASKS`, with the tasks each needs added (``"nuclei"`` and
        ``"regions"`` imply ``"tissue"``: only tiles with tissue are analysed).
    tissue_options : TissueOptions
        Options of the tissue detection of each slide.
    nuclei_options : NucleiOptions
        Options of the nuclei segmentation; its ``segmenter`` ``"auto"`` is resolved per
        slide (the manifest records what it resolved to, see :meth:`run_digest`).
    regions_options : RegionsOptions or None
        The region classifier's file and its content's SHA-256 (task ``"regions"``): in
        :meth:`as_dict` and the digest only when regions are asked for, and never in
        :meth:`segmentation_dict` (a new classifier redoes the regions, not the nuclei).
    classify : str or None
        What classifies the cells, as canonical JSON of
        :func:`~napari_slidescope.pipeline.cell_classes.load_classification`'s descriptor
        (rules with their content, or a classifier's path and SHA-256), or None: a
        changed rules file changes the digest, so ``resume`` never mixes rule sets.
    anndata : bool
        Also write ``cells.h5ad`` per slide (cells x markers, ``to_anndata``).
    spatialdata : bool
        Also write ``cells.zarr`` per slide: a SpatialData store (shapes, the linked
        table, the slide by reference). In :meth:`as_dict` and the digest only when True,
        so the digests of runs without it are those they had before it existed.
    storage_options : dict or None
        fsspec storage options of slides given as URLs: they travel with the tasks to
        the workers, and are in neither :meth:`as_dict` (manifests) nor the digest, nor
        the repr (they may hold credentials).
    tiles_options : TilesOptions or None
        Tiling and embedding of each slide (task ``"tiles"``), the model file's SHA-256
        included: in :meth:`as_dict` and the digest only when tiles are asked for, never
        in :meth:`segmentation_dict`; :meth:`digest_without` ``("tiles",)`` is what the
        other tasks' outputs depend on, so a new model redoes the tiles alone.
    """

    tasks: tuple[str, ...] = DEFAULT_TASKS
    tissue_options: TissueOptions = field(default_factory=TissueOptions)
    nuclei_options: NucleiOptions = field(default_factory=NucleiOptions)
    classify: str | None = None
    anndata: bool = False
    spatialdata: bool = False
    storage_options: dict[str, Any] | None = field(default=None, compare=False, repr=False)
    regions_options: RegionsOptions | None = None
    tiles_options: TilesOptions | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "tasks", with_needs(self.tasks))
        for spec in TASK_TABLE:
            value = getattr(self, spec.params_field)
            if value is None and spec.name not in self.tasks:
                continue
            if not isinstance(value, spec.options):
                raise ValueError(
                    f"{spec.params_field}: expected a {spec.options.__name__}, got {value!r}"
                )

    def has(self, name: str) -> bool:
        """Whether the task called `name` runs."""
        return task(name).name in self.tasks

    def options_of(self, name: str) -> Any:
        """Return the options of the task called `name` (None for a task not asked for)."""
        return getattr(self, task(name).params_field)

    @property
    def nuclei(self) -> bool:
        """Whether nuclei are segmented."""
        return self.has("nuclei")

    @property
    def regions(self) -> bool:
        """Whether tissue regions are classified."""
        return self.has("regions")

    def as_dict(self) -> dict[str, Any]:
        """Return the parameters and the software version as JSON-ready values.

        ``{"tasks": [...], "tissue": {...}, "nuclei": {...}, "classify": ..., "anndata":
        ..., "version": ...}`` with the options as their ``as_dict()``, and
        ``"spatialdata": true`` and ``"regions": {...}`` when asked for.
        """
        return {
            **self.segmentation_dict(),
            **{
                spec.name: spec.params_entry(self.options_of(spec.name))
                for spec in TASK_TABLE
                if not spec.segmentation and spec.name in self.tasks
            },
            "classify": None if self.classify is None else json.loads(self.classify),
            "anndata": self.anndata,
            **({"spatialdata": True} if self.spatialdata else {}),
        }

    def segmentation_dict(self) -> dict[str, Any]:
        """Return what the tissue and nuclei outputs depend on.

        :meth:`as_dict` less the classification, the regions and the scverse files: what
        ``resume`` compares to redo only the classification and regions of a finished
        slide. The tasks the segmentation depends on (:attr:`TaskSpec.segmentation
        <napari_slidescope.pipeline.task_table.TaskSpec.segmentation>`) with their
        options, those recorded always (tissue, nuclei) even when not asked for.
        """
        out: dict[str, Any] = {
            "tasks": [t for t in self.tasks if task(t).segmentation],
        }
        for spec in TASK_TABLE:
            if spec.segmentation and (spec.recorded_always or spec.name in self.tasks):
                out[spec.name] = spec.params_entry(self.options_of(spec.name))
        out["version"] = __version__
        return out

    def digest(self) -> str:
        """SHA-256 of :meth:`as_dict` in canonical JSON (sorted keys): what was asked for."""
        return _sha256(self.as_dict())

    def digest_without(self, names: Iterable[str]) -> str:
        """SHA-256 of :meth:`as_dict` less the entries of the tasks `names`.

        What the other tasks' outputs depend on: equal for two runs that differ only in
        those tasks (``resume`` then keeps the rest and redoes them alone).
        """
        return params_digest_without(self.as_dict(), names)

    def run_digest(self, resolved: dict[str, Any]) -> str:
        """SHA-256 of what was asked for and what it resolved to on a slide.

        `resolved` is what actually ran (the segmenter ``"auto"`` chose, its model,
        version and weights' SHA-256, the working resolution, the stain mode and the
        nuclear channel): two runs that computed different things never share this
        digest, so ``resume`` never keeps or mixes results of another model.
        """
        return _sha256({"requested": self.as_dict(), "resolved": resolved})

    def segmentation_digest(self, resolved: dict[str, Any]) -> str:
        """Return the :meth:`run_digest` of :meth:`segmentation_dict`.

        Equal for two runs whose tissue and nuclei outputs are the same, whatever their
        classification.
        """
        return _sha256({"requested": self.segmentation_dict(), "resolved": resolved})


def params_digest_without(params: dict[str, Any], names: Iterable[str]) -> str:
    """SHA-256 of recorded parameters (``as_dict``, a manifest's) less some tasks' entries."""
    drop = set(names)
    return _sha256({k: v for k, v in params.items() if k not in drop})


def _sha256(value: Any) -> str:
    """SHA-256 of `value` as canonical JSON (anything JSON cannot hold as its ``str``)."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True)
class SlideStamp:
    """What identifies a slide's content.

    A local file: size, modification time, hash of its first MiB. An object on a server
    or store (``remote`` set): its size and what the store says about its version
    (``etag``, ``version_id``, ``last_modified``, whichever it gives), whose hash is
    ``head_sha256``; ``mtime_ns`` is 0.
    """

    size: int
    mtime_ns: int
    head_sha256: str
    remote: dict[str, Any] | None = None

    @property
    def key(self) -> tuple[Any, ...]:
        """What workers check before reading: ``(size, mtime_ns)``, plus the hash for URLs."""
        if self.remote is not None:
            return (self.size, self.mtime_ns, self.head_sha256)
        return (self.size, self.mtime_ns)


def remote_identity(stamp: dict[str, Any]) -> str:
    """SHA-256 of what a store says about an object's version (size, ETag, version...)."""
    keys = ("size", "etag", "version_id", "last_modified")
    text = json.dumps({k: stamp.get(k) for k in keys}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


def stamp_slide(
    path: str | os.PathLike[str], storage_options: dict[str, Any] | None = None
) -> SlideStamp:
    """Stat a slide and hash its first MiB (a URL: ask the store for its version).

    Raises
    ------
    OSError
        If the file cannot be read.
    SlideError
        If a URL cannot be reached or its object is not there.
    """
    from napari_slidescope.slide.source import is_url

    if is_url(path):
        from napari_slidescope.slide.remote import stat_remote
        from napari_slidescope.slide.source import resolve

        info = stat_remote(resolve(str(path), storage_options))
        return SlideStamp(int(info["size"]), 0, remote_identity(info), info)
    if os.path.isdir(path):  # a DICOM folder or an OME-Zarr image: its files' listing
        size, mtime, listing = _folder_state(path)
        return SlideStamp(size, mtime, hashlib.sha256(listing.encode()).hexdigest())
    st = os.stat(path)
    with open(path, "rb") as fh:
        head = hashlib.sha256(fh.read(HEAD_BYTES)).hexdigest()
    return SlideStamp(int(st.st_size), int(st.st_mtime_ns), head)


def local_size_mtime(path: str | os.PathLike[str]) -> tuple[int, int]:
    """Return (size, mtime_ns) of a slide file; of a slide folder, its files' sum and latest."""
    if os.path.isdir(path):
        size, mtime, _ = _folder_state(path)
        return size, mtime
    st = os.stat(path)
    return int(st.st_size), int(st.st_mtime_ns)


def _folder_state(path: str | os.PathLike[str]) -> tuple[int, int, str]:
    """Total size, latest mtime and a listing (name, size, mtime per file) of a folder."""
    size = mtime = 0
    lines = []
    for root, dirs, files in os.walk(path):
        dirs.sort()
        for name in sorted(files):
            full = os.path.join(root, name)
            st = os.stat(full)
            size += int(st.st_size)
            mtime = max(mtime, int(st.st_mtime_ns))
            lines.append(f"{os.path.relpath(full, path)}\t{st.st_size}\t{st.st_mtime_ns}")
    return size, mtime, "\n".join(lines)


def _is_folder_slide(files: list[str]) -> bool:
    return any(f in _FOLDER_SLIDE_MARKERS or f.lower().endswith(DICOM_SUFFIX) for f in files)


def _is_slide_name(name: str) -> bool:
    return name.lower().endswith(SLIDE_EXTENSIONS) and not name.startswith(".")


def find_slides(
    inputs: Iterable[str | os.PathLike[str]], storage_options: dict[str, Any] | None = None
) -> list[Path | str]:
    """Slides named by files and URLs and found in folders and URL prefixes, each once.

    Parameters
    ----------
    inputs : iterable of str or PathLike
        Slide files (any name: a file given by name is taken as it is), folders
        (searched recursively for :data:`SLIDE_EXTENSIONS`, and for folders that are one
        slide: an OME-Zarr image, a folder of DICOM instances), slide URLs (``https://``,
        ``s3://``..., taken as they are) and URL prefixes ending in ``/`` (an object
        store "folder", listed recursively).
    storage_options : dict, optional
        For listing URL prefixes (fsspec storage options).

    Returns
    -------
    list of Path or str
        In the order given, each folder's slides sorted by path; URLs as strings.

    Raises
    ------
    FileNotFoundError
        If an input path does not exist.
    SlideError
        If a URL prefix cannot be listed, or a URL's scheme is unknown.
    """
    from napari_slidescope.slide.source import is_url, resolve

    found: list[Path | str] = []
    seen: set[Path | str] = set()
    for item in inputs:
        if is_url(item):
            url = str(item)
            source = resolve(url, storage_options)  # an unknown scheme fails here
            urls = _list_prefix(source) if url.endswith("/") else [url]
            for u in urls:
                if u not in seen:
                    seen.add(u)
                    found.append(u)
            continue
        p = Path(item)
        if p.is_dir():
            names = []
            for root, dirs, files in os.walk(p):
                if _is_folder_slide(files):  # OME-Zarr, DICOM: the folder is one slide
                    names.append(Path(root))
                    dirs[:] = []
                    continue
                names += [Path(root) / f for f in files if _is_slide_name(f)]
            names.sort()
        elif p.exists():
            names = [p]
        else:
            raise FileNotFoundError(f"{p}: no such file or folder")
        for n in names:
            r = n.resolve()
            if r not in seen:
                seen.add(r)
                found.append(n)
    return found


def _list_prefix(source: Source) -> list[str]:
    """Return the slide URLs under a URL prefix, sorted."""
    from napari_slidescope.errors import SlideError

    fs, path = source.filesystem()
    try:
        keys = fs.find(path)
    except Exception as exc:
        raise SlideError(
            source.display, f"cannot be listed ({type(exc).__name__}: {source.scrub(str(exc))})"
        ) from exc
    names = [k for k in keys if _is_slide_name(k.rsplit("/", 1)[-1])]
    return sorted(fs.unstrip_protocol(k) for k in names)


def slide_name(slide: Path | str) -> str:
    """Return the file name of a slide path or URL (its output folder's name)."""
    from napari_slidescope.slide.source import resolve

    return slide.name if isinstance(slide, Path) else resolve(slide).name


def shown_path(slide: Path | str) -> str:
    """Return what manifests show: the absolute path, or the URL without credentials."""
    from napari_slidescope.slide.source import redact

    return str(slide.resolve()) if isinstance(slide, Path) else redact(slide)


def output_names(slides: Sequence[Path | str]) -> list[str]:
    """Output folder name of each slide: its file name (``OUT/<name>/``).

    Raises
    ------
    ValueError
        If two slides have the same file name (their outputs would mix).
    """
    names = [slide_name(s) for s in slides]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ValueError(
            f"slides with the same file name in different folders: {dup}; "
            "their outputs would share OUT/<name>/ (run them into different outputs)"
        )
    return names


def check_writable(out: str | os.PathLike[str]) -> Path:
    """Create the output folder and check a file can be written in it.

    Raises
    ------
    OSError
        If the folder cannot be created or written to.
    ValueError
        If `out` is a URL: outputs go to a local or mounted folder.
    """
    from napari_slidescope.slide.source import is_url, redact

    if is_url(out):
        raise ValueError(
            f"{redact(str(out))}: writing outputs to a URL is not supported; give a local "
            "or mounted folder (slides may be URLs)"
        )
    path = Path(out)
    path.mkdir(parents=True, exist_ok=True)
    probe = path / f".slidescope-write-test-{os.getpid()}"
    try:
        probe.write_bytes(b"")
    finally:
        probe.unlink(missing_ok=True)
    return path
