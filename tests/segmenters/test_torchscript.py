"""The torch-free TorchScript reader: tensors as torch has them, and nothing in a file runs."""

import pickle
import warnings
import zipfile

import numpy as np
import pytest

from napari_slidescope.segmenters import instanseg
from napari_slidescope.segmenters._torchscript import (
    TorchScriptArchive,
    TorchScriptError,
    state_dict,
)


def _archive(path, data_pkl, storages=(), constants=None):
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("m/data.pkl", data_pkl)
        zf.writestr("m/byteorder", b"little")
        for key, raw in storages:
            zf.writestr(f"m/data/{key}", raw)
        if constants is not None:
            zf.writestr("m/constants.pkl", constants)
    return path


def _global(module, name):
    return f"c{module}\n{name}\n".encode()


def _tensor_pickle(key, numel, offset, size, stride):
    """Protocol-2 opcodes of ``_rebuild_tensor_v2(storage, offset, size, stride, ...)``."""
    tup = lambda items: b"(" + b"".join(items) + b"t"  # noqa: E731
    ints = lambda xs: tup([b"K" + bytes([x]) for x in xs])  # noqa: E731
    storage_pid = (
        tup(
            [
                b"X\x07\x00\x00\x00storage",
                _global("torch", "FloatStorage"),
                b"X" + len(key).to_bytes(4, "little") + key.encode(),
                b"X\x03\x00\x00\x00cpu",
                b"K" + bytes([numel]),
            ]
        )
        + b"Q"
    )
    args = tup(
        [
            storage_pid,
            b"K" + bytes([offset]),
            ints(size),
            ints(stride),
            b"\x89",
            _global("collections", "OrderedDict") + b")R",
        ]
    )
    return _global("torch._utils", "_rebuild_tensor_v2") + args + b"R"


def _module_pickle(attrs):
    """A ``__torch__`` module object whose state is `attrs` (name -> pickled value bytes)."""
    body = b"".join(b"X" + len(k).to_bytes(4, "little") + k.encode() + v for k, v in attrs.items())
    return b"\x80\x02" + _global("__torch__.m", "Net") + b")\x81}(" + body + b"ub."


def test_tensors_respect_storage_offset_size_and_stride(tmp_path):
    raw = np.arange(12, dtype="<f4").tobytes()
    # a (2, 3) transposed view starting at element 2: rows step 1, columns step 2
    data = _module_pickle(
        {"w": _tensor_pickle("0", 12, 2, (2, 3), (1, 2)), "k": b"K\x05", "flag": b"\x88"}
    )
    with TorchScriptArchive(_archive(tmp_path / "a.pt", data, [("0", raw)])) as arc:
        assert arc.module.torch_type == "__torch__.m.Net"
        assert arc.module.k == 5 and arc.module.flag is True
        expected = np.arange(12, dtype=np.float32)[2:][np.array([[0, 2, 4], [1, 3, 5]])]
        np.testing.assert_array_equal(arc.module.w, expected)
        assert list(state_dict(arc.module)) == ["w"]


@pytest.mark.parametrize(
    "payload",
    [
        b"\x80\x02" + _global("os", "system") + b"X\x04\x00\x00\x00true\x85R.",
        b"\x80\x02" + _global("builtins", "eval") + b"X\x01\x00\x00\x001\x85R.",
        b"\x80\x02" + _global("torch", "load") + b")R.",
    ],
)
def test_a_file_that_would_run_code_is_refused_naming_it(tmp_path, payload):
    path = _archive(tmp_path / "evil.pt", payload)
    with pytest.raises(TorchScriptError, match=r"evil\.pt.*not allowed"):
        TorchScriptArchive(path)


def test_tensors_outside_their_storage_and_non_archives_are_refused(tmp_path):
    data = _module_pickle({"w": _tensor_pickle("0", 4, 2, (2, 3), (1, 2))})
    raw = np.arange(4, dtype="<f4").tobytes()
    with pytest.raises(TorchScriptError, match=r"big\.pt.*outside its storage"):
        TorchScriptArchive(_archive(tmp_path / "big.pt", data, [("0", raw)]))
    (tmp_path / "plain.pt").write_bytes(pickle.dumps({"a": 1}))
    with pytest.raises(TorchScriptError, match=r"plain\.pt: not a TorchScript file"):
        TorchScriptArchive(tmp_path / "plain.pt")


@pytest.mark.parametrize("name", list(instanseg.MODELS))
def test_the_instanseg_models_read_as_torch_reads_them(name):
    weights = instanseg.model_folder(name) / "instanseg.pt"
    if not weights.is_file():
        pytest.skip(f"InstanSeg {name} not installed in {weights.parent}")
    with TorchScriptArchive(weights) as arc:
        net = arc.module
        tensors = state_dict(net)
        assert net.default_mask_threshold == 0.53
        assert net.default_window_size == 32
        assert net.cells_and_nuclei is (name != "brightfield_nuclei")
    assert all(v.dtype == np.float32 for k, v in tensors.items() if k.endswith("weight"))
    try:
        import torch
    except ImportError:
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        theirs = torch.jit.load(str(weights), map_location="cpu").state_dict()
    assert set(theirs) <= set(tensors)
    for key, value in theirs.items():
        np.testing.assert_array_equal(tensors[key], value.numpy(), err_msg=key)
