"""The segmenter protocol: what the tiled pipeline asks of every nuclei segmenter.

A segmenter splits its work in two for the staged runner: :meth:`Segmenter.predict` (the
model stage, batches of tiles, a GPU when the package has one) and
:meth:`Segmenter.postprocess` (the CPU stage, one tile). :meth:`Segmenter.prepare` is
called once per run with crops of the region at the working resolution, so that stain
vectors, thresholds and intensity scaling are fixed for all tiles alike. ``input`` says
what the segmenter reads: ``"brightfield"`` RGB tiles ``(B, H, W, 3)`` or one
``"fluorescence"`` channel ``(B, H, W, 1)``; ``target_mpp`` is its working resolution and
``min_overlap_um`` the tile overlap it needs.
"""

from __future__ import annotations

import hashlib
import importlib.util
import inspect
import os
import threading
from pathlib import Path
from typing import Any, ClassVar, Literal, Protocol, runtime_checkable

import numpy as np

from napari_slidescope.errors import (
    SegmenterInfoWarning,
    SegmenterMismatchWarning,
    SegmenterUnavailableError,
)

__all__ = [
    "IDENTITY_KEYS",
    "Identity",
    "INPUTS",
    "Input",
    "ModelSegmenter",
    "Segmenter",
    "SegmenterBase",
    "SegmenterInfoWarning",
    "SegmenterMismatchWarning",
    "SegmenterUnavailableError",
    "as_segmenter",
    "file_sha256",
    "identity_of",
    "missing_packages",
]

#: What names the model a segmenter runs: two results with different values here were
#: computed by different models (recorded in results, manifests and parameter hashes).
IDENTITY_KEYS = ("segmenter", "model", "model_version", "weights_sha256")
#: What an adapter says of its model: :data:`IDENTITY_KEYS` to text, None where unknown.
Identity = dict[str, str | None]

_SHA_LOCK = threading.Lock()
_SHA_CACHE: dict[tuple[str, int, int], str] = {}


def file_sha256(path: str | os.PathLike[str]) -> str:
    """SHA-256 of a file, cached by its path, size and modification time.

    Raises
    ------
    OSError
        If the file cannot be read.
    """
    st = os.stat(path)
    key = (os.fspath(path), int(st.st_size), int(st.st_mtime_ns))
    with _SHA_LOCK:
        found = _SHA_CACHE.get(key)
    if found is not None:
        return found
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    digest = h.hexdigest()
    with _SHA_LOCK:
        _SHA_CACHE[key] = digest
    return digest


def identity_of(segmenter: object) -> dict[str, Any]:
    """Return what model a segmenter object runs: :data:`IDENTITY_KEYS` as a dict.

    ``segmenter`` is its ``name``; ``model``, ``model_version`` and ``weights_sha256``
    come from its ``identity()`` method when it has one (the learned adapters: the
    model's name, version and the SHA-256 of the weights file it loaded), else None
    (the built-in methods, whose parameters the software version fixes).

    Examples
    --------
    >>> class Thresh:
    ...     name = "thresh"
    ...     def predict(self, tiles, *, mpp): ...
    ...     def postprocess(self, raw, *, mpp): ...
    >>> identity_of(as_segmenter(Thresh()))["segmenter"]
    'thresh'
    """
    own = getattr(segmenter, "identity", None)
    extra = dict(own()) if callable(own) else {}
    out: dict[str, Any] = {k: extra.get(k) for k in IDENTITY_KEYS}
    out["segmenter"] = str(extra.get("segmenter") or getattr(segmenter, "name", "segmenter"))
    return out


#: What a segmenter reads: RGB brightfield tiles, or one fluorescence channel.
Input = Literal["brightfield", "fluorescence"]
INPUTS: tuple[Input, ...] = ("brightfield", "fluorescence")


@runtime_checkable
class Segmenter(Protocol):
    """What :func:`~napari_slidescope.pipeline.nuclei.segment_nuclei` runs.

    Attributes
    ----------
    name : str
        Registry name (shown in results).
    input : {"brightfield", "fluorescence"}
        ``"brightfield"``: tiles are (B, H, W, 3) RGB; ``"fluorescence"``: (B, H, W, 1), the
        nuclear channel.
    target_mpp : float
        Working resolution in µm/px (see :func:`~napari_slidescope.segmenters.working_mpp`).
    min_overlap_um : float
        Tile overlap (µm) that makes objects at tile edges independent of the cut.
    parallel_predict : bool
        True when ``predict`` is thread-safe CPU work (the runner gives it several threads).
    """

    name: str
    input: Input
    target_mpp: float
    min_overlap_um: float
    parallel_predict: bool

    def prepare(self, reference: np.ndarray, *, mpp: float) -> None:
        """Fix per-run settings from ``reference`` (crops of the region, working mpp)."""

    def predict(self, tiles: np.ndarray, *, mpp: float) -> np.ndarray:
        """Model stage: (B, H, W, C) tiles to (B, ...) raw maps."""

    def postprocess(self, raw: np.ndarray, *, mpp: float) -> np.ndarray:
        """CPU stage: one tile's raw map to (H, W) int32 labels."""


class SegmenterBase:
    """Defaults for a :class:`Segmenter` (subclass it and write ``predict``/``postprocess``).

    Parameters
    ----------
    target_mpp : float
        Working resolution in µm/px.
    min_overlap_um : float
        Tile overlap in µm.
    """

    name = "segmenter"
    input: Input = "brightfield"
    parallel_predict = False

    def __init__(self, *, target_mpp: float = 0.5, min_overlap_um: float = 20.0) -> None:
        self.target_mpp = float(target_mpp)
        self.min_overlap_um = float(min_overlap_um)

    def prepare(self, reference: np.ndarray, *, mpp: float) -> None:
        """Nothing to fix per run."""

    def predict(self, tiles: np.ndarray, *, mpp: float) -> np.ndarray:  # pragma: no cover
        """Model stage (subclasses implement it)."""
        raise NotImplementedError

    def postprocess(self, raw: np.ndarray, *, mpp: float) -> np.ndarray:  # pragma: no cover
        """CPU stage (subclasses implement it)."""
        raise NotImplementedError


def missing_packages(*packages: str) -> str | None:
    """Say which of `packages` are not installed (and the pip command), or return None.

    Looks the packages up without importing them.

    Examples
    --------
    >>> missing_packages("numpy") is None
    True
    >>> missing_packages("numpy", "no_such_package_here")
    'package(s) no_such_package_here not installed (pip install no_such_package_here)'
    """
    missing = [p for p in packages if importlib.util.find_spec(p) is None]
    if missing:
        return f"package(s) {', '.join(missing)} not installed (pip install {' '.join(missing)})"
    return None


class ModelSegmenter(SegmenterBase):
    """Base of the adapters over a model installed on this machine (Cellpose, StarDist...).

    A subclass names the packages it needs (``packages``), says where a model's file is
    looked for (:meth:`model_files`: a folder and a glob pattern; the first match, sorted,
    is the model) and how to get it (``install_hint``), and loads the model in its own
    ``__init__`` after calling this one, which checks both and raises otherwise.
    :meth:`missing_reason` is what the adapter module's ``missing_reason()`` returns to the
    registry.

    Parameters
    ----------
    model : str
        The model's name.
    target_mpp : float
        Working resolution in µm/px.
    min_overlap_um : float
        Tile overlap in µm.

    Raises
    ------
    SegmenterUnavailableError
        If a package or the model's files are missing.
    """

    packages: ClassVar[tuple[str, ...]] = ()
    #: How to get a model's files, said when they are missing (``{model}``: its name).
    install_hint: ClassVar[str] = ""

    def __init__(self, model: str, *, target_mpp: float, min_overlap_um: float) -> None:
        reason = missing_packages(*self.packages)
        found = self.model_path(model) if reason is None else None
        if found is None:
            reason = reason or self.model_missing(model)
            raise SegmenterUnavailableError(f"segmenter {self.name!r} is not available: {reason}")
        super().__init__(target_mpp=target_mpp, min_overlap_um=min_overlap_um)
        #: The model's file found by :meth:`model_path`.
        self.model_file: Path = found
        #: The model's name.
        self.model_name = str(model)

    #: The model's version, when the adapter knows it (None: unknown).
    model_version: ClassVar[str | None] = None

    @classmethod
    def weights_files(cls, model_file: Path) -> list[Path]:
        """Return the files that hold the model's weights (default: the model's file)."""
        return [model_file]

    @classmethod
    def describe(cls, model: str) -> Identity:
        """Return the identity of `model` as installed here (see :func:`identity_of`).

        ``weights_sha256`` is the SHA-256 of the weights file (of the names and hashes of
        the files, when there are several); None when the model is not installed.
        """
        found = cls.model_path(model) if missing_packages(*cls.packages) is None else None
        sha = None
        if found is not None:
            files = cls.weights_files(found)
            if len(files) == 1:
                sha = file_sha256(files[0])
            else:
                text = "".join(f"{p.name}:{file_sha256(p)}\n" for p in sorted(files))
                sha = hashlib.sha256(text.encode()).hexdigest()
        version = cls.model_version if found is not None else None
        return {"model": model, "model_version": version, "weights_sha256": sha}

    def identity(self) -> Identity:
        """Return the model this segmenter loaded (:func:`identity_of`)."""
        return {"segmenter": self.name, **self.describe(self.model_name)}

    @classmethod
    def model_files(cls, model: str) -> tuple[Path, str] | None:
        """Return the folder and the glob pattern (within it) of the model's file."""
        return None

    @classmethod
    def model_path(cls, model: str) -> Path | None:
        """Return the model's file on this machine (first match of :meth:`model_files`), or None."""
        where = cls.model_files(model)
        if where is None or not where[0].is_dir():
            return None
        found = sorted(p for p in where[0].glob(where[1]) if p.is_file())
        return found[0] if found else None

    @classmethod
    def model_missing(cls, model: str) -> str:
        """Say where the model's file was looked for, and how to get it."""
        where = cls.model_files(model)
        if where is None:
            return f"model {model!r} not found"
        hint = cls.install_hint.format(model=model)
        return f"model file {where[0] / where[1]} not found" + (f"; {hint}" if hint else "")

    @classmethod
    def missing_reason(cls, model: str) -> str | None:
        """Say what is missing (a package or the model's files), or return None."""
        reason = missing_packages(*cls.packages)
        if reason is None and cls.model_path(model) is None:
            reason = cls.model_missing(model)
        return reason


class _Adapted(SegmenterBase):
    """A user object with only ``predict`` and ``postprocess``, given the protocol's defaults.

    The one place where optional members are looked up: the pipeline itself reads the
    protocol's members directly.
    """

    def __init__(self, obj: Any) -> None:
        declared: dict[str, Any] = {}
        for cls in reversed(type(obj).__mro__):  # class attributes, inherited ones too
            declared.update(vars(cls))
        declared.update(getattr(obj, "__dict__", {}))
        super().__init__(
            target_mpp=float(declared.get("target_mpp", 0.5)),
            min_overlap_um=float(declared.get("min_overlap_um", 0.0)),
        )
        self._obj = obj
        self.name = str(declared.get("name", type(obj).__name__))
        self.input = declared.get("input", "brightfield")
        self.parallel_predict = bool(declared.get("parallel_predict", False))
        self.stains = declared.get("stains")
        self._prepare = declared.get("prepare")

    def identity(self) -> dict[str, Any]:
        """Return the object's own ``identity()`` when it has one, else its name."""
        own = getattr(self._obj, "identity", None)
        return {"segmenter": self.name, **(dict(own()) if callable(own) else {})}

    def prepare(self, reference: np.ndarray, *, mpp: float) -> None:
        """Call the object's own ``prepare(reference[, mpp=])`` when it has one."""
        if self._prepare is None:
            return
        try:
            takes_mpp = "mpp" in inspect.signature(self._obj.prepare).parameters
        except (TypeError, ValueError):  # builtins and C callables
            takes_mpp = False
        if takes_mpp:
            self._obj.prepare(reference, mpp=mpp)
        else:
            self._obj.prepare(reference)

    def predict(self, tiles: np.ndarray, *, mpp: float) -> np.ndarray:
        """Run the object's ``predict``."""
        return np.asarray(self._obj.predict(tiles, mpp=mpp))

    def postprocess(self, raw: np.ndarray, *, mpp: float) -> np.ndarray:
        """Run the object's ``postprocess``."""
        return np.asarray(self._obj.postprocess(raw, mpp=mpp))


def as_segmenter(obj: Any) -> Segmenter:
    """Return `obj` as a :class:`Segmenter`.

    Objects implementing the whole protocol are returned as they are; an object with only
    ``predict`` and ``postprocess`` (and optionally ``prepare(reference)``, ``target_mpp``,
    ``min_overlap_um``, ``name``, ``input``, ``stains`` as class or instance attributes)
    is wrapped with the protocol's defaults (0.5 µm/px, no overlap, brightfield).

    Raises
    ------
    TypeError
        If `obj` has no ``predict`` or ``postprocess`` method.
    """
    if isinstance(obj, Segmenter):
        return obj
    for attr in ("predict", "postprocess"):
        if not callable(getattr(obj, attr, None)):
            raise TypeError(f"segmenter: expected a name or an object with {attr}(), got {obj!r}")
    return _Adapted(obj)
