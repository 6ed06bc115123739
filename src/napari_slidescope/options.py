"""The options of each analysis step, as one typed value: defined, documented and checked once.

Every way of running an analysis builds one of these and passes it on: the API entry points
(:func:`~napari_slidescope.pipeline.tissue.detect_tissue`,
:func:`~napari_slidescope.pipeline.nuclei.segment_nuclei`), the dock widget's fields and
remembered settings, the viewer's jobs, :func:`~napari_slidescope.batch.analyze_slides` and
the ``slidescope batch`` command line. So a default is written in one place (here), a
parameter has one name everywhere, a bad value gets the same message from every entry point,
and the digest that ``--resume`` and "Add (skip duplicates)" compare is computed from the
same value the run used.

Each field carries its documentation, unit and bounds (:class:`OptionInfo`, in the field's
metadata): the CLI builds its flags from them (:func:`option_fields`) and the widget its
spin boxes and menus. Only options that change what is computed belong here; how a run is
executed (worker threads, progress callbacks, the cluster) stays with the function that
runs it.

Classification has no options class here: its options object is
:class:`~napari_slidescope.pipeline.cell_classes.PhenotypeRules`, already frozen, checked
once (``PhenotypeRules.of``), saved and loaded as JSON, and taken whole by
:func:`~napari_slidescope.pipeline.cell_classes.classify_cells`. A ``ClassifyOptions`` beside
it would be a second copy of the same rules; what classification adds to a digest is the
rules' JSON.

Entry points take an options object and, for its fields, keywords applied on top of it
(:meth:`NucleiOptions.merged`: a keyword wins over the same field of the object).

Examples
--------
>>> from napari_slidescope.options import NucleiOptions, TissueOptions
>>> NucleiOptions(tile_size_um=256).tile_size_um
256.0
>>> NucleiOptions(stain="HE")
Traceback (most recent call last):
...
ValueError: stain: expected one of 'auto', 'H&E', 'H-DAB', got 'HE'
>>> TissueOptions().replace(min_tissue_um2=1e4).min_tissue_um2
10000.0
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import numbers
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, TypeVar

__all__ = [
    "FrozenMapping",
    "NucleiOptions",
    "OptionInfo",
    "RegionsOptions",
    "TilesOptions",
    "TissueOptions",
    "canonical_json",
    "option_fields",
]

_O = TypeVar("_O", bound="_Options")

#: Metadata key of a field's :class:`OptionInfo`.
_KEY = "slidescope"


@dataclass(frozen=True)
class OptionInfo:
    """What a user needs to know of one option, and what values it takes.

    Attributes
    ----------
    doc : str
        One-line description (the CLI's help and the widget's tooltip).
    kind : {"float", "int", "str", "bool"}
        Type of a set value (ints are accepted for floats and stored as floats).
    unit : str, optional
        Physical unit shown after the value (``"µm"``, ``"µm/px"``, ``"µm²"``).
    optional : bool
        None is allowed and means "automatic" (documented in `doc`).
    positive : bool
        A set number must be finite and > 0.
    low, high : float, optional
        Inclusive bounds of a set number.
    choices : tuple of str, optional
        The allowed strings.
    label : str
        The widget's label.
    """

    doc: str
    kind: Literal["float", "int", "str", "bool"]
    unit: str | None = None
    optional: bool = False
    positive: bool = False
    low: float | None = None
    high: float | None = None
    choices: tuple[str, ...] | None = None
    label: str = ""

    def expected(self) -> str:
        """Describe the values this option accepts, for error messages."""
        if self.choices is not None:
            text = "one of " + ", ".join(repr(c) for c in self.choices)
        elif self.kind == "bool":
            text = "True or False"
        elif self.kind == "str":
            text = "a string"
        else:
            text = "a number" if self.kind == "float" else "a whole number"
            if self.positive:
                text = "a positive " + text.split(" ", 1)[1]
            if self.low is not None and self.high is not None:
                text += f" in [{self.low:g}, {self.high:g}]"
            elif self.low is not None:
                text += f" >= {self.low:g}"
            if self.unit:
                text += f" of {self.unit}"
        return text + (" or None" if self.optional else "")

    def check(self, name: str, value: Any) -> Any:
        """Return `value` normalised (ints and numpy numbers as Python floats or ints), or raise.

        Raises
        ------
        ValueError
            ``"{name}: expected {what}, got {value!r}"``.
        """
        if value is None and self.optional:
            return None
        bad = ValueError(f"{name}: expected {self.expected()}, got {value!r}")
        if self.kind == "bool":
            if not isinstance(value, bool):
                raise bad
            return value
        if self.kind == "str":
            if not isinstance(value, str) or (
                self.choices is not None and value not in self.choices
            ):
                raise bad
            return value
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise bad  # (numpy numbers are Real; numpy bools are not)
        real = float(value)
        if self.kind == "int" and not real.is_integer():
            raise bad
        if self.kind == "float":
            number: float = real
        else:
            number = int(value) if isinstance(value, numbers.Integral) else int(real)
        if not math.isfinite(number) or (self.positive and not number > 0):
            raise bad
        if (self.low is not None and number < self.low) or (
            self.high is not None and number > self.high
        ):
            raise bad
        return number


class FrozenMapping(Mapping[str, Any]):
    """A read-only mapping that pickles (options travel to dask workers) and compares as a dict."""

    __slots__ = ("_data",)

    def __init__(self, data: Mapping[str, Any] | None = None) -> None:
        self._data = dict(data or {})

    def __getitem__(self, key: str) -> Any:
        return self._data[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __repr__(self) -> str:
        return repr(self._data)

    def __reduce__(self) -> tuple[Any, ...]:
        return (FrozenMapping, (self._data,))

    def __hash__(self) -> int:
        return hash(canonical_json(self._data))


def _option(default: Any, info: OptionInfo) -> Any:
    return field(default=default, metadata={_KEY: info})


def option_fields(cls: type[_Options]) -> Iterator[tuple[str, Any, OptionInfo]]:
    """Yield ``(name, default, info)`` of each documented option of an options class.

    The CLI and the widget build their flags and fields from this, so neither repeats a
    default, a bound or a help text.
    """
    for f in dataclasses.fields(cls):
        info = f.metadata.get(_KEY)
        if info is not None:
            yield f.name, f.default, info


def canonical_json(value: Any) -> str:
    """JSON with sorted keys and no spaces: the text digests are computed from."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


@dataclass(frozen=True)
class _Options:
    """Base of the option classes: checking, replacing, JSON and digest."""

    #: Name used in messages about the whole object (``"NucleiOptions"``).
    _what: ClassVar[str] = "options"

    def __post_init__(self) -> None:
        for name, _default, info in option_fields(type(self)):
            object.__setattr__(self, name, info.check(name, getattr(self, name)))

    @classmethod
    def from_mapping(cls: type[_O], values: Mapping[str, Any], *, where: str = "") -> _O:
        """Build from a mapping (settings, JSON, keyword arguments); unknown keys are refused.

        Raises
        ------
        ValueError
            Naming the unknown keys and the known ones, prefixed by `where`.
        """
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            prefix = f"{where}: " if where else ""
            raise ValueError(
                f"{prefix}unknown {cls.__name__} option(s) {unknown}; expected some of "
                f"{sorted(known)}"
            )
        return cls(**dict(values))

    @classmethod
    def merged(cls: type[_O], options: _O | None, changes: Mapping[str, Any], *, where: str) -> _O:
        """Return `options` (default ``cls()``) with the keyword `changes` applied on top.

        How the entry points combine ``options=`` with keywords naming fields
        (``detect_tissue(slide, options=opts, target_mpp=4)``): a keyword wins over the
        same field of `options`, as in :meth:`replace`.

        Raises
        ------
        TypeError
            If `options` is not a `cls`, or a keyword is not one of its fields (naming
            them, prefixed by `where`, the calling function).
        ValueError
            For a bad value (the field's message).
        """
        if options is None:
            options = cls()
        elif not isinstance(options, cls):
            raise TypeError(f"{where}: options: expected a {cls.__name__}, got {options!r}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(changes) - known)
        if unknown:
            raise TypeError(
                f"{where}() got unexpected keyword argument(s) {unknown}; the "
                f"{cls.__name__} fields are {sorted(known)}"
            )
        return options.replace(**changes) if changes else options

    def replace(self: _O, **changes: Any) -> _O:
        """Return a copy with `changes` applied (and checked)."""
        return dataclasses.replace(self, **changes)

    def as_dict(self) -> dict[str, Any]:
        """Return the options as JSON-ready values (what manifests and digests record)."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, Mapping):
                value = dict(value)
            out[f.name] = value
        return out

    def digest(self) -> str:
        """SHA-256 of :meth:`as_dict` as :func:`canonical_json`."""
        return hashlib.sha256(canonical_json(self.as_dict()).encode()).hexdigest()


@dataclass(frozen=True)
class TissueOptions(_Options):
    """Options of tissue detection (:func:`~napari_slidescope.pipeline.tissue.detect_tissue`).

    Attributes
    ----------
    target_mpp : float
        Working resolution, µm/px: the level nearest to it is read and, when finer,
        reduced by the whole factor that comes nearest it (a level at 4.04 µm/px: 2, for
        8.09 µm/px), in the DCT domain where the level is JPEG.
    mode : {"auto", "brightfield", "fluorescence"}
        ``"auto"`` takes fluorescence when the metadata say so or the image is very dark.
    threshold : float or None
        Manual feature threshold in [0, 1]; None: automatic.
    smooth_um : float or None
        Smoothing sigma, µm; None: the mode's default.
    min_tissue_um2 : float
        Tissue pieces smaller than this are dropped, µm².
    max_hole_um2 : float
        Holes smaller than this are filled, µm².
    outer_only : bool
        Fill every hole; polygons are outer contours only.
    reject_artifacts : bool
        Brightfield: drop pen marks and near-black debris.
    """

    _what: ClassVar[str] = "tissue options"

    target_mpp: float = _option(
        8.0,
        OptionInfo(
            "tissue working resolution",
            "float",
            unit="µm/px",
            positive=True,
            label="Tissue resolution",
        ),
    )
    mode: str = _option(
        "auto",
        OptionInfo(
            "stain mode of tissue detection ('auto': from the metadata and the image)",
            "str",
            choices=("auto", "brightfield", "fluorescence"),
            label="Tissue mode",
        ),
    )
    threshold: float | None = _option(
        None,
        OptionInfo(
            "manual feature threshold (default: automatic)",
            "float",
            optional=True,
            low=0.0,
            high=1.0,
            label="Tissue threshold",
        ),
    )
    smooth_um: float | None = _option(
        None,
        OptionInfo(
            "smoothing sigma (default: the mode's)",
            "float",
            unit="µm",
            optional=True,
            positive=True,
            label="Smoothing",
        ),
    )
    min_tissue_um2: float = _option(
        2_500.0,
        OptionInfo(
            "tissue pieces smaller than this are dropped",
            "float",
            unit="µm²",
            low=0.0,
            label="Min. tissue piece",
        ),
    )
    max_hole_um2: float = _option(
        1_000.0,
        OptionInfo(
            "holes smaller than this are filled",
            "float",
            unit="µm²",
            low=0.0,
            label="Fill holes up to",
        ),
    )
    outer_only: bool = _option(
        False,
        OptionInfo("fill every hole: outer contours only", "bool", label="Outer only"),
    )
    reject_artifacts: bool = _option(
        True,
        OptionInfo(
            "brightfield: drop pen marks and near-black debris",
            "bool",
            label="Reject artifacts",
        ),
    )


@dataclass(frozen=True)
class NucleiOptions(_Options):
    """Options of nuclei segmentation (:func:`~napari_slidescope.pipeline.nuclei.segment_nuclei`).

    Attributes
    ----------
    segmenter : str
        ``"auto"`` (the learned model for the image's kind when installed, else the
        built-in method for it) or a name from
        :func:`~napari_slidescope.segmenters.available_segmenters`. A brightfield
        segmenter on a multichannel fluorescence slide (or the reverse) is refused with the
        names of the right ones; on an RGB-encoded fluorescence scan it runs with a
        warning. (The entry points also take a segmenter object as ``segmenter=``; that
        object is not an option: the options then record its name.)
    target_mpp : float or None
        Working resolution, µm/px; None: :func:`~napari_slidescope.segmenters.working_mpp`,
        the segmenter's own, or the slide's pixel size when that is coarser (a 20x slide
        is not upsampled to 40x). An uncalibrated slide's pixels are taken to be at it
        (with an :class:`~napari_slidescope.segmenters.UncalibratedWarning`) unless the
        entry point's ``mpp`` is given.
    tile_size_um : float
        Side of the part of each tile it owns, µm (tiles add the segmenter's overlap).
    channel : int, str or None
        Nuclear channel of a fluorescence slide, by index or name; None: a channel named
        DAPI, Hoechst..., else the channel carrying the signal of an RGB-encoded scan.
    stain : {"auto", "H&E", "H-DAB"}
        Brightfield stain: the second stain vector is eosin (``eosin_od_mean``) or DAB
        (``dab_od_mean``, for IHC scoring with
        :func:`~napari_slidescope.pipeline.cell_classes.classify_cells`). ``"auto"``: what the
        slide's estimated vectors show (a pink or a brown second stain,
        :func:`~napari_slidescope.analysis.stains.stain_kind`).
    cell_expansion_um : float or None
        Grow each nucleus into a cell by up to this distance, µm, never into a neighbour
        (each pixel goes to the nearest nucleus, as QuPath's cell expansion). The result
        then has ``cells`` (or ``cell_outlines``) and the table gains ``cell_area_um2``,
        ``cytoplasm_area_um2`` and, per channel or stain, ``{name}_nucleus_mean``,
        ``{name}_cytoplasm_mean`` (cell minus nucleus) and ``{name}_cell_mean``
        (``CD3_cell_mean``, ``dab_od_cytoplasm_mean``); the nucleus-only names
        (``DAPI_mean``, ``hematoxylin_od_mean``) stay as they are. None: nuclei only.
    segmenter_options : mapping
        Keyword arguments of the constructor of a segmenter given by name (read-only once
        set).
    """

    _what: ClassVar[str] = "nuclei options"

    segmenter: str = _option(
        "auto",
        OptionInfo(
            "segmenter name ('auto': the learned model when installed, else built-in)",
            "str",
            label="Segmenter",
        ),
    )
    target_mpp: float | None = _option(
        None,
        OptionInfo(
            "nuclei working resolution (default: the segmenter's, never finer than the "
            "slide's pixels)",
            "float",
            unit="µm/px",
            optional=True,
            positive=True,
            label="Nuclei resolution",
        ),
    )
    tile_size_um: float = _option(
        512.0,
        OptionInfo(
            "side of the part of each tile it owns (tiles add the segmenter's overlap)",
            "float",
            unit="µm",
            positive=True,
            label="Tile size",
        ),
    )
    channel: int | str | None = field(default=None)
    stain: str = _option(
        "auto",
        OptionInfo(
            "brightfield stain ('auto': from the slide's estimated stain vectors)",
            "str",
            choices=("auto", "H&E", "H-DAB"),
            label="Stain",
        ),
    )
    cell_expansion_um: float | None = _option(
        None,
        OptionInfo(
            "grow each nucleus into a cell by up to this distance (default: nuclei only)",
            "float",
            unit="µm",
            optional=True,
            positive=True,
            label="Cell expansion",
        ),
    )
    segmenter_options: Mapping[str, Any] = field(default_factory=FrozenMapping)

    def __post_init__(self) -> None:
        super().__post_init__()
        channel = self.channel
        if not (
            channel is None
            or isinstance(channel, str)
            or (isinstance(channel, int) and not isinstance(channel, bool) and channel >= 0)
        ):
            raise ValueError(
                f"channel: expected a channel index >= 0, a channel name or None, got {channel!r}"
            )
        opts = self.segmenter_options
        if not isinstance(opts, Mapping) or not all(isinstance(k, str) for k in opts):
            raise ValueError(
                f"segmenter_options: expected a mapping of keyword names to values, got {opts!r}"
            )
        object.__setattr__(self, "segmenter_options", FrozenMapping(opts))


_ENVELOPE = OptionInfo("radius of the tissue gate's pale-tissue envelope", "float", "µm", low=0)


@dataclass(frozen=True)
class RegionsOptions(_Options):
    """Options of whole-slide tissue-region classification (the ``regions`` task).

    The classifier is the option: the file ``classifier.save(path)`` wrote
    (:func:`~napari_slidescope.load_region_classifier` reads it), and the SHA-256 of its
    content, so that a retrained classifier saved under the same name changes the
    parameters (and ``--resume`` redoes the regions, and only them).

    Attributes
    ----------
    classifier : str
        Path of the region classifier's file ("" before one is chosen).
    classifier_sha256 : str
        SHA-256 of the file's bytes (:meth:`of_file` fills it in).
    envelope_um : float
        Radius (µm) of the pale-tissue envelope of the tissue gate
        (:func:`~napari_slidescope.pipeline.region_map.regions_tissue`): fat open to the
        glass at a section's edge is classified, not skipped as glass; 0 gates by the
        tissue mask alone. Recorded, so a run gated otherwise never shares a digest.
    """

    _what: ClassVar[str] = "regions options"

    classifier: str = ""
    classifier_sha256: str = ""
    envelope_um: float = 64.0

    def __post_init__(self) -> None:
        super().__post_init__()
        # checked and made a float here (not a documented option: the ``--regions`` flag
        # and the dock take the classifier only), so 64 and 64.0 share one digest and a
        # negative or NaN radius fails when the options are made, not in a batch worker
        object.__setattr__(self, "envelope_um", _ENVELOPE.check("envelope_um", self.envelope_um))

    @classmethod
    def of_file(cls, path: str | os.PathLike[str]) -> RegionsOptions:
        """Return the options of the classifier in `path`, its content hashed.

        Raises
        ------
        FileNotFoundError
            If `path` is not a file (naming it).
        """
        p = os.path.abspath(os.fspath(path))
        if not os.path.isfile(p):
            raise FileNotFoundError(f"{p}: no such region classifier file")
        digest = hashlib.sha256()
        with open(p, "rb") as fh:
            for block in iter(lambda: fh.read(2**20), b""):
                digest.update(block)
        return cls(p, digest.hexdigest())


def _file_sha256(path: str) -> str:
    """SHA-256 of a file's bytes, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(2**20), b""):
            digest.update(block)
    return digest.hexdigest()


@dataclass(frozen=True)
class TilesOptions(_Options):
    """Options of the ``tiles`` task: tissue tiles at a stated µm/px, optionally embedded.

    The tiling is :func:`~napari_slidescope.tiles.tile_slide`'s and the embedding
    :func:`~napari_slidescope.tiles.embed_tiles`'. The model is a file of the user's (ONNX
    or TorchScript) recorded with the SHA-256 of its content, so a model re-exported under
    the same name changes the parameters and ``--resume`` redoes the tiles and embeddings,
    and only them.

    Attributes
    ----------
    tile_um : float
        Tile side in µm.
    mpp : float
        µm/px the tiles are delivered at.
    overlap_um : float
        Overlap of neighbouring tiles in µm (smaller than `tile_um`).
    min_tissue : float
        Fraction of a tile that must be tissue for it to be kept.
    model : str
        Path of the model file that embeds the tiles ("": tiles only, no embeddings).
    model_sha256 : str
        SHA-256 of the model file's bytes (:meth:`with_model` fills it in).
    embed_batch : int
        Tiles per model call.
    """

    _what: ClassVar[str] = "tiles options"

    tile_um: float = _option(
        112.0,
        OptionInfo("tile side", "float", unit="µm", positive=True, label="Tile size"),
    )
    mpp: float = _option(
        0.5,
        OptionInfo(
            "resolution the tiles are delivered at (resampled exactly from a finer level)",
            "float",
            unit="µm/px",
            positive=True,
            label="Tile resolution",
        ),
    )
    overlap_um: float = _option(
        0.0,
        OptionInfo("overlap of neighbouring tiles", "float", unit="µm", low=0.0, label="Overlap"),
    )
    min_tissue: float = _option(
        0.5,
        OptionInfo(
            "fraction of a tile that must be tissue for it to be kept",
            "float",
            low=0.0,
            high=1.0,
            label="Minimum tissue",
        ),
    )
    model: str = _option(
        "",
        OptionInfo(
            "embed each tile with this model file (.onnx, or TorchScript .pt); its SHA-256 "
            "is in the parameters (default: tiles only)",
            "str",
            label="Model",
        ),
    )
    model_sha256: str = ""
    embed_batch: int = _option(
        32,
        OptionInfo("tiles per model call", "int", positive=True, label="Batch size"),
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.overlap_um >= self.tile_um:
            raise ValueError(
                f"overlap_um: expected less than tile_um ({self.tile_um:g} µm), "
                f"got {self.overlap_um:g}"
            )
        if self.model and not self.model_sha256:
            object.__setattr__(self, "model", os.path.abspath(self.model))
            if not os.path.isfile(self.model):
                raise FileNotFoundError(f"{self.model}: no such model file")
            object.__setattr__(self, "model_sha256", _file_sha256(self.model))

    def replace(self, **changes: Any) -> TilesOptions:
        """Return a copy with `changes` applied; a new `model` is hashed again."""
        if "model" in changes and "model_sha256" not in changes:
            changes["model_sha256"] = ""
        return dataclasses.replace(self, **changes)

    def model_changed(self) -> bool:
        """Whether the model file's content is no longer the one hashed (or it is gone)."""
        if not self.model:
            return False
        return not os.path.isfile(self.model) or _file_sha256(self.model) != self.model_sha256
