"""Cell classes in napari: class colours on a nuclei layer, a legend dock, a cells layer.

:func:`classify` runs :func:`~napari_slidescope.pipeline.cell_classes.classify_cells` on what a
slide's nuclei layer holds and shows the result: each nucleus in its class colour (a
direct label colormap, so whole-slide pyramid layers are coloured without touching their
pixels), ``class`` and the positivity columns in the layer's features (hover shows them),
and a "Cell classes" dock listing each class with its colour and count (and, for IHC,
positive % and H-score). :func:`add_cells` draws a result's cell outlines as their own
Labels layer.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from napari_slidescope._napari.class_layers import (
    class_colormap,
    events,
    legend_text,
    show_classes,
)
from napari_slidescope.pipeline.task_table import task

__all__ = ["add_cells", "class_colormap", "classify", "events", "legend_text", "show_classes"]

#: Name of the legend dock widget.
LEGEND_NAME = "Cell classes"


def _docked(window: Any) -> dict[str, Any]:
    """Return the window's docked widgets by name, the inner widgets.

    napari's public ``dock_widgets`` where it has one; the dock wrappers' ``widget()``
    on older napari.
    """
    public = getattr(type(window), "dock_widgets", None)
    if isinstance(public, property):
        return dict(window.dock_widgets)
    return {name: dock.widget() for name, dock in getattr(window, "_dock_widgets", {}).items()}


def _legend(viewer: Any, result: Any, area_mm2: float | None) -> Any:
    """Create or update the "Cell classes" dock: a swatch, name and count per class."""
    from qtpy.QtWidgets import QLabel, QVBoxLayout, QWidget

    window = getattr(viewer, "window", None)
    widget = None
    if window is not None and LEGEND_NAME in _docked(window):
        widget = _docked(window)[LEGEND_NAME]
    if widget is None:
        widget = QWidget()
        widget.setObjectName("slidescope_class_legend")
        QVBoxLayout(widget)
        if window is not None:
            window.add_dock_widget(widget, name=LEGEND_NAME, area="right")
    box: Any = widget.layout()
    while box.count():
        item: Any = box.takeAt(0)
        old: Any = item.widget() if item is not None else None
        if old is not None:
            old.hide()  # at once: deleteLater waits for the event loop (a drag redraws often)
            old.deleteLater()
    text = legend_text(result, area_mm2).splitlines()
    for name, line in zip(list(result.classes) + [None] * len(text), text, strict=False):
        label = QLabel()
        if name is not None:
            r, g, b = result.classes[name]
            label.setText(
                f'<span style="color: rgb({r},{g},{b}); font-size: 14pt">&#9632;</span> {line}'
            )
        else:
            label.setText(line)
        label.setObjectName("legend_row")
        box.addWidget(label)
    box.addStretch(1)
    return widget


def classify(viewer: Any, layer: Any = None, **kwargs: Any) -> Any:
    """Classify the cells of a slide's nuclei layer and show the classes.

    Parameters
    ----------
    viewer : napari.Viewer
    layer : Labels layer, optional
        The nuclei layer (``"<slide> nuclei"``); default that of the selected slide, else
        of the slide of the selected result layer, else of the slide that has nuclei.
    **kwargs
        Keyword arguments of :func:`~napari_slidescope.pipeline.cell_classes.classify_cells`
        (``markers``, ``dab``, ``phenotypes``, ``compartment``, ``classifier``, ``rules``).

    Returns
    -------
    NucleiResult
        The classified result (``table["class"]``, ``classes``).

    Examples
    --------
    >>> classify(viewer, dab=True)  # doctest: +SKIP
    >>> classify(viewer, phenotypes={"Cytotoxic T": "CD3+ CD8+"})  # doctest: +SKIP
    """
    from napari_slidescope._napari import jobs
    from napari_slidescope._napari.layers import canvas_of
    from napari_slidescope.pipeline.cell_classes import classify_cells

    if layer is None:
        image = jobs.slide_with_results(viewer, "nuclei")
        name = task("nuclei").layer_name(image.name)
        if name not in viewer.layers:
            raise ValueError(f"{image.name}: no nuclei layer to classify; segment nuclei first")
        layer = viewer.layers[name]
    canvas = canvas_of(layer)
    if canvas is None:
        raise ValueError(f"{layer.name}: not a nuclei layer of this plugin")
    result = classify_cells(canvas.to_result(), **kwargs)
    show_classes(layer, result)
    area_mm2 = None
    try:
        from napari_slidescope._qt import session

        image = _slide_of(viewer, layer)
        summary = session.session_for(viewer).summary(image)
        area_um2 = getattr(summary, "tissue_area_um2", None)
        area_mm2 = None if not area_um2 else float(area_um2) / 1e6
    except (ValueError, LookupError, AttributeError):
        area_mm2 = None
    _legend(viewer, result, area_mm2)
    return result


def _slide_of(viewer: Any, nuclei: Any) -> Any:
    """Return the slide layer whose ``"<slide> nuclei"`` layer is `nuclei`."""
    from napari_slidescope._napari import jobs

    for image in jobs.slide_layers(viewer):
        if task("nuclei").layer_name(image.name) == nuclei.name:
            return image
    raise LookupError(f"{nuclei.name}: no slide layer of that name")


def add_cells(viewer: Any, result: Any, image: Any = None) -> Any:
    """Draw a result's cells (``segment_nuclei(cell_expansion_um=...)``) as outlines.

    A result with a cell label image becomes a Labels layer on its grid; one with only
    outlines (a whole slide) is rasterised into a label pyramid on disk, a multiscale
    layer like whole-slide nuclei. Cells take their class colour when classified.

    Returns
    -------
    napari.layers.Labels
        ``"<slide> cells"``, drawn as outlines (``contour=1``).
    """
    from napari_slidescope._napari import jobs
    from napari_slidescope._napari.layers import aligned_transform

    if not result.has_cells:
        raise ValueError(
            "this result has no cells; segment with segment_nuclei(..., cell_expansion_um=...)"
        )
    if image is None:
        image = jobs.active_slide_layer(viewer)
    name = f"{image.name} cells"
    if name in viewer.layers:
        viewer.layers.remove(name)
    if result.cells is not None:
        scale, translate = aligned_transform(image, result.origin, result.downsample)
        units = getattr(image, "units", None)
        extra = {} if units is None else {"units": tuple(units)[-2:]}
        layer = viewer.add_labels(
            result.cells, name=name, scale=scale, translate=translate, opacity=0.8, **extra
        )
    else:
        from napari_slidescope._napari.qupath import detections_layer
        from napari_slidescope._napari.viewport import image_shape0
        from napari_slidescope.analysis.qupath import QuPathObject

        polys, ids = result.cell_outlines
        objects = [QuPathObject("cell", [(p, [])]) for p in polys]
        scale, translate = aligned_transform(image, (0, 0), (1.0, 1.0))
        align: dict[str, Any] = {"scale": scale, "translate": translate}
        if getattr(image, "units", None) is not None:
            align["units"] = tuple(image.units)[-2:]
        data, layer_meta, _ = detections_layer(objects, name, align, image_shape0(image))
        meta = dict(layer_meta)
        meta["features"] = {"index": np.arange(1, len(ids) + 1), "id": np.asarray(ids)}
        layer = viewer.add_labels(data, **meta)
        layer.metadata["slidescope_label_ids"] = np.asarray(ids)
    layer.contour = 1
    if "class" in result.columns:
        ids = layer.metadata.get("slidescope_label_ids")
        if ids is None:
            layer.colormap = class_colormap(
                result.columns["id"], result.columns["class"], result.classes
            )
        else:  # rasterised outlines are numbered 1..n in outline order
            by_id = dict(
                zip(np.asarray(result.columns["id"]).tolist(), result.columns["class"], strict=True)
            )
            classes = np.array([by_id.get(int(i), "") for i in ids], dtype=object)
            layer.colormap = class_colormap(np.arange(1, len(ids) + 1), classes, result.classes)
    return layer
