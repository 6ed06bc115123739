"""InstanSeg on ONNX Runtime without torch: the graph built from the weights, and no torch."""

import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import numpy as np
import pytest

import napari_slidescope
from napari_slidescope.segmenters import instanseg

BF, FL = "brightfield_nuclei", "fluorescence_nuclei_and_cells"


def _weights(name):
    if instanseg.missing_packages("onnxruntime", "onnx"):
        pytest.skip("onnxruntime / onnx not installed (the [instanseg-onnx] extra)")
    path = instanseg.model_folder(name) / "instanseg.pt"
    if not path.is_file():
        pytest.skip(f"InstanSeg {name} not installed in {path.parent}")
    return path


#: Block torch (and anything under it) for the rest of a process: importing it raises.
_NO_TORCH = """
import sys
class _NoTorch:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ImportError(f"torch is blocked in this test ({name})")
        return None
sys.meta_path.insert(0, _NoTorch())
import importlib.util
_real = importlib.util.find_spec
importlib.util.find_spec = lambda n, *a: None if n.split(".")[0] == "torch" else _real(n, *a)
"""


def _run_without_torch(script: str, cwd: Path) -> None:
    """Run `script` in a fresh Python with torch blocked; it must end by printing "ok".

    The child imports this package from wherever this test imported it.
    """
    env = {**os.environ, "PYTHONPATH": str(Path(napari_slidescope.__file__).parents[1])}
    out = subprocess.run(
        [sys.executable, "-c", _NO_TORCH + script],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=cwd,
        env=env,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.startswith("ok")


def test_a_whole_segmentation_imports_no_torch(tmp_path):
    """auto = ONNX Runtime with torch blocked: the card's labels, and torch never imported."""
    weights = _weights(BF)
    script = textwrap.dedent(
        f"""
        import numpy as np
        from napari_slidescope import segment_nuclei
        from napari_slidescope.segmenters import get_segmenter, missing_reason

        folder = {str(weights.parent)!r}
        assert missing_reason("instanseg") is None
        assert missing_reason("instanseg-fluorescence") is None
        seg = get_segmenter("instanseg")
        assert seg.runtime == "onnxruntime", seg.runtime
        x = np.load(folder + "/test-input.npy")
        card = np.load(folder + "/test-output_instance_segmentation.npy")[:, 0]
        got = seg.predict(np.moveaxis(x, 1, -1), mpp=0.5)[..., 0]
        np.testing.assert_array_equal(got, card)
        rgb = np.ascontiguousarray(np.moveaxis(x[0], 0, -1)).astype(np.uint8)
        res = segment_nuclei(rgb, mpp=0.5, segmenter="instanseg", tissue=False, workers=1)
        assert res.parameters["runtime"] == "onnxruntime"
        assert res.count > 300, res.count
        torch = sorted(m for m in sys.modules if m == "torch" or m.startswith("torch."))
        assert not torch, torch
        print("ok", res.count)
        """
    )
    _run_without_torch(script, tmp_path)


def test_the_fluorescence_model_runs_whole_with_torch_blocked(tmp_path):
    """auto = ONNX Runtime for nuclei and cells: the card's labels, its cells in a run, no torch."""
    weights = _weights(FL)
    script = textwrap.dedent(
        f"""
        import numpy as np
        import tifffile
        from napari_slidescope import segment_nuclei
        from napari_slidescope.segmenters import get_segmenter

        folder = {str(weights.parent)!r}
        seg = get_segmenter("instanseg-fluorescence")
        assert seg.runtime == "onnxruntime", seg.runtime
        x = np.moveaxis(np.load(folder + "/test-input.npy"), 1, -1)  # (1, 256, 256, 2)
        card = np.load(folder + "/test-output_instance_segmentation.npy")  # nuclei, cells
        np.testing.assert_array_equal(seg.raw_forward(seg._scale(x)), card)
        path = "fl.ome.tif"
        meta = {{"axes": "CYX", "PhysicalSizeX": 0.5, "PhysicalSizeY": 0.5}}
        meta["Channel"] = {{"Name": ["CK", "DAPI"]}}
        tifffile.imwrite(path, np.moveaxis(x[0], -1, 0).astype(np.uint16), metadata=meta)
        res = segment_nuclei(
            path, segmenter=seg, tissue=False, cell_expansion_um=5, workers=1
        )
        assert res.parameters["runtime"] == "onnxruntime"
        assert res.parameters["cell_outlines"] == "model"
        assert res.count == len(np.unique(card[0, 0])) - 1, res.count
        torch = sorted(m for m in sys.modules if m == "torch" or m.startswith("torch."))
        assert not torch, torch
        print("ok", res.count)
        """
    )
    _run_without_torch(script, tmp_path)


def test_fluorescence_clustering_in_numpy_equals_the_models_torchscript():
    """Same network output, the model's own TorchScript clustering against the numpy one.

    The card tile, and outputs made to reach the reconciliation's other branches: no
    nuclei (unnucleated cells kept), no cells (each nucleus its own cell), the tile mirrored.
    """
    torch = pytest.importorskip("torch", reason="the model's TorchScript clustering needs torch")
    from napari_slidescope.segmenters._instanseg_torch import forward_with_given_network

    weights = _weights(FL)
    seg = instanseg.InstanSegSegmenter(model=FL, runtime="onnxruntime")
    assert seg._cluster is not None and seg._net is None  # numpy clustering, no torch model
    script = forward_with_given_network(weights, "cpu")
    x = seg._scale(np.moveaxis(np.load(weights.parent / "test-input.npy"), 1, -1))
    net = seg._ort.run(None, {"x": instanseg.network_input(x)})[0]
    half = net.shape[1] // 2  # nuclei's channels, then cells'; each ends with its seed map
    no_nuclei, no_cells = net.copy(), net.copy()
    no_nuclei[:, half - 1] = -20.0
    no_cells[:, -1] = -20.0
    cases = {
        "card": net,
        "no nuclei": no_nuclei,
        "no cells": no_cells,
        "mirrored": np.ascontiguousarray(net[..., ::-1]),
    }
    got = {}
    for name, out in cases.items():
        with torch.inference_mode():
            want = script(torch.tensor(x), args={"x_full": torch.from_numpy(out)}).numpy()
        got[name] = seg._cluster(out, *x.shape[-2:])
        assert got[name].shape == (1, 2, *x.shape[-2:])
        np.testing.assert_array_equal(got[name], want, err_msg=name)
    assert got["card"][0, 0].max() > 10 and got["card"][0, 1].max() > 10
    assert got["no nuclei"][0, 0].max() == 0 < got["no nuclei"][0, 1].max()
    np.testing.assert_array_equal(got["no cells"][0, 1], got["no cells"][0, 0])


@pytest.mark.parametrize("name", [BF, FL])
def test_the_built_graph_computes_what_torchs_export_computes(name, tmp_path):
    """ORT on our graph against ORT on torch.onnx.export's, card tile and other channel counts.

    Not bit-equal: torch's exporter folds each batch norm into its convolution with its own
    rounding; the outputs (up to 10-40 in size) agree to 1e-4, as close to torch's own as
    the export's are.
    """
    weights = _weights(name)
    torch = pytest.importorskip("torch", reason="the reference is torch's own export")
    import onnxruntime

    from napari_slidescope.segmenters._instanseg_onnx import build_network, network_input
    from napari_slidescope.segmenters._torchscript import TorchScriptArchive

    with TorchScriptArchive(weights) as archive:
        ours = build_network(archive)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        net = torch.jit.load(str(weights), map_location="cpu").eval()
        channels = 3 if name == BF else 2
        dynamic = {0: "b", 2: "h", 3: "w"} if name == BF else {0: "b", 1: "c", 2: "h", 3: "w"}
        theirs = tmp_path / "torch.onnx"
        torch.onnx.export(
            net.fcn,
            (torch.zeros((1, channels, 64, 64)),),
            str(theirs),
            input_names=["x"],
            output_names=["y"],
            dynamic_axes={"x": dynamic, "y": {0: "b", 2: "h", 3: "w"}},
            opset_version=17,
            dynamo=False,
        )
    options = onnxruntime.SessionOptions()
    a = onnxruntime.InferenceSession(ours, options, providers=["CPUExecutionProvider"])
    b = onnxruntime.InferenceSession(str(theirs), options, providers=["CPUExecutionProvider"])
    x = np.load(weights.parent / "test-input.npy").astype(np.float32)
    lo, hi = np.percentile(x, [0.1, 99.9], axis=(2, 3), keepdims=True)
    x = network_input((x - lo) / (hi - lo + np.float32(1e-6)))
    batches = [x, x[:, :, :128, :96]]
    if name == FL:  # channel-invariant: one, two and three channels
        batches += [x[:, 1:], np.concatenate([x, 0.5 * x[:, 1:]], 1)]
    for batch in batches:
        batch = np.ascontiguousarray(batch)
        ya, yb = a.run(None, {"x": batch})[0], b.run(None, {"x": batch})[0]
        assert ya.shape == yb.shape
        np.testing.assert_allclose(ya, yb, rtol=0, atol=1e-4)
        assert np.abs(yb).max() > 1


def test_a_network_this_builder_does_not_know_is_refused_naming_the_file(tmp_path):
    weights = _weights(BF)
    from napari_slidescope.segmenters._instanseg_onnx import NetworkError, build_network
    from napari_slidescope.segmenters._torchscript import TorchScriptArchive

    with TorchScriptArchive(weights) as archive:
        archive.module.fcn.encoder["1"].conv0["2"].torch_type = "__torch__.x.GELU"
        with pytest.raises(NetworkError, match=r"instanseg\.pt: .*GELU in a Sequential"):
            build_network(archive)


def test_auto_picks_onnxruntime_whether_or_not_torch_is_installed():
    _weights(BF)
    seg = instanseg.InstanSegSegmenter()
    assert seg.runtime == "onnxruntime"
    assert seg._net is None and seg._torch is None  # nothing of torch loaded for it
    assert instanseg.identity(BF)["model_version"] == "0.1.1"
