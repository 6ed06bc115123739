"""The slide ledger of a batch run: what each slide is, what an earlier run left, what is written.

The ledger decides, per slide, what ``resume`` may keep (same slide file, same request,
same model), records what the workers found and computed in the slide's manifest and
``summary.csv``, and writes the slide's outputs when its last tile is in. It knows
nothing of dask: the scheduler (:mod:`napari_slidescope.batch.scheduler`) hands it
what the tasks returned.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import time
import traceback
import warnings
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from napari_slidescope._io import one_line
from napari_slidescope._version import __version__
from napari_slidescope.batch import outputs
from napari_slidescope.batch.outputs import Manifest, SummaryRow, TileRecord
from napari_slidescope.batch.params import (
    BatchParams,
    SlideStamp,
    params_digest_without,
    shown_path,
    stamp_slide,
)
from napari_slidescope.batch.tasks import RegionsOut, SlideInfo, TaskFailed, TileOut, TilesOut
from napari_slidescope.pipeline.task_table import task
from napari_slidescope.slide.source import scrub

if TYPE_CHECKING:
    from distributed import Future

__all__ = ["MANIFEST_EVERY_S", "BatchProgress", "Ledger"]

log = logging.getLogger(__name__)

#: Seconds between two writes of a running slide's manifest (parts are written at once).
MANIFEST_EVERY_S = 5.0


@dataclass
class BatchProgress:
    """Where a batch stands, handed to the ``progress`` callback after each event.

    Attributes
    ----------
    slides_total, slides_done, slides_failed : int
        Slides in the batch, finished (ok or failed), failed.
    tiles_total, tiles_done : int
        Tiles with tissue found so far (grows as slides are planned) and tiles finished
        (including those a resumed run found finished).
    finished : dict or None
        The summary row of the slide that has just finished, else None.
    kept : bool
        True when that slide was not run but kept from an earlier run (``resume``).
    """

    slides_total: int
    slides_done: int = 0
    slides_failed: int = 0
    tiles_total: int = 0
    tiles_done: int = 0
    finished: dict[str, Any] | None = None
    kept: bool = False


@dataclass
class _Slide:
    index: int
    path: Path | str  # a str is a URL (it may carry credentials: show `shown` instead)
    name: str
    folder: Path
    stamp: SlideStamp | None = None
    status: str = "pending"
    error: str | None = None
    info: SlideInfo | None = None
    tiles: list[int] = field(default_factory=list)
    done: dict[int, float] = field(default_factory=dict)
    manifest: Manifest | None = None
    written_at: float = 0.0
    row: SummaryRow | None = None
    #: Parts of an interrupted earlier run with the same request may be kept (by digest).
    keep_parts: bool = False
    #: What ran on this slide (``SlideInfo.resolved``) and its digest (``run_digest``).
    resolved: dict[str, Any] = field(default_factory=dict)
    digest: str = ""
    #: The slide's class map (``--regions``) once the regions task is in, and its seconds.
    regions: Any = None
    regions_seconds: float = 0.0
    #: Only the regions task is submitted: the nuclei are kept (``resume`` after the
    #: region classifier changed), the slide task is not run again.
    regions_only: bool = False
    #: ``--tiles``: the tiles task is to run (False: not asked, or an earlier run's tiles
    #: of the same parameters are kept), and its record once in (or the kept one).
    tiles_todo: bool = False
    tile_table: dict[str, Any] | None = None
    tiles_seconds: float = 0.0
    #: Only the tiles task runs: the slide's other outputs are kept as they are.
    tiles_only: bool = False
    #: The slide task is not run (its tissue and nuclei are kept): the scheduler submits
    #: the regions and tiles tasks alone.
    skip_slide_task: bool = False
    # the scheduler's: the slide task's future (its tissue mask feeds the tile tasks),
    # the chunks of tiles still to submit and the futures in flight
    prep: Future[Any] | None = None
    todo: deque[list[int]] = field(default_factory=deque)
    futures: set[Future[Any]] = field(default_factory=set)
    #: nuclei.parquet / nuclei.geojson.gz written as the tiles finish (none: joined at
    #: the end, as a classified slide's are)
    stream: Any = None

    @property
    def shown(self) -> str:
        """The absolute path, or the URL without credentials."""
        return shown_path(self.path)


def _message(exc: BaseException) -> str:
    """One line: the exception's type, message and notes (``_io.one_line``)."""
    return one_line(exc, typed=True)


#: The ``summary.csv`` columns of ``--tiles`` (after the usual ones) and their record keys.
TILE_COLUMNS = {"tiles": "tiles", "tiles_per_s": "tiles_per_s", "model_wait_s": "model_wait_s"}


def _tile_columns(record: dict[str, Any]) -> dict[str, Any]:
    """Return the summary figures of a slide's tiles: count, tiles per second, model wait."""
    return {col: record.get(key) for col, key in TILE_COLUMNS.items()}


def _without_tiles(figures: Any) -> dict[str, Any]:
    """Return a row's extra columns less those of ``--tiles``."""
    return {k: v for k, v in dict(figures).items() if k not in TILE_COLUMNS}


class Ledger:
    """The slides of a batch run, their resume decisions, manifests and summary rows.

    Parameters
    ----------
    params : BatchParams
        What the run is asked to do.
    out : Path
        The output folder.
    slides : list of _Slide
        The slides, in input order.
    resume : bool
        Keep what an earlier run into `out` finished with the same request and model.
    progress : callable, optional
        ``progress(BatchProgress)`` after each event.
    model_now : callable
        ``model_now(segmenter, stain_mode)``: the identity of the model the cluster's
        workers would run now (asked once per stain mode, on ``resume`` only).
    """

    #: Write nuclei.parquet / nuclei.geojson.gz while the tiles finish (no whole-slide
    #: class thresholds to wait for); False joins the parts at the end.
    stream_outputs = True

    def __init__(
        self,
        params: BatchParams,
        out: Path,
        slides: list[_Slide],
        *,
        resume: bool,
        progress: Callable[[BatchProgress], None] | None,
        model_now: Callable[[str, str], dict[str, Any]],
    ) -> None:
        self.params, self.out, self.slides, self.resume = params, out, slides, resume
        self.report = progress or (lambda p: None)
        self.state = BatchProgress(slides_total=len(slides))
        self.request = params.digest()
        self.model_now = model_now
        self.expected: dict[str, dict[str, Any]] = {}  # stain mode -> model identity now
        self.noted: set[str] = set()

    def rows(self) -> list[dict[str, Any]]:
        """Return the summary row of each slide, in input order, as dicts."""
        return [self._shown_row(s).to_json() for s in self.slides]

    def _shown_row(self, s: _Slide) -> SummaryRow:
        """Return the slide's row; a slide not started yet: its name, status and path."""
        return s.row or SummaryRow(s.name, s.status, path=s.shown)

    # -- per slide -------------------------------------------------------------------------

    def start(self, s: _Slide) -> bool:
        """Stamp the slide and decide what an earlier run left; False when nothing to do."""
        try:
            s.stamp = stamp_slide(s.path, self.params.storage_options)
        except (OSError, ValueError) as exc:  # ValueError: a SlideError for a URL
            s.folder.mkdir(parents=True, exist_ok=True)
            self.fail(s, exc, write_manifest=True)
            return False
        s.folder.mkdir(parents=True, exist_ok=True)
        old = outputs.read_manifest(s.folder)
        if self.params.has("tiles"):
            if self.resume and old is not None and self._tiles_same(s, old):
                s.tile_table = dict(old.tile_table or {})
            else:
                s.tiles_todo = True
        if old is not None and self._others_kept(s, old):
            return self._keep_others(s, old)
        same = (
            self.resume
            and old is not None
            and old.requested_sha256 == self.request
            and old.slide_stamp == self.stamp_dict(s)
        )
        kept = [s.folder / name for t in self.params.tasks for name in task(t).files]
        if self.params.nuclei and self.params.anndata:
            kept.append(s.folder / "cells.h5ad")
        no_nuclei = old is not None and old.summary is not None and old.summary.nuclei == 0
        if self.params.nuclei and self.params.spatialdata and not no_nuclei:  # none: no store
            kept.append(s.folder / outputs.SPATIALDATA_STORE / "zarr.json")  # renamed in whole
        if same and old is not None and old.status == "done" and all(p.is_file() for p in kept):
            if self._same_model(old):
                row = old.summary or SummaryRow(s.name, "done")
                s.status, s.manifest = "done", old
                s.row = dataclasses.replace(row, slide=s.name, path=s.shown)
                self.state.slides_done += 1
                n = len(old.tiles or {})
                self.state.tiles_total += n
                self.state.tiles_done += n
                self.state.finished, self.state.kept = s.row.to_json(), True
                self.report(self.state)
                self.state.finished, self.state.kept = None, False
                return False
            same = False  # another model now: redone from scratch, never mixed
        if not same and old is not None and self._nuclei_kept(s, old):
            # the nuclei are kept: only their classes and regions are computed again
            return self._reclassify(s, old)
        if same:
            s.keep_parts = True  # parts of this run's model are kept once it is known
        else:
            outputs.clear_slide(s.folder, keep=() if s.tiles_todo else ("tiles",))
        s.status = "running"
        s.manifest = Manifest(
            slide=s.name,
            path=shown_path(s.path),
            status="running",
            slide_stamp=self.stamp_dict(s),
            parameters=self.params.as_dict(),
            requested_sha256=self.request,
            # resolved and parameters_sha256: what ran, once the slide task has said
            tile_table=s.tile_table,
        )
        s.row = self._row(s)
        outputs.write_manifest(s.folder, s.manifest)
        return True

    def _tiles_digest(self, s: _Slide) -> str:
        """SHA-256 of what a slide's tiles depend on: tiling, model, tissue options, slide."""
        asked = self.params.as_dict()
        value = {
            "tiles": asked.get("tiles"),
            "tissue": asked.get("tissue"),
            "slide_stamp": self.stamp_dict(s),
            "version": __version__,
        }
        text = json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)
        return hashlib.sha256(text.encode()).hexdigest()

    def _tiles_same(self, s: _Slide, old: Manifest) -> bool:
        """Whether an earlier run left this slide's tiles (and embeddings) as asked now."""
        record = old.tile_table or {}
        if record.get("sha256") != self._tiles_digest(s):
            return False
        if not (s.folder / outputs.TILES_FILE).is_file():
            return False
        options = self.params.tiles_options
        return (
            options is None
            or not options.model
            or (s.folder / outputs.TILE_EMBEDDINGS_STORE / "zarr.json").is_file()
        )

    def _others_kept(self, s: _Slide, old: Manifest) -> bool:
        """Whether a finished slide differs from what is asked in its tiles alone.

        Its tiles are to be computed (a new model or tiling), or no longer asked for,
        while every other output was finished with the parameters asked now (the request
        less the tiles) and the same model: those are kept, the tiles task runs alone.
        """
        if not (self.resume and old.status == "done" and old.parameters is not None):
            return False
        if not (s.tiles_todo or (old.tile_table is not None and not self.params.has("tiles"))):
            return False
        if old.slide_stamp != self.stamp_dict(s):
            return False
        if params_digest_without(old.parameters, ["tiles"]) != self.params.digest_without(
            ["tiles"]
        ):
            return False
        names = [n for t in self.params.tasks if t != "tiles" for n in task(t).files]
        if self.params.nuclei and self.params.anndata:
            names.append("cells.h5ad")
        if not all((s.folder / n).is_file() for n in names):
            return False
        return not self.params.nuclei or self._model_unchanged(old.resolved or {})

    def _keep_others(self, s: _Slide, old: Manifest) -> bool:
        """Keep a finished slide's other outputs; run its tiles task alone (True) or none.

        A slide whose tiles are no longer asked for loses them and is done (False).
        """
        row = old.summary or SummaryRow(s.name, "done")
        row = dataclasses.replace(row, slide=s.name, path=s.shown)
        manifest = old.replace(
            parameters=self.params.as_dict(),
            requested_sha256=self.request,
            parameters_sha256=self.params.run_digest(old.resolved or {}),
            tile_table=None,
        )
        if not s.tiles_todo:  # the tiles are no longer asked for
            outputs.remove_tiles(s.folder)
            s.row = dataclasses.replace(row, regions=_without_tiles(row.regions))
            s.status, s.manifest = "done", manifest.replace(summary=s.row)
            outputs.write_manifest(s.folder, s.manifest)
            self.state.slides_done += 1
            self.state.finished, self.state.kept = s.row.to_json(), True
            self.report(self.state)
            self.state.finished, self.state.kept = None, False
            return False
        s.tiles_only = s.skip_slide_task = True
        s.status, s.row = "running", dataclasses.replace(row, status="running")
        # written first: a run stopped half-way redoes the tiles, never keeps old ones
        s.manifest = manifest.replace(status="running", summary=None)
        outputs.write_manifest(s.folder, s.manifest)
        return True

    def _same_model(self, old: Manifest) -> bool:
        """Whether a finished slide's record names the model that would run on it now."""
        if not self.params.nuclei:
            return True
        resolved = old.resolved or {}
        if old.parameters_sha256 != self.params.run_digest(resolved):
            return False
        return self._model_unchanged(resolved)

    def _model_unchanged(self, resolved: dict[str, Any]) -> bool:
        """Whether the model a slide's record names is the one the cluster would run now."""
        from napari_slidescope.segmenters import IDENTITY_KEYS

        mode = resolved.get("stain_mode")
        if mode is None:
            return False
        if mode not in self.expected:  # asked of the cluster: the model its workers have
            self.expected[mode] = self.model_now(self.params.nuclei_options.segmenter, mode)
        now = self.expected[mode]
        return all(resolved.get(k) == now.get(k) for k in IDENTITY_KEYS)

    def _nuclei_kept(self, s: _Slide, old: Manifest) -> bool:
        """Whether only what a finished slide's nuclei feed differs from what is asked.

        That is the classification or the regions (the tasks outside the segmentation
        digest, ``TaskSpec.segmentation``). Then its tissue and nuclei (same slide file,
        options and model) are kept; its classes are computed again from the measurements
        ``nuclei.parquet`` holds, and its regions by the regions task alone.
        """
        if not (self.resume and self.params.nuclei and old.status == "done"):
            return False
        if old.slide_stamp != self.stamp_dict(s) or old.requested_sha256 == self.request:
            return False
        if (old.parameters or {}).get("anndata") != self.params.anndata:
            return False
        resolved = old.resolved or {}
        if old.segmentation_sha256 != self.params.segmentation_digest(resolved):
            return False
        if not old.tiles or old.slide_info is None:
            return False
        names = [n for t in self.params.tasks if task(t).segmentation for n in task(t).files]
        if self.params.anndata:
            names.append("cells.h5ad")
        # a store asked for now or no longer is written or removed as the slide finishes
        if not all((s.folder / n).is_file() for n in names):
            return False
        return self._model_unchanged(resolved)

    def _reclassify(self, s: _Slide, old: Manifest) -> bool:
        """Classify a finished slide again from its stored measurements (no segmentation).

        Its tile parts are written back from ``nuclei.parquet`` and the slide is finished
        as a run from scratch finishes it: the same tables, outlines and ids, the new
        classes. ``tissue.geojson`` is not touched. With ``--regions`` the slide's class
        map is computed again first (the regions task alone: True, the scheduler submits
        it), then the slide finishes with the new regions; else it finishes here (False).
        """
        assert old.tiles is not None and old.slide_info is not None
        shown = old.slide_info
        mpp = shown.get("mpp")
        area = old.tissue_area_mm2
        s.info = SlideInfo(
            shape0=(int(shown["shape0"][0]), int(shown["shape0"][1])),
            mpp=None if mpp is None else (float(mpp[0]), float(mpp[1])),
            format=str(shown.get("format", "")),
            tissue_area_um2=None if area is None else area * 1e6,
            tissue_polygons=[],
            tissue_holes=[],
            seconds=float(old.slide_task_seconds or 0.0),
            tiles=sorted(old.tiles),
            plan=dict(old.plan or {}),
            resolved=dict(old.resolved or {}),
        )
        s.resolved = dict(s.info.resolved)
        s.digest = self.params.run_digest(s.resolved)
        s.status = "running"
        # written first: a run stopped half-way is redone, never kept with other classes
        s.manifest = old.replace(
            status="running",
            parameters=self.params.as_dict(),
            requested_sha256=self.request,
            parameters_sha256=s.digest,
            summary=None,
            tile_table=s.tile_table,
        )
        outputs.write_manifest(s.folder, s.manifest)
        try:
            s.tiles = outputs.parts_from_nuclei(s.folder, s.info.tiles)
            s.done = {i: old.tiles[i].seconds or 0.0 for i in s.tiles}
            self.state.tiles_total += len(s.tiles)
            self.state.tiles_done += len(s.tiles)
            if self.params.regions or s.tiles_todo:
                s.regions_only = self.params.regions
                s.skip_slide_task = True
                return True
            self.finish(s)
        except Exception as exc:  # noqa: BLE001 - the slide fails, the batch goes on
            outputs.remove_parts(s.folder)
            self.fail(s, exc)
        return False

    def stamp_dict(self, s: _Slide) -> dict[str, Any]:
        """Return what the manifest records of the slide's stamp."""
        assert s.stamp is not None
        stamp = {
            "size": s.stamp.size,
            "mtime_ns": s.stamp.mtime_ns,
            "head_sha256": s.stamp.head_sha256,
        }
        if s.stamp.remote is not None:  # what the store said: ETag, version, last-modified
            stamp.update({k: v for k, v in s.stamp.remote.items() if k != "size"})
        return stamp

    def planned(self, s: _Slide, info: SlideInfo) -> list[int]:
        """Record what the slide task found; return the tiles still to segment."""
        s.info = info
        s.resolved = dict(info.resolved)
        s.digest = self.params.run_digest(s.resolved)
        if info.note is not None and info.note not in self.noted:  # once per run
            from napari_slidescope.segmenters import SegmenterInfoWarning

            self.noted.add(info.note)
            warnings.warn(info.note, SegmenterInfoWarning, stacklevel=2)
        outputs.write_tissue(s.folder, info.tissue_polygons, info.tissue_holes)
        area = None if info.tissue_area_um2 is None else info.tissue_area_um2 / 1e6
        s.manifest = self._manifest(s).replace(
            slide_info={"shape0": list(info.shape0), "mpp": info.mpp, "format": info.format},
            tissue_area_mm2=area,
            slide_task_seconds=info.seconds,
            resolved=s.resolved,
            parameters_sha256=s.digest,
            segmentation_sha256=self.params.segmentation_digest(s.resolved),
        )
        if not self.params.nuclei:
            self._finish_when_ready(s)
            return []
        s.tiles = list(info.tiles)
        # parts an interrupted run wrote with this very model and plan (same digest)
        found = outputs.finished_parts(s.folder, s.digest) if s.keep_parts else {}
        s.done = {i: t for i, t in found.items() if i in set(s.tiles)}
        todo = [i for i in s.tiles if i not in s.done]
        s.manifest = s.manifest.replace(plan=info.plan)
        self.state.tiles_total += len(s.tiles)
        self.state.tiles_done += len(s.done)
        self.write_manifest(s, force=True)
        # written as it goes, unless every nucleus is needed first: the classification's
        # thresholds, or the region each nucleus lies in (the regions task may finish last)
        if self.stream_outputs and self.params.classify is None and not self.params.regions:
            from napari_slidescope.batch.nuclei_stream import NucleiStream

            if s.stream is not None:
                s.stream.abort()
            s.stream = NucleiStream(s.folder, **self._nuclei_outputs(s))
            s.stream.advance(s.tiles, s.done)
        if not todo:
            self._finish_when_ready(s)
        else:
            self.report(self.state)
        return todo

    def tiles_done(self, s: _Slide, results: list[TileOut]) -> None:
        """Write the parts of finished tiles; finish the slide with its last tile."""
        for tile in results:
            outputs.write_part(s.folder, tile, s.digest)
            s.done[tile.index] = tile.seconds
            self.state.tiles_done += 1
        if s.stream is not None:
            s.stream.advance(s.tiles, s.done)
        if not self._finish_when_ready(s):
            self.write_manifest(s)
            self.report(self.state)

    def regions_done(self, s: _Slide, out: RegionsOut) -> None:
        """Write the slide's class map and outlines; finish the slide if its tiles are in."""
        outputs.write_regions(s.folder, out.regions)
        s.regions, s.regions_seconds = out.regions, out.seconds
        if not self._finish_when_ready(s):
            self.report(self.state)

    def tiles_table_done(self, s: _Slide, out: TilesOut) -> None:
        """Write the slide's tiles and embeddings; finish the slide if the rest is in."""
        outputs.write_tiles(s.folder, out.tiles, out.embeddings)
        s.tile_table = {"sha256": self._tiles_digest(s), **out.record}
        s.tiles_seconds = float(out.record.get("seconds") or 0.0)
        s.manifest = self._manifest(s).replace(tile_table=s.tile_table)
        if s.tiles_only:  # the rest was kept: the slide is done with its new tiles
            assert s.row is not None
            s.status = "done"
            s.row = dataclasses.replace(
                s.row, status="done", regions={**s.row.regions, **_tile_columns(s.tile_table)}
            )
            s.manifest = s.manifest.replace(status="done", error=None, summary=s.row)
            self.write_manifest(s, force=True)
            self.state.slides_done += 1
            self._announce(s)
        elif not self._finish_when_ready(s):
            self.write_manifest(s, force=True)
            self.report(self.state)

    def _finish_when_ready(self, s: _Slide) -> bool:
        """Finish the slide once its slide task, tiles, regions and tile table are all in."""
        if s.info is None or len(s.done) < len(s.tiles):
            return False
        if self.params.regions and s.regions is None:
            return False
        if s.tiles_todo and s.tile_table is None:
            return False
        self.finish(s)
        return True

    def finish(self, s: _Slide) -> None:
        """Write a slide's outputs (classified), manifest and summary row: it is done."""
        assert s.info is not None and s.stamp is not None
        summary = None
        classes = None
        regions = None  # the region of each nucleus
        if self.params.nuclei and s.regions is not None:
            regions = outputs.region_columns(s.folder, s.tiles, s.regions)
        if self.params.nuclei:
            if s.stream is not None:  # written as the tiles finished: the footers only
                summary = s.stream.close()
                s.stream = None
            else:
                if self.params.classify is not None:
                    area = s.info.tissue_area_um2
                    classes = outputs.classify_parts(
                        s.folder,
                        s.tiles,
                        json.loads(self.params.classify),
                        None if area is None else area / 1e6,
                    )
                summary = outputs.write_nuclei(
                    s.folder, s.tiles, classes=classes, regions=regions, **self._nuclei_outputs(s)
                )
            # the nuclei (and cells) as an OME-NGFF label image: viewers show them without
            # drawing a polygon (napari_slidescope.batch.label_image)
            from napari_slidescope.batch.label_image import write_label_image

            write_label_image(s.folder, s.tiles, shape0=s.info.shape0, mpp=s.info.mpp)
        if self.params.nuclei and self.params.anndata:
            outputs.write_anndata(
                s.folder,
                s.tiles,
                slide=s.name,
                mpp=s.info.mpp or 1.0,
                classes=classes,
                regions=regions,
            )
        if self.params.nuclei and self.params.spatialdata:
            outputs.write_spatialdata(
                s.folder,
                s.tiles,
                slide_path=shown_path(s.path),
                shape0=s.info.shape0,
                mpp=s.info.mpp or 1.0,
                segmenter=str(s.resolved.get("segmenter", "")),
                classes=classes,
                regions=regions,
            )
        else:  # one an earlier run asked for no longer matches what was asked
            outputs.remove_spatialdata(s.folder)
        s.status = "done"
        s.row = self._row(s, summary)
        if self.params.nuclei and classes is not None:
            s.row = dataclasses.replace(s.row, **classes.row())
        if s.regions is not None:
            figures = outputs.region_figures(s.regions, regions, classes)
            outputs.write_regions_csv(s.folder, outputs.region_rows(s.regions, figures))
            s.row = dataclasses.replace(s.row, regions=figures)
        elif not self.params.regions:  # those of an earlier run with --regions
            outputs.remove_regions(s.folder)
        if s.tile_table is not None:
            s.row = dataclasses.replace(
                s.row, regions={**s.row.regions, **_tile_columns(s.tile_table)}
            )
        elif not self.params.has("tiles"):  # those of an earlier run with --tiles
            outputs.remove_tiles(s.folder)
        s.manifest = self._manifest(s).replace(status="done", error=None, summary=s.row)
        self.write_manifest(s, force=True)
        outputs.remove_parts(s.folder)
        self.state.slides_done += 1
        self._announce(s)

    def _nuclei_outputs(self, s: _Slide) -> dict[str, Any]:
        """Return the metadata, units and feature-id seed of a slide's nuclei outputs."""
        from napari_slidescope.analysis.measure import COLUMNS

        assert s.info is not None and s.stamp is not None
        return {
            "file_metadata": {
                "slide": s.name,
                "path": shown_path(s.path),
                "slide_stamp": self.stamp_dict(s),
                "mpp": s.info.mpp,
                "shape0": list(s.info.shape0),
                "software": f"napari-slidescope {__version__}",
                "parameters": self.params.as_dict(),
                "requested_sha256": self.request,
                "resolved": s.resolved,
                "parameters_sha256": s.digest,
                "plan": s.info.plan,
                "columns": {**outputs.NUCLEI_COLUMNS, **COLUMNS},
                **(
                    {"regions": {"classes": list(s.regions.classes)}}
                    if s.regions is not None
                    else {}
                ),
            },
            "units": {k: v for k, v in COLUMNS.items() if k != "id"},
            "feature_ns": f"{s.name}/{s.stamp.head_sha256}/{s.digest}",
        }

    def fail(
        self, s: _Slide, exc: BaseException | TaskFailed, *, write_manifest: bool = True
    ) -> None:
        """Record why a slide failed (one line, the traceback in its manifest)."""
        if s.stream is not None:  # its temporary files go; parts stay for a resume
            s.stream.abort()
            s.stream = None
        secrets = self.params.storage_options
        if isinstance(exc, TaskFailed):
            s.error, tb = exc.message, exc.traceback
        else:
            s.error, tb = _message(exc), "".join(traceback.format_exception(exc))
        s.error, tb = scrub(s.error, secrets), scrub(tb, secrets)
        s.status = "failed"
        s.row = self._row(s)
        s.manifest = self._manifest(s).replace(status="failed", error=s.error, traceback=tb)
        if write_manifest:
            try:
                self.write_manifest(s, force=True)
            except OSError:
                log.exception("cannot write the manifest of %s", s.name)
        self.state.slides_done += 1
        self.state.slides_failed += 1
        self._announce(s)

    def _announce(self, s: _Slide) -> None:
        self.write_summary()
        self.state.finished = self._shown_row(s).to_json()
        self.report(self.state)
        self.state.finished = None

    def write_manifest(self, s: _Slide, *, force: bool = False) -> None:
        """Write the slide's manifest (at most every :data:`MANIFEST_EVERY_S` unless forced)."""
        now = time.monotonic()
        if not force and now - s.written_at < MANIFEST_EVERY_S:
            return
        manifest = self._manifest(s)
        if s.tiles:
            waiting = "pending" if s.status == "running" else s.status
            manifest = manifest.replace(
                tiles={
                    i: (
                        TileRecord("done", round(s.done[i], 4))
                        if i in s.done
                        else TileRecord(waiting)
                    )
                    for i in s.tiles
                }
            )
        s.manifest = manifest
        outputs.write_manifest(s.folder, manifest)
        s.written_at = now

    def _manifest(self, s: _Slide) -> Manifest:
        """Return the slide's manifest so far (failed before it began: a bare one)."""
        return s.manifest or Manifest(s.name, s.shown, s.status)

    def _row(self, s: _Slide, summary: outputs.SlideSummary | None = None) -> SummaryRow:
        info = s.info
        area = None
        if info is not None and info.tissue_area_um2 is not None:
            area = info.tissue_area_um2 / 1e6
        seconds = None
        if info is not None:
            seconds = info.seconds + sum(s.done.values()) + s.regions_seconds + s.tiles_seconds
        row = SummaryRow(
            s.name, s.status, s.error, tissue_area_mm2=area, seconds=seconds, path=s.shown
        )
        if summary is not None:  # the one definition of the figures (pipeline.summary)
            from napari_slidescope.pipeline.summary import nuclei_figures

            tissue = None if info is None else info.tissue_area_um2
            fig = nuclei_figures(summary.nuclei, tissue, summary.area_um2_sum)
            row = dataclasses.replace(
                row,
                nuclei=fig.count,
                nuclei_per_mm2=fig.density_per_mm2,
                mean_nucleus_area_um2=fig.mean_area_um2,
            )
        return row

    def write_summary(self) -> None:
        """Write ``summary.csv``: one row per slide, those not started yet as pending."""
        rows = [self._shown_row(s) for s in self.slides]
        outputs.write_summary(self.out / "summary.csv", rows)
