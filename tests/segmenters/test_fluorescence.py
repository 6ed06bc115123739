"""Fluorescence and multiplex slides: the right segmenter, channel and measurements."""

import warnings

import numpy as np
import pytest
from scipy import ndimage as ndi

from napari_slidescope import segment_nuclei
from napari_slidescope.analysis.metrics import f1_at_iou
from napari_slidescope.segmenters import (
    SegmenterInfoWarning,
    SegmenterMismatchWarning,
    image_kind,
    registry,
    resolve_auto,
)
from napari_slidescope.slide import ArraySlide, open_slide

MPP = 0.5


def synthetic_dapi(seed=0, shape=(600, 600), n=140):
    """Bright elliptical nuclei (some touching) on an uneven, noisy background; the truth."""
    rng = np.random.default_rng(seed)
    truth = np.zeros(shape, np.int32)
    yy, xx = np.mgrid[: shape[0], : shape[1]]
    centres: list[tuple[float, float]] = []
    k = 0
    while k < n:
        cy, cx = rng.uniform(12, shape[0] - 12), rng.uniform(12, shape[1] - 12)
        a, b = rng.uniform(2.5, 4.5) / MPP, rng.uniform(2.5, 4.5) / MPP  # semi-axes, px
        # close pairs touch; nothing overlaps the truth of another nucleus
        if any(np.hypot(cy - y, cx - x) < 1.05 * (a + b) for y, x in centres):
            continue
        t = rng.uniform(0, np.pi)
        dy, dx = yy - cy, xx - cx
        u, v = dy * np.cos(t) + dx * np.sin(t), -dy * np.sin(t) + dx * np.cos(t)
        inside = (u / a) ** 2 + (v / b) ** 2 <= 1
        if (truth[inside] > 0).any():
            continue
        k += 1
        truth[inside] = k
        centres.append((cy, cx))
    brightness = rng.uniform(60, 160, n + 1)
    brightness[0] = 0
    signal = ndi.gaussian_filter(brightness[truth].astype(np.float32), 1.0)
    texture = 1 + 0.15 * ndi.gaussian_filter(rng.normal(size=shape), 1.5)
    background = 15 + 20 * xx / shape[1]  # uneven illumination
    image = signal * texture + background + rng.normal(0, 4, shape)
    return np.clip(image, 0, 255).astype(np.uint8), truth


def test_builtin_fluorescence_finds_known_nuclei():
    image, truth = synthetic_dapi()
    res = segment_nuclei(image, mpp=MPP, segmenter="builtin-fluorescence", tissue=False)
    assert res.segmenter == "builtin-fluorescence"
    assert res.labels.shape == image.shape
    assert f1_at_iou(truth, res.labels) >= 0.9
    assert "intensity_mean" in res.columns
    assert "hematoxylin_od_mean" not in res.columns
    # the mean intensity under each nucleus: about its brightness, above the background
    assert (res.columns["intensity_mean"] > 40).mean() > 0.9


def test_image_kinds_from_metadata(shared_file):
    rgb = ArraySlide(np.zeros((8, 8, 3), np.uint8), mpp=0.5)
    assert image_kind(rgb).input == "brightfield"
    gray = ArraySlide(np.zeros((8, 8), np.uint16), mpp=0.5)
    assert image_kind(gray).input == "fluorescence"
    assert image_kind(gray).nuclear_channel == 0
    with open_slide(shared_file("small_vectra.qptiff")) as qp:
        kind = image_kind(qp)
        assert kind.channel_names == ("DAPI", "FITC", "Cy3")
        assert kind.nuclear_channel == 0
        assert image_kind(qp, channel="fitc").nuclear_channel == 1
        assert image_kind(qp, channel=2).nuclear_channel == 2
        with pytest.raises(ValueError, match="DAPI"):
            image_kind(qp, channel="Opal 690")
    with open_slide(shared_file("test3-DAPI-2-387.ndpi")) as nd:
        kind = image_kind(nd)
        assert kind.input == "fluorescence"
        assert kind.rgb_encoded
        assert kind.fluorochrome == "DAPI 2 (387)"


def test_dapi_ndpi_gives_nuclei_with_its_channel_intensity(shared_file):
    path = shared_file("test3-DAPI-2-387.ndpi")
    region = (1500, 1000, 2500, 2000)
    res = segment_nuclei(path, region=region, segmenter="builtin-fluorescence", tissue=False)
    assert res.count > 20
    assert res.mpp == 0.5
    # the signal of this RGB-encoded DAPI scan is in its blue channel: named after the dye
    assert "DAPI_mean" in res.columns
    assert "hematoxylin_od_mean" not in res.columns
    assert np.isfinite(res.columns["DAPI_mean"]).all()
    assert res.columns["DAPI_mean"].mean() > 20
    areas = res.columns["area_um2"]
    assert 15 < np.median(areas) < 120  # nuclei, not background blobs
    # the H&E method on it runs, but says which ones fit
    with pytest.warns(SegmenterMismatchWarning, match="builtin-fluorescence"):
        segment_nuclei(path, region=region, segmenter="builtin", tissue=False)


def test_qptiff_gives_nuclei_with_every_channel_mean(shared_file):
    path = shared_file("small_vectra.qptiff")
    region = (200, 200, 700, 700)
    res = segment_nuclei(path, region=region, segmenter="builtin-fluorescence", tissue=False)
    assert res.count > 20
    for name in ("DAPI_mean", "FITC_mean", "Cy3_mean"):
        assert name in res.columns
        assert np.isfinite(res.columns[name]).all()
    # segmented on DAPI: nuclei are brighter in DAPI than the region's DAPI median
    with open_slide(path) as slide:
        dapi = slide.read_region(region)[0]
    assert np.median(res.columns["DAPI_mean"]) > np.median(dapi)
    # another nuclear channel on request
    other = segment_nuclei(path, region=region, segmenter="builtin-fluorescence", channel="Cy3")
    assert other.count != res.count
    # an H&E segmenter on a multichannel slide is refused, naming the right ones
    with pytest.raises(ValueError, match="builtin-fluorescence"):
        segment_nuclei(path, region=region, segmenter="builtin")


def write_multiplex(path, glass_cols=300):
    """A 3-channel OME-TIFF (DAPI, FITC, Cy3) of :func:`synthetic_dapi`; empty glass on the
    right `glass_cols` columns; Cy3 shows a third of the nuclei only. Returns the truth."""
    import tifffile

    dapi, truth = synthetic_dapi()
    rng = np.random.default_rng(1)
    fitc = (40 + 60 * ndi.gaussian_filter(rng.random(dapi.shape), 8)).astype(np.uint8)
    cy3 = np.where(truth % 3 == 0, dapi, 20).astype(np.uint8)
    data = np.stack([dapi, fitc, cy3])
    data[:, :, data.shape[2] - glass_cols :] = 0
    truth = np.where(np.arange(truth.shape[1]) < truth.shape[1] - glass_cols, truth, 0)
    tifffile.imwrite(
        path,
        data,
        tile=(128, 128),
        compression="zlib",
        metadata={
            "axes": "CYX",
            "Channel": {"Name": ["DAPI", "FITC", "Cy3"]},
            "PhysicalSizeX": MPP,
            "PhysicalSizeY": MPP,
        },
    )
    return truth


def test_multichannel_slide_segments_its_nuclear_channel_and_measures_every_channel(tmp_path):
    from napari_slidescope import detect_tissue

    path = tmp_path / "multiplex.ome.tif"
    truth = write_multiplex(path)
    with open_slide(path) as slide:
        kind = image_kind(slide)
        assert kind.channel_names == ("DAPI", "FITC", "Cy3")
        assert kind.nuclear_channel == 0
        assert image_kind(slide, channel="fitc").nuclear_channel == 1
        with pytest.raises(ValueError, match="DAPI"):
            image_kind(slide, channel="Opal 690")
        tissue = detect_tissue(slide)
        dapi = slide.read_region((0, 0, *slide.shape0))[0]
    assert tissue.mode == "fluorescence"
    assert 0.3 < tissue.fraction < 0.7
    res = segment_nuclei(path, segmenter="builtin-fluorescence", tissue=False)
    assert f1_at_iou(truth, res.labels) >= 0.9
    for name in ("DAPI_mean", "FITC_mean", "Cy3_mean"):
        assert name in res.columns
        assert np.isfinite(res.columns[name]).all()
    assert "hematoxylin_od_mean" not in res.columns
    assert np.median(res.columns["DAPI_mean"]) > np.median(dapi)
    # another nuclear channel on request: only the nuclei that channel shows
    other = segment_nuclei(path, segmenter="builtin-fluorescence", channel="Cy3", tissue=False)
    assert 0 < other.count < 0.6 * res.count
    # an H&E segmenter on a multichannel slide is refused, naming the right ones
    with pytest.raises(ValueError, match="builtin-fluorescence"):
        segment_nuclei(path, segmenter="builtin", tissue=False)


def test_auto_picks_the_learned_model_when_installed(monkeypatch):
    real = registry.missing_reason

    def installed(name):
        return None if name.startswith("instanseg") else real(name)

    monkeypatch.setattr(registry, "missing_reason", installed)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing to say: the accurate one runs
        assert resolve_auto("brightfield") == "instanseg"
        assert resolve_auto("fluorescence") == "instanseg-fluorescence"

    def missing(name):
        return "model file not found" if name.startswith("instanseg") else real(name)

    monkeypatch.setattr(registry, "missing_reason", missing)
    for kind, builtin, learned in [
        ("brightfield", "builtin", "instanseg"),
        ("fluorescence", "builtin-fluorescence", "instanseg-fluorescence"),
    ]:
        with pytest.warns(SegmenterInfoWarning, match=f"{builtin!r}.*{learned!r}") as rec:
            assert resolve_auto(kind) == builtin
        assert len(rec) == 1  # one message
    # through segment_nuclei: the built-in fluorescence method ran, and said so once
    image, _ = synthetic_dapi(n=20, shape=(200, 200))
    with pytest.warns(SegmenterInfoWarning, match="install") as rec:
        res = segment_nuclei(image, mpp=MPP, tissue=False)
    said = [str(w.message) for w in rec if issubclass(w.category, SegmenterInfoWarning)]
    assert res.segmenter == "builtin-fluorescence", [str(w.message) for w in rec]
    assert len(said) == 1, [str(w.message) for w in rec]


def test_one_fluorescence_rule_for_tissue_and_nuclei():
    """Tissue detection and the nuclei pipeline decide "fluorescence" from the same metadata."""
    from napari_slidescope.pipeline.tissue import _auto_mode
    from napari_slidescope.segmenters import is_fluorescence

    cases = [  # (axes, flag, channel names) -> fluorescence, by hand from the formats
        ("YXS", False, [], False),  # an H&E scan
        ("YXS", True, ["DAPI 2 (387)"], True),  # NDPI fluorescence: its tag
        ("YXS", False, ["FITC"], True),  # a fluorophore named
        ("YXS", False, ["red", "green", "blue"], False),
        ("CYX", False, ["channel 0", "channel 1"], True),  # multichannel
        ("YX", False, [], True),  # one channel
    ]
    for axes, flag, names, want in cases:
        assert is_fluorescence(axes, fluorescence=flag, channel_names=names) is want, axes
        slide = ArraySlide(np.zeros((8, 8, 3), np.uint8), mpp=0.5)  # metadata set below
        slide.axes, slide.fluorescence, slide.channel_names = axes, flag, names
        assert (_auto_mode(slide) == "fluorescence") is want, (axes, flag, names)
        assert (image_kind(slide).input == "fluorescence") is want, (axes, flag, names)
