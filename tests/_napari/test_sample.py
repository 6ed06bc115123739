"""The synthetic sample slide: deterministic, pyramidal, with exact ground truth."""

import numpy as np

from napari_slidescope import open_slide
from napari_slidescope.sample_data import TRUTH_DOWNSAMPLE, make_truth, write_sample_slide


def test_sample_is_deterministic(tmp_path):
    a = write_sample_slide(tmp_path / "a.svs", shape=(512, 768), seed=3, tile=128)
    b = write_sample_slide(tmp_path / "b.svs", shape=(512, 768), seed=3, tile=128)
    np.testing.assert_array_equal(a.tissue_mask, b.tissue_mask)
    with open_slide(tmp_path / "a.svs") as sa, open_slide(tmp_path / "b.svs") as sb:
        np.testing.assert_array_equal(np.asarray(sa.levels[0]), np.asarray(sb.levels[0]))


def test_sample_truth_matches_pixels(sample_slide):
    path, truth = sample_slide
    assert truth.tissue_mask.shape == (2048 // TRUTH_DOWNSAMPLE, 3072 // TRUTH_DOWNSAMPLE)
    with open_slide(path) as slide:
        assert slide.format == "svs"
        assert slide.mpp == (0.5, 0.5)
        lvl = np.asarray(slide.levels[1]).astype(float)  # 4x downsample
    # glass is bright, tissue is darker: compare per truth cell
    cells = lvl.reshape(128, 4, 192, 4, 3).mean((1, 3, 4))
    assert cells[truth.tissue_mask].mean() < cells[~truth.tissue_mask].mean() - 30


def test_nuclei_lie_in_tissue():
    truth = make_truth((1024, 1024), mpp=0.5, seed=0)
    assert len(truth.nuclei) > 0
    ys = (truth.nuclei[:, 0] // TRUTH_DOWNSAMPLE).astype(int)
    xs = (truth.nuclei[:, 1] // TRUTH_DOWNSAMPLE).astype(int)
    assert truth.tissue_mask[ys, xs].all()


def test_ki67_and_multiplex_samples_open_with_their_stains_and_markers(tmp_path, monkeypatch):
    """The npe2 sample entries write the IHC and multiplex samples once and open them."""
    from napari_slidescope._napari import sample

    monkeypatch.setenv("SLIDESCOPE_CACHE", str(tmp_path))
    ((_, ki67, kind),) = sample.make_ki67_sample()
    assert kind == "image" and ki67["rgb"] and ki67["scale"] == (0.5, 0.5)
    ((_, multiplex, _),) = sample.make_multiplex_sample()
    assert multiplex["channel_axis"] == 0
    assert [name.split(" ")[-1] for name in multiplex["name"]] == [
        "[DAPI]",
        "[CD3]",
        "[CD8]",
        "[PanCK]",
        "[Ki67]",
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "slidescope-ki67-v1.svs",
        "slidescope-multiplex-v1.ome.tif",
    ]
