"""A tiny ONNX model the tile tests build themselves: global average pooling + a linear layer."""

from __future__ import annotations

import numpy as np
import pytest

RNG = np.random.default_rng(7)
W = RNG.normal(size=(3, 8)).astype(np.float32)
B = RNG.normal(size=(8,)).astype(np.float32)


def onnx_model(path, side: int | str = "H", weight: np.ndarray = W):
    """Write the model to `path` (input ``(N, 3, side, side)``, output ``(N, 8)``)."""
    onnx = pytest.importorskip("onnx", reason="onnx is not installed")
    pytest.importorskip("onnxruntime", reason="onnxruntime (the 'onnx' extra) is not installed")
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph(
        [
            helper.make_node("GlobalAveragePool", ["x"], ["pooled"]),
            helper.make_node("Flatten", ["pooled"], ["flat"]),
            helper.make_node("MatMul", ["flat", "W"], ["mm"]),
            helper.make_node("Add", ["mm", "B"], ["features"]),
        ],
        "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, side, side])],
        [helper.make_tensor_value_info("features", TensorProto.FLOAT, ["N", 8])],
        [numpy_helper.from_array(weight, "W"), numpy_helper.from_array(B, "B")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path
