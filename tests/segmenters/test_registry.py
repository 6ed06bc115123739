import importlib.util

import numpy as np
import pytest

from napari_slidescope.segmenters import (
    SegmenterUnavailableError,
    available_segmenters,
    get_segmenter,
    missing_reason,
    register_segmenter,
    registry,
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
    assert reason is not None
    assert package in reason or "model file" in reason
    with pytest.raises(SegmenterUnavailableError, match=f"segmenter '{name}' is not available"):
        get_segmenter(name)


def test_package_present_but_model_file_missing(monkeypatch, no_model_caches, tmp_path):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda n, *a: object() if n in ("stardist", "tensorflow") else real(n, *a),
    )
    reason = missing_reason("stardist")
    assert "model file" in reason
    assert str(tmp_path / "keras") in reason
    assert "2D_versatile_he" in reason
    # a model folder in the Keras cache makes it available (loading itself is not tried here)
    folder = tmp_path / "keras" / "models" / "StarDist2D" / "2D_versatile_he" / "2D_versatile_he"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    assert missing_reason("stardist") is None
    assert "stardist" in available_segmenters()


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
        seg = get_segmenter("fake-test")  # given the protocol's defaults
        assert seg.name == "Fake"
        assert seg.target_mpp == 1.0
        assert seg.input == "brightfield"
        tiles = np.ones((1, 4, 4, 3), np.uint8)
        assert seg.postprocess(seg.predict(tiles, mpp=1.0)[0], mpp=1.0).max() == 1
        assert "fake-missing" not in available_segmenters()
        with pytest.raises(SegmenterUnavailableError, match="needs a unicorn"):
            get_segmenter("fake-missing")
    finally:
        registry._REGISTRY.pop("fake-test")
        registry._REGISTRY.pop("fake-missing")


def test_builtins_are_always_available_and_declare_their_input():
    from napari_slidescope.segmenters import segmenter_input

    assert {"builtin", "builtin-fluorescence"} <= set(available_segmenters())
    assert segmenter_input("builtin") == "brightfield"
    assert segmenter_input("builtin-fluorescence") == "fluorescence"
    assert segmenter_input("instanseg-fluorescence") == "fluorescence"
    assert "builtin-fluorescence" in available_segmenters("fluorescence")
    assert "builtin" not in available_segmenters("fluorescence")


def test_every_entry_creates_a_segmenter_of_its_declared_input_and_resolution(no_model_caches):
    from napari_slidescope.segmenters import Segmenter, segmenter_input, segmenter_target_mpp

    for name in ("builtin", "builtin-fluorescence"):
        seg = get_segmenter(name)
        assert isinstance(seg, Segmenter)
        assert seg.input == segmenter_input(name)
        assert seg.name == name
        assert seg.target_mpp == segmenter_target_mpp(name)


def test_adapter_modules_do_not_import_each_other():
    """Adding a segmenter is one module plus one registry line: adapters stand alone."""
    import ast
    from pathlib import Path

    import napari_slidescope.segmenters as pkg

    adapters = {"builtin", "builtin_fluorescence", "instanseg", "stardist", "cellpose"}
    for name in adapters:
        tree = ast.parse((Path(pkg.__file__).parent / f"{name}.py").read_text())
        imported = {
            n.module.rsplit(".", 1)[-1]
            for n in ast.walk(tree)
            if isinstance(n, ast.ImportFrom) and n.module and "segmenters" in n.module
        }
        assert not (imported & adapters), (name, imported)


def test_model_segmenter_base_checks_packages_then_the_model_files(tmp_path):
    from napari_slidescope.segmenters.base import ModelSegmenter

    class Local(ModelSegmenter):
        name = "local"
        packages = ("numpy",)
        install_hint = "copy {model}.bin there"

        @classmethod
        def model_files(cls, model):
            return tmp_path / "models", f"{model}.bin"

        def __init__(self, model="m", *, target_mpp=0.5, min_overlap_um=8.0):
            super().__init__(model, target_mpp=target_mpp, min_overlap_um=min_overlap_um)

    expected = f"model file {tmp_path / 'models' / 'm.bin'} not found; copy m.bin there"
    assert Local.missing_reason("m") == expected  # the folder does not exist
    (tmp_path / "models").mkdir()
    assert Local.missing_reason("m") == expected  # the folder holds no such file
    with pytest.raises(SegmenterUnavailableError, match="segmenter 'local' is not available"):
        Local()
    (tmp_path / "models" / "m.bin").write_bytes(b"")
    seg = Local(min_overlap_um=3.0)
    assert Local.missing_reason("m") is None
    assert Local.missing_reason("other") is not None
    assert seg.model_file == tmp_path / "models" / "m.bin"
    assert seg.min_overlap_um == 3.0

    class NeedsMore(Local):
        packages = ("numpy", "no_such_package_here")

    assert "no_such_package_here not installed" in NeedsMore.missing_reason("m")
    with pytest.raises(SegmenterUnavailableError, match="no_such_package_here"):
        NeedsMore()
