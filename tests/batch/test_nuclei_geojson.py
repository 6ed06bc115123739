"""``nuclei.geojson.gz`` features formatted in bulk: the per-feature writer's text exactly."""

from __future__ import annotations

import json
import uuid

import numpy as np
import pytest

from napari_slidescope.analysis.geojson import polygon_feature
from napari_slidescope.batch.outputs.nuclei import features_text


def _closed_xy(n: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Closed (x, y) rings as WKB holds them, some at half pixels, some wound clockwise."""
    out = []
    for i in range(n):
        k = int(rng.integers(3, 25))
        angle = np.linspace(0, 2 * np.pi, k, endpoint=False) * (1 if i % 2 else -1)
        ring = np.c_[np.cos(angle), np.sin(angle)] * rng.uniform(2, 9) + rng.uniform(0, 9e4, 2)
        if i % 3 == 0:
            ring = np.round(ring * 2) / 2
        out.append(np.vstack([ring, ring[:1]]))
    return out


def _per_feature(ids, rings, measures, ns, cell_rings, names, colors, extra, first):
    """What write_nuclei / NucleiStream wrote before: a dict and json.dumps per nucleus."""
    text = []
    for k in range(len(ids)):
        meas = {c: float(v[k]) for c, v in measures.items()}
        meas["id"] = float(ids[k])
        meas.update({c: float(v[k]) for c, v in extra.items()})
        name = "Nucleus" if names is None else names[k]
        nucleus = rings[k][:-1, ::-1]
        feature = polygon_feature(
            nucleus if cell_rings is None else cell_rings[k][:-1, ::-1],
            name=name,
            color=colors[name],
            object_type="detection" if cell_rings is None else "cell",
            nucleus=None if cell_rings is None else nucleus,
            measurements=meas,
            feature_id=str(uuid.uuid5(ns, str(int(ids[k])))),
        )
        text.append(("," if (k or not first) else "") + "\n" + json.dumps(feature))
    return "".join(text)


@pytest.mark.parametrize("cells", [False, True])
@pytest.mark.parametrize("first", [True, False])
def test_bulk_features_are_the_per_feature_text(cells, first):
    rng = np.random.default_rng(7)
    n = 120
    ids = np.arange(1, n + 1, dtype=np.int64) + 5000
    rings = _closed_xy(n, rng)
    cell_rings = [(r - r.mean(0)) * 1.5 + r.mean(0) for r in rings] if cells else None
    measures = {
        "area_um2": rng.random(n).astype(np.float32) * 40,
        "solidity": np.where(np.arange(n) % 11 == 0, np.nan, rng.random(n)),
        "perimeter_um": rng.random(n) * 1e-7,
        "count": rng.integers(0, 9, n),
        "flag": rng.random(n) > 0.5,
    }
    names = [["Tumor", "Stroma", 'odd "name"'][i % 3] for i in range(n)]
    colors = {"Tumor": (200, 0, 0), "Stroma": (0, 150, 0), 'odd "name"': (1, 2, 3)}
    extra = {"region_id": rng.integers(-1, 4, n)}
    ns = uuid.uuid5(uuid.NAMESPACE_URL, "slide-x")
    got = features_text(
        ids, rings, measures, ns=ns, cell_rings=cell_rings, names=names, colors=colors,
        extra=extra, first=first,
    )  # fmt: skip
    want = _per_feature(ids, rings, measures, ns, cell_rings, names, colors, extra, first)
    assert got == want
    doc = json.loads('{"features": [' + (got if first else got[1:]) + "]}")
    assert len(doc["features"]) == n


def test_default_names_and_an_empty_tile():
    rng = np.random.default_rng(8)
    rings = _closed_xy(5, rng)
    ids = np.arange(1, 6)
    measures = {"area_um2": rng.random(5)}
    ns = uuid.uuid5(uuid.NAMESPACE_URL, "s")
    colors = {"Nucleus": (0, 0, 255)}
    got = features_text(ids, rings, measures, ns=ns, colors=colors, first=True)
    assert got == _per_feature(ids, rings, measures, ns, None, None, colors, {}, True)
    empty = features_text(
        ids[:0], [], {"area_um2": measures["area_um2"][:0]}, ns=ns, colors=colors, first=True
    )
    assert empty == ""
