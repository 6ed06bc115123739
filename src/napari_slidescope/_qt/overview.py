"""The "Slide overview" dock widget: the slide's thumbnail with the current view on it.

The thumbnail is the smallest pyramid level of the active slide layer; for a
multichannel slide (one image layer per channel, opened with ``channel_axis``) the
smallest levels of its visible channels are composited additively with their
colormaps and contrast limits, as napari shows them. The current view
(:func:`~napari_slidescope._napari.viewport.visible_region`) is drawn as a rectangle;
clicking or dragging moves the camera centre to that point. The widget follows the
camera (centre, zoom), the canvas size and the layer list, rebuilds the thumbnail when
a shown layer's colormap, contrast limits or visibility change (debounced: a drag of the
contrast slider rebuilds once it pauses), and disconnects on close.

Mapping: thumbnail pixel ``j`` of ``m`` covers level-0 pixels ``[j * f, (j + 1) * f)``
with ``f = n0 / m`` along each axis (pixel edges), and level-0 pixel ``i`` is centred on
world ``translate + scale * i`` (napari's convention, see ``viewport``).
"""

from __future__ import annotations

import contextlib
from typing import Any

import numpy as np
from qtpy.QtCore import QPointF, QRectF, QSize, Qt, QTimer
from qtpy.QtGui import QColor, QImage, QMouseEvent, QPainter, QPaintEvent, QPen, QPixmap
from qtpy.QtWidgets import QSizePolicy, QWidget

from napari_slidescope._napari.jobs import active_slide_layer, is_slide_layer
from napari_slidescope._napari.viewport import camera_of, image_shape0, visible_region
from napari_slidescope._types import Box

__all__ = ["OverviewWidget", "thumbnail_rgb"]

#: Layer events after which the thumbnail is rebuilt (what :func:`thumbnail_rgb` reads).
_DISPLAY_EVENTS = ("colormap", "contrast_limits", "visible")
#: Quiet time (ms) after the last such event before the thumbnail is rebuilt.
REBUILD_DELAY_MS = 150


def _smallest(layer: Any) -> np.ndarray:
    data = layer.data[-1] if getattr(layer, "multiscale", False) else layer.data
    return np.asarray(data)


def _scaled(pixels: np.ndarray, limits: Any) -> np.ndarray:
    lo, hi = (float(v) for v in limits)
    out = (pixels.astype(np.float32) - lo) / (hi - lo if hi > lo else 1.0)
    return np.clip(out, 0.0, 1.0)


def thumbnail_rgb(layers: list[Any]) -> np.ndarray:
    """RGB uint8 thumbnail of one slide from the smallest level of its layer(s).

    Parameters
    ----------
    layers : list of napari.layers.Image
        One RGB layer, or the channel layers of one multichannel slide (all of one
        shape); channels are mapped through their colormaps and contrast limits and
        added, as napari's additive blending does. Hidden channels are left out
        unless all are hidden.

    Returns
    -------
    rgb : ndarray of uint8, shape (rows, cols, 3)
    """
    first = layers[0]
    if getattr(first, "rgb", False):
        small = _smallest(first)
        if small.dtype == np.uint8 and list(first.contrast_limits) == [0.0, 255.0]:
            return np.ascontiguousarray(small[..., :3])
        return (_scaled(small[..., :3], first.contrast_limits) * 255 + 0.5).astype(np.uint8)
    shown = [ly for ly in layers if ly.visible] or layers
    acc: np.ndarray | None = None
    for ly in shown:
        values = _scaled(_smallest(ly), ly.contrast_limits)
        rgba = np.asarray(ly.colormap.map(values.ravel()), np.float32)
        rgb = rgba[:, :3].reshape(*values.shape, 3)
        acc = rgb if acc is None else acc + rgb
    assert acc is not None
    return (np.clip(acc, 0.0, 1.0) * 255 + 0.5).astype(np.uint8)


def _unwrap(layer: Any) -> Any:
    """Return the layer itself, not napari's proxy of it (plugin widgets get a proxied viewer)."""
    return getattr(layer, "__wrapped__", layer)


def _slide_group(viewer: Any, layer: Any) -> list[Any]:
    """Return the layers of `layer`'s slide: its channels when it is a multichannel slide."""
    layer = _unwrap(layer)
    if getattr(layer, "rgb", False):
        return [layer]
    path = layer.metadata.get("path")
    group = [
        _unwrap(ly)
        for ly in viewer.layers
        if is_slide_layer(ly)
        and not ly.rgb
        and path is not None
        and ly.metadata.get("path") == path
    ]
    return group or [layer]


class OverviewWidget(QWidget):
    """Thumbnail of the active slide with the current view as a rectangle.

    Parameters
    ----------
    napari_viewer : napari.Viewer
        The viewer (injected by napari).
    """

    def __init__(self, napari_viewer: Any) -> None:
        super().__init__()
        self.viewer = napari_viewer
        self._layers: list[Any] = []
        self._thumb: np.ndarray | None = None
        self._pixmap: QPixmap | None = None
        self._shape0: tuple[int, int] = (0, 0)
        self._box: Box | None = None
        self.setMinimumSize(QSize(160, 120))
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Expanding)
        self.setMouseTracking(False)
        self.setToolTip("Click or drag to move the view")
        self._connections: list[tuple[Any, Any]] = []
        self._layer_connections: list[tuple[Any, Any]] = []
        self.rebuilds = 0  # thumbnails built so far (tests, diagnostics)
        self._rebuild_timer = QTimer(self)
        self._rebuild_timer.setSingleShot(True)
        self._rebuild_timer.setInterval(REBUILD_DELAY_MS)
        self._rebuild_timer.timeout.connect(self._on_rebuild_timer)
        camera = camera_of(napari_viewer)
        self._connect(camera.events.center, self._on_camera)
        self._connect(camera.events.zoom, self._on_camera)
        canvas = getattr(napari_viewer, "canvas", None)
        size_event = getattr(getattr(canvas, "events", None), "size", None)
        if size_event is not None:
            self._connect(size_event, self._on_camera)
        layers = napari_viewer.layers
        self._connect(layers.events.inserted, self._on_layers)
        self._connect(layers.events.removed, self._on_layers)
        self._connect(layers.selection.events.active, self._on_layers)
        self.refresh()

    # -- public ---------------------------------------------------------------------------------

    @property
    def layer(self) -> Any:
        """The slide layer shown (the first channel of a multichannel slide), or None."""
        return self._layers[0] if self._layers else None

    @property
    def thumbnail(self) -> np.ndarray | None:
        """The RGB uint8 thumbnail shown, or None without a slide."""
        return self._thumb

    @property
    def view_box(self) -> Box | None:
        """Level-0 box ``(y0, x0, y1, x1)`` the rectangle shows, or None (no slide, or off it)."""
        return self._box

    def refresh(self) -> None:
        """Pick the active slide layer again and rebuild the thumbnail and rectangle."""
        try:
            layer = active_slide_layer(self.viewer)
        except ValueError:
            layer = None
        group = [] if layer is None else _slide_group(self.viewer, layer)
        if group != self._layers:
            self._layers = group
            self._watch(group)
            self._rebuild()
        self._update_box()

    def world_at(self, point: QPointF) -> tuple[float, float] | None:
        """World ``(y, x)`` under a widget point, or None off the thumbnail."""
        target = self._target_rect()
        if target is None or self._thumb is None or not target.contains(point):
            return None
        fy = (point.y() - target.top()) / target.height()
        fx = (point.x() - target.left()) / target.width()
        layer = self._layers[0]
        sy, sx = (float(v) for v in tuple(layer.scale)[-2:])
        ty, tx = (float(v) for v in tuple(layer.translate)[-2:])
        # fraction of the slide's extent (pixel edges) -> level-0 data coordinate
        py = fy * self._shape0[0] - 0.5
        px = fx * self._shape0[1] - 0.5
        return (ty + sy * py, tx + sx * px)

    def widget_point(self, world: tuple[float, float]) -> QPointF | None:
        """Widget point of a world ``(y, x)`` (the inverse of :meth:`world_at`)."""
        target = self._target_rect()
        if target is None or not self._layers:
            return None
        layer = self._layers[0]
        sy, sx = (float(v) for v in tuple(layer.scale)[-2:])
        ty, tx = (float(v) for v in tuple(layer.translate)[-2:])
        fy = ((world[0] - ty) / sy + 0.5) / self._shape0[0]
        fx = ((world[1] - tx) / sx + 0.5) / self._shape0[1]
        return QPointF(target.left() + fx * target.width(), target.top() + fy * target.height())

    def move_to(self, point: QPointF) -> bool:
        """Centre the camera on the world point under widget `point`; False off the slide."""
        world = self.world_at(point)
        if world is None:
            return False
        camera = camera_of(self.viewer)
        center = list(camera.center)
        center[-2:] = world
        camera.center = tuple(center)
        return True

    def close_connections(self) -> None:
        """Disconnect from the viewer (called on close)."""
        self._rebuild_timer.stop()
        self._watch([])
        for emitter, callback in self._connections:
            with contextlib.suppress(Exception):
                emitter.disconnect(callback)
        self._connections = []

    # -- Qt -------------------------------------------------------------------------------------

    def sizeHint(self) -> QSize:  # noqa: N802 - Qt API
        return QSize(300, 220)

    def paintEvent(self, event: QPaintEvent | None) -> None:  # noqa: N802 - Qt API
        painter = QPainter(self)
        try:
            painter.fillRect(self.rect(), QColor(38, 41, 48))
            target = self._target_rect()
            if target is None or self._pixmap is None:
                painter.setPen(QColor(200, 200, 200))
                painter.drawText(self.rect(), int(Qt.AlignmentFlag.AlignCenter), "No slide open")
                return
            painter.drawPixmap(target, self._pixmap, QRectF(self._pixmap.rect()))
            rect = self._box_rect()
            if rect is not None:
                pen = QPen(QColor(255, 220, 0))
                pen.setWidth(2)
                painter.setPen(pen)
                painter.setBrush(Qt.BrushStyle.NoBrush)
                painter.drawRect(rect)
        finally:
            painter.end()

    def mousePressEvent(self, event: QMouseEvent | None) -> None:  # noqa: N802 - Qt API
        if event is not None and event.button() == Qt.MouseButton.LeftButton:
            self.move_to(event.position())
        super().mousePressEvent(event)

    def mouseMoveEvent(self, event: QMouseEvent | None) -> None:  # noqa: N802 - Qt API
        if event is not None and event.buttons() & Qt.MouseButton.LeftButton:
            self.move_to(event.position())
        super().mouseMoveEvent(event)

    def closeEvent(self, event: Any) -> None:  # noqa: N802 - Qt API
        self.close_connections()
        super().closeEvent(event)

    # -- internals ------------------------------------------------------------------------------

    def _connect(self, emitter: Any, callback: Any) -> None:
        emitter.connect(callback)
        self._connections.append((emitter, callback))

    def _watch(self, layers: list[Any]) -> None:
        """Follow the display settings of `layers` (and no longer those of the others)."""
        for emitter, callback in self._layer_connections:
            with contextlib.suppress(Exception):
                emitter.disconnect(callback)
        self._layer_connections = []
        for layer in layers:
            for name in _DISPLAY_EVENTS:
                emitter = getattr(layer.events, name, None)
                if emitter is not None:
                    emitter.connect(self._on_display)
                    self._layer_connections.append((emitter, self._on_display))

    def _rebuild(self) -> None:
        """Build the thumbnail of the shown layers as they are displayed now."""
        self._rebuild_timer.stop()
        if self._layers:
            self._thumb = thumbnail_rgb(self._layers)
            self._shape0 = image_shape0(self._layers[0])
            h, w = self._thumb.shape[:2]
            image = QImage(self._thumb.tobytes(), w, h, 3 * w, QImage.Format.Format_RGB888)
            self._pixmap = QPixmap.fromImage(image.copy())
            self.rebuilds += 1
        else:
            self._thumb, self._pixmap, self._shape0 = None, None, (0, 0)
        self.update()

    def _on_display(self, event: Any = None) -> None:
        self._rebuild_timer.start()  # (re)started: one rebuild once the changes pause

    def _on_rebuild_timer(self) -> None:
        self._rebuild()

    def _on_camera(self, event: Any = None) -> None:
        self._update_box()

    def _on_layers(self, event: Any = None) -> None:
        self.refresh()

    def _update_box(self) -> None:
        box: Box | None = None
        if self._layers:
            try:
                box = visible_region(self.viewer, self._layers[0])
            except (ValueError, RuntimeError):
                box = None
        self._box = box
        self.update()

    def _target_rect(self) -> QRectF | None:
        """Where the thumbnail is drawn: fitted to the widget, aspect kept, centred."""
        if self._thumb is None:
            return None
        th, tw = self._thumb.shape[:2]
        h0, w0 = self._shape0
        # aspect of the slide's level 0 (the thumbnail's may differ by rounding)
        aspect = (w0 / h0) if h0 and w0 else (tw / th)
        if self._layers:
            sy, sx = (abs(float(v)) for v in tuple(self._layers[0].scale)[-2:])
            aspect *= sx / sy
        width, height = float(self.width()), float(self.height())
        if width / height > aspect:
            w, h = height * aspect, height
        else:
            w, h = width, width / aspect
        return QRectF((width - w) / 2.0, (height - h) / 2.0, w, h)

    def _box_rect(self) -> QRectF | None:
        target = self._target_rect()
        if target is None or self._box is None:
            return None
        h0, w0 = self._shape0
        y0, x0, y1, x1 = self._box
        return QRectF(
            target.left() + x0 / w0 * target.width(),
            target.top() + y0 / h0 * target.height(),
            (x1 - x0) / w0 * target.width(),
            (y1 - y0) / h0 * target.height(),
        )
