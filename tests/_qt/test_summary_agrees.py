"""Every entry point reports the same figures for the same slide (one definition).

The console's ``summary()``, the widget's result line and the batch's ``summary.csv`` (and
its manifest) on CMU-1-Small-Region: the same nuclei, the same tissue area, the same density.
"""

import csv

import numpy as np
import pyarrow.parquet as pq
import pytest

pytestmark = pytest.mark.gui


def test_console_widget_and_batch_agree_on_a_slide(dock_slide, shared_file, qtbot, tmp_path):
    import distributed

    from napari_slidescope import analyze_slides
    from napari_slidescope.viewer import add_nuclei, summary

    path = shared_file("CMU-1-Small-Region.svs")
    viewer, [image], widget = dock_slide(path)
    nuclei = add_nuclei(viewer, image, scope="slide", segmenter="builtin")
    console = summary(viewer, image)
    assert console is not None
    assert not console.partial
    assert console.count > 1000
    qtbot.waitUntil(lambda: str(widget.summary.value) == str(console), timeout=10_000)

    with distributed.Client(
        processes=False, n_workers=1, threads_per_worker=2, dashboard_address=None
    ) as client:
        [row] = analyze_slides(path, tmp_path, segmenter="builtin", client=client)
    assert row["status"] == "done"
    assert row["nuclei"] == console.count
    assert row["tissue_area_mm2"] == pytest.approx(console.tissue_mm2, rel=1e-12)
    assert row["nuclei_per_mm2"] == pytest.approx(console.density_per_mm2, rel=1e-12)
    assert row["mean_nucleus_area_um2"] == pytest.approx(console.mean_area_um2, rel=1e-9)
    with open(tmp_path / "summary.csv", newline="") as fh:
        [written] = list(csv.DictReader(fh))
    assert float(written["nuclei_per_mm2"]) == pytest.approx(console.density_per_mm2, rel=1e-5)
    assert f"{console.density_per_mm2:,.0f} /mm²" in str(console)

    # no negative optical densities, in the viewer's table or the batch's
    table = pq.read_table(tmp_path / path.name / "nuclei.parquet")
    assert np.min(table.column("eosin_od_mean").to_numpy()) >= 0
    assert np.min(nuclei.features["eosin_od_mean"]) >= 0
