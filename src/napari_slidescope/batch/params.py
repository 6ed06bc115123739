"""What a batch run is asked to do, and how a slide file is recognised on resume."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

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

#: File name endings searched for in folders: the formats the reader opens.
SLIDE_EXTENSIONS = (
    ".svs",
    ".ndpi",
    ".qptiff",
    ".scn",
    ".bif",
    ".tif",
    ".tiff",
    ".ome.tif",
    ".ome.tiff",
)
#: Tasks a batch can run, in the order they run.
TASKS = ("tissue", "nuclei")
#: Bytes of a slide's start hashed to recognise it (with its size and modification time).
HEAD_BYTES = 2**20


@dataclass(frozen=True)
class BatchParams:
    """The parameters of a batch run; their digest decides what ``resume`` may keep.

    Attributes
    ----------
    tasks : tuple of str
        Subset of :data:`TASKS`; ``"nuclei"`` implies ``"tissue"`` (only tiles with
        tissue are segmented).
    segmenter : str
        Registered segmenter name.
    nuclei_mpp : float or None
        Working resolution of the nuclei segmentation in µm/px; None: the segmenter's,
        never finer than the slide's pixels (as ``segment_nuclei``).
    tile_size_um : float
        Size of the part of each tile it owns, µm.
    cell_expansion_um : float or None
        Grow nuclei into cells by up to this distance (``segment_nuclei``'s), or None.
    classify : str or None
        What classifies the cells, as canonical JSON of
        :func:`~napari_slidescope.pipeline.classify.load_classification`'s descriptor
        (rules with their content, or a classifier's path and SHA-256), or None: a
        changed rules file changes the digest, so ``resume`` never mixes rule sets.
    """

    tasks: tuple[str, ...] = TASKS
    segmenter: str = "auto"
    nuclei_mpp: float | None = None
    tile_size_um: float = 512.0
    cell_expansion_um: float | None = None
    classify: str | None = None

    def __post_init__(self) -> None:
        tasks = tuple(t for t in TASKS if t in set(self.tasks))
        unknown = sorted(set(self.tasks) - set(TASKS))
        if unknown or not tasks:
            raise ValueError(f"tasks: expected some of {list(TASKS)}, got {list(self.tasks)}")
        if "nuclei" in tasks:
            tasks = TASKS  # nuclei are only looked for where there is tissue
        object.__setattr__(self, "tasks", tasks)
        if not (isinstance(self.tile_size_um, int | float) and self.tile_size_um > 0):
            raise ValueError(f"tile_size_um: expected a positive number, got {self.tile_size_um!r}")
        if self.nuclei_mpp is not None and not self.nuclei_mpp > 0:
            raise ValueError(f"nuclei_mpp: expected a positive µm/px, got {self.nuclei_mpp!r}")
        if self.cell_expansion_um is not None and not (
            isinstance(self.cell_expansion_um, int | float) and self.cell_expansion_um > 0
        ):
            raise ValueError(
                f"cell_expansion_um: expected a positive distance in µm, got "
                f"{self.cell_expansion_um!r}"
            )

    @property
    def nuclei(self) -> bool:
        """Whether nuclei are segmented."""
        return "nuclei" in self.tasks

    def as_dict(self) -> dict[str, Any]:
        """Return the parameters and the software version as JSON-ready values."""
        from napari_slidescope import __version__

        d = asdict(self)
        d["tasks"] = list(self.tasks)
        for key in ("cell_expansion_um", "classify"):  # unset: the digest of earlier versions
            if d[key] is None:
                del d[key]
        if self.classify is not None:
            d["classify"] = json.loads(self.classify)
        d["version"] = __version__
        return d

    def digest(self) -> str:
        """SHA-256 of :meth:`as_dict` in canonical JSON (sorted keys)."""
        text = json.dumps(self.as_dict(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True)
class SlideStamp:
    """What identifies a slide file's content: size, modification time, hash of its start."""

    size: int
    mtime_ns: int
    head_sha256: str

    @property
    def key(self) -> tuple[int, int]:
        """``(size, mtime_ns)``: what workers check before reading."""
        return (self.size, self.mtime_ns)


def stamp_slide(path: str | os.PathLike[str]) -> SlideStamp:
    """Stat a slide and hash its first MiB.

    Raises
    ------
    OSError
        If the file cannot be read.
    """
    st = os.stat(path)
    with open(path, "rb") as fh:
        head = hashlib.sha256(fh.read(HEAD_BYTES)).hexdigest()
    return SlideStamp(int(st.st_size), int(st.st_mtime_ns), head)


def _is_slide_name(name: str) -> bool:
    return name.lower().endswith(SLIDE_EXTENSIONS) and not name.startswith(".")


def find_slides(inputs: Iterable[str | os.PathLike[str]]) -> list[Path]:
    """Slides named by files and found in folders (recursively, sorted), each once.

    Parameters
    ----------
    inputs : iterable of str or PathLike
        Slide files (any name: a file given by name is taken as it is) and folders
        (searched for :data:`SLIDE_EXTENSIONS`).

    Returns
    -------
    list of Path
        In the order given, each folder's slides sorted by path.

    Raises
    ------
    FileNotFoundError
        If an input does not exist.
    """
    found: list[Path] = []
    seen: set[Path] = set()
    for item in inputs:
        p = Path(item)
        if p.is_dir():
            names = sorted(
                Path(root) / f for root, _, files in os.walk(p) for f in files if _is_slide_name(f)
            )
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


def output_names(slides: Sequence[Path]) -> list[str]:
    """Output folder name of each slide: its file name (``OUT/<name>/``).

    Raises
    ------
    ValueError
        If two slides have the same file name (their outputs would mix).
    """
    names = [s.name for s in slides]
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
    """
    path = Path(out)
    path.mkdir(parents=True, exist_ok=True)
    probe = path / f".slidescope-write-test-{os.getpid()}"
    try:
        probe.write_bytes(b"")
    finally:
        probe.unlink(missing_ok=True)
    return path
