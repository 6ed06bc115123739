"""The "Slide analysis" widget's settings: what they are, their defaults, where they are kept.

:class:`WidgetSettings` is the widget's own choices (task, scope, what a nuclei run does
with the layer, worker threads) beside a
:class:`~napari_slidescope.options.TissueOptions` and a
:class:`~napari_slidescope.options.NucleiOptions`: the options model defines, documents
and checks every analysis option once, and the widget only shows it. The built-in
segmenter's nucleus area range travels in ``NucleiOptions.segmenter_options``.

They are remembered between sessions in Qt's per-user settings file
(:func:`settings_store`): the widget's choices under their names, each option under
``tissue/<name>`` / ``nuclei/<name>``, the built-in segmenter's under ``builtin/<name>``.
Settings saved by earlier versions under flat keys (``tissue_mpp``, ``nuclei_mpp``,
``tile_size_um``...) still load (:data:`LEGACY_KEYS`).
"""

from __future__ import annotations

import dataclasses
import errno
import os
import shutil
from dataclasses import dataclass, field
from typing import Any, TypeVar

from qtpy.QtCore import QSettings

from napari_slidescope._napari.jobs import NucleiRun
from napari_slidescope.options import (
    NucleiOptions,
    TissueOptions,
    option_fields,
)

__all__ = [
    "BUILTIN",
    "LEGACY_KEYS",
    "SETTINGS_GROUP",
    "WidgetSettings",
    "builtin_defaults",
    "default_settings",
    "read_settings",
    "settings_error",
    "settings_store",
    "write_settings",
]

#: The group of the settings file the widget's keys live in.
SETTINGS_GROUP = "slide_analysis"
#: The registered name of the built-in segmenter, whose area range the widget shows.
BUILTIN = "builtin"
#: Keys of settings saved before the options model, and the keys they now are.
LEGACY_KEYS = {
    "segmenter": "nuclei/segmenter",
    "nuclei_mpp": "nuclei/target_mpp",  # 0.0 then meant "auto", now None
    "tile_size_um": "nuclei/tile_size_um",
    "min_area_um2": "builtin/min_area_um2",
    "max_area_um2": "builtin/max_area_um2",
    "tissue_mpp": "tissue/target_mpp",
    "min_tissue_um2": "tissue/min_tissue_um2",
    "max_hole_um2": "tissue/max_hole_um2",
    "tissue_mode": "tissue/mode",
}

_O = TypeVar("_O", TissueOptions, NucleiOptions)


def builtin_defaults() -> dict[str, float]:
    """Return the built-in segmenter's nucleus area range (µm²), its documented defaults."""
    from napari_slidescope.analysis.brightfield_nuclei import NucleiParams

    params = NucleiParams()
    return {"min_area_um2": params.min_area_um2, "max_area_um2": params.max_area_um2}


def _default_nuclei() -> NucleiOptions:
    return NucleiOptions(segmenter_options=builtin_defaults())


@dataclass(frozen=True)
class WidgetSettings:
    """The widget's parameters (physical units), as remembered between sessions.

    Attributes
    ----------
    task : {"tissue", "nuclei"}
    scope : {"visible", "slide", "shape"}
    mode : {"add", "replace"}
        What a nuclei run does with the nuclei already found.
    workers : int
        Worker threads (0: all cores but one).
    tissue : TissueOptions
        Tissue detection's options.
    nuclei : NucleiOptions
        Nuclei segmentation's options; ``segmenter_options`` holds the built-in
        segmenter's area range, used when that segmenter runs (:meth:`nuclei_run`).
    """

    task: str = "nuclei"
    scope: str = "visible"
    mode: str = "add"
    workers: int = 0
    tissue: TissueOptions = field(default_factory=TissueOptions)
    nuclei: NucleiOptions = field(default_factory=_default_nuclei)

    def nuclei_run(self) -> NucleiRun:
        """Return what a nuclei run takes: the options and the worker threads.

        The built-in's area range stays in the options only when the built-in segmenter
        runs; 0 workers become None (automatic).
        """
        options = self.nuclei
        if options.segmenter != BUILTIN:
            options = options.replace(segmenter_options={})
        return NucleiRun(options, workers=self.workers or None)


def default_settings() -> WidgetSettings:
    """Return the defaults: the options model's, and the built-in segmenter's area range."""
    return WidgetSettings()


def settings_error(path: str) -> OSError:
    """Why Qt could not write the settings file `path` (it reports no errno itself)."""
    folder = os.path.dirname(path) or "."
    while folder and not os.path.isdir(folder):
        folder = os.path.dirname(folder)
    try:
        full = shutil.disk_usage(folder).free == 0
    except OSError:
        full = False
    if full:
        return OSError(
            errno.ENOSPC, f"cannot write {path}: No space left on device (the disk is full)"
        )
    if not os.access(folder, os.W_OK):
        return PermissionError(errno.EACCES, f"cannot write {path}: permission denied")
    return OSError(errno.EIO, f"cannot write {path}: Qt could not save the settings file")


def settings_store() -> QSettings:
    """Qt's per-user settings file of this plugin (INI; tests move it with ``setPath``)."""
    return QSettings(
        QSettings.Format.IniFormat,
        QSettings.Scope.UserScope,
        "napari-slidescope",
        "slide-analysis",
    )


# -- reading and writing --------------------------------------------------------------------


def _parse(raw: object, kind: str) -> float | int | bool | str:
    """Convert a value as the INI file gives it back (text) to the option's type."""
    if kind == "bool":
        if isinstance(raw, bool):
            return raw
        text = str(raw).strip().lower()
        if text not in ("true", "false", "1", "0"):
            raise ValueError(f"expected true or false, got {raw!r}")
        return text in ("true", "1")
    if kind == "float":
        return float(str(raw))
    if kind == "int":
        return int(str(raw))
    return str(raw)


def _stored(store: QSettings, key: str) -> object:
    """Return the value of `key`, else of the legacy key it replaced, else None."""
    if store.contains(key):
        return store.value(key)
    for old, new in LEGACY_KEYS.items():
        if new == key and store.contains(old):
            value = store.value(old)
            if key == "nuclei/target_mpp" and _is_zero(value):
                return ""  # the old "auto"
            return value
    return None


def _is_zero(value: object) -> bool:
    try:
        return float(str(value)) == 0.0
    except (TypeError, ValueError):
        return False


def _read_options(store: QSettings, prefix: str, default: _O) -> _O:
    """Each option saved under ``prefix/<name>``, checked; a bad or missing one: the default."""
    changes: dict[str, object] = {}
    for name, _default, info in option_fields(type(default)):
        raw = _stored(store, f"{prefix}/{name}")
        if raw is None:
            continue
        try:
            value = None if raw == "" and info.optional else _parse(raw, info.kind)
            changes[name] = info.check(name, value)
        except (TypeError, ValueError):
            continue  # an edited or outdated file: keep the default
    return default.replace(**changes)


def read_settings(store: QSettings) -> WidgetSettings:
    """Return the settings saved in `store` (the defaults for anything not saved or bad)."""
    d = default_settings()
    store.beginGroup(SETTINGS_GROUP)
    try:
        own: dict[str, Any] = {}
        for name in ("task", "scope", "mode", "workers"):
            raw = store.value(name, None)
            if raw is None:
                continue
            try:
                own[name] = type(getattr(d, name))(raw)
            except (TypeError, ValueError):
                pass
        tissue = _read_options(store, "tissue", d.tissue)
        nuclei = _read_options(store, "nuclei", d.nuclei)
        builtin = dict(d.nuclei.segmenter_options)
        for name in builtin:
            raw = _stored(store, f"builtin/{name}")
            try:
                builtin[name] = float(str(raw)) if raw is not None else builtin[name]
            except (TypeError, ValueError):
                pass
    finally:
        store.endGroup()
    return dataclasses.replace(
        d, **own, tissue=tissue, nuclei=nuclei.replace(segmenter_options=builtin)
    )


def _write_options(store: QSettings, prefix: str, options: TissueOptions | NucleiOptions) -> None:
    for name, _default, _info in option_fields(type(options)):
        value = getattr(options, name)
        store.setValue(f"{prefix}/{name}", "" if value is None else value)


def write_settings(store: QSettings, settings: WidgetSettings) -> None:
    """Save `settings` in `store` (under today's keys; the legacy ones are dropped).

    Raises
    ------
    OSError
        ``cannot write PATH: CAUSE`` when the settings file cannot be written (a full
        disk, no permission); Qt writes it atomically, so the earlier file is kept.
    """
    store.beginGroup(SETTINGS_GROUP)
    for name in ("task", "scope", "mode", "workers"):
        store.setValue(name, getattr(settings, name))
    _write_options(store, "tissue", settings.tissue)
    _write_options(store, "nuclei", settings.nuclei)
    for name, value in settings.nuclei.segmenter_options.items():
        store.setValue(f"builtin/{name}", value)
    for old in LEGACY_KEYS:
        store.remove(old)
    store.endGroup()
    store.sync()
    if store.status() != QSettings.Status.NoError:
        raise settings_error(store.fileName())
