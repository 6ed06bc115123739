"""InstanSeg's network as an ONNX graph, built from the model file's weights without torch.

The TorchScript file holds the network's weights and, as code text, how its modules are
wired. The wiring of InstanSeg's two networks is written here once, op for op as the
model's code and ``torch.onnx.export`` have it (residual encoder blocks with 2 x 2
max-pooling, decoder blocks with nearest 2x upsampling and skip convolutions, the heads
concatenated; the fluorescence model's channel-invariant adaptor in front: every channel
through shared convolutions, mixed with the maximum over channels after each block). The
modules' own settings (kernel, stride, padding, groups, batch-norm epsilon, pooling) are
read from their code and checked; each batch norm is folded into its convolution with the
same float32 arithmetic as torch's exporter, so ONNX Runtime computes the same floats as it
does on the graph torch exports (tests/segmenters/test_instanseg_onnx.py).

Building the graph takes a fraction of a second: it is built in memory each time a
segmenter is made, never cached on disk.
"""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from napari_slidescope.segmenters._torchscript import ScriptObject, TorchScriptArchive

__all__ = ["NetworkError", "build_network", "network_input", "network_session"]

#: The opset of the graph (the one today's torch export used).
OPSET = 17

_CONV = re.compile(
    r"torch\._convolution\(\w+, weight, (\w+), \[(\d+), (\d+)\], \[(\d+), (\d+)\], "
    r"\[(\d+), (\d+)\], False, \[0, 0\], (\d+), "
)
_BN = re.compile(
    r"torch\.batch_norm\(\w+, weight, bias, running_mean, running_var, False, "
    r"[-+\d.eE]+, ([-+\d.eE]+), True\)"
)
_POOL = re.compile(
    r"torch\.max_pool2d\(\w+, \[(\d+), (\d+)\], \[(\d+), (\d+)\], \[0, 0\], \[1, 1\]\)"
)


class NetworkError(ValueError):
    """The model file's network is not one this builder is written for (names the file)."""


class _Builder:
    """Nodes and weights of the graph being written, and the model's code to check against."""

    def __init__(self, archive: TorchScriptArchive) -> None:
        self.archive = archive
        self.nodes: list[Any] = []
        self.weights: list[Any] = []
        self._n = 0
        self._code: dict[str, str] = {}

    # -- the model's code ----------------------------------------------------------------

    def class_code(self, module: ScriptObject) -> str:
        """Return the code of `module`'s class (its ``class X(Module):`` block)."""
        *path, name = module.torch_type.split(".")
        text = self._code.get(".".join(path))
        if text is None:
            text = self.archive.code("/code/" + "/".join(path) + ".py")
            self._code[".".join(path)] = text
        start = text.find(f"class {name}(Module):")
        if start < 0:
            raise self.error(f"no code for {module.torch_type}")
        end = text.find("\nclass ", start + 1)
        return text[start : end if end > 0 else len(text)]

    def error(self, what: str) -> NetworkError:
        return NetworkError(
            f"{self.archive.path}: {what}; not an InstanSeg network this "
            "version can build for ONNX Runtime (use runtime='torch')"
        )

    # -- graph primitives ----------------------------------------------------------------

    def name(self, op: str) -> str:
        self._n += 1
        return f"{op}_{self._n}"

    def node(self, op: str, inputs: list[str], **attrs: Any) -> str:
        from onnx import helper

        out = self.name(op)
        self.nodes.append(helper.make_node(op, inputs, [out], name=out, **attrs))
        return out

    def const(self, value: np.ndarray, op: str = "w") -> str:
        from onnx import numpy_helper

        name = self.name(op)
        self.weights.append(numpy_helper.from_array(np.ascontiguousarray(value), name))
        return name

    # -- modules -------------------------------------------------------------------------

    def conv(self, x: str, conv: ScriptObject, bn: ScriptObject | None) -> str:
        code = self.class_code(conv)
        m = _CONV.search(code)
        if m is None:
            raise self.error(f"{conv.torch_type}: unexpected convolution")
        has_bias, sh, sw, ph, pw, dh, dw, groups = m.groups()
        weight = np.asarray(conv.weight, np.float32)
        bias = np.asarray(conv.bias, np.float32) if has_bias == "bias" else None
        if bn is not None:
            weight, bias = self.fold(weight, bias, bn)
        inputs = [x, self.const(weight)]
        if bias is not None:
            inputs.append(self.const(bias))
        return self.node(
            "Conv",
            inputs,
            dilations=[int(dh), int(dw)],
            group=int(groups),
            kernel_shape=list(weight.shape[2:]),
            pads=[int(ph), int(pw), int(ph), int(pw)],
            strides=[int(sh), int(sw)],
        )

    def fold(
        self, weight: np.ndarray, bias: np.ndarray | None, bn: ScriptObject
    ) -> tuple[np.ndarray, np.ndarray]:
        """Fold an eval-mode batch norm into the convolution before it.

        As torch's ONNX exporter does it (``fuseConvBatchNorm``), in float32:
        ``s = gamma / sqrt(var + eps)``, ``W * s``, ``beta + (b - mean) * s`` (with a
        bias) or ``beta - mean * s`` (without).
        """
        m = _BN.search(self.class_code(bn))
        if m is None:
            raise self.error(f"{bn.torch_type}: unexpected batch norm")
        eps = np.float32(float(m.group(1)))
        f32 = np.float32
        scale = np.asarray(bn.weight, f32) / np.sqrt(np.asarray(bn.running_var, f32) + eps)
        mean, beta = np.asarray(bn.running_mean, f32), np.asarray(bn.bias, f32)
        w = weight * scale.reshape(-1, *([1] * (weight.ndim - 1)))
        b = beta + (bias - mean) * scale if bias is not None else beta - mean * scale
        return w.astype(f32), b.astype(f32)

    def sequential(self, x: str, seq: ScriptObject) -> str:
        """Run a ``Sequential`` of Conv2d [BatchNorm2d] [ReLU | Identity] ... ."""
        kids = [seq[str(i)] for i in range(len(seq.children()))]
        i = 0
        while i < len(kids):
            kind = kids[i].kind
            if kind == "Conv2d":
                bn = (
                    kids[i + 1] if i + 1 < len(kids) and kids[i + 1].kind == "BatchNorm2d" else None
                )
                x = self.conv(x, kids[i], bn)
                i += 2 if bn is not None else 1
                continue
            if kind == "ReLU":
                if "torch.relu" not in self.class_code(kids[i]):
                    raise self.error(f"{kids[i].torch_type}: unexpected activation")
                x = self.node("Relu", [x])
            elif kind == "Sequential":
                x = self.sequential(x, kids[i])
            elif kind != "Identity":
                raise self.error(f"{kids[i].torch_type} in a Sequential")
            i += 1
        return x

    def maxpool(self, x: str, pool: ScriptObject) -> str:
        if pool.kind == "Identity":
            return x
        m = _POOL.search(self.class_code(pool)) if pool.kind == "MaxPool2d" else None
        if m is None:
            raise self.error(f"{pool.torch_type}: unexpected pooling")
        kh, kw, sh, sw = (int(v) for v in m.groups())
        return self.node(
            "MaxPool",
            [x],
            ceil_mode=0,
            dilations=[1, 1],
            kernel_shape=[kh, kw],
            pads=[0, 0, 0, 0],
            strides=[sh, sw],
        )

    def upsample(self, x: str, block: ScriptObject) -> str:
        if "torch.upsample_nearest2d(argument_1, None, [2., 2.])" not in self.class_code(block):
            raise self.error(f"{block.torch_type}: unexpected upsampling")
        scales = self.const(np.array([1, 1, 2, 2], np.float32), "scales")
        return self.node(
            "Resize",
            [x, "", scales],
            coordinate_transformation_mode="asymmetric",
            cubic_coeff_a=-0.75,
            mode="nearest",
            nearest_mode="floor",
        )

    def residual(self, x: str, block: ScriptObject) -> str:
        """``conv0(x) + conv2(conv1(x))``, then that plus ``conv4(conv3(that))``."""
        a = self.sequential(x, block.conv0)
        b = self.sequential(self.sequential(x, block.conv1), block.conv2)
        inp = self.node("Add", [a, b])
        return self.node(
            "Add", [inp, self.sequential(self.sequential(inp, block.conv3), block.conv4)]
        )

    def encoder_block(self, x: str, block: ScriptObject) -> str:
        return self.residual(self.maxpool(x, block.maxpool), block)

    def decoder_block(self, x: str, skip: str, block: ScriptObject) -> str:
        """Upsample `x`, add the skip connection, then the residual tail."""
        up = self.upsample(x, block)
        a = self.sequential(up, block.conv0)
        inp0 = self.node(
            "Add", [self.sequential(up, block.conv1), self.sequential(skip, block.conv_skip)]
        )
        inp1 = self.node("Add", [a, self.sequential(inp0, block.conv2)])
        return self.node(
            "Add", [inp1, self.sequential(self.sequential(inp1, block.conv3), block.conv4)]
        )

    def unet(self, x: str, net: ScriptObject) -> str:
        """InstanSeg_UNet: encoder blocks, then each decoder's heads, concatenated."""
        enc = net.encoder
        skips = []
        h = x
        for i in range(len(enc.children())):
            h = self.encoder_block(h, enc[str(i)])
            skips.append(h)
        outs = []
        for j in range(len(net.decoders.children())):
            dec = net.decoders[str(j)]
            d = skips[-1]
            blocks = dec.decoder
            for i in range(len(blocks.children())):
                d = self.decoder_block(d, skips[-2 - i], blocks[str(i)])
            heads = dec.final_block
            finals = [self.sequential(d, heads[str(i)]) for i in range(len(heads.children()))]
            outs.append(self.node("Concat", finals, axis=1))
        return outs[0] if len(outs) == 1 else self.node("Concat", outs, axis=1)

    # -- the fluorescence model's channel-invariant adaptor ------------------------------

    def _shape(self, x: str, start: int, end: int | None = None) -> str:
        shape = self.node("Shape", [x])
        stop = np.iinfo(np.int64).max if end is None else end
        return self.node(
            "Slice",
            [
                shape,
                self.const(np.array([start], np.int64)),
                self.const(np.array([stop], np.int64)),
            ],
        )

    def channel_mix(self, y: str, bc: str, block: ScriptObject) -> str:
        """Mix the channels of a (B*C, F, h, w) block output.

        Seen as (B, C, F, h, w): each channel's features with their maximum over channels
        before them, through the block's ``reduce_block``; or only that maximum,
        (B, F, h, w), where the block's code has no ``reduce_block``.
        """
        y5 = self.node("Reshape", [y, self.node("Concat", [bc, self._shape(y, 1)], axis=0)])
        code = self.class_code(block)
        if "(reduce_block).forward(" not in code:
            return self.node("ReduceMax", [y5], axes=[1], keepdims=0)
        top = self.node("ReduceMax", [y5], axes=[1], keepdims=1)
        both = self.node(
            "Concat", [self.node("Expand", [top, self.node("Shape", [y5])]), y5], axis=2
        )
        flat = self.node(
            "Concat", [self.const(np.array([-1], np.int64)), self._shape(both, 2)], axis=0
        )
        return self.sequential(self.node("Reshape", [both, flat]), block.reduce_block)

    def adaptor(self, x: str, net: ScriptObject) -> str:
        """ChannelInvariantNet: any number of channels in, a fixed number of features out."""
        bc = self._shape(x, 0, 2)
        flat = self.node("Reshape", [x, self.const(np.array([-1, 1, 0, 0], np.int64))])
        h0 = self.channel_mix(self.encoder_block(flat, net.conv_0), bc, net.conv_0)
        h1 = self.channel_mix(self.encoder_block(h0, net.down_1), bc, net.down_1)
        h2 = self.channel_mix(self.encoder_block(h1, net.down_2), bc, net.down_2)
        u2 = self.channel_mix(self.decoder_block(h2, h1, net.upcat_2), bc, net.upcat_2)
        u1 = self.channel_mix(self.decoder_block(u2, h0, net.upcat_1), bc, net.upcat_1)
        return self.sequential(u1, net.final_conv)


def network_input(x: np.ndarray) -> np.ndarray:
    """Prepare a scaled batch as the model's forward prepares its network's input.

    Clamped to [-2, 3] and reflect-padded (bottom, right) to multiples of 16, as its
    ``_instanseg_padding`` does.
    """
    x = np.clip(x, -2.0, 3.0, dtype=np.float32)
    ph, pw = -x.shape[-2] % 16, -x.shape[-1] % 16
    if ph or pw:
        x = np.pad(x, ((0, 0), (0, 0), (0, ph), (0, pw)), mode="reflect")
    return np.ascontiguousarray(x, dtype=np.float32)


class _OpenVINOSession:
    """The exported network compiled by OpenVINO for the CPU, run as an ORT session is.

    Full precision (OpenVINO's default on a CPU with bf16 is bf16: network outputs up to
    1.8 apart, benchmarks/RESULTS.md), `threads` threads, latency first. Callers hold the
    segmenter's lock: one inference request serves them all.
    """

    def __init__(self, onnx_file: Path, threads: int) -> None:
        import openvino

        config = {
            "INFERENCE_PRECISION_HINT": "f32",
            "INFERENCE_NUM_THREADS": threads,
            "PERFORMANCE_HINT": "LATENCY",
        }
        compiled = openvino.Core().compile_model(str(onnx_file), "CPU", config)
        self._request = compiled.create_infer_request()

    def run(self, names: Any, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
        """Return ``[y]`` for ``{"x": x}``, as ``onnxruntime.InferenceSession.run`` does."""
        out = self._request.infer({0: feed["x"]})[0]
        return [np.array(out, dtype=np.float32, copy=True)]


def _quantized(onnx_file: Path, calibration: Path) -> Path:
    """Quantize the network of `onnx_file` to 8 bits (QDQ); return the file written next to it.

    Weights are quantized per output channel (signed), activations (unsigned) on the
    min-max ranges they take on the model card's test tile (`calibration`, installed with
    the model: H&E, scaled per channel as the card says) and its two mirror images: the
    same ranges on every machine, nothing measured on the user's slides.
    """
    import logging

    from onnxruntime.quantization import (
        CalibrationDataReader,
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    try:
        x = np.load(calibration).astype(np.float32)  # (1, 3, H, W), 0-255
    except (OSError, ValueError) as exc:
        raise NetworkError(
            f"{calibration}: cannot read the model's test tile for the int8 calibration ({exc})"
        ) from exc
    lo, hi = np.percentile(x, [0.1, 99.9], axis=(2, 3), keepdims=True)
    x = network_input((x - lo) / (hi - lo + np.float32(1e-6)))
    batches = [x, np.ascontiguousarray(x[..., ::-1, :]), np.ascontiguousarray(x[..., ::-1])]

    class _Reader(CalibrationDataReader):  # type: ignore[misc]  # onnxruntime is untyped
        def __init__(self) -> None:
            self._left = iter(batches)

        def get_next(self) -> dict[str, np.ndarray] | None:
            batch = next(self._left, None)
            return None if batch is None else {"x": batch}

    out = onnx_file.with_name("network-int8.onnx")
    # the quantizer logs advice through the root logger (configuring it when bare): keep
    # the user's logging as it is
    root = logging.getLogger()
    quiet, level = logging.NullHandler(), root.level
    root.addHandler(quiet)
    root.setLevel(logging.ERROR)
    try:
        quantize_static(
            str(onnx_file),
            str(out),
            _Reader(),
            quant_format=QuantFormat.QDQ,
            per_channel=True,
            activation_type=QuantType.QUInt8,
            weight_type=QuantType.QInt8,
            calibrate_method=CalibrationMethod.MinMax,
        )
    finally:
        root.setLevel(level)
        root.removeHandler(quiet)
    return out


def build_network(archive: TorchScriptArchive) -> bytes:
    """Return the InstanSeg network of `archive` as a serialized ONNX model (``x`` -> ``y``).

    ``x`` is (B, C, H, W) float32 with H and W multiples of 16 (C = 3 for the brightfield
    model, any C for the channel-invariant fluorescence model); ``y`` is the network's
    (B, K, H, W) output the clustering reads.

    Raises
    ------
    NetworkError
        If the network is not built of the modules this builder knows (the message names
        the file).
    """
    from onnx import TensorProto, helper

    b = _Builder(archive)
    fcn = getattr(archive.module, "fcn", None)
    if not isinstance(fcn, ScriptObject):
        raise b.error("no network (fcn)")
    try:
        if fcn.kind == "InstanSeg_UNet":
            channels: int | str = 3
            y = b.unet("x", fcn)
        elif fcn.kind == "AdaptorNetWrapper" and fcn.model.AdaptorNet.kind == "ChannelInvariantNet":
            channels = "c"
            y = b.unet(b.adaptor("x", fcn.model.AdaptorNet), fcn.model)
        else:
            raise b.error(f"network {fcn.torch_type}")
    except (AttributeError, KeyError) as exc:
        raise b.error(f"module missing ({exc})") from exc
    b.nodes.append(helper.make_node("Identity", [y], ["y"], name="output"))
    graph = helper.make_graph(
        b.nodes,
        "instanseg",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", channels, "h", "w"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", None, "h", "w"])],
        initializer=b.weights,
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="napari-slidescope"
    )
    model.ir_version = 8
    return bytes(model.SerializeToString())


def network_session(
    archive: TorchScriptArchive, *, int8: bool = False, openvino: bool = False, threads: int = 0
) -> Any:
    """Return a CPU session running the network of `archive`: ONNX Runtime, or OpenVINO.

    `int8`: the network quantized (:func:`_quantized`, calibrated on the model card's test
    tile installed beside the weights). `openvino`: compiled by OpenVINO
    (:class:`_OpenVINOSession`). `threads`: 0 lets the runtime choose (a thread per core).
    """
    onnx_model = build_network(archive)
    if int8 or openvino:
        with tempfile.TemporaryDirectory(prefix="slidescope-onnx-") as tmp:
            onnx_file = Path(tmp) / "network.onnx"
            onnx_file.write_bytes(onnx_model)
            if int8:
                onnx_file = _quantized(onnx_file, archive.path.parent / "test-input.npy")
            if openvino:
                return _OpenVINOSession(onnx_file, threads or os.cpu_count() or 1)
            onnx_model = onnx_file.read_bytes()
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    # threads that spin between runs take the cores from the clustering and post-processing
    # that follow (a CMU-1 region: 2.33 s against 2.90 s, same labels; benchmarks/RESULTS.md)
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return onnxruntime.InferenceSession(onnx_model, options, providers=["CPUExecutionProvider"])
