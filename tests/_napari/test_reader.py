"""The npe2 reader contract, without a viewer."""

from pathlib import Path

import numpy as np
import pytest
import tifffile

from napari_slidescope._napari.reader import get_reader, read_slide
from napari_slidescope.slide import SlideError


def test_manifest_mirror_is_identical():
    root = Path(__file__).parents[2]
    top = (root / "napari.yaml").read_text()
    inner = (root / "src" / "napari_slidescope" / "napari.yaml").read_text()
    assert top == inner, "napari.yaml differs from src/napari_slidescope/napari.yaml"


def test_manifest_is_valid():
    from npe2 import PluginManifest

    manifest = PluginManifest.from_file(Path(__file__).parents[2] / "napari.yaml")
    patterns = manifest.contributions.readers[0].filename_patterns
    for ext in ("svs", "ndpi", "tif", "tiff", "ome.tif", "ome.tiff", "qptiff", "scn", "bif"):
        assert f"*.{ext}" in patterns


def test_manifest_claims_every_slide_suffix():
    """npe2 offers the reader every slide ending of slide.formats (one list of each kind)."""
    from npe2 import PluginManifest

    from napari_slidescope._napari.reader import slide_suffixes

    manifest = PluginManifest.from_file(Path(__file__).parents[2] / "napari.yaml")
    patterns = manifest.contributions.readers[0].filename_patterns
    assert {".svs", ".tif", ".mrxs", ".dcm"} <= set(slide_suffixes())
    missing = [s for s in slide_suffixes() if f"*{s}" not in patterns]
    assert not missing, f"napari.yaml lacks {missing}"


@pytest.mark.parametrize("suffix", [".svs", ".ndpi", ".qptiff", ".scn", ".bif", ".mrxs", ".dcm"])
def test_claims_slide_only_suffixes_even_when_damaged(tmp_path, suffix):
    """A slide-only ending is claimed whatever its bytes, so open_slide names the problem."""
    path = tmp_path / f"broken{suffix}"
    path.write_bytes(b"not a slide")
    assert get_reader(str(path)) is read_slide
    assert get_reader(str(tmp_path / "notes.txt")) is None


def test_rejects_non_tiff_bytes_behind_tif(tmp_path):
    path = tmp_path / "x.tif"
    path.write_bytes(b"GIF89a" + b"\x00" * 100)
    assert get_reader(str(path)) is None


def test_rejects_small_plain_tiff(tmp_path):
    path = tmp_path / "plain.tif"
    tifffile.imwrite(path, np.zeros((64, 64), np.uint8))
    assert get_reader(str(path)) is None


def test_rejects_other_extensions_and_lists(tmp_path):
    assert get_reader(str(tmp_path / "x.png")) is None
    assert get_reader([str(tmp_path / "a.svs"), str(tmp_path / "b.svs")]) is None


def test_takes_pyramids_and_slide_extensions(tmp_path, sample_slide):
    path, _ = sample_slide
    assert get_reader(str(path)) is read_slide
    pyramid = tmp_path / "pyr.ome.tif"
    with tifffile.TiffWriter(pyramid) as tif:
        tif.write(np.zeros((512, 512), np.uint8), tile=(128, 128), subifds=1)
        tif.write(np.zeros((256, 256), np.uint8), tile=(128, 128), subfiletype=1)
    assert get_reader(str(pyramid)) is read_slide
    damaged = tmp_path / "damaged.ndpi"
    damaged.write_bytes(b"junk")
    assert get_reader(str(damaged)) is read_slide  # our file: the reader will name the problem


def test_takes_large_tiled_tiff(tmp_path, monkeypatch):
    from napari_slidescope._napari import reader

    path = tmp_path / "big.tif"
    tifffile.imwrite(path, np.zeros((512, 512, 3), np.uint8), tile=(256, 256), photometric="rgb")
    assert get_reader(str(path)) is None
    monkeypatch.setattr(reader, "EAGER_LIMIT_BYTES", 1000)
    assert get_reader(str(path)) is read_slide


def test_sniffer_never_raises(tmp_path):
    path = tmp_path / "bad.tif"
    path.write_bytes(b"II*\x00" + b"\xff" * 20)
    # a damaged TIFF is claimed, so the user reads what is wrong with it
    reader = get_reader(str(path))
    assert reader is read_slide
    with pytest.raises(SlideError, match=r"bad\.tif: is truncated"):
        reader(str(path))
    (tmp_path / "notes.tif").write_bytes(b"not a tiff at all")
    assert get_reader(str(tmp_path / "notes.tif")) is None
    assert get_reader(str(tmp_path)) is None


def test_layer_data_rgb(sample_slide):
    path, truth = sample_slide
    [(data, kwargs, kind)] = read_slide(str(path))
    assert kind == "image"
    assert kwargs["multiscale"] is True
    assert kwargs["rgb"] is True
    assert kwargs["scale"] == (0.5, 0.5)
    assert kwargs["units"] == ("µm", "µm")
    assert kwargs["contrast_limits"] == [0, 255]
    assert kwargs["name"] == "sample.svs"
    assert [d.shape[:2] for d in data] == [(2048, 3072), (512, 768), (128, 192)]
    meta = kwargs["metadata"]["slidescope"]
    assert meta["format"] == "svs"
    assert meta["mpp"] == (0.5, 0.5)
    assert meta["magnification"] == 20
    import dask.array as da

    assert all(isinstance(d, da.Array) for d in data)


def test_layer_data_multichannel(shared_file):
    [(data, kwargs, kind)] = read_slide(str(shared_file("small_vectra.qptiff")))
    assert kwargs["channel_axis"] == 0
    assert kwargs["name"] == [f"small_vectra.qptiff [{c}]" for c in ("DAPI", "FITC", "Cy3")]
    assert len(kwargs["colormap"]) == 3
    assert kwargs["scale"] == pytest.approx((0.4965, 0.4965), rel=1e-3)


def test_reader_error_names_file(tmp_path):
    from napari_slidescope import SlideError

    path = tmp_path / "broken.svs"
    path.write_bytes(b"not a tiff")
    with pytest.raises(SlideError, match=r"broken\.svs: is not a TIFF file"):
        read_slide(str(path))


def test_fluorescence_contrast_limits_come_from_the_smallest_level(shared_file):
    import numpy as np

    from napari_slidescope import open_slide

    path = shared_file("small_vectra.qptiff")
    [(data, kwargs, kind)] = read_slide(str(path))
    with open_slide(path) as slide:
        small = np.asarray(slide.levels[-1])
    for c, (lo, hi) in enumerate(kwargs["contrast_limits"]):
        assert hi == pytest.approx(np.percentile(small[c], 99.9))
        assert lo < hi < 255  # uint8, but dim: not [0, 255]
    # an RGB-encoded fluorescence scan (NDPI DAPI, mean about 13) is stretched too
    path = shared_file("test3-DAPI-2-387.ndpi")
    [(_, nd, _)] = read_slide(str(path))
    with open_slide(path) as slide:
        small = np.asarray(slide.levels[-1])
    assert nd["rgb"]
    assert nd["contrast_limits"] == pytest.approx(list(np.percentile(small, [0.1, 99.9])))
