"""Tissue detection in a fresh process: no dask or zarr import, the same pixels as dask."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from napari_slidescope.pipeline import tissue as tissue_mod
from napari_slidescope.pipeline.tissue import detect_tissue
from napari_slidescope.slide import open_slide

CHILD = """
import json, sys
import napari_slidescope as ns
slide = ns.open_slide(sys.argv[1])
slide.read_region((0, 0, 64, 64), level=1)
tissue = ns.detect_tissue(slide)
heavy = ("dask.array", "zarr", "distributed", "skimage.morphology")
print(json.dumps([[m for m in heavy if m in sys.modules], int(tissue.mask.sum())]))
"""


def test_open_and_detect_tissue_import_neither_dask_array_nor_zarr(sample_slide, small_ndpi):
    # a fresh process only pays for what it uses: the dask levels are built (and dask.array
    # imported) the first time ``slide.levels`` is asked for
    for path in (sample_slide[0], small_ndpi):
        out = subprocess.run(
            [sys.executable, "-W", "ignore", "-c", CHILD, str(path)],
            capture_output=True,
            text=True,
            check=True,
        )
        imported, area = json.loads(out.stdout)
        assert imported == [], (path, out.stderr)
        assert area > 0 or path == small_ndpi


def test_levels_are_built_on_first_use_and_kept(sample_slide):
    with open_slide(sample_slide[0]) as slide:
        first = slide.levels
        assert slide.levels is first
        assert len(first) == len(slide.level_shapes) == 3
        for arr, shape in zip(first, slide.level_shapes, strict=True):
            assert arr.shape[:2] == shape
        np.testing.assert_array_equal(
            np.asarray(first[1][100:200, 50:300]),
            slide.read_level(1, (100, 50, 200, 300)),
        )


@pytest.mark.parametrize(
    "name",
    ["CMU-1-Small-Region.svs", "test3-DAPI-2-387.ndpi", "small_vectra.qptiff"],
)
def test_direct_read_gives_the_mask_of_the_dask_read(shared_file, name, monkeypatch):
    path = shared_file(name)
    # at full size (the DCT-scaled read is compared with it in test_tissue_scaled.py)
    monkeypatch.setattr(tissue_mod, "_dct_scale", lambda *a: 1)
    with open_slide(path) as slide:
        direct = detect_tissue(slide)
    # the former read: the slide's dask level, sliced and read through read_pixels
    monkeypatch.setattr(
        tissue_mod, "_read_working", lambda s, *a: tissue_mod._read_working_dask(s, *a)
    )
    with open_slide(path) as slide:
        through_dask = detect_tissue(slide)
    np.testing.assert_array_equal(direct.mask, through_dask.mask)
    assert direct.threshold == through_dask.threshold
    assert direct.area_um2 == through_dask.area_um2


@pytest.mark.parametrize(
    ("origin", "downsample", "box"),
    [
        ((0, 0), (16, 16), (0, 0, 1600, 3200)),  # the box covers every pixel whole
        ((0, 0), (16, 16), (5, 7, 1590, 3000)),  # box edges inside pixels
        ((3, 1), (4.0003, 3.9997), (0, 0, 400, 800)),  # inexact pyramid downsample
        ((0, 0), (16, 16), (405, 1000.5, 870, 1900.25)),  # a small box: most columns out
        ((0, 0), (16, 16), (405, 1203, 870, 1210)),  # inside one column
        ((0, 0), (16, 16), (1700, 0, 1800, 3200)),  # below the mask
    ],
)
def test_tissue_area_equals_the_cell_by_cell_sum(origin, downsample, box):
    from napari_slidescope.pipeline import summary

    rng = np.random.default_rng(0)
    mask = rng.random((100, 200)) < 0.6
    got = summary.tissue_area_px(mask, origin, downsample, [box])
    # the area of every mask pixel inside the box, from its overlap with the box
    ey = origin[0] + downsample[0] * np.arange(101)
    ex = origin[1] + downsample[1] * np.arange(201)
    wy = np.clip(np.minimum(ey[1:], box[2]) - np.maximum(ey[:-1], box[0]), 0, None)
    wx = np.clip(np.minimum(ex[1:], box[3]) - np.maximum(ex[:-1], box[1]), 0, None)
    assert got == pytest.approx(float(np.outer(wy, wx)[mask].sum()), rel=1e-12)
