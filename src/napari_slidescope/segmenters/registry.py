"""The segmenter registry: name -> adapter module, and ``"auto"``.

Every entry names the module that holds an adapter, the input it reads, its working
resolution and the options its module's ``create`` gets. An adapter module has two
functions: ``missing_reason(**options) -> str | None`` (cheap, imports no heavy package:
None when usable, else what is missing) and ``create(**options, **kwargs) -> Segmenter``.
Adding a segmenter = one module + one line in :data:`_BUILTIN_ENTRIES`.

Learned adapters are listed by :func:`available_segmenters` only when their package is
installed *and* their model files are already on disk: nothing is ever downloaded.
"""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from napari_slidescope.segmenters.base import (
    IDENTITY_KEYS,
    INPUTS,
    Input,
    Segmenter,
    SegmenterInfoWarning,
    SegmenterUnavailableError,
    as_segmenter,
    identity_of,
)

__all__ = [
    "AUTO",
    "SegmenterEntry",
    "auto_choices",
    "auto_note",
    "available_segmenters",
    "get_segmenter",
    "missing_reason",
    "register_segmenter",
    "registered_segmenters",
    "resolve_auto",
    "segmenter_identity",
    "segmenter_input",
    "segmenter_target_mpp",
]

#: The name that picks the best installed segmenter for the image (:func:`resolve_auto`).
AUTO = "auto"


@dataclass(frozen=True)
class SegmenterEntry:
    """One registered segmenter.

    Attributes
    ----------
    module : str
        Adapter module (``missing_reason`` and ``create``), or "" with `factory`.
    input : {"brightfield", "fluorescence"}
        What it reads.
    target_mpp : float
        Default working resolution (µm/px), known without creating the segmenter.
    options : dict
        Fixed keyword arguments of the module's ``create`` / ``missing_reason``.
    factory, check, identity : callable, optional
        For segmenters registered at run time with :func:`register_segmenter`.
    """

    module: str
    input: Input
    target_mpp: float
    options: dict[str, Any] = field(default_factory=dict)
    factory: Callable[..., Any] | None = None
    check: Callable[[], str | None] | None = None
    identity: Callable[[], dict[str, Any]] | None = None


_PKG = "napari_slidescope.segmenters."
_BUILTIN_ENTRIES: dict[str, SegmenterEntry] = {
    "builtin": SegmenterEntry(_PKG + "builtin", "brightfield", 0.25),
    "builtin-fluorescence": SegmenterEntry(_PKG + "builtin_fluorescence", "fluorescence", 0.5),
    "instanseg": SegmenterEntry(
        _PKG + "instanseg", "brightfield", 0.5, {"model": "brightfield_nuclei"}
    ),
    "instanseg-fluorescence": SegmenterEntry(
        _PKG + "instanseg", "fluorescence", 0.5, {"model": "fluorescence_nuclei_and_cells"}
    ),
    "stardist": SegmenterEntry(_PKG + "stardist", "brightfield", 0.25),
    "cellpose": SegmenterEntry(_PKG + "cellpose", "brightfield", 0.5),
}
_REGISTRY: dict[str, SegmenterEntry] = dict(_BUILTIN_ENTRIES)

#: ``"auto"``: the learned model for each input when installed, else the built-in one.
_AUTO_CHOICES: dict[Input, tuple[str, str]] = {
    "brightfield": ("instanseg", "builtin"),
    "fluorescence": ("instanseg-fluorescence", "builtin-fluorescence"),
}


def register_segmenter(
    name: str,
    factory: Callable[..., Any],
    *,
    check: Callable[[], str | None] | None = None,
    target_mpp: float = 0.5,
    input: Input = "brightfield",
    identity: Callable[[], dict[str, Any]] | None = None,
) -> None:
    """Register a segmenter factory under a name at run time (plugins, tests).

    Parameters
    ----------
    name : str
        Registry key.
    factory : callable
        ``factory(**kwargs)`` returns a :class:`Segmenter` (or an object with ``predict``
        and ``postprocess``, see :func:`~napari_slidescope.segmenters.as_segmenter`).
    check : callable, optional
        Returns None when usable, otherwise a sentence saying what is missing.
    target_mpp : float
        Default working resolution in µm/px.
    input : {"brightfield", "fluorescence"}
        What it reads.
    identity : callable, optional
        Returns the ``model``, ``model_version`` and ``weights_sha256`` of what `factory`
        would load (see :func:`segmenter_identity`), as the objects it makes say through
        their ``identity()`` method. Without it only the name identifies the segmenter;
        a batch ``resume`` then redoes slides whose recorded model says more.
    """
    if input not in INPUTS:
        raise ValueError(f"input must be one of {INPUTS}; got {input!r}")
    _REGISTRY[name] = SegmenterEntry("", input, float(target_mpp), {}, factory, check, identity)


def _entry(name: str) -> SegmenterEntry:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise KeyError(
            f"segmenter: unknown name {name!r}; registered: {sorted(_REGISTRY)} or 'auto'"
        ) from None


def missing_reason(name: str) -> str | None:
    """Why a registered segmenter cannot be used, or None when it can (always for "auto").

    Raises
    ------
    KeyError
        If no segmenter has this name.
    """
    if name == AUTO:  # always: it falls back on the built-in methods
        return None
    entry = _entry(name)
    if entry.factory is not None:
        return entry.check() if entry.check is not None else None
    module = importlib.import_module(entry.module)
    reason: str | None = module.missing_reason(**entry.options)
    return reason


def available_segmenters(input: Input | None = None) -> list[str]:
    """Names of the segmenters usable here (package and model files present).

    Parameters
    ----------
    input : {"brightfield", "fluorescence"}, optional
        Only those reading this kind of image.
    """
    return [
        name
        for name, entry in _REGISTRY.items()
        if (input is None or entry.input == input) and missing_reason(name) is None
    ]


def registered_segmenters() -> list[str]:
    """Every registered name, installed or not, in the order registered (without "auto")."""
    return list(_REGISTRY)


def segmenter_identity(segmenter: Any) -> dict[str, Any]:
    """Return what model a segmenter runs, as installed here: :data:`~.base.IDENTITY_KEYS`.

    Two runs whose identities differ were computed by different models; results,
    manifests and parameter hashes record it, so that nothing computed by one model is
    kept or mixed with results of another.

    Parameters
    ----------
    segmenter : str or Segmenter
        A registered name (read from the installed model files, without creating the
        segmenter; ``"auto"`` must be resolved first with :func:`resolve_auto`) or a
        segmenter object (:func:`~.base.identity_of`).

    Returns
    -------
    dict
        ``segmenter`` (the name), ``model``, ``model_version`` and ``weights_sha256``
        (None for the built-in methods, and for a model not installed).

    Raises
    ------
    KeyError
        If no segmenter has this name.
    ValueError
        For ``"auto"``.
    """
    if not isinstance(segmenter, str):
        return identity_of(as_segmenter(segmenter))
    if segmenter == AUTO:
        raise ValueError('segmenter_identity: resolve "auto" first (resolve_auto)')
    entry = _entry(segmenter)
    out: dict[str, Any] = dict.fromkeys(IDENTITY_KEYS)
    describe: Any = entry.identity
    if entry.factory is None:
        module = importlib.import_module(entry.module)
        describe = getattr(module, "identity", None)
        describe = None if describe is None else partial(describe, **entry.options)
    if describe is not None:
        out.update({k: v for k, v in describe().items() if k in out})
    out["segmenter"] = segmenter
    return out


def segmenter_target_mpp(name: str) -> float:
    """Default working resolution (µm/px) of a registered segmenter.

    Raises
    ------
    KeyError
        If no segmenter has this name.
    """
    return _entry(name).target_mpp


def segmenter_input(name: str) -> Input:
    """Return what a registered segmenter reads: ``"brightfield"`` or ``"fluorescence"``.

    Raises
    ------
    KeyError
        If no segmenter has this name.
    """
    return _entry(name).input


def auto_choices(input: Input) -> tuple[str, str]:
    """Return the learned and the built-in segmenter ``"auto"`` chooses between for `input`."""
    if input not in INPUTS:
        raise ValueError(f"input must be one of {INPUTS}; got {input!r}")
    return _AUTO_CHOICES[input]


def resolve_auto(input: Input, *, warn: bool = True) -> str:
    """Name the segmenter ``"auto"`` runs on an image of kind `input`.

    The learned model for that kind when it is installed, else the built-in method; in
    that case one :class:`SegmenterInfoWarning` says which ran and how to install the
    better one (``warn=False`` leaves it out, e.g. to show the choice in a widget).

    Parameters
    ----------
    input : {"brightfield", "fluorescence"}
        The kind of image.

    Returns
    -------
    str
        A registered name.
    """
    learned, builtin = auto_choices(input)
    note = auto_note(input)
    if note is None:
        return learned
    if warn:
        warnings.warn(note, SegmenterInfoWarning, stacklevel=3)
    return builtin


def auto_note(input: Input) -> str | None:
    """Return what :func:`resolve_auto` warns for `input` (None: the learned model is here).

    The batch engine resolves ``"auto"`` on its workers without a warning and says this
    once per run instead.
    """
    learned, builtin = auto_choices(input)
    reason = missing_reason(learned)
    if reason is None:
        return None
    return (
        f'segmenter="auto": ran the built-in {input} method ({builtin!r}); the more '
        f"accurate {learned!r} is not installed: {reason}"
    )


def get_segmenter(name: str, **kwargs: Any) -> Segmenter:
    """Create a segmenter by name.

    Parameters
    ----------
    name : str
        One of :func:`available_segmenters`.
    **kwargs
        Passed to the segmenter's constructor (e.g. ``target_mpp``).

    Returns
    -------
    Segmenter

    Raises
    ------
    SegmenterUnavailableError
        If the segmenter's package or model file is missing (the message says which).
    KeyError
        If no segmenter has this name.
    """
    entry = _entry(name)
    reason = missing_reason(name)
    if reason is not None:
        raise SegmenterUnavailableError(f"segmenter {name!r} is not available: {reason}")
    if entry.factory is not None:
        return as_segmenter(entry.factory(**kwargs))
    module = importlib.import_module(entry.module)
    return as_segmenter(module.create(**entry.options, **kwargs))
