"""DICOM WSI through wsidicom: the shared SVS and NDPI converted by wsidicomizer."""

import numpy as np
import pytest

from napari_slidescope.slide import SlideError, open_slide

pytest.importorskip("wsidicom")

#: shared slide -> (level shapes, mpp, associated images the DICOM copy has)
SOURCES = {
    "CMU-1-Small-Region.svs": ([(2967, 2220)], 0.499, {"label", "macro"}),
    "test3-DAPI-2-387.ndpi": (
        [(4864, 3968), (2432, 1984), (1216, 992), (608, 496)],
        0.22817,
        set(),
    ),
}


@pytest.mark.parametrize("name", sorted(SOURCES))
def test_levels_calibration_and_pixels_equal_the_source(dicom_slides, shared_file, name):
    shapes, mpp, associated = SOURCES[name]
    with open_slide(dicom_slides[name]) as slide, open_slide(shared_file(name)) as ref:
        assert slide.format == "dicom"
        assert slide.backend == "dicom"
        assert slide.axes == "YXS"
        assert slide.level_shapes == shapes == ref.level_shapes
        assert slide.mpp == pytest.approx((mpp, mpp), rel=1e-4)
        assert slide.calibration_source == "DICOM PixelSpacing"
        assert associated <= set(slide.associated)
        for level, (got, want) in enumerate(zip(slide.levels, ref.levels, strict=True)):
            np.testing.assert_array_equal(
                np.asarray(got), np.asarray(want), err_msg=f"level {level}"
            )
        box = (1000, 700, 1500, 1400)
        np.testing.assert_array_equal(slide.read_region(box), ref.read_region(box))


def test_chunks_follow_the_budget_and_tiles(dicom_slides):
    with open_slide(dicom_slides["test3-DAPI-2-387.ndpi"], chunk_bytes="1 MiB") as slide:
        tile = slide._readers[0].native
        cy, cx, _ = slide.levels[0].chunksize
        assert cy % tile[0] == 0
        assert cx % tile[1] == 0
        assert cy * cx * 3 <= 2**20


def test_label_and_overview(dicom_slides, shared_file):
    with open_slide(dicom_slides["CMU-1-Small-Region.svs"]) as slide:
        with open_slide(shared_file("CMU-1-Small-Region.svs")) as ref:
            assert slide.associated["label"].shape[:2] == ref.associated["label"].shape[:2]
            assert slide.associated["macro"].shape[:2] == ref.associated["macro"].shape[:2]


def test_single_instance_file(dicom_slides):
    folder = dicom_slides["test3-DAPI-2-387.ndpi"]
    with open_slide(folder) as whole:
        biggest = max(folder.iterdir(), key=lambda f: f.stat().st_size)
        with open_slide(biggest) as one:
            assert one.format == "dicom"
            assert one.level_shapes[0] == whole.level_shapes[0]


def test_folder_with_no_slide_instance(tmp_path):
    import pydicom
    from pydicom.dataset import FileDataset, FileMetaDataset
    from pydicom.uid import ExplicitVRLittleEndian, SecondaryCaptureImageStorage, generate_uid

    meta = FileMetaDataset()
    meta.MediaStorageSOPClassUID = SecondaryCaptureImageStorage
    meta.MediaStorageSOPInstanceUID = generate_uid()
    meta.TransferSyntaxUID = ExplicitVRLittleEndian
    ds = FileDataset(str(tmp_path / "ct.dcm"), {}, file_meta=meta, preamble=b"\0" * 128)
    ds.SOPClassUID = SecondaryCaptureImageStorage
    ds.SOPInstanceUID = meta.MediaStorageSOPInstanceUID
    ds.PatientName = "Nobody"
    pydicom.dcmwrite(tmp_path / "ct.dcm", ds, enforce_file_format=True)
    with pytest.raises(SlideError, match="no DICOM instance of a slide") as info:
        open_slide(tmp_path)
    assert str(tmp_path) in str(info.value)
