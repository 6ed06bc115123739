"""OME-Zarr (OME-NGFF 0.4 and 0.5) images, read with zarr.

NGFF 0.4 keeps its metadata at the top of the group's attributes (``multiscales``,
``omero``) in a zarr format 2 store; NGFF 0.5 keeps the same under ``attrs['ome']`` in a
zarr format 3 store (``zarr.json``). Both give:

* levels: ``multiscales[0].datasets`` in order (level 0 first), each a zarr array whose
  chunks are the native chunks the level reader decodes and caches;
* calibration: each dataset's ``scale`` transformation (times the multiscale's own, if
  any) on the y and x axes, in the axes' ``unit`` (micrometres, nanometres, ...);
* channels: the ``c`` axis with names and colours from ``omero.channels``; three uint8
  channels coloured red, green, blue (or named so, or without omero metadata) are shown
  as an RGB image, the way slide scanners' OME-Zarr exports (QuPath, bioformats2raw)
  store brightfield slides.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from napari_slidescope.errors import SlideError
from napari_slidescope.slide import _tiff
from napari_slidescope.slide._backend import BackendSlide
from napari_slidescope.slide.formats import PLAUSIBLE_MPP, FormatInfo, warn_uncalibrated
from napari_slidescope.slide.source import Source

#: Micrometres per NGFF (UDUNITS-2) length unit.
_UNIT_UM = {
    "angstrom": 1e-4,
    "picometer": 1e-6,
    "nanometer": 1e-3,
    "micrometer": 1.0,
    "micron": 1.0,
    "µm": 1.0,
    "um": 1.0,
    "millimeter": 1e3,
    "centimeter": 1e4,
    "meter": 1e6,
}

_RGB = ((1.0, 0.0, 0.0), (0.0, 1.0, 0.0), (0.0, 0.0, 1.0))


def _bad(path: str, problem: str) -> SlideError:
    return SlideError(path, f"is not a readable OME-Zarr image: {problem}")


def ngff_metadata(attrs: Mapping[str, Any]) -> tuple[Mapping[str, Any], str]:
    """Return (the NGFF metadata mapping, its version) from a group's attributes."""
    ome = attrs.get("ome")
    if isinstance(ome, Mapping) and "multiscales" in ome:
        return ome, str(ome.get("version", "0.5"))
    ms = attrs.get("multiscales")
    version = ""
    if isinstance(ms, list) and ms and isinstance(ms[0], Mapping):
        version = str(ms[0].get("version", ""))
    return attrs, version or "0.4"


def _axes(path: str, multiscale: Mapping[str, Any], ndim: int) -> list[tuple[str, str | None]]:
    """(name, unit) of each axis; NGFF <= 0.2 files have no axes (t, c, z, y, x)."""
    raw = multiscale.get("axes")
    if raw is None:
        names = "tczyx"[-ndim:] if ndim <= 5 else ""
        return [(n, None) for n in names]
    if not isinstance(raw, list):
        raise _bad(path, "multiscales[0].axes is not a list")
    out: list[tuple[str, str | None]] = []
    for ax in raw:
        if isinstance(ax, str):
            out.append((ax.lower(), None))
        elif isinstance(ax, Mapping) and isinstance(ax.get("name"), str):
            unit = ax.get("unit")
            out.append((ax["name"].lower(), unit if isinstance(unit, str) else None))
        else:
            raise _bad(path, f"multiscales[0].axes has an entry that is not an axis: {ax!r}")
    return out


def _scale(path: str, transforms: Any, ndim: int, where: str) -> list[float]:
    """Multiply the ``scale`` transformations of a list (ones when there are none)."""
    out = [1.0] * ndim
    if transforms is None:
        return out
    if not isinstance(transforms, list):
        raise _bad(path, f"{where}.coordinateTransformations is not a list")
    for t in transforms:
        if not isinstance(t, Mapping) or t.get("type") != "scale":
            continue
        values = t.get("scale")
        if not isinstance(values, list) or len(values) != ndim:
            raise _bad(path, f"{where} has a scale of {values!r} for {ndim} axes")
        try:
            out = [a * float(v) for a, v in zip(out, values, strict=True)]
        except (TypeError, ValueError):
            raise _bad(path, f"{where} has a non-numeric scale {values!r}") from None
    return out


def _hex_rgb(value: Any) -> tuple[float, float, float] | None:
    if not isinstance(value, str) or len(value.lstrip("#")) != 6:
        return None
    try:
        v = int(value.lstrip("#"), 16)
    except ValueError:
        return None
    return ((v >> 16 & 255) / 255, (v >> 8 & 255) / 255, (v & 255) / 255)


def _open_group(source: Source) -> Any:
    import zarr

    path = source.display
    if source.is_remote:
        source.filesystem()  # a URL whose fsspec backend is missing: the error names the extra
    options: dict[str, Any] = (
        {"storage_options": dict(source.storage_options)} if source.is_remote else {}
    )
    try:
        return zarr.open_group(store=source.target, mode="r", **options)
    except Exception as exc:
        local = not source.is_remote
        if local and not os.path.exists(source.target):
            raise SlideError(path, "does not exist") from exc
        if (
            local
            and os.path.isfile(os.path.join(source.target, "zarr.json"))
            and int(zarr.__version__.split(".")[0]) < 3
        ):
            raise _bad(
                path,
                "it is a zarr format 3 store (NGFF 0.5): reading it needs zarr >= 3, "
                f"this is zarr {zarr.__version__}",
            ) from exc
        problem = source.scrub(_tiff.describe_exception(exc))
        raise _bad(path, f"no zarr group ({problem})") from exc


def open_ngff(source: Source) -> BackendSlide:
    """Open an OME-Zarr image (its first multiscale; local or an fsspec URL).

    Raises
    ------
    SlideError
        Naming the path (a URL without credentials) and what is wrong: no group, no or
        broken ``multiscales`` metadata, a dataset that is missing or not an array,
        levels of different rank.
    """
    path = source.display
    group = _open_group(source)
    try:
        attrs = dict(group.attrs)
    except Exception as exc:
        raise _bad(
            path, f"its attributes cannot be read ({_tiff.describe_exception(exc)})"
        ) from exc
    meta, version = ngff_metadata(attrs)
    multiscales = meta.get("multiscales")
    if multiscales is None:
        raise _bad(path, "the group has no 'multiscales' metadata")
    if not isinstance(multiscales, list) or not multiscales:
        raise _bad(path, "'multiscales' is not a non-empty list")
    ms = multiscales[0]
    if not isinstance(ms, Mapping):
        raise _bad(path, "multiscales[0] is not an object")
    datasets = ms.get("datasets")
    if not isinstance(datasets, list) or not datasets:
        raise _bad(path, "multiscales[0].datasets is missing or empty")
    arrays: list[Any] = []
    for i, ds in enumerate(datasets):
        if not isinstance(ds, Mapping) or not isinstance(ds.get("path"), str):
            raise _bad(path, f"multiscales[0].datasets[{i}] has no 'path'")
        try:
            node = group[ds["path"]]
        except Exception:
            raise _bad(
                path, f"multiscales[0].datasets[{i}]: no array at path {ds['path']!r}"
            ) from None
        if not hasattr(node, "chunks") or not hasattr(node, "dtype"):
            raise _bad(path, f"multiscales[0].datasets[{i}]: {ds['path']!r} is not an array")
        arrays.append(node)
    ndim = arrays[0].ndim
    if any(a.ndim != ndim for a in arrays):
        raise _bad(path, f"levels differ in rank: {[a.ndim for a in arrays]}")
    axes = _axes(path, ms, ndim)
    if len(axes) != ndim:
        raise _bad(path, f"multiscales[0].axes names {len(axes)} axes for {ndim}-D arrays")
    names = [n for n, _ in axes]
    if "y" not in names or "x" not in names:
        raise _bad(path, f"no y and x axes (axes {names})")
    extra = [n for n, _ in axes if n not in ("c", "y", "x")]
    notes: list[str] = []
    big = [n for n in extra if arrays[0].shape[names.index(n)] > 1]
    if big:
        notes.append(f"axes {big} (only index 0 of each is shown)")
    shapes = [tuple(int(v) for v in a.shape) for a in arrays]
    yi, xi = names.index("y"), names.index("x")
    for i in range(1, len(shapes)):
        if shapes[i][yi] > shapes[i - 1][yi] or shapes[i][xi] > shapes[i - 1][xi]:
            raise _bad(path, f"level {i} ({shapes[i]}) is larger than level {i - 1}")
    info = FormatInfo("ome-zarr")
    info.properties = {"ngff_version": version, "name": str(ms.get("name", ""))}
    scale0 = _scale(path, datasets[0].get("coordinateTransformations"), ndim, "datasets[0]")
    outer = _scale(path, ms.get("coordinateTransformations"), ndim, "multiscales[0]")
    units = {n: u for n, u in axes}
    if units.get("y") and units.get("x"):
        fy, fx = _UNIT_UM.get(str(units["y"]).lower()), _UNIT_UM.get(str(units["x"]).lower())
        if fy is not None and fx is not None:
            mpp = (scale0[yi] * outer[yi] * fy, scale0[xi] * outer[xi] * fx)
            if all(PLAUSIBLE_MPP[0] <= v <= PLAUSIBLE_MPP[1] for v in mpp):
                info.mpp = mpp
                info.calibration_source = "OME-Zarr coordinateTransformations scale"
    omero = meta.get("omero")
    channels = omero.get("channels") if isinstance(omero, Mapping) else None
    if isinstance(channels, list):
        for k, ch in enumerate(channels):
            ch = ch if isinstance(ch, Mapping) else {}
            info.channel_names.append(str(ch.get("label") or f"channel {k}"))
            rgb = _hex_rgb(ch.get("color"))
            if rgb is not None:
                info.channel_colors.append(rgb)
    nc = shapes[0][names.index("c")] if "c" in names else 1
    dtype = np.dtype(arrays[0].dtype)
    if "c" not in names or nc == 1:
        out_axes = "YX"
    elif nc == 3 and dtype == np.uint8 and _is_rgb(info):
        out_axes = "YXS"
    else:
        out_axes = "CYX"
        info.fluorescence = True
    if out_axes != "CYX":
        info.channel_names, info.channel_colors = [], []
    levels = [_NgffChunks(a, names, out_axes) for a in arrays]
    warn_uncalibrated(path, info)
    return BackendSlide(info=info, levels=levels, axes=out_axes, notes=notes)


def _is_rgb(info: FormatInfo) -> bool:
    if not info.channel_names and not info.channel_colors:
        return True
    if [n.lower() for n in info.channel_names] == ["red", "green", "blue"]:
        return True
    return len(info.channel_colors) == 3 and all(
        np.allclose(c, r) for c, r in zip(info.channel_colors, _RGB, strict=True)
    )


class _NgffChunks(_tiff.OnDemandChunks):
    """Native chunks of one OME-Zarr level: the zarr chunks of its y and x axes."""

    fast = False

    def __init__(self, z: Any, names: Sequence[str], axes: str) -> None:
        self._z = z
        self._names = list(names)
        self._axes = axes
        full = dict(zip(names, (int(v) for v in z.shape), strict=True))
        native = dict(zip(names, (int(v) for v in z.chunks), strict=True))
        if axes == "YXS":
            self.shape: tuple[int, ...] = (full["y"], full["x"], full["c"])
            self.chunks: tuple[int, ...] = (native["y"], native["x"], full["c"])
        elif axes == "CYX":
            self.shape = (full["c"], full["y"], full["x"])
            self.chunks = (native["c"], native["y"], native["x"])
        else:
            self.shape, self.chunks = (full["y"], full["x"]), (native["y"], native["x"])
        self.chunks = tuple(min(c, n) for c, n in zip(self.chunks, self.shape, strict=True))
        self.dtype = np.dtype(z.dtype)

    def read(
        self, indices: Sequence[tuple[int, ...]], raw: Mapping[tuple[int, ...], bytes] | None = None
    ) -> list[np.ndarray | BaseException]:
        out: list[np.ndarray | BaseException] = []
        for idx in indices:
            box = {
                ax: slice(i * c, min((i + 1) * c, n))
                for ax, i, c, n in zip(self._axes, idx, self.chunks, self.shape, strict=True)
            }
            key: list[Any] = []
            for name in self._names:
                if name == "y":
                    key.append(box["Y"])
                elif name == "x":
                    key.append(box["X"])
                elif name == "c":
                    key.append(box["C"] if "C" in box else box.get("S", slice(0, 1)))
                else:
                    key.append(0)
            try:
                block = np.asarray(self._z[tuple(key)])
            except Exception as exc:  # a missing or corrupt chunk object
                out.append(exc)
                continue
            kept = [n for n in self._names if n in ("c", "y", "x")]
            if "c" in self._names and self._axes == "YX":
                block = block.reshape([block.shape[kept.index(n)] for n in ("y", "x")])
                out.append(block)
                continue
            order = {"YXS": "yxc", "CYX": "cyx", "YX": "yx"}[self._axes]
            out.append(np.transpose(block, [kept.index(n) for n in order]))
        return out
