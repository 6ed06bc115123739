"""Live-preview caches of tissue regions: bit-identical to classify_regions, reused, bounded."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from napari_slidescope import Stroke, classify_regions, open_slide, train_region_classifier
from napari_slidescope.errors import Cancelled
from napari_slidescope.pipeline.region_classifier import slide_stains
from napari_slidescope.pipeline.region_preview import _RECT_TILES, RegionPreview, _rectangles
from napari_slidescope.sample_regions import REGION_CLASSES, TRUTH_MPP, write_region_slide

pytest.importorskip("sklearn")

#: Cached tile side in the tests (working px): many tiles on a small slide.
TILE = 32


@pytest.fixture(scope="module")
def region_slide(tmp_path_factory):
    """A 0.6 mm square synthetic H&E slide at 0.5 µm/px: 300 x 300 working px at 2 µm/px."""
    path = tmp_path_factory.mktemp("preview") / "regions.svs"
    truth = write_region_slide(path, shape=(1200, 1200), mpp=0.5, region_um=150.0, seed=5)
    return path, truth


def _strokes(truth, per_class: int, seed: int = 1) -> dict[str, list[Stroke]]:
    """Short horizontal strokes (40 µm) centred on truth pixels of each class present."""
    rng = np.random.default_rng(seed)
    px = TRUTH_MPP / truth.mpp  # level-0 px of a truth pixel
    out = {}
    for k, name in enumerate(REGION_CLASSES, start=1):
        ys, xs = np.nonzero(truth.labels == k)
        if not len(ys):
            continue
        pick = rng.choice(len(ys), per_class, replace=len(ys) < per_class)
        out[name] = [
            Stroke(np.array([[(ys[i] + 0.5) * px, (xs[i] + 0.5) * px + d] for d in (-40, 40)]))
            for i in pick
        ]
    return out


@pytest.fixture(scope="module")
def trained(region_slide):
    path, truth = region_slide
    with open_slide(path) as slide:
        return train_region_classifier(slide, _strokes(truth, 3), stains=slide_stains(slide))


@pytest.fixture
def preview(region_slide):
    pv = RegionPreview(open_slide(region_slide[0]), tile_px=TILE)
    yield pv
    pv.slide.close()


@pytest.mark.parametrize("tissue", [False, None])
def test_cached_preview_equals_classify_regions_bit_for_bit(region_slide, trained, tissue):
    path, _ = region_slide
    # boxes off the tile grid, one at the slide's edge (mirrored pixels), one seen twice
    boxes = [(130, 70, 910, 650), (402, 538, 1200, 1200), (0, 0, 1200, 1200), (130, 70, 910, 650)]
    with open_slide(path) as slide:
        pv = RegionPreview(slide, tile_px=TILE)
        for box in boxes:
            got = pv.classify(trained, box, tissue=tissue)
            want = classify_regions(slide, trained, region=box, tissue=tissue)
            assert got.labels.dtype == want.labels.dtype == np.uint8
            np.testing.assert_array_equal(got.labels, want.labels)
            assert got.origin == want.origin and got.downsample == want.downsample
            assert got.region == want.region and got.classes == want.classes
            assert got.parameters["classifier_sha256"] == trained.sha256
            same = {k: v for k, v in want.parameters.items() if k != "tile_px"}
            assert {k: got.parameters[k] for k in same} == same  # the same gate, recorded
        assert len(np.unique(got.labels)) > 2  # several classes, not a blank map


def test_a_pan_computes_only_the_new_tiles(preview, trained):
    box = (0, 0, 512, 512)  # working px 0..128: tiles 0..3 a side
    streamed = []
    first = preview.classify(
        trained, box, tissue=False, on_tile=lambda b, lab: streamed.append((b, lab))
    )
    assert preview.computed_tiles == 16
    predicted = preview.predicted_pixels
    assert predicted == 128 * 128
    # the tiles came nearest the centre first and cover the map exactly
    canvas = np.zeros_like(first.labels)
    for (y0, x0, y1, x1), lab in streamed:
        canvas[y0:y1, x0:x1] = lab
    np.testing.assert_array_equal(canvas, first.labels)
    centres = [np.hypot((b[0] + b[2]) / 2 - 64, (b[1] + b[3]) / 2 - 64) for b, _ in streamed]
    assert centres == sorted(centres)
    # the same view again: nothing computed, nothing predicted
    again = preview.classify(trained, box, tissue=False)
    np.testing.assert_array_equal(again.labels, first.labels)
    assert (preview.computed_tiles, preview.predicted_pixels) == (16, predicted)
    # a pan by one tile to the right and down: 7 new tiles, only their pixels predicted
    preview.classify(trained, (128, 128, 640, 640), tissue=False)
    assert preview.computed_tiles == 16 + 7
    assert preview.predicted_pixels == predicted + 7 * TILE * TILE
    # zooming in: everything cached
    preview.classify(trained, (200, 200, 400, 400), tissue=False)
    assert preview.computed_tiles == 23


def test_a_new_classifier_reuses_features_and_repredicts(region_slide, preview, trained):
    _, truth = region_slide
    box = (0, 0, 512, 512)
    preview.classify(trained, box, tissue=False)
    computed, predicted = preview.computed_tiles, preview.predicted_pixels
    # a stroke more: trained from the cache (no feature outside it needed), same features
    more = _strokes(truth, 4)
    clf = preview.train(more)
    assert clf.sha256 != trained.sha256
    assert clf.parameters["stains"] == "slide"
    np.testing.assert_array_equal(clf.stains.matrix, preview.stains().matrix)
    # the cache gives the classifier train_region_classifier gives, on another slide object
    with open_slide(region_slide[0]) as other:
        direct = train_region_classifier(other, more, stains="slide")
    assert direct.sha256 == clf.sha256
    tiles_after_training = preview.computed_tiles
    got = preview.classify(clf, box, tissue=False)
    assert preview.computed_tiles == tiles_after_training  # features kept
    assert preview.predicted_pixels == predicted + 128 * 128  # the view predicted again
    np.testing.assert_array_equal(
        got.labels, classify_regions(preview.slide, clf, region=box, tissue=False).labels
    )
    assert tiles_after_training >= computed


def test_other_features_empty_the_cache(region_slide, preview, trained):
    _, truth = region_slide
    box = (0, 0, 512, 512)
    preview.classify(trained, box, tissue=False)
    assert preview.computed_tiles == 16
    other = train_region_classifier(
        preview.slide, _strokes(truth, 3), scales_um=(1.0, 4.0), stains=preview.stains()
    )
    got = preview.classify(other, box, tissue=False)
    assert preview.computed_tiles == 32  # other scales: every tile again
    preview.classify(trained, box, tissue=False)
    assert preview.computed_tiles == 48  # and back: the first features were dropped
    np.testing.assert_array_equal(
        got.labels, classify_regions(preview.slide, other, region=box, tissue=False).labels
    )
    preview.clear()
    assert preview.cached_tiles == 0 and preview.cached_bytes == 0


def test_the_cache_is_bounded_in_bytes(region_slide, trained):
    path, _ = region_slide
    tile_bytes = TILE * TILE * len(trained.features) * 4
    with open_slide(path) as slide:
        pv = RegionPreview(slide, tile_px=TILE, max_bytes=10 * tile_bytes)
        box = (0, 0, 512, 512)
        got = pv.classify(trained, box, tissue=False)  # 16 tiles in view: more than 10
        assert pv.cached_tiles == 10 and pv.cached_bytes <= 10 * tile_bytes
        assert pv.cached_bytes == sum(a.nbytes for a in pv._features.values())  # the count
        np.testing.assert_array_equal(
            got.labels, classify_regions(slide, trained, region=box, tissue=False).labels
        )
        # the least recently used went first: the tiles nearest the centre stay
        pv.classify(trained, (128, 128, 384, 384), tissue=False)
        assert pv.computed_tiles == 16
        assert pv.cached_bytes == sum(a.nbytes for a in pv._features.values())
        pv.clear()
        assert pv.cached_bytes == 0


def test_a_view_larger_than_the_bound_holds_the_bound_while_it_runs(region_slide, trained):
    """Whole-slide classification: the cache is trimmed as tiles come, not at the end."""
    path, _ = region_slide
    tile_bytes = TILE * TILE * len(trained.features) * 4
    with open_slide(path) as slide:
        pv = RegionPreview(slide, tile_px=TILE, max_bytes=10 * tile_bytes, threads=1)
        seen = []
        pv.classify(trained, None, tissue=False, progress=lambda p: seen.append(pv.cached_tiles))
    assert pv.computed_tiles == 100  # 10 x 10 tiles
    # the bound, plus at most one rectangle of tiles in work (not the 100 of the view)
    assert max(seen) <= 10 + _RECT_TILES < 100


def test_cancel_stops_between_tiles_and_keeps_what_was_done(preview, trained):
    cancel = threading.Event()
    seen = []

    def on_tile(box, labels):
        seen.append(box)
        if len(seen) == 3:
            cancel.set()

    with pytest.raises(Cancelled):
        preview.classify(trained, (0, 0, 1200, 1200), tissue=False, on_tile=on_tile, cancel=cancel)
    done = preview.computed_tiles
    assert 0 < done < 100  # 10 x 10 tiles on the slide
    preview.classify(trained, (0, 0, 1200, 1200), tissue=False)
    assert preview.computed_tiles == 100


def test_stains_option_is_checked_and_recorded(region_slide):
    path, truth = region_slide
    with open_slide(path) as slide:
        with pytest.raises(ValueError, match="stains"):
            train_region_classifier(slide, _strokes(truth, 2), stains="tissue")
        a = train_region_classifier(slide, _strokes(truth, 2), stains="slide")
        b = train_region_classifier(slide, _strokes(truth, 3), stains="slide")
        c = train_region_classifier(slide, _strokes(truth, 2))
    assert a.parameters["stains"] == "slide" and "stains" not in c.parameters
    np.testing.assert_array_equal(a.stains.matrix, b.stains.matrix)  # strokes don't matter
    assert a.sha256 != c.sha256


def test_rectangles_cover_the_tiles_once():
    tiles = [(y, x) for y in range(9) for x in range(9) if y >= 7 or x >= 6]  # an L
    rects = _rectangles(tiles)
    covered = [(y, x) for rows, cols in rects for y in rows for x in cols]
    assert sorted(covered) == sorted(tiles)
    assert all(len(rows) * len(cols) <= 36 for rows, cols in rects)
    assert len(rects) <= 4
    strip = _rectangles([(y, x) for y in range(9) for x in (7, 8)])  # after a pan: one piece
    assert strip == [(range(9), range(7, 9))]


def test_cached_features_equal_an_untiled_computation(preview, trained):
    from napari_slidescope.pipeline.region_grid import read_working, working_grid

    grid = working_grid(preview.slide, trained.mpp)
    spec = trained.feature_spec(grid.mpp)
    for box in [(5, 7, 101, 77), (250, 260, 300, 300), (0, 0, 300, 300)]:  # edges mirrored
        want = spec.compute(read_working(preview.slide, grid, box, spec.halo), crop=spec.halo)
        np.testing.assert_array_equal(preview.features(grid, box, spec), want)


def test_progress_counts_every_tile_once(preview, trained):
    box = (0, 0, 1200, 1200)
    seen, tiles = [], []
    preview.classify(
        trained, box, tissue=False, progress=seen.append, on_tile=lambda b, lab: tiles.append(b)
    )
    assert seen[0].done == 0 and seen[-1].done == seen[-1].total == len(tiles)
    assert [p.done for p in seen] == list(range(len(tiles) + 1))
    seen.clear()
    preview.classify(trained, box, tissue=False, progress=lambda d, t: seen.append((d, t)))
    assert seen[-1] == (len(tiles), len(tiles))  # all cached: counted too


def test_carry_over_keeps_previous_classes_by_name_on_the_same_grid(preview, trained):
    from dataclasses import replace

    from napari_slidescope.pipeline.region_preview import carry_over

    old = preview.classify(trained, (0, 0, 800, 800), tissue=False)
    assert old.labels.all()
    new = preview.classify(trained, (400, 400, 1200, 1200), tissue=False)
    blank = replace(new, labels=np.zeros_like(new.labels))
    shown = carry_over(blank, old)
    assert shown.labels is not blank.labels and shown.origin == new.origin
    oy, ox = (
        int(round((a - b) / new.downsample[0])) for a, b in zip(new.origin, old.origin, strict=True)
    )
    # the overlap shows the previous classes; the new part of the view nothing (as before)
    np.testing.assert_array_equal(
        shown.labels[: old.labels.shape[0] - oy, : old.labels.shape[1] - ox], old.labels[oy:, ox:]
    )
    assert not shown.labels[old.labels.shape[0] - oy :].any()
    # tiles already in show their own classes
    done = [(0, 0, 10, 10)]
    mixed = carry_over(replace(new, labels=np.full_like(new.labels, 2)), old, done)
    assert (mixed.labels[:10, :10] == 2).all()
    # classes follow by name (another order of classes), other grids carry nothing
    swapped = replace(old, classes=old.classes[::-1])
    again = carry_over(blank, swapped)
    k = len(old.classes) + 1
    np.testing.assert_array_equal(again.labels[:10, :10], (k - old.labels[oy:, ox:][:10, :10]) % k)
    other = replace(old, downsample=(old.downsample[0] * 2, old.downsample[1] * 2))
    assert not carry_over(blank, other).labels.any()
    gated = replace(old, parameters={**old.parameters, "tissue_gated": True})
    assert not carry_over(blank, gated).labels.any()
