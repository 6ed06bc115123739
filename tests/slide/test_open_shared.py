"""Every shared real slide opens with the right levels, calibration and pixels."""

import numpy as np
import pytest
import tifffile

from napari_slidescope import SlidescopeWarning, open_slide

# name: (format, level shapes (Y, X), mpp or None, axes, channel names, associated)
EXPECTED = {
    "CMU-1-Small-Region.svs": (
        "svs",
        [(2967, 2220)],
        0.499,
        "YXS",
        [],
        {"thumbnail", "label", "macro"},
    ),
    "TCGA-CR-7395-01A-01-TS1.svs": (
        "svs",
        [(3567, 4443), (1783, 2221)],
        None,
        "YXS",
        [],
        {"thumbnail"},
    ),
    "openslide-python_small.svs": ("svs", [(16, 16)], 0.499, "YXS", [], {"thumbnail"}),
    "test3-DAPI-2-387.ndpi": (
        "ndpi",
        [(4864, 3968), (2432, 1984), (1216, 992), (608, 496)],
        0.22817,
        "YXS",
        [],
        {"macro", "map"},
    ),
    "test3-TRITC-2-560.ndpi": (
        "ndpi",
        [(4864, 3968), (2432, 1984), (1216, 992), (608, 496)],
        0.22817,
        "YXS",
        [],
        {"macro", "map"},
    ),
    "small_vectra.qptiff": (
        "qptiff",
        [(1440, 1920)],
        0.49652,
        "CYX",
        ["DAPI", "FITC", "Cy3"],
        {"thumbnail"},
    ),
    "derived/derived_CMU-1-Small-Region_subifd-pyramid.ome.tif": (
        "ome",
        [(2967, 2220), (1483, 1110), (741, 555), (370, 277)],
        0.499,
        "YXS",
        [],
        set(),
    ),
    "derived/derived_CMU-1-Small-Region_generic-pyramid.tif": (
        "generic",
        [(2967, 2220), (1483, 1110), (741, 555), (370, 277)],
        0.499,
        "YXS",
        [],
        set(),
    ),
}


def _open(path, mpp):
    if mpp is None:
        with pytest.warns(SlidescopeWarning, match="no pixel size"):
            return open_slide(path)
    return open_slide(path)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_metadata(shared_file, name):
    fmt, shapes, mpp, axes, channels, associated = EXPECTED[name]
    with _open(shared_file(name), mpp) as slide:
        assert slide.format == fmt
        assert slide.level_shapes == shapes
        assert slide.axes == axes
        assert slide.channel_names == channels
        assert set(slide.associated) == associated
        if mpp is None:
            assert slide.mpp is None
        else:
            assert slide.mpp == pytest.approx((mpp, mpp), rel=1e-3)
        h0, w0 = shapes[0]
        for (h, w), (dy, dx) in zip(shapes, slide.downsamples, strict=True):
            assert (dy, dx) == (h0 / h, w0 / w)  # exact, never rounded
        assert slide.metadata["shape"] == shapes[0]


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_random_regions_equal_tifffile_decode(shared_file, name):
    fmt, shapes, mpp, axes, *_ = EXPECTED[name]
    rng = np.random.default_rng(0)
    path = shared_file(name)
    with _open(path, mpp) as slide, tifffile.TiffFile(path) as tif:
        series = max(
            tif.series, key=lambda s: s.shape[s.axes.index("Y")] * s.shape[s.axes.index("X")]
        )
        for level, arr in enumerate(slide.levels):
            expected = series.levels[level].asarray()
            assert arr.shape == expected.shape
            h, w = shapes[level]
            for _ in range(4):
                y0, x0 = rng.integers(0, h), rng.integers(0, w)
                y1, x1 = rng.integers(y0 + 1, h + 1), rng.integers(x0 + 1, w + 1)
                if axes == "CYX":
                    got, want = arr[:, y0:y1, x0:x1], expected[:, y0:y1, x0:x1]
                else:
                    got, want = arr[y0:y1, x0:x1], expected[y0:y1, x0:x1]
                np.testing.assert_array_equal(np.asarray(got), want)
            # the last row/col edge chunk
            np.testing.assert_array_equal(
                np.asarray(arr[..., -3:, :] if axes == "CYX" else arr[-3:]),
                expected[..., -3:, :] if axes == "CYX" else expected[-3:],
            )


def test_associated_images_decode_on_access(shared_file):
    with open_slide(shared_file("CMU-1-Small-Region.svs")) as slide:
        assert slide.associated["label"].shape == (463, 387, 3)
        assert slide.associated["macro"].shape == (431, 1280, 3)


def test_magnification_and_properties(shared_file):
    with open_slide(shared_file("CMU-1-Small-Region.svs")) as slide:
        assert slide.magnification == 20
        assert slide.metadata["properties"]["AppMag"] == "20"
    with open_slide(shared_file("test3-DAPI-2-387.ndpi")) as slide:
        assert slide.magnification == 40
        assert slide.fluorescence
        assert slide.metadata["properties"]["Fluorescence"] == "DAPI 2 (387)"


def test_qptiff_channel_colours(shared_file):
    with open_slide(shared_file("small_vectra.qptiff")) as slide:
        assert slide.channel_colors == [(0.0, 0.0, 1.0), (0.0, 1.0, 0.0), (1.0, 1.0, 0.0)]
        assert slide.magnification == 10


@pytest.mark.parametrize("name", ["CMU-1-Small-Region.svs", "test3-DAPI-2-387.ndpi"])
def test_openslide_second_opinion(shared_file, name):
    import openslide

    path = shared_file(name)
    with open_slide(path) as slide, openslide.OpenSlide(str(path)) as osr:
        for level in range(len(slide.levels)):
            dy, dx = (int(d) for d in slide.downsamples[level])
            y0, x0 = 1024, 704  # multiples of every downsample
            ours = slide.read_region((y0, x0, y0 + 300 * dy, x0 + 200 * dx), level=level)
            theirs = np.asarray(osr.read_region((x0, y0), level, (200, 300)))[..., :3]
            assert ours.shape == theirs.shape == (300, 200, 3)
            assert np.abs(ours.astype(int) - theirs).mean() < 1.0, level


def test_dask_levels_are_lazy_and_chunked_on_native_tiles(shared_file):
    with open_slide(shared_file("test3-DAPI-2-387.ndpi"), chunk_bytes="1 MiB") as slide:
        chunks = slide.levels[0].chunksize
        assert chunks[1] == 3968
        assert chunks[0] % 8 == 0
        assert chunks[0] * 3968 * 3 <= 2**20
        # the graph is not materialised per chunk at open time
        assert len(slide.levels[0].dask.layers) == 1
