"""`slidescope batch` on slides that are folders: OME-Zarr images and DICOM WSI folders."""

import csv
import os
import shutil

import numpy as np
import pytest
from tests.batch_setup import cli

from napari_slidescope.batch.params import find_slides, local_size_mtime, stamp_slide


def _write_zarr(slide_writers, path):
    rng = np.random.default_rng(0)
    planes = np.full((3, 512, 512), 235, np.uint8)
    planes[:, 100:400, 120:380] = rng.integers(90, 160, (3, 300, 260), dtype=np.uint8)
    slide_writers.write_ngff(path, planes, mpp=(0.5, 0.5), nlevels=3)


def test_folder_slides_are_found_once_and_stamped(slide_writers, tmp_path):
    cohort = tmp_path / "cohort"
    (cohort / "dicom" / "case1").mkdir(parents=True)
    (cohort / "dicom" / "case1" / "a.dcm").write_bytes(b"\0" * 128 + b"DICM")
    (cohort / "dicom" / "case1" / "b.dcm").write_bytes(b"\0" * 128 + b"DICM")
    _write_zarr(slide_writers, cohort / "x.ome.zarr")
    (cohort / "y.svs").write_bytes(b"II*\x00")
    found = find_slides([cohort])
    assert found == sorted([cohort / "dicom" / "case1", cohort / "x.ome.zarr", cohort / "y.svs"])
    stamp = stamp_slide(cohort / "x.ome.zarr")
    assert (stamp.size, stamp.mtime_ns) == local_size_mtime(cohort / "x.ome.zarr")
    (cohort / "dicom" / "case1" / "b.dcm").write_bytes(b"\0" * 128 + b"DICM!")
    assert stamp_slide(cohort / "dicom" / "case1").size == 2 * 132 + 1


def test_batch_runs_tissue_on_ome_zarr_and_dicom(
    slide_writers, dicom_slides, shared_file, tmp_path
):
    cohort = tmp_path / "cohort"
    cohort.mkdir()
    _write_zarr(slide_writers, cohort / "synthetic.ome.zarr")
    shutil.copytree(dicom_slides["CMU-1-Small-Region.svs"], cohort / "cmu_dicom")
    os.symlink(shared_file("CMU-1-Small-Region.svs"), cohort / "cmu.svs")
    out = tmp_path / "out"
    res = cli("batch", cohort, "-o", out, "--tasks", "tissue", "--workers", "1", timeout=600)
    assert res.returncode == 0, res.stderr
    with open(out / "summary.csv", newline="") as fh:
        rows = {r["slide"]: r for r in csv.DictReader(fh)}
    assert set(rows) == {"synthetic.ome.zarr", "cmu_dicom", "cmu.svs"}
    assert all(r["status"] == "done" for r in rows.values())
    assert float(rows["synthetic.ome.zarr"]["tissue_area_mm2"]) > 0
    # the same pixels as DICOM and as SVS: the same tissue, to the working image's decode
    # (the SVS's JPEG tiles are read 1/8 in the DCT domain, the DICOM frames through
    # wsidicom at full size and averaged: a grey level apart here and there)
    dicom_area = float(rows["cmu_dicom"]["tissue_area_mm2"])
    assert dicom_area == pytest.approx(float(rows["cmu.svs"]["tissue_area_mm2"]), rel=0.005)


def test_folders_are_searched_for_every_slide_suffix_of_the_reader(tmp_path):
    from napari_slidescope.slide.formats import OPENSLIDE_SUFFIXES, SLIDE_SUFFIXES

    names = [
        f"s{i}{suffix.upper() if i % 2 else suffix}"
        for i, suffix in enumerate(SLIDE_SUFFIXES + OPENSLIDE_SUFFIXES)
    ]
    for name in [*names, "notes.txt", "s.json", ".hidden.svs"]:
        (tmp_path / name).write_bytes(b"")
    assert [p.name for p in find_slides([tmp_path])] == sorted(names)
    assert {".svs", ".ndpi", ".ome.tiff", ".mrxs", ".vms"} <= set(
        SLIDE_SUFFIXES + OPENSLIDE_SUFFIXES
    )
