"""The peer's side of ``tiles_peer.py``: LazySlide / wsidata in their own interpreter.

Run by ``tiles_peer.py`` with the peer's Python (a venv holding ``lazyslide``, ``wsidata``
and a CPU torch); imports nothing of napari-slidescope. It reads one JSON command a line on
stdin and answers one JSON line on its stdout (everything the libraries print goes to
stderr), so that the driver can interleave its runs with ours in the same minutes:

* ``{"op": "open", "slide": PATH, "mpp": M, "tile_px": N}``: ``open_wsi`` (OpenSlide, the
  reader wsidata picks) and the peer's own ``TileSpec.from_wsidata`` at that mpp (the level
  it reads and its resize), answered with the level and the read size it chose;
* ``{"op": "tiles", "key": K, "xy": [[x, y], ...]}``: a tile set of level-0 corners, added
  with ``wsidata.io.add_tiles`` (what ``lazyslide.pp.tile_tissues`` stores);
* ``{"op": "read", "key": K, "mode": "iter" | "loader", "workers": W, "batch": B}``: read every
  tile, through ``wsi.iter.tile_images`` (one thread) or a DataLoader over
  ``wsi.ds.tile_images`` with W worker processes; answered with the seconds;
* ``{"op": "save", "key": K, "out": PATH}``: the tiles as an ``.npy`` (pixel check);
* ``{"op": "model", "weights": NPZ}``: the torch twin of the driver's small ONNX model;
* ``{"op": "embed", "key": K, "workers": W, "batch": B, "out": PATH}``:
  ``lazyslide.tl.feature_extraction`` with that model (the peer's path for a user's own
  model: a torch callable; it runs no ONNX), or its loop where it cannot be imported (see
  ``_embed``), answered with the seconds and which ran; features to PATH.
"""

from __future__ import annotations

import json
import os
import sys
import time
import warnings

import numpy as np

warnings.filterwarnings("ignore")
_reply = sys.stdout
sys.stdout = sys.stderr  # the libraries' prints never reach the driver's pipe

MEAN = np.array([0.485, 0.456, 0.406], np.float32)
STD = np.array([0.229, 0.224, 0.225], np.float32)


def _transform(img):
    """(H, W, 3) uint8 -> float (3, H, W), ImageNet-normalised: what the driver's model gets."""
    import torch

    x = (np.asarray(img, np.float32) / 255.0 - MEAN) / STD
    return torch.from_numpy(np.ascontiguousarray(x.transpose(2, 0, 1)))


def _tiny_torch(weights: str):
    import torch

    w = np.load(weights)

    class Tiny(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.c1 = torch.nn.Conv2d(3, 32, 4, stride=4, bias=False)
            self.c2 = torch.nn.Conv2d(32, 64, 2, stride=2, bias=False)
            self.fc = torch.nn.Linear(64, 128, bias=False)
            with torch.no_grad():
                self.c1.weight.copy_(torch.from_numpy(w["w1"]))
                self.c2.weight.copy_(torch.from_numpy(w["w2"]))
                self.fc.weight.copy_(torch.from_numpy(w["w3"].T.copy()))

        def forward(self, x):
            x = torch.relu(self.c2(torch.relu(self.c1(x))))
            return self.fc(x.mean(dim=(2, 3)))

    return Tiny().eval()


def _embed(state: dict, cmd: dict) -> tuple[np.ndarray, str]:
    """Features of the tiles `cmd["key"]`: ``lazyslide.tl.feature_extraction``, else its loop.

    ``feature_extraction`` imports ``lazyslide_models`` (timm, torchvision); where that import
    fails (PyPI's torchvision wheel needs PyTorch's CUDA libraries, absent beside a CPU-only
    torch) the same loop runs from LazySlide's own parts: its DataLoader options
    (``lazyslide._api.loader_kws``) over wsidata's ``tile_images`` dataset, the model on each
    batch under ``torch.inference_mode``, the features stored with ``wsidata.io.add_features``.
    """
    import torch

    try:
        import lazyslide_models  # noqa: F401 - what feature_extraction imports first
    except Exception as exc:  # torchvision's RuntimeError, an ImportError
        reason = f"{type(exc).__name__}: {exc}"
    else:
        import lazyslide as zs

        feats = zs.tl.feature_extraction(
            state["wsi"],
            model=state["model"],
            tile_key=cmd["key"],
            transform=_transform,
            batch_size=cmd["batch"],
            num_workers=cmd["workers"],
            device="cpu",
            pbar=False,
            return_features=True,
            key_added=f"f_{cmd['key']}",
        )
        return np.asarray(feats), "lazyslide.tl.feature_extraction"
    from lazyslide import _api
    from torch.utils.data import DataLoader
    from wsidata.io import add_features

    wsi = state["wsi"]
    ds = wsi.ds.tile_images(tile_key=cmd["key"], transform=_transform)
    loader = DataLoader(ds, batch_size=cmd["batch"], **_api.loader_kws("cpu", cmd["workers"]))
    with torch.inference_mode():
        out = [state["model"](b["image"]).numpy() for b in loader]
    feats = np.vstack(out)
    add_features(wsi, key=f"f_{cmd['key']}", tile_key=cmd["key"], features=feats)
    return feats, f"feature_extraction's loop ({reason})"


def main() -> None:
    import wsidata
    from wsidata import TileSpec
    from wsidata.io import add_tiles

    state: dict = {}
    for line in sys.stdin:
        cmd = json.loads(line)
        op = cmd["op"]
        answer: dict = {"ok": True}
        if op == "open":
            if "wsi" in state:
                state["wsi"].reader.detach_reader()
            wsi = wsidata.open_wsi(cmd["slide"], store=None)
            spec = TileSpec.from_wsidata(wsi, cmd["tile_px"], mpp=cmd["mpp"])
            state.update(wsi=wsi, spec=spec)
            answer.update(
                reader=type(wsi.reader).__name__,
                level=spec.ops_level,
                read_px=spec.ops_width,
                slide_mpp=wsi.properties.mpp,
            )
        elif op == "tiles":
            xy = np.asarray(cmd["xy"], np.int64).reshape(-1, 2)
            add_tiles(state["wsi"], cmd["key"], xy, state["spec"], np.zeros(len(xy), np.int64))
        elif op == "read":
            wsi = state["wsi"]
            t0 = time.perf_counter()
            if cmd["mode"] == "iter":
                n = sum(1 for _ in wsi.iter.tile_images(cmd["key"]))
            else:
                from torch.utils.data import DataLoader

                ds = wsi.ds.tile_images(tile_key=cmd["key"])
                loader = DataLoader(ds, batch_size=cmd["batch"], num_workers=cmd["workers"])
                n = sum(len(b["image"]) for b in loader)
            answer.update(seconds=time.perf_counter() - t0, n=n)
        elif op == "save":
            imgs = [t.image for t in state["wsi"].iter.tile_images(cmd["key"])]
            np.save(cmd["out"], np.stack(imgs))
        elif op == "model":
            state["model"] = _tiny_torch(cmd["weights"])
            import torch

            answer.update(torch=torch.__version__, threads=torch.get_num_threads())
        elif op == "embed":
            t0 = time.perf_counter()
            feats, path = _embed(state, cmd)
            answer.update(seconds=time.perf_counter() - t0, path=path)
            np.save(cmd["out"], feats)
        elif op == "quit":
            break
        else:
            answer = {"ok": False, "error": f"unknown op {op!r}"}
        _reply.write(json.dumps(answer) + "\n")
        _reply.flush()
    os._exit(0)  # skip the libraries' slow interpreter teardown


if __name__ == "__main__":
    main()
