"""Damaged tiles of a slide in the viewer: one notification and a Shapes overlay.

The reader opens slides with ``on_error="blank"`` so that panning keeps working over a
damaged tile; a blank tile must never pass for glass. Each tile the slide's
:class:`~napari_slidescope.slide.DamageLog` reports (on whatever thread decoded it) is
queued to the main thread, where it is

* outlined on the canvas: a rectangle with a red edge and a translucent red face in a
  Shapes layer ``"<slide> damaged tiles"`` above the image (one per tile and level, with
  its level, rows, columns and the decoder's reason as features). A Shapes overlay
  rather than hatched pixels: the image's pixels stay what the API returns (zeros, so
  nothing invents texture that analysis could take for tissue), the mark can be hidden,
  selected and inspected like any layer, and it is drawn at every zoom, even when napari
  shows a coarser, intact level over the damaged one;
* announced once per file by a napari warning notification naming the file, the level
  and the tiles (it replaces the library's Python warning, so the user sees it once).

At most :data:`MAX_OUTLINES` rectangles are drawn (Shapes layers slow down past a few
thousand); the notification says when more tiles are damaged than outlined.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from napari_slidescope.slide import damage_message

__all__ = ["DAMAGE_KEY", "MAX_OUTLINES", "damage_layers", "notify", "outline"]

#: Most damaged-tile rectangles drawn per slide.
MAX_OUTLINES = 2000
#: Layer metadata key holding the owner id of the slide whose damage a layer outlines.
DAMAGE_KEY = "slidescope_damage_of"
EDGE_COLOR = (1.0, 0.0, 0.0, 1.0)
FACE_COLOR = (1.0, 0.0, 0.0, 0.3)


def notify(slide: Any, tiles: list[Any], layer_name: str) -> None:
    """Announce `slide`'s damaged `tiles` in one napari warning notification."""
    from napari.utils.notifications import (
        Notification,
        NotificationSeverity,
        notification_manager,
    )

    reasons = slide.damage.reasons()
    text = damage_message(str(slide.path), tiles, reasons.get(tiles[0], ""))
    text += f" They are outlined in red in the layer {layer_name!r}."
    notification_manager.dispatch(Notification(text, severity=NotificationSeverity.WARNING))


def _rectangles(slide: Any, tiles: list[Any]) -> tuple[list[np.ndarray], list[float]]:
    """Level-0 ``(row, col)`` corners of each tile (napari centres pixel i on i)."""
    rects, widths = [], []
    for level, ((r0, r1), (c0, c1)) in tiles:
        dy, dx = slide.downsamples[level]
        y0, y1, x0, x1 = r0 * dy - 0.5, r1 * dy - 0.5, c0 * dx - 0.5, c1 * dx - 0.5
        rects.append(np.array([[y0, x0], [y0, x1], [y1, x1], [y1, x0]], dtype=float))
        widths.append(max(2.0, min(y1 - y0, x1 - x0) / 24))
    return rects, widths


def outline(viewer: Any, slide: Any, tiles: list[Any], name: str, owner: Any) -> None:
    """Outline `tiles` in the Shapes layer `name` (created on the first call), up to the cap."""
    import pandas as pd

    layer = next(iter(damage_layers(viewer.layers, owner)), None)
    shown = 0 if layer is None else len(layer.data)
    room = MAX_OUTLINES - shown
    if room <= 0:
        return
    tiles = tiles[:room]
    rects, widths = _rectangles(slide, tiles)
    reasons = slide.damage.reasons()
    rows = pd.DataFrame(
        {
            "level": [t[0] for t in tiles],
            "rows": [f"{t[1][0][0]}:{t[1][0][1]}" for t in tiles],
            "cols": [f"{t[1][1][0]}:{t[1][1][1]}" for t in tiles],
            "reason": [reasons.get(t, "").lstrip(": ") for t in tiles],
        }
    )
    if layer is None:
        calibrated: dict[str, Any] = {}
        if slide.mpp is not None:  # as the image layer (layer_data)
            calibrated = {"scale": tuple(slide.mpp), "units": ("µm", "µm")}
        active = viewer.layers.selection.active  # the user's layer stays the active one
        layer = viewer.add_shapes(
            rects,
            shape_type="rectangle",
            edge_color=[EDGE_COLOR] * len(rects),
            face_color=[FACE_COLOR] * len(rects),
            edge_width=widths,
            name=name,
            features=rows,
            metadata={DAMAGE_KEY: owner, "path": str(slide.path)},
            **calibrated,
        )
        if active is not None and active in viewer.layers:
            viewer.layers.selection.active = active
        return
    features = pd.concat([layer.features, rows], ignore_index=True)
    layer.add(
        rects,
        shape_type="rectangle",
        edge_color=EDGE_COLOR,
        face_color=FACE_COLOR,
        edge_width=widths,
    )
    layer.features = features


def damage_layers(layers: Any, owner: Any) -> list[Any]:
    """Return the damaged-tile overlays of the slide `owner` among `layers`."""
    return [ly for ly in layers if ly.metadata.get(DAMAGE_KEY) == owner]
