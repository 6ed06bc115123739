"""The widget's sentences: how a slide, a run's progress and its outcome read.

Plain functions of plain values (no Qt), so the words can be tested without a viewer.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from napari_slidescope._napari.jobs import SlideSource

if TYPE_CHECKING:
    from napari_slidescope._qt.session import Outcome
    from napari_slidescope.pipeline.tissue import TissueResult

__all__ = ["describe", "duration", "key_text", "models_text", "outcome_words", "tissue_words"]


def key_text(key: str) -> str:
    """Write a napari key binding as a user reads it (``Control-Shift-R`` -> ``Ctrl+Shift+R``)."""
    return key.replace("Control", "Ctrl").replace("-", "+")


def models_text(kind: Literal["brightfield", "fluorescence"] | None, name: str) -> str:
    """Say on the "Models" line which model runs, what is missing, what is installed.

    `kind` is the slide's ``"brightfield"`` or ``"fluorescence"`` (None: no slide yet).
    """
    from napari_slidescope.segmenters import registry

    installed = ", ".join(registry.available_segmenters())
    if kind is None:
        return f"installed: {installed}"
    if name != "auto":
        return f"{name} on this {kind} slide; installed: {installed}"
    chosen = registry.resolve_auto(kind, warn=False)
    learned, _builtin = registry.auto_choices(kind)
    if chosen == learned:
        return f"auto runs {chosen} on this {kind} slide; installed: {installed}"
    return (
        f"auto runs {chosen} on this {kind} slide: {learned} is not installed (see the "
        f"README, Segmenters); installed: {installed}"
    )


def duration(seconds: float | None) -> str:
    """Write seconds as ``m:ss`` (``h:mm:ss`` from an hour on); ``?`` when unknown."""
    if seconds is None:
        return "?"
    s = int(round(seconds))
    if s >= 3600:
        return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"
    return f"{s // 60}:{s % 60:02d}"


def outcome_words(out: Outcome) -> str:
    """Say how a run ended: ``"Cancelled: 37 of 120 tiles"``.

    `out` is the session's :class:`~napari_slidescope._qt.session.Outcome`.
    """
    tiles = f"{out.tiles_done:,} of {out.tiles_total:,} tiles" if out.tiles_total else ""
    if out.state == "done":
        return f"Done: {tiles}" if tiles else "Done"
    if out.state == "cancelled":
        return f"Cancelled: {tiles}" if tiles else "Cancelled before any tile finished"
    error = (out.error or "").split(" failed: ", 1)[-1][:200]
    return f"Failed after {tiles}: {error}" if tiles else f"Failed: {error}"


def tissue_words(result: TissueResult | None) -> str:
    """Say what a tissue result found: its area and the share of the area analysed."""
    if result is None:
        return "–"
    parts = []
    if result.area_um2 is not None:
        parts.append(f"Tissue {result.area_um2 / 1e6:,.2f} mm²")
    else:
        parts.append(f"Tissue {result.area_px:,.0f} px² (uncalibrated)")
    parts.append(f"{100 * result.fraction:.0f}% of the area analysed")
    return " · ".join(parts)


def describe(src: SlideSource) -> str:
    """One line on a slide: format, size, pixel size (and where it came from), magnification."""
    info = src.info
    h, w = src.shape0
    parts = [str(info.get("format", "?")), f"{h:,} × {w:,} px"]
    mpp = info.get("mpp")
    if mpp:
        how = info.get("calibration_source")
        parts.append(f"{float(mpp[1]):.4g} µm/px" + (f" ({how})" if how else ""))
    else:
        parts.append("uncalibrated")
    if info.get("magnification"):
        parts.append(f"{float(info['magnification']):g}×")
    return " · ".join(parts)
