"""The npe2 reader on the formats beyond the TIFF family (and SCN / BIF), without a viewer."""

import numpy as np
import pytest

from napari_slidescope._napari.reader import get_reader, read_slide


def _one_image(layers):
    assert len(layers) == 1
    data, kwargs, kind = layers[0]
    assert kind == "image"
    return data, kwargs


def test_ome_zarr_rgb_folder(slide_writers, tmp_path):
    path = tmp_path / "rgb.ome.zarr"
    levels = slide_writers.write_ngff(
        path,
        slide_writers.rgb_planes((300, 400)),
        mpp=(0.5, 0.5),
        channels=[("R", "FF0000"), ("G", "00FF00"), ("B", "0000FF")],
    )
    assert get_reader(str(path)) is read_slide
    data, kwargs = _one_image(read_slide(str(path)))
    assert kwargs["rgb"] is True
    assert kwargs["multiscale"] is True
    assert kwargs["scale"] == (0.5, 0.5)
    assert kwargs["units"] == ("µm", "µm")
    assert [d.shape for d in data] == [np.moveaxis(a, 0, -1).shape for a in levels]
    assert kwargs["metadata"]["slidescope"]["format"] == "ome-zarr"


def test_ome_zarr_channels(slide_writers, tmp_path):
    path = tmp_path / "fl.zarr"
    rng = np.random.default_rng(0)
    slide_writers.write_ngff(
        path,
        rng.integers(0, 1000, (2, 256, 256), dtype=np.uint16),
        nlevels=2,
        channels=[("DAPI", "0000FF"), ("CD3", "FF00FF")],
    )
    data, kwargs = _one_image(read_slide(str(path)))
    assert kwargs["channel_axis"] == 0
    assert kwargs["name"] == ["fl.zarr [DAPI]", "fl.zarr [CD3]"]
    assert [c.colors[-1][:3].tolist() for c in kwargs["colormap"]] == [[0, 0, 1], [1, 0, 1]]


def test_broken_ome_zarr_is_still_claimed(tmp_path):
    path = tmp_path / "broken.zarr"
    path.mkdir()
    (path / ".zgroup").write_text('{"zarr_format": 2}')
    assert get_reader(str(path)) is read_slide
    from napari_slidescope.slide import SlideError

    with pytest.raises(SlideError, match="multiscales"):
        read_slide(str(path))


def test_dicom_folder(dicom_slides):
    folder = dicom_slides["CMU-1-Small-Region.svs"]
    assert get_reader(str(folder)) is read_slide
    data, kwargs = _one_image(read_slide(str(folder)))
    assert kwargs["rgb"] is True
    assert kwargs["scale"] == pytest.approx((0.499, 0.499))
    assert data.shape == (2967, 2220, 3)
    assert kwargs["metadata"]["slidescope"]["format"] == "dicom"


@pytest.mark.parametrize("kind", ["scn", "bif"])
def test_scn_and_bif(slide_writers, tmp_path, kind):
    path = tmp_path / f"fixture.{kind}"
    levels = getattr(slide_writers, f"write_{kind}")(path)[0]
    assert get_reader(str(path)) is read_slide
    data, kwargs = _one_image(read_slide(str(path)))
    assert [d.shape for d in data] == [a.shape for a in levels]
    assert kwargs["metadata"]["slidescope"]["format"] == kind


def test_openslide_only_extensions_are_claimed(tmp_path):
    for ext in ("mrxs", "vms", "vmu", "dcm"):
        path = tmp_path / f"slide.{ext}"
        path.write_bytes(b"x")
        assert get_reader(str(path)) is read_slide, ext


def test_plain_folder_is_left_alone(tmp_path):
    (tmp_path / "a.txt").write_text("x")
    assert get_reader(str(tmp_path)) is None


@pytest.mark.gui
def test_viewer_opens_ome_zarr_and_dicom_folders(
    make_napari_viewer, slide_writers, dicom_slides, tmp_path
):
    viewer = make_napari_viewer()
    path = tmp_path / "slide.ome.zarr"
    slide_writers.write_ngff(path, slide_writers.rgb_planes((256, 384)), mpp=(0.5, 0.5))
    [layer] = viewer.open(str(path), plugin="napari-slidescope")
    assert layer.rgb
    assert layer.multiscale
    assert tuple(layer.scale) == pytest.approx((0.5, 0.5))
    folder = dicom_slides["CMU-1-Small-Region.svs"]
    [layer2] = viewer.open(str(folder), plugin="napari-slidescope")
    assert layer2.rgb
    assert layer2.data.shape == (2967, 2220, 3)
    assert tuple(layer2.scale) == pytest.approx((0.499, 0.499))
