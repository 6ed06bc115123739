import numpy as np
import pytest

from napari_slidescope.pipeline import models
from napari_slidescope.pipeline.models import (
    SegmenterUnavailableError,
    available_segmenters,
    get_segmenter,
    missing_reason,
    register_segmenter,
)


@pytest.fixture
def no_model_caches(monkeypatch, tmp_path):
    monkeypatch.setenv("KERAS_HOME", str(tmp_path / "keras"))
    monkeypatch.setenv("CELLPOSE_LOCAL_MODELS_PATH", str(tmp_path / "cellpose"))
    monkeypatch.setenv("SLIDESCOPE_MODELS", str(tmp_path / "models"))


@pytest.mark.parametrize(
    "name,package",
    [
        ("stardist", "stardist"),
        ("cellpose", "cellpose"),
        ("instanseg", "torch"),
    ],
)
def test_missing_adapters_are_hidden_with_a_clear_message(no_model_caches, name, package):
    assert name not in available_segmenters()
    reason = missing_reason(name)
    assert reason is not None and (package in reason or "model file" in reason)
    with pytest.raises(SegmenterUnavailableError, match=f"segmenter '{name}' is not available"):
        get_segmenter(name)


def test_package_present_but_model_file_missing(monkeypatch, no_model_caches, tmp_path):
    real = models.importlib.util.find_spec
    monkeypatch.setattr(
        models.importlib.util,
        "find_spec",
        lambda n, *a: object() if n in ("stardist", "tensorflow") else real(n, *a),
    )
    reason = missing_reason("stardist")
    assert "model file" in reason and str(tmp_path / "keras") in reason
    assert "2D_versatile_he" in reason
    # a model folder in the Keras cache makes it available (loading itself is not tried here)
    folder = tmp_path / "keras" / "models" / "StarDist2D" / "2D_versatile_he" / "2D_versatile_he"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    assert missing_reason("stardist") is None and "stardist" in available_segmenters()


def test_unknown_name_and_registration():
    with pytest.raises(KeyError, match="unknown name 'nope'"):
        get_segmenter("nope")

    class Fake:
        target_mpp, min_overlap_um = 1.0, 0.0

        def predict(self, tiles, *, mpp):
            return tiles[..., :1].astype(np.float32)

        def postprocess(self, raw, *, mpp):
            return (raw[..., 0] > 0).astype(np.int32)

    register_segmenter("fake-test", Fake)
    register_segmenter("fake-missing", Fake, check=lambda: "needs a unicorn")
    try:
        assert "fake-test" in available_segmenters()
        assert isinstance(get_segmenter("fake-test"), Fake)
        assert "fake-missing" not in available_segmenters()
        with pytest.raises(SegmenterUnavailableError, match="needs a unicorn"):
            get_segmenter("fake-missing")
    finally:
        models._REGISTRY.pop("fake-test")
        models._REGISTRY.pop("fake-missing")


def test_builtin_listed_when_its_module_exists():
    present = models.importlib.util.find_spec("napari_slidescope.analysis.nuclei") is not None
    assert ("builtin" in available_segmenters()) == present
