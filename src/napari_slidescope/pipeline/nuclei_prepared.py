"""A nuclei run set up and not yet run (:class:`PreparedNuclei`), for engines that spread tiles."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from napari_slidescope.pipeline.nuclei_setup import _Run
from napari_slidescope.pipeline.runner import TileResult, iter_tiles, postprocess_tile
from napari_slidescope.pipeline.tiling import Tile, TilePlan, read_tile
from napari_slidescope.segmenters import Segmenter
from napari_slidescope.slide.level_choice import coarsest_level_not_coarser

__all__ = ["PreparedNuclei"]


class PreparedNuclei:
    """A nuclei run set up and not yet run: its plan, its tiles and a prepared segmenter.

    Made by :func:`~napari_slidescope.pipeline.nuclei.prepare_nuclei`. :meth:`segment` runs
    any subset of the tiles with exactly the per-tile steps of
    :func:`~napari_slidescope.pipeline.nuclei.segment_nuclei` (read, model, post-process,
    ownership, measurements), so a tile segmented here, in another process or on
    another machine gives the same nuclei as in one ``segment_nuclei`` call. This is
    the entry point for engines that spread a slide's tiles over processes (the batch
    engine in :mod:`napari_slidescope.batch`).

    Attributes
    ----------
    plan : TilePlan
        The plan of the whole region.
    tiles : tuple of Tile
        The tiles ``segment_nuclei`` would segment (those with tissue), in plan order.
    segmenter : Segmenter
        The prepared segmenter.
    parameters : dict
        What the run computes with, every default resolved (see
        :attr:`~napari_slidescope.pipeline.nuclei_result.NucleiResult.parameters`).
    """

    def __init__(self, run: _Run) -> None:
        self._run = run

    @property
    def plan(self) -> TilePlan:  # noqa: D102
        return self._run.plan

    @property
    def tiles(self) -> tuple[Tile, ...]:  # noqa: D102
        return self._run.tiles

    @property
    def segmenter(self) -> Segmenter:  # noqa: D102
        return self._run.segmenter

    @property
    def parameters(self) -> dict[str, Any]:
        """What the run computes with, every default resolved (as ``NucleiResult.parameters``)."""
        return dict(self._run.parameters)

    def segment(self, indices: Sequence[int], **runner_kwargs: Any) -> Iterator[TileResult]:
        """Segment the tiles with these plan indices, yielding one result per tile.

        Parameters
        ----------
        indices : sequence of int
            ``Tile.index`` values of tiles in :attr:`tiles`.
        **runner_kwargs
            Passed to :func:`~napari_slidescope.pipeline.runner.iter_tiles`
            (``workers``, ``read_threads``, ...; they change speed, never results).

        Yields
        ------
        TileResult
            In the order of ``indices`` (one staged run: reading, the model and
            post-processing of different tiles overlap); ids are local to each tile
            (``1 .. count``):
            add the counts of the tiles before it in :attr:`tiles` to get the ids
            :func:`~napari_slidescope.pipeline.nuclei.segment_nuclei` gives.

        Raises
        ------
        ValueError
            If an index is not one of :attr:`tiles`.
        """
        by_index = {t.index: t for t in self._run.tiles}
        missing = [int(i) for i in indices if int(i) not in by_index]
        if missing:
            raise ValueError(f"indices: tiles {missing} are not among the tiles to segment")
        kwargs = {**self._run.runner_kwargs, **runner_kwargs}
        # one staged run over all the tiles (reading and post-processing overlap the
        # model), ids made local to each tile again
        gen = iter_tiles(
            self._run.slide,
            self._run.plan,
            self._run.segmenter,
            tiles=[by_index[int(i)] for i in indices],
            measure=self._run.measure,
            **kwargs,
        )
        try:
            for res in gen:
                if res.offset:
                    shift = np.int32(res.offset)
                    labels = np.where(res.labels > 0, res.labels - shift, 0).astype(np.int32)
                    table = {**res.table, "id": np.asarray(res.table["id"]) - shift}
                    cells = res.cells
                    if cells is not None:
                        cells = np.where(cells > 0, cells - shift, 0).astype(np.int32)
                    res = dataclasses.replace(
                        res, labels=labels, table=table, offset=0, cells=cells
                    )
                yield res
        finally:
            gen.close()

    def columns(self) -> list[str]:
        """Return table columns this run's tiles will have (one tile read, nothing segmented)."""
        if not self._run.tiles:
            return []
        tile = self._run.tiles[0]
        pixels = self._read(tile)
        empty = np.zeros(pixels.shape[:2], np.int32)
        measure: Any = self._run.measure
        if getattr(measure, "cell_distance_px", 0):
            return list(measure(empty, pixels, tile, empty))
        return list(measure(empty, pixels, tile))

    def _tile(self, index: int) -> Tile:
        for t in self._run.tiles:
            if t.index == int(index):
                return t
        raise ValueError(f"index: tile {index} is not among the tiles to segment")

    def _read(self, tile: Tile) -> np.ndarray:
        kwargs = self._run.runner_kwargs
        if kwargs.get("reader") is not None:
            return np.asarray(kwargs["reader"](tile))
        level = kwargs.get("level")
        if level is None:
            level = coarsest_level_not_coarser(
                self._run.slide.downsamples, self._run.plan.downsample
            )
        return read_tile(self._run.slide, tile, self._run.plan, level=int(level))

    def predict(self, index: int) -> np.ndarray:
        """Read one tile and run the model stage on it alone (for a model on another worker).

        Parameters
        ----------
        index : int
            ``Tile.index`` of a tile in :attr:`tiles`.

        Returns
        -------
        ndarray
            The segmenter's ``predict`` output for the tile (without the batch axis);
            :meth:`postprocess` turns it into the nuclei :meth:`segment` gives.
        """
        rgb = self._read(self._tile(index))
        raw = np.asarray(self._run.segmenter.predict(rgb[None], mpp=self._run.plan.mpp))
        if raw.shape[0] != 1:
            raise ValueError(f"predict: expected 1 output, got shape {raw.shape}")
        return raw[0]

    def postprocess(self, index: int, raw: np.ndarray) -> TileResult:
        """Post-process one tile's model output: the nuclei it owns and their measurements.

        The tile is read again for its measurements, so this runs where the slide can be
        read, apart from the model.

        Parameters
        ----------
        index : int
            ``Tile.index`` of a tile in :attr:`tiles`.
        raw : ndarray
            :meth:`predict`'s output for that tile.

        Returns
        -------
        TileResult
            As :meth:`segment` yields it (ids local to the tile).
        """
        tile = self._tile(index)
        owned, table, cells = postprocess_tile(
            self._run.segmenter,
            raw,
            self._read(tile),
            tile,
            mpp=self._run.plan.mpp,
            measure=self._run.measure,
            with_cells=True,
        )
        count = int(owned.max()) if owned.size else 0
        return TileResult(tile=tile, labels=owned, count=count, offset=0, table=table, cells=cells)

    def close(self) -> None:
        """Close the slide when ``prepare_nuclei`` opened it."""
        if self._run.owned:
            self._run.slide.close()
