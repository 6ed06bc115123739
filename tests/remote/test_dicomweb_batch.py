"""`analyze_slides` (the batch engine) on a DICOMweb series: the workers open it themselves."""

from __future__ import annotations

import json

import pytest

from napari_slidescope import analyze_slides

pytest.importorskip("wsidicom")


def test_batch_from_a_dicomweb_series_equals_the_local_folder(dicomweb, dicom_slides, tmp_path):
    study, series = dicomweb.series()["CMU-1-Small-Region_svs"]
    url = dicomweb.url(study, series)
    folder = dicom_slides["CMU-1-Small-Region.svs"]
    [got] = analyze_slides([url], tmp_path / "web", tasks=["tissue"], workers=1)
    [want] = analyze_slides([folder], tmp_path / "local", tasks=["tissue"], workers=1)
    assert got["status"] == "done", got.get("error")
    assert got["path"] == url
    assert got["tissue_area_mm2"] == want["tissue_area_mm2"]
    out = tmp_path / "web" / got["slide"]
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["slide_stamp"]["etag"]  # the hash of the series' instance UIDs
    a = json.loads((out / "tissue.geojson").read_text())
    b = json.loads((tmp_path / "local" / want["slide"] / "tissue.geojson").read_text())
    assert a == b
