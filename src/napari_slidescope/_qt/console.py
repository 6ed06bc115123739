"""One-line helpers for the napari console (and scripts driving a viewer).

Each helper takes the viewer first and works on the selected slide layer (else the last
2D RGB image layer). Analysis runs in the background, like the dock widget: pixels are
read on worker threads, results stream into the viewer tile by tile, and the call
returns when the run has finished (the viewer stays responsive meanwhile); pass
``wait=False`` to return at once. napari is imported only inside the functions, so
importing this module stays cheap.

Examples
--------
In the napari console (``viewer`` is predefined)::

    from napari_slidescope.viewer import add_slide, visible_region, add_tissue, add_nuclei

    add_slide(viewer)                        # the synthetic sample slide (or a path)
    visible_region(viewer)                   # (y0, x0, y1, x1) level-0 px on screen
    add_tissue(viewer, scope="slide")        # "<slide> tissue" over the whole slide
    add_nuclei(viewer)                       # nuclei of what is visible -> "<slide> nuclei"
    add_nuclei(viewer, scope="slide")        # ... of all the tissue on the slide
    summary(viewer)                          # 1,234 nuclei · 5,678 /mm² of tissue · ...
"""

from __future__ import annotations

import os
from typing import Any, Literal

from napari_slidescope._qt.task_fields import dock_task
from napari_slidescope._types import Box

__all__ = ["add_nuclei", "add_slide", "add_tissue", "cancel", "summary", "visible_region"]


def add_slide(
    viewer: Any,
    path: str | os.PathLike[str] | None = None,
    *,
    storage_options: dict[str, Any] | None = None,
) -> Any:
    """Open a slide with this plugin's reader (the bundled sample slide when `path` is None).

    Parameters
    ----------
    viewer : napari.Viewer
    path : str or PathLike, optional
        A local path or a URL (``https://``, ``s3://``... see
        :func:`~napari_slidescope.slide.open_slide`).
    storage_options : dict, optional
        For a URL: passed to its fsspec filesystem (credentials, endpoint...).

    Returns
    -------
    layer : napari.layers.Image
        The slide layer (the first one for a multichannel slide); it becomes selected.

    Examples
    --------
    >>> add_slide(viewer, "CMU-1.svs")  # doctest: +SKIP
    >>> add_slide(viewer, "s3://bucket/CMU-1.svs", storage_options={"anon": True})  # doctest: +SKIP
    """
    if path is None:
        layers = viewer.open_sample("napari-slidescope", "synthetic_he")
    elif storage_options:
        from napari_slidescope._napari.reader import add_slide_layers

        layers = add_slide_layers(viewer, os.fspath(path), storage_options=storage_options)
    else:
        layers = viewer.open(os.fspath(path), plugin="napari-slidescope")
    viewer.layers.selection.active = layers[0]
    return layers[0]


def visible_region(viewer: Any, layer: Any = None) -> Box:
    """Level-0 box ``(y0, x0, y1, x1)`` of the slide that the canvas shows.

    Computed from the camera centre and zoom and the canvas size, through the layer's
    scale and translate, clipped to the slide.

    Examples
    --------
    >>> visible_region(viewer)  # doctest: +SKIP
    (10240, 20480, 11264, 22016)
    """
    from napari_slidescope._napari import jobs, viewport

    layer = layer if layer is not None else jobs.active_slide_layer(viewer)
    return viewport.visible_region(viewer, layer)


def add_tissue(
    viewer: Any,
    layer: Any = None,
    *,
    scope: Literal["visible", "slide"] = "visible",
    region: Box | None = None,
    wait: bool = True,
    **options: Any,
) -> Any:
    """Detect tissue on what is visible (or the whole slide) and show ``"<slide> tissue"``.

    Parameters
    ----------
    viewer : napari.Viewer
    layer : napari.layers.Image, optional
        The slide layer; default the selected one.
    scope : {"visible", "slide"}
        The visible region, or the whole slide.
    region : box, optional
        A level-0 box instead of `scope`.
    wait : bool
        Return when the run has finished (events keep being processed).
    **options
        Keyword arguments of :func:`napari_slidescope.pipeline.tissue.detect_tissue`
        (``target_mpp``, ``min_tissue_um2``, ``mode``, ...).

    Returns
    -------
    layer or worker
        The tissue Shapes layer (outlines; None if the run failed), or the worker with
        ``wait=False``.

    Examples
    --------
    >>> add_tissue(viewer, scope="slide")  # doctest: +SKIP
    """
    from napari_slidescope._napari import jobs
    from napari_slidescope._qt import session

    ctl = session.session_for(viewer)
    image = layer if layer is not None else jobs.active_slide_layer(viewer)
    worker = ctl.run(image, "tissue", scope=scope, region=region, tissue_options=options)
    if not wait:
        return worker
    ctl.wait()
    name = dock_task("tissue").layer_name(image.name)
    return ctl.viewer.layers[name] if name in ctl.viewer.layers else None


def add_nuclei(
    viewer: Any,
    layer: Any = None,
    *,
    scope: Literal["visible", "slide"] = "visible",
    region: Box | None = None,
    mode: Literal["add", "replace"] = "add",
    wait: bool = True,
    tissue_options: dict[str, Any] | None = None,
    **options: Any,
) -> Any:
    """Segment the nuclei of what is visible (or of all tissue) into ``"<slide> nuclei"``.

    Tissue is detected first (once per slide) to gate whole-slide runs and to give the
    density per mm² of tissue. Hover the layer to see each nucleus's measurements.

    Parameters
    ----------
    viewer, layer, region, wait
        As for :func:`add_tissue`.
    scope : {"visible", "slide"}
        The visible region, or the whole slide (tiles with tissue only).
    mode : {"add", "replace"}
        Add to the nuclei already found (no duplicates) or replace them.
    tissue_options : dict, optional
        Keyword arguments of ``detect_tissue``.
    **options
        Keyword arguments of
        :func:`napari_slidescope.pipeline.nuclei.iter_segment_nuclei` (``target_mpp``,
        ``tile_size_um``, ``workers``, ``segmenter``) and ``segmenter_options``.

    Returns
    -------
    layer or worker
        The nuclei Labels layer, or the worker with ``wait=False``.

    Examples
    --------
    >>> add_nuclei(viewer)  # doctest: +SKIP
    >>> add_nuclei(viewer, scope="slide", target_mpp=0.5)  # doctest: +SKIP
    """
    from napari_slidescope._napari import jobs
    from napari_slidescope._qt import session

    ctl = session.session_for(viewer)
    image = layer if layer is not None else jobs.active_slide_layer(viewer)
    worker = ctl.run(
        image,
        "nuclei",
        scope=scope,
        region=region,
        mode=mode,
        tissue_options=tissue_options,
        nuclei_run=options,
    )
    if not wait:
        return worker
    ctl.wait()
    return ctl.viewer.layers[dock_task("nuclei").layer_name(image.name)]


def summary(viewer: Any, layer: Any = None) -> Any:
    """Nuclei count, density per mm² of tissue and mean area of the slide's nuclei layer.

    Parameters
    ----------
    viewer : napari.Viewer
    layer : Image layer, optional
        The slide. Default: the selected slide, else the slide of the selected result
        layer, else the slide that has nuclei (the last one, with a warning naming it,
        when several have).

    Returns
    -------
    Summary or None
        None when no nuclei were segmented on this slide yet.
    """
    from napari_slidescope._napari import jobs
    from napari_slidescope._qt import session

    image = layer if layer is not None else jobs.slide_with_results(viewer, "nuclei")
    return session.session_for(viewer).summary(image)


def cancel(viewer: Any) -> None:
    """Stop the run in flight after its current tile (finished tiles stay)."""
    from napari_slidescope._qt import session

    session.session_for(viewer).cancel()
