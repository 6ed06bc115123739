import pickle

import numpy as np
import pytest
from scipy import ndimage as ndi
from tests.fakes import ThresholdSegmenter

from napari_slidescope.pipeline.runner import iter_tiles
from napari_slidescope.pipeline.tiling import make_plan, owned_labels, paste_owned, read_tile
from napari_slidescope.slide import ArraySlide


def disc_image(shape=(600, 700), radius=10, spacing=36, seed=0):
    """Light background with dark discs on a jittered grid (no two discs touch)."""
    rng = np.random.default_rng(seed)
    img = np.empty((*shape, 3), np.uint8)
    img[:] = (235, 225, 235)
    r = radius
    yy, xx = np.mgrid[-r : r + 1, -r : r + 1]
    disc = yy**2 + xx**2 <= r**2
    centres = []
    for cy in range(spacing // 2, shape[0] - spacing // 2 + 1, spacing):
        for cx in range(spacing // 2, shape[1] - spacing // 2 + 1, spacing):
            y, x = cy + rng.integers(-5, 6), cx + rng.integers(-5, 6)
            centres.append((y, x))
            img[y - r : y + r + 1, x - r : x + r + 1][disc] = (80, 50, 140)
    return img, np.array(centres)


def match(a, b):
    """IoU of each label of `a` with its best-overlapping label of `b`; ids of b used."""
    ious, used = [], []
    for i in range(1, a.max() + 1):
        m = a == i
        if not m.any():
            continue
        ids, counts = np.unique(b[m], return_counts=True)
        counts, ids = counts[ids > 0], ids[ids > 0]
        if ids.size == 0:
            ious.append(0.0)
            continue
        j = ids[np.argmax(counts)]
        mb = b == j
        ious.append((m & mb).sum() / (m | mb).sum())
        used.append(j)
    return np.array(ious), used


def stitched(slide, plan, seg, **kw):
    out = np.zeros(plan.shape, np.int32)
    for res in iter_tiles(slide, plan, seg, **kw):
        paste_owned(out, res.labels, res.tile)
    return out


@pytest.mark.parametrize("region", [(0, 0, 600, 700), (3, 7, 517, 611), (0, 0, 50, 700)])
@pytest.mark.parametrize("mpp", [0.25, (0.3, 0.2), 0.5])
def test_cores_partition_region(region, mpp):
    plan = make_plan(region, slide_mpp=mpp, target_mpp=0.5, tile_size_um=40, min_overlap_um=12)
    cover = np.zeros(plan.shape, np.int32)
    shapes = {t.shape for t in plan}
    assert len(shapes) == 1
    for t in plan:
        y0, x0, y1, x1 = t.core
        cover[y0:y1, x0:x1] += 1
        by0, bx0, by1, bx1 = t.box
        assert by0 <= y0
        assert bx0 <= x0
        assert by1 >= y1
        assert bx1 >= x1
        assert 0 <= by0
        assert by1 <= plan.shape[0]
        assert 0 <= bx0
        assert bx1 <= plan.shape[1]
        # context on each side is >= overlap unless the region edge is closer
        assert y0 - by0 >= min(plan.overlap, y0)
        assert by1 - y1 >= min(plan.overlap, plan.shape[0] - y1)
        assert x0 - bx0 >= min(plan.overlap, x0)
        assert bx1 - x1 >= min(plan.overlap, plan.shape[1] - x1)
        ry0, rx0, ry1, rx1 = t.box0
        assert region[0] <= ry0 < ry1 <= region[2]
        assert region[1] <= rx0 < rx1 <= region[3]
        assert all(type(v) is int for v in (*t.box, *t.core, *t.box0, t.index))
    assert (cover == 1).all()
    assert plan.overlap == 24  # 12 µm at 0.5 µm/px


def test_plan_is_picklable_and_carries_path():
    plan = make_plan(
        (0, 0, 900, 900),
        slide_mpp=0.25,
        target_mpp=0.5,
        tile_size_um=50,
        min_overlap_um=10,
        path="/data/slide.svs",
    )
    again = pickle.loads(pickle.dumps(plan))
    assert again == plan
    assert again.tiles == plan.tiles
    assert {t.path for t in plan} == {"/data/slide.svs"}


@pytest.mark.parametrize(
    "bad", [dict(region=(5, 5, 5, 9)), dict(target_mpp=0), dict(tile_size_um=-1)]
)
def test_plan_rejects_bad_input(bad):
    kw = (
        dict(
            region=(0, 0, 100, 100),
            slide_mpp=0.25,
            target_mpp=0.5,
            tile_size_um=10,
            min_overlap_um=1,
        )
        | bad
    )
    region = kw.pop("region")
    with pytest.raises(ValueError, match=next(iter(bad))):
        make_plan(region, **kw)


def test_owned_by_centroid_and_paste_keeps_earlier_pixels():
    plan = make_plan((0, 0, 40, 40), slide_mpp=1, target_mpp=1, tile_size_um=20, min_overlap_um=5)
    tile = plan.tiles[0]  # two tiles per axis: each needs context on one side only
    assert tile.core == (0, 0, 20, 20)
    assert tile.box == (0, 0, 25, 25)
    lab = np.zeros(tile.shape, np.int32)
    lab[15:24, 15:24] = 7  # centroid (19, 19): owned, crosses the core edge
    lab[18:25, 20:25] = 3  # centroid col 22: not owned
    owned = owned_labels(lab, tile)
    assert set(np.unique(owned)) == {0, 1}
    assert (owned == 1).sum() == (lab == 7).sum()  # whole nucleus, also outside the core
    out = np.zeros(plan.shape, np.int32)
    out[15, 15] = 99
    paste_owned(out, owned, tile, offset=10)
    assert out[15, 15] == 99
    assert out[16, 16] == 11
    assert out[23, 23] == 0


def _owned_reference(labels, tile):
    """The definition: ids whose centroid floor lies in the core, renumbered in order."""
    ids = np.unique(labels)
    ids = ids[ids > 0]
    out = np.zeros(labels.shape, np.int32)
    if ids.size == 0:
        return out
    cents = np.atleast_2d(ndi.center_of_mass(np.ones(labels.shape), labels, ids))
    cy0, cx0, cy1, cx1 = tile.core_in_tile
    fy, fx = np.floor(cents[:, 0] + 1e-9), np.floor(cents[:, 1] + 1e-9)
    keep = ids[(fy >= cy0) & (fy < cy1) & (fx >= cx0) & (fx < cx1)]
    for new, i in enumerate(keep, 1):
        out[labels == i] = new
    return out


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("scale", [1, 7, 10**9])  # sparse ids, beyond the pixel count
def test_owned_labels_match_the_centroid_definition(seed, scale):
    rng = np.random.default_rng(seed)
    lab = ndi.label(ndi.gaussian_filter(rng.random((80, 90)), 1.5) > 0.52)[0].astype(np.int64)
    lab *= scale
    lab[lab == 2 * scale] = -5  # negative ids are background
    plan = make_plan((0, 0, 80, 90), slide_mpp=1, target_mpp=1, tile_size_um=25, min_overlap_um=6)
    for tile in plan:
        y0, x0, y1, x1 = tile.box
        sub = lab[y0:y1, x0:x1]
        want = _owned_reference(np.where(sub > 0, sub, 0), tile)
        np.testing.assert_array_equal(owned_labels(sub, tile), want)


def test_cores_are_balanced_and_tiles_no_larger_than_needed():
    plan = make_plan((0, 0, 100, 50), slide_mpp=1, target_mpp=1, tile_size_um=40, min_overlap_um=5)
    assert plan.grid_shape == (3, 2)
    assert [t.core[0] for t in plan.tiles[::2]] == [0, 33, 66]  # 33/33/34, not 40/40/20
    assert {t.shape for t in plan} == {(43, 30)}  # interior row: 33 + 2 x 5; columns: 25 + 5


def test_read_tile_at_the_level_resolution_is_a_crop():
    img, _ = disc_image((200, 300))
    slide = ArraySlide(img, mpp=0.5)
    plan = make_plan(
        (10, 20, 200, 300), slide_mpp=0.5, target_mpp=0.5, tile_size_um=40, min_overlap_um=5
    )
    for t in plan.tiles:
        (y0, x0, y1, x1), got = t.box0, read_tile(slide, t, plan, level=0)
        assert got.flags.c_contiguous
        np.testing.assert_array_equal(got, img[y0:y1, x0:x1])


def test_read_tile_pixels_do_not_depend_on_the_tile():
    img, _ = disc_image()
    slide = ArraySlide(img, mpp=0.25)
    plan = make_plan(
        (3, 5, 600, 700), slide_mpp=0.25, target_mpp=0.6, tile_size_um=40, min_overlap_um=12
    )
    whole = make_plan(
        (3, 5, 600, 700), slide_mpp=0.25, target_mpp=0.6, tile_size_um=10_000, min_overlap_um=12
    )
    ref = read_tile(slide, whole.tiles[0], whole, level=0)
    assert ref.shape == (*whole.shape, 3)
    for t in plan.tiles[:6]:
        y0, x0, y1, x1 = t.box
        got = read_tile(slide, t, plan, level=0)
        assert np.abs(got.astype(int) - ref[y0:y1, x0:x1]).max() <= 1


def test_read_tile_integer_downsample_is_block_mean():
    img, _ = disc_image((64, 64))
    slide = ArraySlide(img, mpp=0.25)
    plan = make_plan(
        (0, 0, 64, 64), slide_mpp=0.25, target_mpp=0.5, tile_size_um=100, min_overlap_um=0
    )
    got = read_tile(slide, plan.tiles[0], plan, level=0)
    want = img.reshape(32, 2, 32, 2, 3).mean(axis=(1, 3))
    assert np.abs(got - want).max() <= 0.5 + 1e-6


def builtin_segmenter():
    from napari_slidescope.analysis import brightfield_nuclei as nuclei
    from napari_slidescope.analysis.stains import RUIFROK_HE

    # 0.5 µm/px keeps the test fast; its overlap is still the segmenter's own (~50 µm)
    return nuclei.BuiltinSegmenter(nuclei.NucleiParams(target_mpp=0.5), stains=RUIFROK_HE)


@pytest.mark.parametrize(
    "kind,shape,tile_um",
    [("threshold", (600, 700), 40), ("builtin", (1000, 1150), 80)],
)
def test_tiled_matches_untiled_nucleus_for_nucleus(kind, shape, tile_um):
    seg = (
        ThresholdSegmenter(min_overlap_um=12.0, opening=False)
        if kind == "threshold"
        else builtin_segmenter()
    )
    img, centres = disc_image(shape)
    slide = ArraySlide(img, mpp=0.25)
    region = (0, 0, *img.shape[:2])
    kw = dict(slide_mpp=0.25, target_mpp=seg.target_mpp, min_overlap_um=seg.min_overlap_um)
    tiled_plan = make_plan(region, tile_size_um=tile_um, **kw)
    assert len(tiled_plan) >= 12
    one_plan = make_plan(region, tile_size_um=10_000, **kw)
    assert len(one_plan) == 1
    if hasattr(seg, "prepare"):
        seg.prepare(img[::4, ::4])
    tiled = stitched(slide, tiled_plan, seg, workers=2)
    whole = stitched(slide, one_plan, seg, workers=1)
    n = len(np.unique(whole)) - 1
    assert n >= 0.9 * len(centres)
    assert len(np.unique(tiled)) - 1 == n  # no duplicates, none lost
    ious, used = match(tiled, whole)
    assert len(set(used)) == len(used) == n  # one-to-one
    assert ious.min() >= 0.9
    # many nuclei cross core borders; none is cut there
    crossing = 0
    for t in tiled_plan:
        y1, x1 = t.core[2], t.core[3]
        if y1 < tiled.shape[0]:
            a, b = tiled[y1 - 1], tiled[y1]
            both = (a > 0) & (b > 0)
            crossing += len(np.unique(a[both]))
            assert (a[both] == b[both]).all()
        if x1 < tiled.shape[1]:
            a, b = tiled[:, x1 - 1], tiled[:, x1]
            both = (a > 0) & (b > 0)
            crossing += len(np.unique(a[both]))
            assert (a[both] == b[both]).all()
    assert crossing >= 5


@pytest.mark.parametrize("dtype", [bool, np.complex64])
def test_read_tile_refuses_pixels_that_are_not_numbers(dtype):
    """Every resampling path (crop, bin, interpolate) takes integer or float pixels only."""
    slide = ArraySlide(np.zeros((64, 64, 3), dtype), mpp=0.25)
    plan = make_plan((0, 0, 64, 64), slide_mpp=0.25, target_mpp=0.4, tile_size_um=8.0,
                     min_overlap_um=1.0)  # fmt: skip
    with pytest.raises(
        ValueError, match=f"expected integer or float pixels, got dtype {np.dtype(dtype)}"
    ):
        read_tile(slide, plan.tiles[0], plan, level=0)
