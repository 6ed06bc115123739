"""The slides the reader opened: what to reopen them from, and when to close them.

The reader (:mod:`.reader`) opens a slide and hands its levels to layers; the analysis
jobs (:mod:`.jobs`) and the thumbnails reopen a layer's slide on a worker. Both need the
same bookkeeping, kept here, apart from either, so that neither imports the other: the
source of every URL the reader opened (with credentials and storage options the layer
does not show), and the open slides a viewer's layers still show, closed when the last
such layer is removed.
"""

from __future__ import annotations

import weakref
from typing import Any

#: Layer metadata key holding the id of the open slide a layer shows.
SLIDE_KEY = "slidescope_slide"


#: The sources (URL as given, storage options) of the URLs the reader opened, by the
#: credential-free URL the layers show: the widget reopens a layer's slide through them.
_SOURCES: dict[str, Any] = {}


def remember_source(slide: Any) -> None:
    """Keep the source of a slide the reader opened from a URL, for :func:`source_for`."""
    if slide.source.is_remote:
        _SOURCES[slide.source.display] = slide.source


def source_for(path: str) -> Any:
    """Return what to open for a layer's ``metadata["path"]``.

    For a URL the reader opened, the :class:`~napari_slidescope.slide.source.Source` it
    was opened from (with its credentials and storage options, which the layer does not
    show); else `path` itself.
    """
    return _SOURCES.get(path, path)


#: Slides opened by the reader that a viewer's layers may still show.
_OPEN: list[Any] = []
_WATCHED: weakref.WeakSet[Any] = weakref.WeakSet()


def close_with_layers(slide: Any) -> None:
    """Close `slide` once no layer of the current viewer shows it any more.

    The layers of one slide (its channels, duplicates) carry the slide's id in their
    metadata under :data:`SLIDE_KEY`.
    """
    import napari

    viewer = napari.current_viewer()
    if viewer is None:  # read outside a viewer: the caller owns the layer data
        return
    _OPEN.append(slide)
    if viewer not in _WATCHED:
        _WATCHED.add(viewer)
        viewer.layers.events.removed.connect(_on_layer_removed)


def _slide_key(layer: Any) -> Any:
    metadata = getattr(layer, "metadata", None)
    return metadata.get(SLIDE_KEY) if isinstance(metadata, dict) else None


def _on_layer_removed(event: Any) -> None:
    """Close the reader's slides that the remaining layers no longer show."""
    key = _slide_key(event.value)
    if key is None or any(_slide_key(layer) == key for layer in event.source):
        return
    for slide in [s for s in _OPEN if s._owner == key]:
        _OPEN.remove(slide)
        slide.close()
    # damage.py imports the slide package (tifffile...): deferred, as the reader defers it
    from napari_slidescope._napari.damage import damage_layers

    for overlay in damage_layers(event.source, key):  # its damaged-tile outlines
        event.source.remove(overlay)
