"""Where a nuclei run of the dock paints: its layers and canvas, set up before it starts.

A nuclei run paints its tiles into ``"<slide> nuclei"`` (and ``"<slide> cells"`` with a
cell expansion) on the main thread while the worker segments. Before the worker starts,
the run's working resolution is fixed with the slide's own (unrounded) pixel size, and
the canvas is made or extended for the run's region: a whole-slide run gets a label
pyramid the worker pastes into, a region run a canvas over the region; "Add (skip
duplicates)" tells the worker the areas analysed before (``covered``) and the first free
id. :func:`set_up_nuclei` does all of that and returns what the session keeps of it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from napari_slidescope._napari import layers as _layers
from napari_slidescope._napari.jobs import JobSpec, NucleiRun, nuclei_identity, nuclei_mpp

__all__ = ["NucleiCanvas", "resolve_nuclei_run", "set_up_nuclei"]


@dataclass
class NucleiCanvas:
    """The layers and canvas a nuclei run paints into.

    Attributes
    ----------
    layer : napari.layers.Labels
        ``"<slide> nuclei"``.
    cells_layer : napari.layers.Labels or None
        ``"<slide> cells"`` of a run with a cell expansion, else None.
    canvas : ResultCanvas or PyramidCanvas
        The labels the tiles are painted into.
    region_index : int
        The run's region among the canvas's regions.
    polygon : (N, 2) ndarray or None
        The run's polygon region (level-0 ``(row, col)`` ring), None for a box.
    """

    layer: Any
    cells_layer: Any
    canvas: _layers.ResultCanvas | _layers.PyramidCanvas
    region_index: int
    polygon: np.ndarray | None


def resolve_nuclei_run(source: Any, nuclei: NucleiRun) -> tuple[NucleiRun, dict[str, Any]]:
    """Return the run with its working resolution fixed, and the identity of its method.

    The one resolution rule (:func:`~napari_slidescope._napari.jobs.nuclei_mpp`), with the
    slide's own (unrounded) pixel size; the identity (segmenter, model, resolution...) is
    what "Add (skip duplicates)" compares with the nuclei already in the layer.
    """
    target = nuclei_mpp(source, nuclei)
    identity = nuclei_identity(source, nuclei)
    run = NucleiRun(nuclei.options.replace(target_mpp=target), nuclei.segmenter, nuclei.workers)
    return run, identity


def set_up_nuclei(
    viewer: Any,
    image: Any,
    spec: JobSpec,
    region: Any,
    mode: Literal["add", "replace"],
    identity: dict[str, Any],
) -> NucleiCanvas:
    """Make or extend the nuclei (and cells) layers of `image` for a run; fill in `spec`.

    Parameters
    ----------
    viewer : napari.Viewer
    image : napari.layers.Image
        The slide layer.
    spec : JobSpec
        The run's job, its nuclei run resolved (:func:`resolve_nuclei_run`): gains the
        canvas's grid, its pyramids (whole slide), the areas covered before and the first
        free id.
    region : box, polygon or None
        The run's region (None: the whole slide).
    mode : {"add", "replace"}
        Add to the layer (skipping what is covered) or replace it.
    identity : dict
        The method's identity, kept on the canvas.

    Returns
    -------
    NucleiCanvas
    """
    from napari_slidescope.pipeline.regions import check_region, split_region

    source, options = spec.source, spec.nuclei.options
    target = float(options.target_mpp)  # type: ignore[arg-type]  # resolved: a number
    own = source.info.get("mpp") or (target, target)  # uncalibrated: 1:1
    ds = (target / own[0], target / own[1])
    box, ring = split_region(region)
    box = check_region(box, source.shape0)
    layer, canvas, covered, offset = _layers.prepare_nuclei_layer(
        viewer, image, box, ds, mode=mode,
        pyramid=True if region is None else None, polygon=ring,
        cells=bool(options.cell_expansion_um),
    )  # fmt: skip
    # the cells on the nuclei's grid, same ids; a run without cells drops old ones
    cells_layer = _layers.prepare_cells_layer(viewer, image, canvas)
    canvas.identity = identity
    spec.grid = (canvas.origin, canvas.downsample, canvas.shape)
    if isinstance(canvas, _layers.PyramidCanvas):
        spec.pyramid = canvas.pyramid
        spec.cell_pyramid = canvas.cells
    spec.covered, spec.id_offset = tuple(covered), offset
    return NucleiCanvas(layer, cells_layer, canvas, len(canvas.regions) - 1, ring)
