"""Exports of a NucleiResult in bulk: the same text as the per-feature writers, in seconds.

The bulk writers (GeoJSON, CSV, GeoParquet) must write what the simple writers write:
the GeoJSON text of :func:`polygon_feature` + :func:`write_features` (ids aside, they
are random), :func:`csv.writer`'s CSV, and batch's ``nuclei.parquet`` rows.
"""

from __future__ import annotations

import csv
import dataclasses
import gzip
import io
import json
import re
import sys

import numpy as np
import pytest

from napari_slidescope.analysis.geojson import (
    polygon_coordinates_text,
    polygon_feature,
    write_features,
    write_polygon_features,
)
from napari_slidescope.analysis.measure import measure_nuclei, write_csv
from napari_slidescope.pipeline.nuclei_result import NucleiResult

_ID = re.compile(r'"id": "[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}"')


def _rings(n: int, seed: int = 0) -> list[np.ndarray]:
    """Rings with awkward coordinates: halves, thousandths on the edge, negatives, big values."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        scale = [1.0, 2.0, 1.9786123, 0.37][i % 4]
        ring = rng.normal(size=(int(rng.integers(3, 30)), 2)) * 10 * scale
        ring += rng.uniform(-5, 150_000, 2)
        if i % 5 == 0:
            ring = np.round(ring * 2) / 2
        if i % 7 == 0:
            ring = np.round(ring, 4) + 0.0005  # a half at the 4th decimal
        out.append(ring)
    out.append(np.array([[0.0, -0.0001], [1.0, -0.0004], [1.0, 1.0]]))  # -0.0
    return out


def test_coordinates_text_is_json_of_the_features_rings():
    rings = _rings(400)
    expected = [json.dumps(polygon_feature(r)["geometry"]["coordinates"]) for r in rings]
    assert polygon_coordinates_text(rings) == expected


@pytest.mark.parametrize("offset", [0.0, -3.5, 2_345_678.25, -1_234_567.5, -7.3e7, 1e12])
def test_coordinates_text_at_any_magnitude(offset):
    """Past a million px (wider thousands), past 65.5 million (json's own), negatives."""
    rings = [r + offset for r in _rings(60, seed=4)]
    rings.append(np.array([[offset, 0.0], [offset + 999.9996, 1000.0], [offset + 1000, 0.0]]))
    expected = [json.dumps(polygon_feature(r)["geometry"]["coordinates"]) for r in rings]
    assert polygon_coordinates_text(rings) == expected
    assert polygon_coordinates_text([]) == []


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_coordinates_are_refused_not_written(bad):
    """JSON has no NaN or infinity: both the bulk text and the per-feature dict say so."""
    rings = _rings(10, seed=2)
    rings[3] = rings[3].copy()
    rings[3][1, 0] = bad
    with pytest.raises(ValueError, match="finite"):
        polygon_coordinates_text(rings)
    with pytest.raises(ValueError, match="finite"):
        polygon_feature(rings[3])


@pytest.mark.parametrize("cells", [False, True])
def test_bulk_features_are_the_per_feature_text(cells):
    rings = _rings(300, seed=1)
    n = len(rings)
    rng = np.random.default_rng(2)
    names = ['Big, "odd"' if i % 3 else "Nucleus" for i in range(n)]
    colors = {'Big, "odd"': (255, 0, 0), "Nucleus": (0, 0, 255)}
    meas = {
        "id": np.arange(n, dtype=np.int32),
        "area_um2": rng.normal(size=n) * 1e-5,
        "flag": rng.random(n) > 0.5,
        "gaps": np.where(np.arange(n) % 4 == 0, np.nan, rng.random(n)),
        "inf": np.where(np.arange(n) % 9 == 0, np.inf, 1e17 * rng.random(n)),
    }
    nuclei = [r * 0.5 if i % 5 else None for i, r in enumerate(rings)] if cells else None
    kind = "cell" if cells else "detection"
    per_feature = io.StringIO()
    write_features(
        per_feature,
        (
            polygon_feature(
                r,
                name=names[i],
                color=colors[names[i]],
                object_type=kind,
                measurements={k: float(v[i]) for k, v in meas.items()},
                nucleus=None if nuclei is None else nuclei[i],
            )
            for i, r in enumerate(rings)
        ),
    )
    bulk = io.BytesIO()
    seen = []
    written = write_polygon_features(
        bulk, rings, names=names, colors=colors, object_type=kind, measurements=meas,
        nuclei=nuclei, chunk=97, progress=lambda done, total: seen.append((done, total)),
    )  # fmt: skip
    assert written == n
    text = bulk.getvalue().decode("ascii")
    assert len(_ID.findall(text)) == n  # every feature a (version 4) UUID ...
    assert len(set(_ID.findall(text))) == n  # ... of its own
    assert _ID.sub('"id": ""', text) == _ID.sub('"id": ""', per_feature.getvalue())
    assert seen[-1] == (n, n) and len(seen) == -(-n // 97)


def test_csv_is_csv_writers_text(tmp_path):
    n = 2500
    rng = np.random.default_rng(3)
    table = {
        "id": np.arange(n, dtype=np.int32),
        "x": rng.normal(size=n) * 10.0 ** rng.integers(-8, 18, n),
        "nan": np.where(np.arange(n) % 3 == 0, np.nan, np.inf),
        "f32": rng.random(n).astype(np.float32),
        "flag": rng.random(n) > 0.5,
        "class": np.array(["a", 'b, "c"', "d\ne", ""] * (n // 4) + ["a"] * (n % 4)),
    }
    ref = io.StringIO(newline="")
    w = csv.writer(ref)
    w.writerow(list(table))
    for row in zip(*(np.asarray(c).tolist() for c in table.values()), strict=True):
        w.writerow(row)
    write_csv(table, tmp_path / "t.csv", chunk=333)
    assert (tmp_path / "t.csv").read_bytes() == ref.getvalue().encode()


def _result(cells: bool = False) -> NucleiResult:
    lab = np.zeros((60, 80), np.int32)
    lab[5:15, 5:20] = 1
    lab[20:32, 30:41] = 2
    lab[40:55, 60:75] = 3
    table = measure_nuclei(lab, mpp=0.5, origin=(100, 200))
    cell_lab = None
    if cells:
        from scipy import ndimage as ndi

        cell_lab = ndi.grey_dilation(lab, size=5).astype(np.int32)
    return NucleiResult(
        labels=lab, mpp=0.5, origin=(100, 200), downsample=(1.0, 1.0), count=3, columns=table,
        region=(100, 200, 160, 280), segmenter="test", parameters={"mpp": 0.5}, cells=cell_lab,
    )  # fmt: skip


@pytest.mark.parametrize("cells", [False, True])
def test_geojson_of_a_result_reads_back(tmp_path, cells):
    res = _result(cells)
    for name in ("n.geojson", "n.geojson.gz"):
        out = res.to_geojson(tmp_path / name)
        raw = out.read_bytes()
        doc = json.loads(gzip.decompress(raw) if name.endswith(".gz") else raw)
        feats = doc["features"]
        assert [f["properties"]["measurements"]["id"] for f in feats] == [1.0, 2.0, 3.0]
        assert {f["properties"]["objectType"] for f in feats} == {"cell" if cells else "detection"}
        assert all(("nucleusGeometry" in f) == cells for f in feats)
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


@pytest.mark.parametrize("cells", [False, True])
def test_geoparquet_has_batchs_schema(tmp_path, cells):
    pq = pytest.importorskip("pyarrow.parquet")
    from napari_slidescope.batch.tasks import wkb_polygon
    from napari_slidescope.pipeline.geoparquet import NUCLEI_COLUMNS

    res = _result(cells)
    t = dict(res.columns)
    t["class"] = np.array(["Big", "Small", "Big"])
    res = dataclasses.replace(res, columns=t, classes={"Big": (255, 0, 0)})
    seen = []
    out = res.to_geoparquet(tmp_path / "n.parquet", progress=seen.append, row_group=2)
    table = pq.read_table(out)
    assert set(NUCLEI_COLUMNS) <= set(table.column_names)
    assert table.column_names[-2 if cells else -1] == "geometry"
    assert ("cell_geometry" in table.column_names) == cells
    assert table.column("id").to_pylist() == [1, 2, 3]
    assert table.column("tile").to_pylist() == [-1, -1, -1]
    assert table.column("class").to_pylist() == ["Big", "Small", "Big"]
    meta = table.schema.metadata
    geo = json.loads(meta[b"geo"])
    assert geo["primary_column"] == "geometry" and geo["columns"]["geometry"]["encoding"] == "WKB"
    assert json.loads(meta[b"slidescope"])["parameters"] == {"mpp": 0.5}
    assert table.schema.field("area_um2").metadata[b"unit"] == "µm²".encode()
    polys, ids = res.outlines_of("nuclei")
    assert table.column("geometry").to_pylist() == [wkb_polygon(p) for p in polys]
    assert table.column("bbox_row0").to_pylist() == [float(p[:, 0].min()) for p in polys]
    assert pq.ParquetFile(out).num_row_groups == 2
    assert seen[-1].done == seen[-1].total == 3


def test_geoparquet_without_pyarrow_names_the_extra(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    with pytest.raises(ImportError, match=r"napari-slidescope\[batch\]"):
        _result().to_geoparquet(tmp_path / "n.parquet")
    assert list(tmp_path.iterdir()) == []


def test_arrow_formatted_measurements_are_the_same_numbers():
    """to_geojson formats measurement rows with Arrow (json_rows): other text, same values,
    rows with gaps still as json writes them."""
    from napari_slidescope.analysis.geojson import measurements_text
    from napari_slidescope.pipeline.geoparquet import json_rows

    rng = np.random.default_rng(5)
    n = 500
    cols = {
        "id": np.arange(n, dtype=np.int32),
        "tiny": rng.normal(size=n) * 1e-7,
        "huge": rng.random(n) * 1e22,
        "whole": np.round(rng.random(n) * 100),
        "flag": rng.random(n) > 0.5,
        "gaps": np.where(np.arange(n) % 4 == 0, np.nan, rng.random(n)),
        "neg_zero": np.full(n, -0.0),
    }
    plain = measurements_text(cols)
    fast = measurements_text(cols, format_rows=json_rows)
    assert [json.loads(t) for t in fast] == [json.loads(t) for t in plain]
    assert fast[0] == plain[0]  # row 0 has a gap: json's own text
    assert fast[1] != plain[1]  # e.g. "id": 1 rather than 1.0
    whole = {k: v for k, v in cols.items() if k != "gaps"}
    assert [json.loads(t) for t in measurements_text(whole, format_rows=json_rows)] == [
        json.loads(t) for t in measurements_text(whole)
    ]
