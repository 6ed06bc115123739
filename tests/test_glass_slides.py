"""The glass-slide check: annotated crops laid out on glass, written as SVS, scored per area."""

import numpy as np
import pytest
from scipy import ndimage as ndi

from napari_slidescope import segment_nuclei
from napari_slidescope.analysis.metrics import instance_scores
from napari_slidescope.glass_slides import downsample, lay_on_glass, score_areas, write_svs
from napari_slidescope.slide import open_slide

MPP = 0.25


def _he_image(seed, shape=(384, 320)):
    """Pink tissue with dark purple nuclei (discs of 3-4 µm radius) and their labels."""
    rng = np.random.default_rng(seed)
    rgb = np.empty((*shape, 3), np.uint8)
    rgb[:] = (225, 160, 200)
    rgb[:] = np.clip(rgb + rng.normal(0, 4, (*shape, 3)), 0, 255).astype(np.uint8)
    truth = np.zeros(shape, np.int32)
    yy, xx = np.mgrid[: shape[0], : shape[1]]
    n = 0
    for y in range(24, shape[0] - 20, 44):
        for x in range(24, shape[1] - 20, 44):
            cy, cx = y + rng.integers(-6, 7), x + rng.integers(-6, 7)
            r = rng.uniform(3.0, 4.0) / MPP
            disc = (yy - cy) ** 2 + (xx - cx) ** 2 <= r * r
            n += 1
            truth[disc] = n
    # soft edges, as a scanner's optics give them (sharp ones lose their chroma to JPEG)
    weight = ndi.gaussian_filter((truth > 0).astype(np.float32), 1.5)[..., None]
    nucleus = np.array((70, 40, 120), np.float32)
    rgb = np.clip(rgb * (1 - weight) + nucleus * weight + 0.5, 0, 255).astype(np.uint8)
    return rgb, truth


@pytest.fixture(scope="module")
def glass(tmp_path_factory):
    images, truths = zip(*(_he_image(s) for s in range(3)), strict=True)
    rgb, truth, layout = lay_on_glass(images, truths, mpp=MPP, gap=200)
    return images, truths, rgb, truth, layout, tmp_path_factory.mktemp("glass")


def test_layout_places_every_image_and_renumbers_its_truth(glass):
    images, truths, rgb, truth, layout, _ = glass
    assert rgb.shape[:2] == truth.shape == layout.shape
    assert len(layout.boxes) == 3
    ids = []
    for im, tr, (y0, x0, y1, x1) in zip(images, truths, layout.boxes, strict=True):
        assert y0 % 16 == 0
        assert x0 % 16 == 0
        assert y0 >= 200
        assert x0 >= 200
        np.testing.assert_array_equal(rgb[y0:y1, x0:x1], im)
        area = truth[y0:y1, x0:x1]
        assert (area > 0).sum() == (tr > 0).sum()
        ids.append(set(np.unique(area)) - {0})
    assert not ids[0] & ids[1]
    assert len(set().union(*ids)) == truth.max()
    glass_px = np.ones(truth.shape, bool)
    for y0, x0, y1, x1 in layout.boxes:
        glass_px[y0:y1, x0:x1] = False
    assert (truth[glass_px] == 0).all()
    assert rgb[glass_px].min() >= 230


def test_bad_input_is_refused_with_the_argument_named():
    rgb, truth = _he_image(0, (64, 64))
    with pytest.raises(ValueError, match="truths\\[0\\]: shape"):
        lay_on_glass([rgb], [truth[:10]], mpp=MPP)
    with pytest.raises(ValueError, match="same non-zero count"):
        lay_on_glass([rgb], [], mpp=MPP)
    with pytest.raises(ValueError, match="images\\[0\\]: expected"):
        lay_on_glass([rgb[..., 0]], [truth], mpp=MPP)


# two flat colours are too few for stain estimation: it falls back to Ruifrok's vectors
@pytest.mark.filterwarnings("ignore:stain estimation fell back")
@pytest.mark.parametrize("factor", [1, 2])
def test_slide_scores_like_its_crops_at_40x_and_20x(glass, factor):
    """The whole-slide path (tissue, preparation, tiles) costs < 0.02 F1 / AJI per area."""
    _, _, rgb, truth, layout, folder = glass
    if factor > 1:
        rgb, truth, layout = downsample(rgb, truth, layout, factor)
    assert layout.mpp == pytest.approx(MPP * factor)
    # lossless tiles: what is compared is the slide path, not the JPEG codec
    path = write_svs(folder / f"glass_{factor}.svs", rgb, mpp=layout.mpp, compression="zlib")
    with open_slide(path) as slide:
        assert slide.shape0 == layout.shape
        assert slide.mpp[0] == pytest.approx(layout.mpp, 1e-3)
    result = segment_nuclei(path, segmenter="builtin", tile_size_um=64, tissue=True)
    slide_scores = score_areas(result, truth, layout)
    for (y0, x0, y1, x1), s in zip(layout.boxes, slide_scores, strict=True):
        crop = segment_nuclei(rgb[y0:y1, x0:x1], mpp=layout.mpp, segmenter="builtin")
        c = instance_scores(truth[y0:y1, x0:x1], crop.labels)
        assert c["f1"] > 0.9
        assert s["n_true"] == c["n_true"] > 20
        assert abs(s["f1"] - c["f1"]) <= 0.02
        assert abs(s["aji"] - c["aji"]) <= 0.02
