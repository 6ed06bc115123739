"""Analysis jobs that run on a worker thread: what to analyse, and the generator that does it.

A :class:`JobSpec` carries a slide path (or an in-memory image) and level-0 boxes, never
pixels or open file handles; :func:`run_job` opens the slide and reads pixels on the
calling (worker) thread, yielding per finished tile. Nothing here touches a layer.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Generator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from napari_slidescope._napari.canvases import Patch, tile_patch
from napari_slidescope._napari.open_slides import source_for
from napari_slidescope._napari.viewport import image_shape0
from napari_slidescope._types import Box
from napari_slidescope.errors import SlidescopeWarning
from napari_slidescope.options import NucleiOptions, TissueOptions, canonical_json
from napari_slidescope.pipeline.task_table import task as task_spec
from napari_slidescope.pipeline.task_table import with_needs

Scope = Literal["visible", "slide", "shape"]
#: The tasks a job runs (those of the task table the viewer's jobs know: :data:`JOB_STEPS`).
Task = Literal["tissue", "nuclei"]


@dataclass(frozen=True)
class SlideSource:
    """What a worker needs to open a layer's slide: a path, or the level-0 array.

    Tasks carry this (a path and coordinates), never pixels read on the main thread.
    """

    name: str
    path: str | None
    array: Any
    mpp: tuple[float, float]
    shape0: tuple[int, int]
    info: dict[str, Any] = field(default_factory=dict, compare=False)

    @classmethod
    def from_layer(cls, layer: Any) -> SlideSource:
        """Describe a slide layer (a slide opened by this plugin, or any 2D RGB image).

        Raises
        ------
        ValueError
            If the layer is not a 2D RGB image layer or a slide of this plugin.
        """
        if not is_slide_layer(layer):
            raise ValueError(
                f"layer {getattr(layer, 'name', layer)!r}: expected a 2D RGB image layer"
            )
        mpp = (float(layer.scale[-2]), float(layer.scale[-1]))
        meta = layer.metadata.get("slidescope")
        path = layer.metadata.get("path") if isinstance(meta, dict) else None
        if path:
            return cls(layer.name, str(path), None, mpp, image_shape0(layer), dict(meta))
        data = layer.data[0] if layer.multiscale else layer.data
        info = {"format": "napari layer", "mpp": mpp, "shape": image_shape0(layer)}
        return cls(layer.name, None, data[..., :3], mpp, image_shape0(layer), info)

    def open(self) -> Any:
        """Open the slide (call on the worker thread); close it when done."""
        from napari_slidescope.slide import ArraySlide, open_slide

        if self.path is not None:
            return open_slide(source_for(self.path))
        return ArraySlide(self.array, mpp=self.mpp, name=self.name)


def is_slide_layer(layer: Any) -> bool:
    """Return True for 2D RGB image layers and this plugin's multichannel slides."""
    from napari.layers import Image

    if not (isinstance(layer, Image) and layer.ndim == 2):
        return False
    # RGB images, and the channels of a multichannel slide this plugin opened
    return bool(layer.rgb) or isinstance(layer.metadata.get("slidescope"), dict)


def slide_layers(viewer: Any) -> list[Any]:
    """Return the viewer's 2D RGB image layers, slides opened by this plugin first."""
    found = [ly for ly in viewer.layers if is_slide_layer(ly)]
    return sorted(found, key=lambda ly: "slidescope" not in ly.metadata)


def active_slide_layer(viewer: Any) -> Any:
    """Return the selected slide layer, else the last one; ValueError if there is none."""
    active = viewer.layers.selection.active
    if active is not None and is_slide_layer(active):
        return active
    found = [ly for ly in viewer.layers if is_slide_layer(ly)]
    if not found:
        raise ValueError("no slide in the viewer: open one (a 2D RGB image layer) first")
    return found[-1]


def slide_with_results(viewer: Any, kind: str = "nuclei") -> Any:
    """Return the slide layer whose ``"<slide> <kind>"`` results a console helper should use.

    The selected slide layer when one is selected; else the slide of the selected layer
    when that is one of a slide's result layers (``"<slide> tissue"`` is selected after
    ``add_nuclei``); else the only slide with a ``"<slide> <kind>"`` layer; else, when
    several have one, the last of them, with a :class:`SlidescopeWarning` naming it (pass
    ``layer=`` to choose); else :func:`active_slide_layer`'s answer.

    Raises
    ------
    ValueError
        No slide in the viewer.
    """
    import warnings

    active = viewer.layers.selection.active
    if active is not None and is_slide_layer(active):
        return active
    slides = [ly for ly in viewer.layers if is_slide_layer(ly)]
    if active is not None:
        owners = [s for s in slides if str(active.name).startswith(f"{s.name} ")]
        if owners:
            return max(owners, key=lambda s: len(str(s.name)))  # the most specific name
    having = [s for s in slides if task_spec(kind).layer_name(s.name) in viewer.layers]
    if len(having) > 1:
        warnings.warn(
            f"{len(having)} slides have {kind}: using {having[-1].name!r} (select its layer "
            "or pass layer= to choose)",
            SlidescopeWarning,
            stacklevel=3,
        )
    if having:
        return having[-1]
    return active_slide_layer(viewer)


# -- the job: runs on a worker thread -----------------------------------------------------------


@dataclass
class TissueDone:
    """A tissue result arrived (``whole``: it covers the whole slide)."""

    result: Any
    whole: bool


@dataclass
class Stage:
    """The run entered a stage.

    ``"tissue"`` (finding tissue), ``"preparing"`` (planning tiles, estimating stains,
    loading the model) or ``"segmenting"``.
    """

    name: Literal["tissue", "preparing", "segmenting"]


@dataclass
class TileDone:
    """A tile finished: ``done`` of ``total``; ``core0`` the level-0 box it owns.

    ``patch`` holds its nuclei on the canvas grid (None when it adds nothing there).
    """

    done: int
    total: int
    core0: Box
    patch: Patch | None


@dataclass
class Failed:
    """The run failed with ``error``."""

    error: BaseException


@dataclass(frozen=True)
class NucleiRun:
    """A nuclei run's options, and how it runs: the segmenter object, the worker threads.

    `segmenter` is a :class:`~napari_slidescope.segmenters.Segmenter` object given instead
    of the options' segmenter name (None: ``options.segmenter``); `workers` the tile
    threads (None: all cores but one, leaving one to the GUI thread).
    """

    options: NucleiOptions = field(default_factory=NucleiOptions)
    segmenter: Any = None
    workers: int | None = None

    @classmethod
    def of(cls, value: NucleiRun | NucleiOptions | Mapping[str, Any] | None) -> NucleiRun:
        """Build from options, or from the keywords of ``iter_segment_nuclei``.

        The keywords are :class:`~napari_slidescope.options.NucleiOptions` field names,
        ``workers``, and ``segmenter`` as a name or a segmenter object.

        Raises
        ------
        ValueError
            For an unknown keyword or a bad value (the options' message).
        """
        if isinstance(value, NucleiRun):
            return value
        if isinstance(value, NucleiOptions):
            return cls(value)
        keywords = dict(value or {})
        workers = keywords.pop("workers", None)
        segmenter = keywords.get("segmenter")
        if segmenter is not None and not isinstance(segmenter, str):
            del keywords["segmenter"]
        else:
            segmenter = None
        options = NucleiOptions.from_mapping(keywords, where="nuclei options")
        return cls(options, segmenter, None if workers is None else int(workers))

    @property
    def chosen(self) -> Any:
        """The segmenter asked for: the object, else the options' name."""
        return self.segmenter if self.segmenter is not None else self.options.segmenter


def as_tissue_options(value: TissueOptions | Mapping[str, Any] | None) -> TissueOptions:
    """Build tissue options from options or the keywords of ``detect_tissue``."""
    if isinstance(value, TissueOptions):
        return value
    return TissueOptions.from_mapping(value or {}, where="tissue options")


@dataclass
class JobSpec:
    """Everything a run needs, made on the main thread, read on the worker."""

    source: SlideSource
    task: Task
    region: Box | Any  # a box, a (row, col) polygon, or None for the whole slide
    tissue_options: TissueOptions
    nuclei: NucleiRun
    grid: tuple[Any, Any, tuple[int, int]] | None = None
    covered: tuple[Any, ...] = ()  # level-0 boxes and polygon rings analysed before
    id_offset: int = 0
    tissue: Any = None
    #: The ``LabelPyramid`` the worker pastes tiles into (a whole-slide canvas), or None.
    pyramid: Any = None
    #: The ``LabelPyramid`` the worker pastes the tiles' cells into (a whole-slide canvas
    #: of a run with ``cell_expansion_um``), or None.
    cell_pyramid: Any = None


def source_input(source: SlideSource) -> Literal["brightfield", "fluorescence"]:
    """``"fluorescence"`` or ``"brightfield"``: what the slide's metadata say it is.

    The library's one rule, :func:`~napari_slidescope.segmenters.is_fluorescence`.
    """
    from napari_slidescope.segmenters import is_fluorescence

    info = source.info
    fluorescent = is_fluorescence(
        str(info.get("axes") or ""),
        fluorescence=bool(info.get("fluorescence")),
        channel_names=info.get("channel_names") or (),
    )
    return "fluorescence" if fluorescent else "brightfield"


def nuclei_mpp(source: SlideSource, run: NucleiRun | NucleiOptions | Mapping[str, Any]) -> float:
    """Return the working resolution of a nuclei run (:func:`~.segmenters.working_mpp`).

    With the slide's own pixel size (its metadata, never a rounded display value) and the
    run's segmenter and ``target_mpp`` (None: automatic).
    """
    from napari_slidescope.segmenters import working_mpp

    run = NucleiRun.of(run)
    return working_mpp(
        run.chosen,
        source.info.get("mpp"),
        run.options.target_mpp,
        input=source_input(source),
    )


def nuclei_identity(source: SlideSource, run: NucleiRun | NucleiOptions) -> dict[str, Any]:
    """Return what a nuclei run computes with, defaults resolved (main thread).

    The segmenter ``"auto"`` resolves to for the slide's kind and its model (name,
    version, weights' SHA-256: :func:`~napari_slidescope.segmenters.segmenter_identity`),
    its options, the working resolution (:func:`nuclei_mpp`), the stain mode, the
    nuclear channel, the brightfield stain and the cell expansion asked for. Two runs
    with different identities computed different things: "Add (skip duplicates)" never
    mixes them on one layer.
    """
    from napari_slidescope.segmenters import AUTO, resolve_auto, segmenter_identity

    run = NucleiRun.of(run)
    kind = source_input(source)
    seg = run.chosen
    if isinstance(seg, str) and seg == AUTO:
        seg = resolve_auto(kind, warn=False)
    opts = run.options
    return {
        **segmenter_identity(seg),
        "segmenter_options": canonical_json(dict(opts.segmenter_options)),
        "mpp": float(nuclei_mpp(source, run)),
        "stain_mode": kind,
        "nuclear_channel": opts.channel,
        "stain": opts.stain,
        "cell_expansion_um": opts.cell_expansion_um,
    }


def run_job(spec: JobSpec, cancel: threading.Event) -> Generator[Any, None, None]:
    """Open the slide and analyse it, yielding results as they finish (worker thread).

    The job's task runs after the tasks it needs (the task table's ``needs``), each by its
    step in :data:`JOB_STEPS`; a needed task runs on the whole slide (tissue for nuclei),
    unless the job carries its result already (``spec.tissue``).
    Yields :class:`Stage` as the run moves on, :class:`TissueDone`, one :class:`TileDone`
    per finished tile and, on error, one :class:`Failed` (exceptions never escape, so the
    worker always finishes cleanly).
    Stops within a fraction of a second once `cancel` is set, whatever the stage (tissue
    detection, segmenter preparation and the tiled runner all check it); what was
    yielded so far stays with the caller.
    """
    from napari_slidescope.pipeline.cancel import Cancelled

    slide, state = None, _JobState()
    try:
        slide = spec.source.open()
        calibrated = spec.source.info.get("mpp") is not None
        state.mpp = spec.source.mpp if calibrated else None
        state.results["tissue"] = spec.tissue
        for name in with_needs([spec.task]):
            if name != spec.task and state.results.get(name) is not None:
                continue  # a needed task's result the job carries
            yield from JOB_STEPS[name](spec, slide, state, cancel, name == spec.task)
            if cancel.is_set():
                return
    except Cancelled:
        return  # the tiles yielded so far stay on the canvas
    except Exception as exc:  # noqa: BLE001 - reported to the user as a notification
        yield Failed(exc)
    finally:
        if state.steps is not None:
            state.steps.close()  # stops and joins the tile threads here, on the worker thread
        if slide is not None:
            slide.close()


@dataclass
class _JobState:
    """What a job's steps hand on: the pixel size, results by task, open tile steps."""

    mpp: tuple[float, float] | None = None
    results: dict[str, Any] = field(default_factory=dict)
    steps: Any = None


def _tissue_step(
    spec: JobSpec, slide: Any, state: _JobState, cancel: threading.Event, asked: bool
) -> Generator[Any, None, None]:
    """Find the tissue: in the job's region when asked for, else of the whole slide."""
    from napari_slidescope.pipeline import tissue as tissue_mod

    region = spec.region if asked else None
    yield Stage("tissue")
    tissue = tissue_mod.detect_tissue(
        slide, region=region, mpp=state.mpp, options=spec.tissue_options, cancel=cancel
    )
    tissue.polygons  # noqa: B018 (outlines are traced lazily: here, not on the GUI thread)
    state.results["tissue"] = tissue
    yield TissueDone(tissue, region is None)


def _nuclei_step(
    spec: JobSpec, slide: Any, state: _JobState, cancel: threading.Event, asked: bool
) -> Generator[Any, None, None]:
    """Segment the nuclei of the job's region tile by tile, yielding each tile's patch."""
    from napari_slidescope.pipeline import nuclei as nuclei_mod

    run = spec.nuclei
    opts = run.options
    target, mpp = opts.target_mpp, state.mpp
    if mpp is None and target:  # uncalibrated: its pixels are at the working resolution
        mpp = (target, target)
    # a segmenter object given to the run goes beside the options; a name is in them
    given = {} if run.segmenter is None else {"segmenter": run.segmenter}
    steps = state.steps = nuclei_mod.iter_segment_nuclei(
        slide,
        region=spec.region,
        mpp=mpp,
        options=opts,
        tissue=state.results.get("tissue") if spec.region is None else "auto",
        # leave a core to the GUI thread: fewer threads competing with it for the GIL
        workers=run.workers or max(1, (os.cpu_count() or 2) - 1),
        cancel=cancel,
        read_threads=1,
        **given,
    )
    origin, downsample, shape = spec.grid  # type: ignore[misc]
    yield Stage("preparing")  # set-up runs on the first next(): tissue, stains, model
    segmenting = False
    for step in steps:
        if not segmenting:
            segmenting = True
            yield Stage("segmenting")
        patch = tile_patch(
            step,
            origin=origin,
            downsample=downsample,
            shape=shape,
            covered=spec.covered,
            id_offset=spec.id_offset,
            pyramid=spec.pyramid,
            cell_pyramid=spec.cell_pyramid,
        )
        core0 = step.plan.working_to_level0(step.result.tile.core)
        yield TileDone(step.done, step.total, core0, patch)
        if cancel.is_set():
            return


#: What a job does for each task it runs or needs, by task name (the task table's names):
#: ``step(spec, slide, state, cancel, asked)`` yields the job's messages; `asked` is True
#: for the job's own task, False for one it needs.
JOB_STEPS: dict[str, Callable[..., Generator[Any, None, None]]] = {
    "tissue": _tissue_step,
    "nuclei": _nuclei_step,
}
