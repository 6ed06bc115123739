"""Cell classes on napari layers: class colours on a nuclei layer and in its features.

The napari-only half of :mod:`napari_slidescope._qt.cell_classes_dock` (which adds the legend dock
and the console's ``classify``/``add_cells``): :func:`class_colormap` also colours classified
detections read from QuPath GeoJSON (:mod:`napari_slidescope._napari.qupath`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from psygnal import Signal

from napari_slidescope._napari.layers import canvas_of, cells_layers_of

__all__ = ["class_colormap", "events", "legend_text", "show_classes"]


class _ClassEvents:
    """``changed(layer, result)``: a layer's classes were (re)coloured by :func:`show_classes`.

    The measurements table redraws its threshold lines and the "Cell classification" dock
    takes the rules (thresholds dragged on the histogram included) from it.
    """

    changed = Signal(object, object)


#: The module's events (:class:`_ClassEvents`).
events = _ClassEvents()


def class_colormap(
    ids: np.ndarray, classes: np.ndarray, colors: dict[str, tuple[int, int, int]]
) -> Any:
    """Return a napari ``DirectLabelColormap``: each id in its class's colour, background clear."""
    from napari.utils.colormaps import DirectLabelColormap

    mapping: dict[Any, Any] = {None: np.array([0.5, 0.5, 0.5, 1.0]), 0: np.zeros(4)}
    rgba = {k: np.array([*(np.asarray(v[:3], float) / 255), 1.0]) for k, v in colors.items()}
    grey = np.array([0.6, 0.6, 0.6, 1.0])
    for i, c in zip(np.asarray(ids).tolist(), np.asarray(classes).tolist(), strict=True):
        mapping[int(i)] = rgba.get(str(c), grey)
    return DirectLabelColormap(color_dict=mapping)


def legend_text(result: Any, area_mm2: float | None = None) -> str:
    """One line per class: ``name  count`` (and per mm²), then the IHC figures if scored."""
    from napari_slidescope.pipeline.cell_classes import class_summary

    s = class_summary(result, area_mm2=area_mm2)
    lines = []
    for name in result.classes:
        line = f"{name}: {s[f'{name}_count']}"
        if area_mm2:
            line += f" ({s[f'{name}_per_mm2']:.0f} /mm²)"
        lines.append(line)
    if "h_score" in s:
        lines.append(f"Positive {s['positive_percent']:.1f} % · H-score {s['h_score']:.0f}")
    return "\n".join(lines)


def show_classes(layer: Any, result: Any) -> None:
    """Colour `layer`'s labels by the classes of `result` and add them to its features.

    The cells a run drew beside the nuclei (``"<slide> cells"``, same ids) take the same
    colours.
    """
    table = result.columns
    layer.colormap = class_colormap(table["id"], table["class"], result.classes)
    for cells in cells_layers_of(canvas_of(layer)):
        cells.colormap = class_colormap(table["id"], table["class"], result.classes)
    feats = layer.features
    if len(feats) == len(table["id"]) and "index" in feats:
        order = {int(i): k for k, i in enumerate(table["id"])}
        rows = [order.get(int(i), -1) for i in np.asarray(feats["index"])]
        new = {c: v for c, v in feats.items()}
        for col, values in table.items():
            if col == "class" or col.endswith("_positive") or col == "dab_score":
                values = np.asarray(values)
                new[col] = [values[r] if r >= 0 else None for r in rows]
        layer.features = new
    layer.metadata["slidescope_classes"] = dict(result.classes)
    layer.metadata["slidescope_classification"] = result.classification
    events.changed.emit(layer, result)
