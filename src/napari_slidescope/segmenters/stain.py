"""What kind of image a slide is, and which of its channels holds the nuclei.

Three kinds reach the nuclei pipeline: brightfield RGB (H&E), RGB-encoded fluorescence (a
Hamamatsu NDPI fluorescence scan: one fluorochrome stored as RGB, the signal in one
channel) and multichannel fluorescence / multiplex (QPTIFF, OME: ``CYX``). The slide's own
metadata say which (``axes``, ``fluorescence``, ``channel_names``); the nuclear channel is
chosen by name (DAPI, Hoechst, ...), else the channel that carries the signal.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from napari_slidescope.segmenters.base import Input

__all__ = [
    "FLUOROPHORE_NAMES",
    "NUCLEAR_NAMES",
    "ImageKind",
    "column_name",
    "image_kind",
    "is_fluorescence",
    "signal_channel",
]

#: Channel names of nuclear stains, searched in this order.
NUCLEAR_NAMES = re.compile(
    r"dapi|hoechst|draq ?5|draq ?7|syto|nuclear|nuclei|\bnuc\b|propidium|\bpi\b|topro|sir-?dna",
    re.I,
)
#: Fluorophore names: a slide with a channel named so is fluorescence.
FLUOROPHORE_NAMES = re.compile(
    r"dapi|hoechst|fitc|tritc|texas|\bcy[2-7]|alexa|\baf\d{3}|opal|[gry]fp\b|fluor", re.I
)
_RGB_NAMES = ("red", "green", "blue")


def is_fluorescence(
    axes: str, *, fluorescence: bool = False, channel_names: Sequence[str] | None = ()
) -> bool:
    """Whether a slide's metadata say it is fluorescence: the one rule of the library.

    Tissue detection (``mode="auto"``), the nuclei pipeline (:func:`image_kind`), the
    viewer and the batch engine all decide with this. Metadata alone, no pixels: a slide
    they do not call fluorescence may still be found dark (tissue detection then looks
    at its pixels).

    Parameters
    ----------
    axes : str
        The slide's axes: ``"CYX"`` (multichannel, as QPTIFF and OME) and ``"YX"`` (one
        channel) are fluorescence.
    fluorescence : bool
        The format's own flag (NDPI's ``Fluorescence`` tag, QPTIFF).
    channel_names : sequence of str, optional
        A name of a fluorophore (:data:`FLUOROPHORE_NAMES`: DAPI, FITC, Cy5, Opal 520,
        ...) makes the slide fluorescence.

    Examples
    --------
    >>> is_fluorescence("YXS"), is_fluorescence("CYX"), is_fluorescence("YXS", fluorescence=True)
    (False, True, True)
    >>> is_fluorescence("YXS", channel_names=["DAPI 2 (387)"])
    True
    """
    if fluorescence or axes in ("CYX", "YX"):
        return True
    return any(FLUOROPHORE_NAMES.search(str(n)) for n in channel_names or ())


def slide_is_fluorescence(slide: Any) -> bool:
    """:func:`is_fluorescence` of a slide's ``axes``, ``fluorescence`` and ``channel_names``."""
    return is_fluorescence(
        str(slide.axes),
        fluorescence=bool(getattr(slide, "fluorescence", False)),
        channel_names=[str(n) for n in (getattr(slide, "channel_names", None) or [])],
    )


@dataclass(frozen=True)
class ImageKind:
    """What the nuclei pipeline needs to know about an image's channels.

    Attributes
    ----------
    input : {"brightfield", "fluorescence"}
        Kind of image (decides the segmenter for ``"auto"`` and the measurements).
    channel_names : tuple of str
        Names of the channels of a tile, channels last (``("red", "green", "blue")`` for
        RGB, ``("DAPI", "FITC", "Cy3")`` for a QPTIFF).
    nuclear_channel : int or None
        Index of the nuclear channel among them; None for brightfield, and for RGB-encoded
        fluorescence until :func:`signal_channel` has seen pixels.
    rgb_encoded : bool
        True for a fluorescence scan stored as RGB (the signal is in one channel).
    measured : tuple of int
        Channels measured as ``<name>_mean`` under each nucleus (fluorescence only).
    fluorochrome : str or None
        What an RGB-encoded scan holds (``"DAPI"`` from NDPI's ``Fluorescence`` tag,
        ``"DAPI 2 (387)"``): the name its signal channel gets.
    """

    input: Input
    channel_names: tuple[str, ...]
    nuclear_channel: int | None = None
    rgb_encoded: bool = False
    measured: tuple[int, ...] = ()
    fluorochrome: str | None = None

    def mean_columns(self) -> dict[int, str]:
        """``{channel index: column name}`` of the per-channel intensity columns."""
        return {c: column_name(self.channel_names[c]) for c in self.measured}


def column_name(channel: str) -> str:
    """``<channel>_mean``, the channel's name with spaces and punctuation as ``_``.

    Examples
    --------
    >>> column_name("DAPI")
    'DAPI_mean'
    >>> column_name("Opal 520")
    'Opal_520_mean'
    """
    return (re.sub(r"[^0-9A-Za-z]+", "_", str(channel)).strip("_") or "channel") + "_mean"


def _pick(names: Sequence[str], channel: int | str, what: str) -> int:
    if isinstance(channel, int | np.integer) and not isinstance(channel, bool):
        if not 0 <= int(channel) < len(names):
            raise ValueError(f"channel={channel}: {what} has channels 0..{len(names) - 1}")
        return int(channel)
    wanted = str(channel).strip().lower()
    exact = [i for i, n in enumerate(names) if n.strip().lower() == wanted]
    starts = [i for i, n in enumerate(names) if n.strip().lower().startswith(wanted)]
    found = exact or starts
    if not found:
        raise ValueError(f"channel={channel!r}: {what} has channels {list(names)}")
    return found[0]


def image_kind(slide: Any, *, channel: int | str | None = None) -> ImageKind:
    """Kind of image and nuclear channel of a slide, from its metadata.

    Parameters
    ----------
    slide : Slide or ArraySlide
        Reads ``axes``, ``fluorescence`` and ``channel_names`` (no pixels).
    channel : int or str, optional
        The nuclear channel, by index or name (case-insensitive; a prefix is enough);
        default: a channel named like a nuclear stain (DAPI, Hoechst, ...), else the first.
        Giving one makes an RGB slide fluorescence (its channels are then "red", "green",
        "blue").

    Returns
    -------
    ImageKind

    Raises
    ------
    ValueError
        If `channel` names no channel of the slide.
    """
    axes = str(slide.axes)
    meta_names = [str(n) for n in (getattr(slide, "channel_names", None) or [])]
    fluo = slide_is_fluorescence(slide)
    what = str(getattr(slide, "path", "the slide"))
    if axes == "CYX":
        n = int(slide.levels[0].shape[0])
        names = meta_names if len(meta_names) == n else [f"channel {c}" for c in range(n)]
        if channel is not None:
            nuc = _pick(names, channel, what)
        else:
            hits = [i for i, name in enumerate(names) if NUCLEAR_NAMES.search(name)]
            nuc = hits[0] if hits else 0
        return ImageKind("fluorescence", tuple(names), nuc, False, tuple(range(n)))
    if axes == "YX":
        names = meta_names[:1] or ["intensity"]
        if channel not in (None, 0) and str(channel).lower() != names[0].lower():
            _pick(names, channel, what)
        return ImageKind("fluorescence", tuple(names), 0, False, (0,))
    if fluo or channel is not None:
        names = list(_RGB_NAMES)
        props = getattr(slide, "metadata", {}).get("properties") or {}
        label = (meta_names[:1] or [str(props.get("Fluorescence") or "")])[0].strip() or None
        kind = ImageKind("fluorescence", tuple(names), None, True, fluorochrome=label)
        if channel is not None:
            kind = _with_signal(kind, _pick(names, channel, what))
        return kind
    return ImageKind("brightfield", _RGB_NAMES)


def _with_signal(kind: ImageKind, c: int) -> ImageKind:
    names = list(kind.channel_names)
    if kind.fluorochrome:  # "DAPI 2 (387)" -> "DAPI": the name of its signal channel
        names[c] = kind.fluorochrome.split()[0]
    return ImageKind(kind.input, tuple(names), c, True, (c,), kind.fluorochrome)


def signal_channel(kind: ImageKind, sample: np.ndarray) -> ImageKind:
    """Fix the nuclear channel of an RGB-encoded fluorescence image from its pixels.

    The channel whose 99th percentile stands highest above its median carries the signal
    (the blue channel of a DAPI scan).

    Parameters
    ----------
    kind : ImageKind
        From :func:`image_kind`; returned as it is unless RGB-encoded without a channel.
    sample : (M, N, C) ndarray
        Pixels of the region (channels last).
    """
    if not kind.rgb_encoded or kind.nuclear_channel is not None:
        return kind
    px = np.asarray(sample).reshape(-1, sample.shape[-1])[::7].astype(np.float32)
    hi, mid = np.percentile(px, [99.0, 50.0], axis=0)
    return _with_signal(kind, int(np.argmax(hi - mid)))
