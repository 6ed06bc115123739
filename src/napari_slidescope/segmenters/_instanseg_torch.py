"""InstanSeg's TorchScript forward with its network's output given (torch needed).

The ONNX runtimes run the network; the fluorescence model's clustering (nuclei, cells and
their reconciliation) still runs in its TorchScript ``forward``, given that output. The
model's flood fill and hole filling are replaced there by the scipy ones
(:func:`~napari_slidescope.segmenters._instanseg_clustering.flood_fill`), registered as
torch ops.
"""

from __future__ import annotations

import io
import re
import threading
import zipfile
from pathlib import Path
from typing import Any

from napari_slidescope.segmenters._instanseg_clustering import fill_holes, flood_fill

__all__ = ["forward_with_given_network"]

#: The TorchScript file holding the model's ``forward`` (the fluorescence model's is a
#: mangled ``instanseg_loss/___torch_mangle_N.py``), and the line that runs the network.
_FORWARD_CODE = re.compile(
    r"code/__torch__/instanseg/utils/loss/instanseg_loss(/___torch_mangle_\d+)?\.py$"
)
_NETWORK_CALL = "      x_full = (fcn).forward(x0, )\n"
#: The same, taking the network's output from ``args["x_full"]`` when given.
_NETWORK_OR_GIVEN = (
    '      if torch.__contains__(args0, "x_full"):\n'
    '        x_full = args0["x_full"]\n'
    "      else:\n"
    "        x_full = (fcn).forward(x0, )\n"
)


#: The TorchScript file holding the model's flood fill and hole filling (of each nucleus's
#: window), the head of each function, and the head of the function after each.
_UTILS_CODE = "code/__torch__/instanseg/utils/pytorch_utils.py"
_FILLS = (
    ("def flood_fill(bw_mask: Tensor,\n    bw_seed: Tensor) -> Tensor:\n", "def fill_holes("),
    ("def fill_holes(bw_mask: Tensor) -> Tensor:\n", "def fast_sparse_intersection_over"),
)
#: Their bodies calling :func:`flood_fill` and :func:`fill_holes` (registered torch ops).
_FILL_BODIES = (
    "  _0 = __torch__.instanseg.utils.pytorch_utils._to_ndim\n"
    "  return ops.slidescope.instanseg_flood_fill(_0(bw_mask, 4, ), _0(bw_seed, 4, ))\n",
    "  _0 = __torch__.instanseg.utils.pytorch_utils._to_ndim\n"
    "  return ops.slidescope.instanseg_fill_holes(_0(bw_mask, 4, ))\n",
)
_FILL_LOCK = threading.Lock()
_FILL_OPS: list[bool] = []


def _register_fill_ops() -> bool:
    """Register :func:`flood_fill` and :func:`fill_holes` as torch ops, once; whether done.

    The model's own versions (one 3 x 3 max-pool of every nucleus's window per step,
    tens of steps) take most of its clustering time on a CPU. Needs torch 2.4's
    ``torch.library.custom_op``; without it the model's own versions run.
    """
    import torch

    with _FILL_LOCK:
        if _FILL_OPS:
            return _FILL_OPS[0]
        custom_op = getattr(getattr(torch, "library", None), "custom_op", None)
        if custom_op is None:
            _FILL_OPS.append(False)
            return False

        def flood(mask: torch.Tensor, seed: torch.Tensor) -> torch.Tensor:
            out = flood_fill(mask.cpu().numpy(), seed.cpu().numpy())
            return torch.from_numpy(out).to(mask.device)

        def holes(mask: torch.Tensor) -> torch.Tensor:
            return torch.from_numpy(fill_holes(mask.cpu().numpy())).to(mask.device)

        try:
            custom_op(
                "slidescope::instanseg_flood_fill",
                flood,
                mutates_args=(),
                schema="(Tensor mask, Tensor seed) -> Tensor",
            )
            custom_op(
                "slidescope::instanseg_fill_holes",
                holes,
                mutates_args=(),
                schema="(Tensor mask) -> Tensor",
            )
        except (TypeError, RuntimeError):  # an older custom_op, or registered before a reload
            try:
                _ = (
                    torch.ops.slidescope.instanseg_flood_fill,
                    torch.ops.slidescope.instanseg_fill_holes,
                )
            except (AttributeError, RuntimeError):
                _FILL_OPS.append(False)
                return False
        _FILL_OPS.append(True)
        return True


def _with_fill_ops(code: str) -> str:
    """Return the model's utilities, ``flood_fill`` and ``fill_holes`` calling the scipy ops."""
    for (head, after), body in zip(_FILLS, _FILL_BODIES, strict=True):
        start, end = code.find(head), code.find(after)
        if not 0 <= start < end:  # not the code this was written for: the model's own
            return code
        code = code[:start] + head + body + code[end:]
    return code


def forward_with_given_network(weights: Path, device: Any) -> Any:
    """Load the model, its forward able to take the network's output (``args["x_full"]``).

    The archive's forward gets one change: ``x_full = fcn(x0)`` becomes "use
    ``args['x_full']`` when given"; the clustering and its thresholds are unchanged.

    Raises
    ------
    ValueError
        If the forward is not the one this was written for.
    """
    import torch

    fills = _register_fill_ops()
    buf = io.BytesIO()
    with zipfile.ZipFile(weights) as zin, zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as zout:
        changed = 0
        for info in zin.infolist():
            data = zin.read(info)
            if _FORWARD_CODE.search(info.filename):
                text = data.decode()
                changed += text.count(_NETWORK_CALL)
                data = text.replace(_NETWORK_CALL, _NETWORK_OR_GIVEN).encode()
            elif fills and info.filename.endswith(_UTILS_CODE):
                data = _with_fill_ops(data.decode()).encode()
            zout.writestr(info.filename, data)
    if changed != 1:
        raise ValueError(f"{weights}: the model's forward is not the expected one")
    buf.seek(0)
    return torch.jit.load(buf, map_location=device).eval()
