"""The slide's label and macro images as previews in the dock; a click opens one as a layer.

The images are read on a worker thread (:func:`load_associated`) when a slide is chosen;
:class:`Thumbnails` shows them side by side, as tall as the taller one up to a bound.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import numpy as np
from magicgui.widgets import Container, Image
from qtpy.QtCore import Qt
from qtpy.QtWidgets import QSizePolicy

from napari_slidescope._qt.layout import ClickFilter

__all__ = ["Thumbnails", "load_associated", "preview"]

#: Preview size (px) of the label image and of the macro image.
_LABEL_PX, _MACRO_PX = 150, 230
#: Tallest a preview is shown (px): the row of previews is as tall as the taller one.
_PREVIEW_MAX_H = 120


class Thumbnails(Container):
    """A row of two previews (label, macro); clicking one calls ``on_click(key)``."""

    def __init__(self, on_click: Callable[[str], object]) -> None:
        self.label_image = Image(label="Label")
        self.macro_image = Image(label="Macro")
        super().__init__(
            widgets=[self.label_image, self.macro_image],
            layout="horizontal",
            labels=False,
            visible=False,
        )
        #: The full-size images shown, by key (``"label"``, ``"macro"``).
        self.images: dict[str, np.ndarray] = {}
        self.token = 0  # which slide the images being read belong to
        self._click_filters: list[ClickFilter] = []
        for key, img in (("label", self.label_image), ("macro", self.macro_image)):
            # magicgui's Image ignores its size hint (0 px tall under a dock's stretch):
            # a fixed height, set when an image is shown, makes the row as tall as it
            img.native.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Fixed)
            img.native.setAlignment(Qt.AlignmentFlag.AlignCenter)
            filt = ClickFilter(partial(on_click, key))
            img.native.installEventFilter(filt)
            img.native.setCursor(Qt.CursorShape.PointingHandCursor)
            img.tooltip = f"The slide's {key} image: click to open it as a layer"
            self._click_filters.append(filt)

    def clear(self) -> None:
        """Hide the previews and forget the images (a newer slide's reading may follow)."""
        self.token += 1
        self.images = {}
        self.visible = False
        for img in (self.label_image, self.macro_image):
            img.visible = False

    def load(self, path: str) -> None:
        """Read the label and macro images of the slide at `path` on a worker, then show them."""
        from napari.qt.threading import create_worker

        token = self.token
        worker = create_worker(load_associated, path, _start_thread=False)
        worker.returned.connect(lambda images: self.show_images(images, token))
        worker.start()

    def show_images(self, images: dict[str, np.ndarray], token: int = -1) -> None:
        """Show `images` (unless `token` says another slide's were asked for since)."""
        if token not in (-1, self.token):
            return  # the slide changed while they were read
        self.images = dict(images)
        for key, widget, px in (
            ("label", self.label_image, _LABEL_PX),
            ("macro", self.macro_image, _MACRO_PX),
        ):
            if key in images:
                shown = preview(images[key], px)
                widget.value = shown
                widget.native.setFixedHeight(min(shown.shape[0], _PREVIEW_MAX_H))
                widget.visible = self.visible = True


def preview(img: np.ndarray, px: int) -> np.ndarray:
    """Shrink an RGB image (nearest pixel) so that its longer side is at most `px`."""
    step = max(1, int(np.ceil(max(img.shape[:2]) / px)))
    return np.ascontiguousarray(img[::step, ::step, :3])


def load_associated(path: str) -> dict[str, np.ndarray]:
    """Read the slide's label and macro images (worker thread)."""
    from napari_slidescope._napari.open_slides import source_for
    from napari_slidescope.slide import open_slide

    out = {}
    with open_slide(source_for(path)) as slide:
        for key in ("label", "macro"):
            if key in slide.associated:
                out[key] = np.ascontiguousarray(np.asarray(slide.associated[key])[..., :3])
    return out
