"""Polygons in level-0 pixels, GeoJSON for QuPath, and tile gating."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest

from napari_slidescope.analysis.geojson import read_geojson, read_geojson_rings, write_geojson
from napari_slidescope.analysis.geometry import (
    labels_to_polygons,
    mask_to_polygons,
    polygons_to_mask,
    tiles_with_tissue,
    tissue_fraction,
)

ORIGIN = (1000.0, 520.0)
DS = (4.0, 2.0)


def blobby_mask(seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    m = np.zeros((60, 80), bool)
    m[5:40, 10:70] = True
    m[15:25, 20:30] = False  # hole
    m[30, 40:42] = False  # tiny hole
    m[45:55, 5:12] = True  # second piece
    m[50, 60] = True  # 1-px piece
    m |= rng.random(m.shape) > 0.97  # speckle: many pieces, diagonal contacts
    return m


def test_square_coordinates_are_level0_pixel_edges():
    m = np.zeros((8, 8), bool)
    m[2:4, 3:6] = True
    ext, holes = mask_to_polygons(m, downsample=4, origin=(100, 200))
    assert len(ext) == 1
    assert holes == [[]]
    ring = ext[0]
    assert ring.shape[1] == 2
    assert not np.array_equal(ring[0], ring[-1])
    # rows: pixels 2..3 -> level-0 [108, 116); cols: 3..5 -> [212, 224)
    # (corners are cut diagonally by half a mask pixel, as find_contours does)
    assert (ring[:, 0].min(), ring[:, 0].max()) == (108, 116)
    assert (ring[:, 1].min(), ring[:, 1].max()) == (212, 224)
    assert len(ring) == 8  # collinear vertices dropped
    back = polygons_to_mask(ext, holes, shape=m.shape, downsample=4, origin=(100, 200))
    np.testing.assert_array_equal(back, m)


@pytest.mark.parametrize("seed", [0, 1])
def test_mask_polygon_round_trip_with_origin_and_holes(seed):
    m = blobby_mask(seed)
    ext, holes = mask_to_polygons(m, downsample=DS, origin=ORIGIN)
    assert len(ext) == len(holes) > 2
    assert len(holes[0]) >= 2  # the biggest piece has its holes
    sizes = [
        abs(np.sum(p[:, 1] * np.roll(p[:, 0], -1) - p[:, 0] * np.roll(p[:, 1], -1))) for p in ext
    ]
    assert sizes[0] == max(sizes)  # largest first
    allv = np.vstack(ext)
    assert allv[:, 0].min() >= ORIGIN[0]
    assert allv[:, 1].min() >= ORIGIN[1]
    back = polygons_to_mask(ext, holes, shape=m.shape, downsample=DS, origin=ORIGIN)
    np.testing.assert_array_equal(back, m)


def test_outer_contours_only():
    m = blobby_mask(0)
    ext, holes = mask_to_polygons(m, downsample=DS, origin=ORIGIN, holes=False)
    assert all(h == [] for h in holes)
    back = polygons_to_mask(ext, None, shape=m.shape, downsample=DS, origin=ORIGIN)
    from scipy import ndimage as ndi

    np.testing.assert_array_equal(back, ndi.binary_fill_holes(m))


def test_empty_mask_has_no_polygons():
    assert mask_to_polygons(np.zeros((5, 5), bool)) == ([], [])
    with pytest.raises(ValueError, match="2-D"):
        mask_to_polygons(np.zeros((2, 2, 2), bool))


def test_labels_to_polygons_one_outline_per_label():
    rng = np.random.default_rng(0)
    labels = np.zeros((400, 400), np.int32)
    yy, xx = np.mgrid[:400, :400]
    k = 0
    for cy in range(8, 400, 16):
        for cx in range(8, 400, 16):
            k += 1
            r = rng.uniform(3, 6.5)
            labels[((yy - cy) ** 2 + (xx - cx) ** 2) < r * r] = k
    labels[labels == 5] = 0  # a missing id
    polys, ids = labels_to_polygons(labels, downsample=2.0, origin=(50, 70))
    assert len(polys) == len(ids) == k - 1
    assert 5 not in ids
    assert np.all(np.diff(ids) > 0)
    for poly, lab in list(zip(polys, ids, strict=True))[::37]:
        back = polygons_to_mask([poly], shape=labels.shape, downsample=2.0, origin=(50, 70))
        np.testing.assert_array_equal(back, labels == lab)


def test_labels_split_label_gets_largest_piece_and_bad_input():
    labels = np.zeros((20, 20), np.int64)
    labels[2:10, 2:10] = 3
    labels[15:17, 15:17] = 3
    polys, ids = labels_to_polygons(labels)
    assert ids.tolist() == [3]
    assert polys[0][:, 0].max() == 10
    with pytest.raises(ValueError, match="integer"):
        labels_to_polygons(np.zeros((4, 4), float))
    polys, ids = labels_to_polygons(np.zeros((4, 4), np.int32))
    assert polys == []
    assert ids.size == 0


def test_geojson_schema_and_round_trip(tmp_path):
    m = blobby_mask(0)
    ext, holes = mask_to_polygons(m, downsample=DS, origin=ORIGIN)
    path = tmp_path / "tissue.geojson"
    write_geojson(path, ext, holes, name="Tissue", color=(0, 200, 0))
    doc = json.loads(path.read_text())
    assert doc["type"] == "FeatureCollection"
    feat = doc["features"][0]
    assert feat["type"] == "Feature"
    assert feat["geometry"]["type"] == "Polygon"
    props = feat["properties"]
    assert props["objectType"] == "annotation"
    assert props["classification"] == {"name": "Tissue", "color": [0, 200, 0]}
    rings = feat["geometry"]["coordinates"]
    assert len(rings) == 1 + len(holes[0])
    outer = np.asarray(rings[0])
    assert np.array_equal(outer[0], outer[-1])  # closed
    # (x, y) = (col, row)
    assert outer[:, 0].min() == pytest.approx(ext[0][:, 1].min())
    assert outer[:, 1].min() == pytest.approx(ext[0][:, 0].min())

    # RFC 7946 winding in (x, y): exterior counter-clockwise, holes clockwise
    def area(r):
        r = np.asarray(r)
        return np.sum(r[:-1, 0] * r[1:, 1] - r[1:, 0] * r[:-1, 1])

    assert area(rings[0]) > 0
    assert all(area(h) < 0 for h in rings[1:])
    ext2, holes2 = read_geojson_rings(path)
    assert len(ext2) == len(ext)
    back = polygons_to_mask(ext2, holes2, shape=m.shape, downsample=DS, origin=ORIGIN)
    np.testing.assert_array_equal(back, m)
    assert len(read_geojson(path)) == len(ext)


def test_geojson_detections_and_measurements(tmp_path):
    polys = [np.array([[0, 0], [0, 4], [4, 4], [4, 0]], float)]
    path = tmp_path / "nuclei.geojson"
    write_geojson(
        path, polys, name="Nucleus", object_type="detection", measurements=[{"area_um2": 4.0}]
    )
    props = json.loads(path.read_text())["features"][0]["properties"]
    assert props["objectType"] == "detection"
    assert props["measurements"] == {"area_um2": 4.0}


def test_read_qupath_style_feature_list_and_multipolygon(tmp_path):
    sq = [[0, 0], [10, 0], [10, 5], [0, 5], [0, 0]]
    features = [
        {"type": "Feature", "geometry": {"type": "MultiPolygon", "coordinates": [[sq], [sq]]}},
        {"type": "Feature", "geometry": {"type": "Point", "coordinates": [1, 2]}},
    ]
    path = tmp_path / "q.geojson"
    path.write_text(json.dumps(features))
    rings = read_geojson(path)
    assert len(rings) == 2
    np.testing.assert_array_equal(rings[0][:, 0], [0, 0, 5, 5])  # rows = y
    bad = tmp_path / "bad.geojson"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="bad.geojson"):
        read_geojson(bad)


def test_tiles_with_tissue_matches_brute_force():
    m = blobby_mask(0)
    # a 4x-coarser tile grid (any level), in level-0 px, offset from the mask origin
    boxes = []
    for y in np.arange(ORIGIN[0] - 40, ORIGIN[0] + 60 * DS[0] + 40, 28):
        for x in np.arange(ORIGIN[1] - 30, ORIGIN[1] + 80 * DS[1] + 30, 17):
            boxes.append((y, x, y + 28, x + 17))
    boxes = np.asarray(boxes)
    got = tiles_with_tissue(m, boxes, downsample=DS, origin=ORIGIN)
    rr, cc = np.nonzero(m)
    py0, px0 = ORIGIN[0] + rr * DS[0], ORIGIN[1] + cc * DS[1]
    want = np.array(
        [
            np.any((py0 < y1) & (py0 + DS[0] > y0) & (px0 < x1) & (px0 + DS[1] > x0))
            for y0, x0, y1, x1 in boxes
        ]
    )
    np.testing.assert_array_equal(got, want)
    assert want.any()
    assert not want.all()
    frac = tissue_fraction(m, boxes, downsample=DS, origin=ORIGIN)
    assert np.all((frac >= 0) & (frac <= 1))
    assert np.array_equal(frac > 0, want)
    strict = tiles_with_tissue(m, boxes, downsample=DS, origin=ORIGIN, min_fraction=0.5)
    np.testing.assert_array_equal(strict, want & (frac >= 0.5))


def test_tiles_with_tissue_takes_a_result_object():
    m = np.zeros((10, 10), bool)
    m[2, 3] = True
    res = SimpleNamespace(mask=m, downsample=(8.0, 8.0), origin=(80.0, 0.0))
    # pixel (2, 3) covers level-0 rows [96, 104), cols [24, 32)
    boxes = [(96, 24, 104, 32), (0, 0, 96, 24), (103, 31, 200, 200), (10_000, 0, 10_100, 100)]
    assert tiles_with_tissue(res, boxes).tolist() == [True, False, True, False]
    with pytest.raises(ValueError, match="min_fraction"):
        tiles_with_tissue(res, boxes, min_fraction=2)
    with pytest.raises(ValueError, match="boxes"):
        tiles_with_tissue(res, [(10, 10, 0, 0)])


def test_geojson_rings_read_gzip_like_plain(tmp_path):
    """One GeoJSON reader: a .geojson.gz (as QuPath writes it) gives the same rings."""
    import gzip

    square = np.array([[10, 20], [10, 60], [50, 60], [50, 20]], float)  # (row, col)
    hole = np.array([[20, 30], [20, 40], [30, 40], [30, 30]], float)
    plain = tmp_path / "a.geojson"
    write_geojson(plain, [square], interiors=[[hole]])
    packed = tmp_path / "a.geojson.gz"
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    ext, holes = read_geojson_rings(packed)
    assert len(ext) == 1
    assert len(holes) == 1
    assert len(holes[0]) == 1
    # the same vertex set, (row, col), whatever the winding write_geojson chose
    assert sorted(map(tuple, ext[0])) == sorted(map(tuple, square))
    assert sorted(map(tuple, holes[0][0])) == sorted(map(tuple, hole))
    assert [e.tolist() for e in read_geojson(packed)] == [e.tolist() for e in ext]


def _find_contours_rings(mask):
    """The former mask_to_polygons: skimage's find_contours on each piece's crop."""
    from scipy import ndimage as ndi
    from skimage import measure

    labels, _ = ndi.label(mask)
    sizes = np.bincount(labels.ravel())[1:]
    pieces = []
    for lab, sl in enumerate(ndi.find_objects(labels), start=1):
        crop = np.pad(labels[sl] == lab, 1).astype(np.uint8)
        contours = measure.find_contours(crop, 0.5)
        off = np.array([sl[0].start, sl[1].start]) - 1
        areas = [abs(_shoelace(c)) for c in contours]
        k = int(np.argmax(areas))
        rings = [c[:-1] + off for c in contours]
        pieces.append((-sizes[lab - 1], rings[k], [r for i, r in enumerate(rings) if i != k]))
    pieces.sort(key=lambda p: p[0])
    return [p[1] for p in pieces], [p[2] for p in pieces]


def _shoelace(ring):
    r, c = ring[:, 0], ring[:, 1]
    return 0.5 * float(np.dot(c, np.roll(r, -1)) - np.dot(r, np.roll(c, -1)))


def _canonical(ring, drop_collinear=True):
    """A ring as a tuple of vertices from its smallest, in its one direction."""
    if drop_collinear:
        prev, nxt = np.roll(ring, 1, axis=0), np.roll(ring, -1, axis=0)
        a, b = ring - prev, nxt - ring
        keep = np.abs(a[:, 0] * b[:, 1] - a[:, 1] * b[:, 0]) > 1e-9
        ring = ring[keep] if keep.sum() >= 3 else ring
    ring = np.round(ring, 6)
    k = np.lexsort((ring[:, 1], ring[:, 0]))[0]
    return tuple(map(tuple, np.roll(ring, -k, axis=0)))


@pytest.mark.parametrize("seed", range(6))
def test_mask_to_polygons_draws_the_rings_find_contours_draws(seed):
    from scipy import ndimage as ndi

    rng = np.random.default_rng(seed)
    if seed % 2:
        mask = rng.random((40, 50)) < 0.5  # saddles, pixels touching at corners
    else:
        mask = ndi.gaussian_filter(rng.random((70, 90)), 2) > 0.5  # pieces with holes
    # origin -0.5: level-0 coordinates are the mask's pixel-centre units, as find_contours'
    exts, holes = mask_to_polygons(mask, downsample=1.0, origin=(-0.5, -0.5))
    ref_exts, ref_holes = _find_contours_rings(mask)
    assert len(exts) == len(ref_exts)
    for e, h, re_, rh in zip(exts, holes, ref_exts, ref_holes, strict=True):
        assert _canonical(e) == _canonical(re_)
        assert sorted(map(_canonical, h)) == sorted(map(_canonical, rh))
        # the orientation find_contours gives: pieces one way, holes the other
        assert np.sign(_shoelace(e)) == np.sign(_shoelace(re_))
        assert all(np.sign(_shoelace(a)) == -np.sign(_shoelace(e)) for a in h)


def _outline_per_object(labels, downsample, origin):
    """The outlines as find_contours traces them label by label (the reference)."""
    from scipy import ndimage as ndi
    from skimage import measure

    from napari_slidescope.analysis.geometry import _drop_collinear, _signed_area, _to_level0

    out = {}
    for i, sl in enumerate(ndi.find_objects(labels), 1):
        if sl is None:
            continue
        crop = np.pad(labels[sl] == i, 1).astype(np.uint8)
        ring = max(measure.find_contours(crop, 0.5), key=lambda c: abs(_signed_area(c)))
        out[i] = _drop_collinear(_to_level0(ring, (sl[0].start, sl[1].start), downsample, origin))
    return out


@pytest.mark.parametrize("seed", range(8))
def test_labels_to_polygons_traces_as_find_contours(seed):
    """All labels traced at once give find_contours' rings, vertex for vertex and in the
    same order (from another first vertex): touching labels, pieces, holes, one-pixel
    objects, objects on the edges."""
    from scipy import ndimage as ndi

    rng = np.random.default_rng(seed)
    shape = tuple(int(v) for v in rng.integers(1, 48, 2))
    if seed % 2:
        labels = rng.integers(0, 5, shape).astype(np.int32)
    else:
        labels = ndi.label(ndi.gaussian_filter(rng.random(shape), 1.5) > 0.5)[0]
        labels[rng.random(shape) < 0.05] = 0
    ds, org = (2.0, 3.0), (10.0, -5.0)
    polys, ids = labels_to_polygons(labels, downsample=ds, origin=org)
    want = _outline_per_object(labels, ds, org)
    assert ids.tolist() == sorted(want)
    for ring, i in zip(polys, ids, strict=True):
        np.testing.assert_array_equal(_from_lowest(ring), _from_lowest(want[int(i)]))


def _from_lowest(ring):
    """The ring rolled to start at its lowest (row, col) vertex."""
    return np.roll(ring, -int(np.lexsort((ring[:, 1], ring[:, 0]))[0]), axis=0)
