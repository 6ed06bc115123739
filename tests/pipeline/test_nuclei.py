import csv
import json
import sys
import threading
import types
import warnings

import dask.array as da
import numpy as np
import pytest
from tests.fakes import ThresholdSegmenter

from napari_slidescope.analysis.measure import COLUMNS
from napari_slidescope.analysis.stains import RUIFROK_HE
from napari_slidescope.errors import SlidescopeWarning
from napari_slidescope.pipeline.nuclei import iter_segment_nuclei, segment_nuclei
from napari_slidescope.slide import ArraySlide

MPP = 0.25
BG, NUC = (235, 225, 235), (80, 50, 140)


def discs(shape=(480, 560), radii=(16, 10), spacing=60, seed=0):
    """Background with discs of alternating radii on a jittered grid; returns (img, truth)."""
    rng = np.random.default_rng(seed)
    img = np.empty((*shape, 3), np.uint8)
    img[:] = BG
    truth = []
    for cy in range(spacing // 2, shape[0] - spacing // 2 + 1, spacing):
        for cx in range(spacing // 2, shape[1] - spacing // 2 + 1, spacing):
            r = radii[len(truth) % len(radii)]
            y, x = cy + rng.integers(-4, 5), cx + rng.integers(-4, 5)
            yy, xx = np.mgrid[-r : r + 1, -r : r + 1]
            img[y - r : y + r + 1, x - r : x + r + 1][yy**2 + xx**2 <= r**2] = NUC
            truth.append((y, x, r))
    return img, np.array(truth, float)


def _segmenter():
    """The shared stand-in, with the overlap and the stains these tests measure with."""
    return ThresholdSegmenter(min_overlap_um=12.0, stains=RUIFROK_HE, opening=False)


class RecordingSlide(ArraySlide):
    """Two-level in-memory slide that records every read_region call."""

    def __init__(self, img, mpp=MPP):
        super().__init__(img, mpp=mpp)
        low = img[::8, ::8]
        self.levels = [da.from_array(img), da.from_array(low)]
        self.reads = []
        self._lock = threading.Lock()

    def read_region(self, region, *, level=0):
        with self._lock:
            self.reads.append((tuple(region), level))
        return super().read_region(region, level=level)


@pytest.fixture(scope="module")
def disc_result():
    img, truth = discs()
    res = segment_nuclei(
        img, mpp=MPP, segmenter=_segmenter(), tile_size_um=30, tissue=False, workers=2
    )
    return img, truth, res


def test_table_columns_units_and_known_sizes(disc_result):
    img, truth, res = disc_result
    assert res.count == len(truth) == len(res.columns["id"])
    assert list(res.columns) == list(COLUMNS)
    assert all(v.shape == (res.count,) for v in res.columns.values())
    # array source: labels in the array's own pixels
    assert res.labels.shape == img.shape[:2]
    assert res.labels.dtype == np.int32
    assert res.downsample == (1.0, 1.0)
    assert res.mpp == MPP
    assert res.origin == (0, 0)
    assert set(np.unique(res.labels)) == {0, *res.columns["id"].tolist()}
    # match each truth disc to the nearest centroid
    cents = np.stack([res.columns["centroid_row"], res.columns["centroid_col"]], axis=1)
    d = np.linalg.norm(cents[:, None] - truth[None, :, :2], axis=2)
    k = d.argmin(axis=0)
    assert len(set(k.tolist())) == len(truth)
    assert d.min(axis=0).max() < 1.5
    area_true = np.pi * (truth[:, 2] * MPP) ** 2
    np.testing.assert_allclose(res.columns["area_um2"][k], area_true, rtol=0.1)
    np.testing.assert_allclose(
        res.columns["perimeter_um"][k], 2 * np.pi * truth[:, 2] * MPP, rtol=0.15
    )
    np.testing.assert_allclose(res.columns["centroid_y_um"], (cents[:, 0] + 0.5) * MPP)
    assert (res.columns["eccentricity"] < 0.5).all()
    assert (res.columns["solidity"] > 0.9).all()
    assert (res.columns["hematoxylin_od_mean"] > 0.1).all()
    assert np.isfinite(res.columns["eosin_od_mean"]).all()
    import pandas as pd

    assert isinstance(res.to_pandas(), pd.DataFrame)
    assert len(res.to_pandas()) == res.count


def test_csv_and_geojson_round_trip(tmp_path):
    img, _ = discs()
    region = (100, 150, 420, 520)
    res = segment_nuclei(
        ArraySlide(img, mpp=MPP),
        region=region,
        segmenter=_segmenter(),
        tile_size_um=30,
        tissue=False,
        workers=2,
    )
    assert res.origin == (100, 150)
    assert res.downsample == (2.0, 2.0)
    assert res.mpp == 0.5
    assert res.labels.shape == (160, 185)
    with open(res.to_csv(tmp_path / "n.csv"), newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == res.count > 5
    assert list(rows[0]) == list(COLUMNS)
    np.testing.assert_allclose([float(r["area_um2"]) for r in rows], res.columns["area_um2"])
    doc = json.loads((res.to_geojson(tmp_path / "n.geojson")).read_text())
    assert doc["type"] == "FeatureCollection"
    assert len(doc["features"]) == res.count
    by_id = {int(i): k for k, i in enumerate(res.columns["id"])}
    for f in doc["features"]:
        p = f["properties"]
        assert p["objectType"] == "detection"
        assert p["classification"]["name"] == "Nucleus"
        k = by_id[int(p["measurements"]["id"])]
        ring = np.array(f["geometry"]["coordinates"][0])
        assert (ring[0] == ring[-1]).all()
        x, y = ring[:, 0].mean(), ring[:, 1].mean()  # (x, y) level-0, origin applied
        assert abs(x - res.columns["centroid_col"][k]) < 3
        assert abs(y - res.columns["centroid_row"][k]) < 3
        assert region[1] <= ring[:, 0].min()
        assert ring[:, 0].max() <= region[3]
        assert region[0] <= ring[:, 1].min()
        assert ring[:, 1].max() <= region[2]


def _features(path):
    doc = json.loads(path.read_text())
    return {int(f["properties"]["measurements"]["id"]): f for f in doc["features"]}


def test_large_regions_keep_outlines_instead_of_a_label_image(tmp_path, monkeypatch):
    from napari_slidescope.pipeline import nuclei_stitch

    img, _ = discs()
    kw = dict(segmenter=_segmenter(), tile_size_um=30, tissue=False, workers=2)
    dense = segment_nuclei(ArraySlide(img, mpp=MPP), **kw)
    monkeypatch.setattr(nuclei_stitch, "DENSE_LABELS_BYTES", 1000)  # smaller than this region
    with pytest.warns(SlidescopeWarning, match=r"would take .* GiB.*labels=True"):
        auto = segment_nuclei(ArraySlide(img, mpp=MPP), **kw)
    none = segment_nuclei(ArraySlide(img, mpp=MPP), labels=False, **kw)
    forced = segment_nuclei(ArraySlide(img, mpp=MPP), labels=True, **kw)
    assert auto.labels is None
    assert none.labels is None
    assert forced.labels is not None
    np.testing.assert_array_equal(forced.labels, dense.labels)
    for res in (auto, none):
        assert res.count == dense.count
        assert np.array_equal(res.columns["id"], dense.columns["id"])
    # the outlines written from tiles are the ones the label image gives
    want = _features(dense.to_geojson(tmp_path / "dense.geojson"))
    got = _features(auto.to_geojson(tmp_path / "auto.geojson"))
    assert sorted(got) == sorted(want)
    assert len(got) == dense.count
    for i, f in want.items():
        assert got[i]["geometry"] == f["geometry"]
    # arrays always get labels in their own pixels
    arr = segment_nuclei(img, mpp=MPP, **kw)
    assert arr.labels is not None
    assert arr.labels.shape == img.shape[:2]
    with pytest.raises(ValueError, match="labels must be"):
        segment_nuclei(img, mpp=MPP, labels="yes", **kw)


@pytest.mark.parametrize(
    "bad,match",
    [
        (np.zeros((50, 50), np.uint8), "fluorescence image.*builtin-fluorescence"),
        (np.zeros((50, 50, 4), np.uint8), "RGBA"),
        (np.zeros((50, 50, 3), np.float32), "uint8"),
    ],
)
def test_bad_arrays_rejected(bad, match):
    with pytest.raises(ValueError, match=match):
        segment_nuclei(bad, mpp=MPP, segmenter=_segmenter())


def test_array_needs_mpp_and_region_must_not_be_empty():
    img, _ = discs((64, 64))
    with pytest.raises(ValueError, match="mpp"):
        segment_nuclei(img, segmenter=_segmenter())
    with pytest.raises(ValueError, match="empty"):
        segment_nuclei(img, mpp=MPP, region=(10, 10, 10, 40), segmenter=_segmenter())
    with pytest.raises(TypeError, match="segmenter"):
        segment_nuclei(img, mpp=MPP, segmenter=object())


def test_all_background_gives_no_nuclei():
    img = np.full((200, 240, 3), BG, np.uint8)
    calls = []
    res = segment_nuclei(
        img,
        mpp=MPP,
        segmenter=_segmenter(),
        tissue=False,
        tile_size_um=20,
        progress=lambda d, t: calls.append((d, t)),
    )
    assert res.count == 0
    assert not res.labels.any()
    assert list(res.columns) == list(COLUMNS)
    assert all(v.size == 0 for v in res.columns.values())
    assert calls[0] == (0, calls[-1][1])
    assert calls[-1][0] == calls[-1][1] > 1
    # the one-argument form gets the same progress as Progress records
    from napari_slidescope.pipeline.progress import Progress

    records = []
    segment_nuclei(
        img, mpp=MPP, segmenter=_segmenter(), tissue=False, tile_size_um=20,
        progress=records.append,
    )  # fmt: skip
    assert records == [Progress(d, t) for d, t in calls]


def tissue_half(img):
    """A TissueResult-like object: tissue only in the left ~40% of the image."""
    mask = np.zeros((img.shape[0] // 16, img.shape[1] // 16), bool)
    mask[:, : int(mask.shape[1] * 0.4)] = True
    return types.SimpleNamespace(mask=mask, downsample=16.0, origin=(0, 0), mpp=16 * MPP)


def test_tiles_without_tissue_are_never_read():
    img, _ = discs()
    slide = RecordingSlide(img)
    tissue = tissue_half(img)
    res = segment_nuclei(slide, segmenter=_segmenter(), tile_size_um=30, tissue=tissue, workers=2)
    limit = tissue.mask.shape[1] * 0.4 * 16 + 24 * 2 + 16  # tissue edge + overlap + margins
    level0 = [box for box, level in slide.reads if level == 0]
    assert level0
    assert all(box[1] < limit for box in level0)
    assert max(box[3] for box, _ in slide.reads if _ == 0) < img.shape[1] * 0.7
    assert res.count > 0
    assert res.columns["centroid_col"].max() < limit


@pytest.mark.parametrize("size_um,expect_detect", [(20, True), (1000, False)])
def test_auto_tissue_runs_detection_for_large_regions(monkeypatch, size_um, expect_detect):
    img, _ = discs()
    slide = RecordingSlide(img)
    called = []

    def detect_tissue(source, *, region=None, mpp=None, **kw):
        called.append(region)
        return tissue_half(img)

    fake = types.ModuleType("napari_slidescope.pipeline.tissue")
    fake.detect_tissue = detect_tissue
    monkeypatch.setitem(sys.modules, "napari_slidescope.pipeline.tissue", fake)
    segment_nuclei(slide, segmenter=_segmenter(), tile_size_um=size_um, workers=1)
    assert bool(called) == expect_detect


def test_streaming_steps_and_early_close():
    img, _ = discs()
    baseline = threading.active_count()
    gen = iter_segment_nuclei(
        img, mpp=MPP, segmenter=_segmenter(), tile_size_um=20, tissue=False, workers=2
    )
    steps = [next(gen), next(gen)]
    assert [s.done for s in steps] == [1, 2]
    assert steps[0].total == len(steps[0].plan) > 4
    assert steps[1].result.offset == steps[0].result.count
    gen.close()
    assert threading.active_count() == baseline
    full = list(
        iter_segment_nuclei(
            img, mpp=MPP, segmenter=_segmenter(), tile_size_um=20, tissue=False, workers=2
        )
    )
    assert [s.done for s in full] == list(range(1, len(full) + 1))
    assert threading.active_count() == baseline


def test_builtin_segmenter_on_discs():
    img, truth = discs()
    from napari_slidescope import SlidescopeWarning

    # two flat colours: stain estimation falls back to the standard vectors and says so
    with pytest.warns(SlidescopeWarning, match="fell back to the standard Ruifrok"):
        res = segment_nuclei(
            img, mpp=MPP, segmenter="builtin", tissue=False, tile_size_um=1000, workers=1
        )
    assert res.segmenter == "builtin"
    assert res.labels.shape == img.shape[:2]
    assert abs(res.count - len(truth)) <= 0.1 * len(truth)


def test_upsampling_warns():
    from napari_slidescope import SlidescopeWarning

    img, _ = discs((120, 140))
    with pytest.warns(SlidescopeWarning, match="upsampled"):  # asked for explicitly
        res = segment_nuclei(img, mpp=1.0, target_mpp=0.5, segmenter=_segmenter(), tissue=False)
    assert res.labels.shape == img.shape[:2]  # back in the array's px
    assert res.mpp == 1.0


def test_default_working_resolution_is_never_finer_than_the_slide():
    img, _ = discs((120, 140))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no upsampling warning
        coarse = segment_nuclei(ArraySlide(img, mpp=1.0), segmenter=_segmenter(), tissue=False)
        fine = segment_nuclei(ArraySlide(img, mpp=0.25), segmenter=_segmenter(), tissue=False)
    assert coarse.mpp == 1.0  # the slide's own pixels
    assert coarse.downsample == (1.0, 1.0)
    assert fine.mpp == 0.5  # the segmenter's 0.5 µm/px


def test_slide_pipeline_finds_what_the_array_method_finds(shared_file):
    """Tiles are prepared (stains, threshold) from working-resolution pixels of the region.

    A low-resolution, strided reference once gave a threshold twice too high on this real
    20x H&E slide: 71 nuclei where the same method on the same pixels finds ~240.
    """
    from napari_slidescope import open_slide
    from napari_slidescope.analysis.brightfield_nuclei import segment_nuclei_array
    from napari_slidescope.analysis.metrics import instance_scores

    region = (1200, 700, 1700, 1200)
    with open_slide(shared_file("CMU-1-Small-Region.svs")) as slide:
        mpp = slide.mpp[0]
        rgb = slide.read_region(region, level=0)
        tiled = segment_nuclei(
            slide, region=region, target_mpp=mpp, segmenter="builtin", tissue=False
        )
    whole = segment_nuclei_array(rgb, mpp=mpp)
    assert tiled.labels.shape == whole.shape
    assert abs(tiled.count - int(whole.max())) <= 0.05 * whole.max()
    assert tiled.count > 150
    assert instance_scores(whole, tiled.labels)["f1"] > 0.9


def test_prepare_nuclei_tiles_one_by_one_equal_segment_nuclei():
    from napari_slidescope.pipeline.nuclei import prepare_nuclei

    img, _ = discs()
    kwargs = dict(mpp=MPP, segmenter=_segmenter(), tile_size_um=30, tissue=False)
    whole = segment_nuclei(img, workers=2, **kwargs)
    run = prepare_nuclei(img, **kwargs)
    assert len(run.tiles) == len(run.plan.tiles) > 4
    # out of order, one tile at a time: local ids, shifted by the tiles before in plan order
    order = [t.index for t in run.tiles][::-1]
    results = {r.tile.index: r for r in run.segment(order, workers=1)}
    offset, ids, areas = 0, [], []
    for t in run.tiles:
        r = results[t.index]
        assert r.offset == 0
        assert list(r.table["id"]) == list(range(1, r.count + 1))
        ids.extend(r.table["id"] + offset)
        areas.extend(r.table["area_um2"])
        offset += r.count
    np.testing.assert_array_equal(ids, whole.columns["id"])
    np.testing.assert_array_equal(areas, whole.columns["area_um2"])
    with pytest.raises(ValueError, match="not among the tiles"):
        next(run.segment([10_000]))
    run.close()


def test_options_object_and_keywords_give_the_same_run_and_keywords_win():
    from napari_slidescope.options import NucleiOptions
    from napari_slidescope.pipeline.nuclei import prepare_nuclei

    img, _ = discs()
    seg = _segmenter()
    by_keywords = segment_nuclei(img, mpp=MPP, segmenter=seg, tile_size_um=30, tissue=False)
    opts = NucleiOptions(tile_size_um=30)
    by_options = segment_nuclei(img, mpp=MPP, segmenter=seg, options=opts, tissue=False)
    np.testing.assert_array_equal(by_options.labels, by_keywords.labels)
    assert by_options.parameters == by_keywords.parameters
    # what was asked for is recorded; a segmenter object is recorded by its name
    assert by_options.parameters["options"] == opts.replace(segmenter="threshold").as_dict()
    # a keyword wins over the same field of options (30 µm at 0.75 µm/px: 40 px tiles)
    run = prepare_nuclei(
        img, mpp=MPP, segmenter=seg, options=NucleiOptions(tile_size_um=60, target_mpp=0.75),
        tile_size_um=30, tissue=False,
    )  # fmt: skip
    assert run.plan.tile_size == 40
    assert run.parameters["options"]["tile_size_um"] == 30.0
    run.close()
    for fn in (segment_nuclei, iter_segment_nuclei, prepare_nuclei):
        with pytest.raises(TypeError, match=r"unexpected keyword.*'tile_size'"):
            fn(img, mpp=MPP, tile_size=30)
        with pytest.raises(ValueError, match=r"^tile_size_um: expected a positive number"):
            fn(img, mpp=MPP, tile_size_um=0)
        with pytest.raises(TypeError, match="expected a NucleiOptions"):
            fn(img, mpp=MPP, options={"tile_size_um": 30})


def test_every_set_up_option_reaches_the_run():
    from napari_slidescope.pipeline.nuclei import prepare_nuclei

    img, _ = discs()
    seg = _segmenter()
    options = dict(
        mpp=MPP, segmenter=seg, tile_size_um=30, target_mpp=0.75, tissue=False,
        region=(0, 0, 150, 170),
    )  # fmt: skip
    steps = list(iter_segment_nuclei(img, workers=1, **options))
    plan = steps[0].plan
    assert plan.region == (0, 0, 150, 170)
    assert plan.mpp == 0.75
    assert plan.tile_size == 40  # 30 µm at 0.75 µm/px
    run = prepare_nuclei(img, **options)
    assert run.plan == plan
    assert run.segmenter.name == "threshold"
    run.close()


def test_repr_is_a_line_not_the_arrays(disc_result):
    """print(result) dumped every array of the label image and the table."""
    _, _, res = disc_result
    text = repr(res)
    assert len(text) < 600, text
    assert f"count={res.count}" in text
    assert "array(" not in text
