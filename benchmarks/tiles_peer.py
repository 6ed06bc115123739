"""Tiles per second against the issue's named peer, LazySlide / wsidata, on the same tiles.

Usage::

    python benchmarks/tiles_peer.py SLIDE [SLIDE ...] --peer-python PY \
        [--mpp 0.5 1.0] [--tiles 160] [--runs 5] [--threads 2] [--embed-tiles 128]

``PY`` (or ``$SLIDESCOPE_PEER_PYTHON``): the Python of a separate venv holding ``lazyslide``,
``wsidata`` and a CPU ``torch`` (never this project's environment), e.g.::

    python3.11 -m venv peer && peer/bin/pip install torch-*+cpu-*.whl   # a CPU wheel
    echo "torch==<that version>+cpu" > c.txt   # else pip swaps in PyPI's CUDA torch
    PIP_CONSTRAINT=c.txt peer/bin/pip install lazyslide wsidata onnxruntime

The peer runs there, in one long-lived process (``_tiles_peer_worker.py``), driven command
by command, so that its runs interleave with ours in the same minutes; its imports and slide
opening are not timed, as ours are not.

For each slide and each µm/px, ``tile_slide`` cuts 224 px tissue tiles (min tissue 0.5);
the peer gets the same tiles: their level-0 corners as a wsidata tile table (what
``lazyslide.pp.tile_tissues`` stores), with the peer's own ``TileSpec`` at that µm/px (its
level, its read size, its OpenCV ``INTER_AREA`` resize). Ours is exact in µm (a fractional
level-0 footprint); the peer's corner and read size are whole pixels: the pixel check
reports the mean absolute difference per tile (0..255) of the same tiles from both.

Readers, each run on fresh disjoint tiles (no reader finds another's tiles in a cache; the
file's bytes are in the page cache beforehand), order rotating per run:

* ours ``iter_tiles`` (``--threads`` threads) and ``read_tile`` in a loop (1 thread);
* peer ``wsi.iter.tile_images`` (its iterator, 1 thread) and a DataLoader over
  ``wsi.ds.tile_images`` with ``--threads`` worker processes (its parallel path);
* the decode floor: the native JPEG tiles ours touched, decoded once each on ``--threads``
  threads (``tiles_read.py``).

Then embedding with the small model of ``tiles_read.py`` (two strided convolutions, pooling,
a linear layer): ours ``embed_tiles`` with the ONNX file (ONNX Runtime) and with its torch
twin (same weights) as a callable; the peer's ``lazyslide.tl.feature_extraction`` with the
torch twin (LazySlide runs a torch model, not ONNX) and ``--threads`` DataLoader workers.
Features of the same tiles from ours (ONNX) and the peer (torch) are compared.
Reported: medians over runs of tiles/s, ratios, the load average.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from tiles_read import _decode_floor, _raw_tiles, _tiny_onnx  # noqa: E402

BATCH = 16


class Peer:
    """The peer's worker process: one JSON command in, one JSON answer out."""

    def __init__(self, python: str) -> None:
        worker = Path(__file__).with_name("_tiles_peer_worker.py")
        self.proc = subprocess.Popen(
            [python, str(worker)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=None if os.environ.get("TILES_PEER_DEBUG") else subprocess.DEVNULL,
            text=True,
        )

    def __call__(self, **cmd) -> dict:
        assert self.proc.stdin and self.proc.stdout
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the peer's worker died on {cmd['op']}")
        answer = json.loads(line)
        if not answer.get("ok"):
            raise RuntimeError(f"peer: {answer}")
        return answer

    def close(self) -> None:
        self.proc.stdin.write(json.dumps({"op": "quit"}) + "\n")  # type: ignore[union-attr]
        self.proc.stdin.close()  # type: ignore[union-attr]
        self.proc.wait(60)


def _xy(tiles) -> list[list[int]]:
    """Level-0 (x, y) corners, whole pixels, as the peer's tile tables hold them."""
    return np.stack([tiles["col0"], tiles["row0"]], axis=1).tolist()


def _torch_twin(onnx_path: Path):
    """The ONNX model's weights as an .npz (the peer's torch twin) and our own torch twin."""
    import onnx
    import torch
    from onnx import numpy_helper

    w = {i.name: numpy_helper.to_array(i) for i in onnx.load(str(onnx_path)).graph.initializer}
    npz = onnx_path.with_suffix(".npz")
    np.savez(npz, **w)

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

    net = Tiny().eval()

    def twin(batch: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            return net(torch.from_numpy(batch)).numpy()

    return npz, twin


def _table(rates: dict[str, list[float]], ref: str) -> None:
    r = statistics.median(rates[ref])
    print(f"| reader | tiles/s (median) | min | max | this / {ref} |")
    print("|---|---|---|---|---|")
    for name, v in rates.items():
        m = statistics.median(v)
        print(f"| {name} | {m:.1f} | {min(v):.1f} | {max(v):.1f} | {m / r:.2f} |")


def _bench(args, peer: Peer, path: str, mpp: float, model) -> None:
    from napari_slidescope import open_slide
    from napari_slidescope.tiles import area_resize, embed_tiles, iter_tiles, read_tile, tile_slide

    slide = open_slide(path)
    tiles = tile_slide(slide, tile_um=224 * mpp, mpp=mpp, min_tissue_fraction=0.5)
    info = peer(op="open", slide=path, mpp=mpp, tile_px=224)
    level = int(tiles["level"][0])
    ratio = mpp / slide.mpp[0] / slide.downsamples[level][0]
    print(
        f"\n## {Path(path).name} ({slide.shape0[1]} x {slide.shape0[0]}, {slide.mpp[0]} µm/px) "
        f"at {mpp} µm/px: {len(tiles)} tissue tiles of 224 px; ours reads level {level} "
        f"({'native, no resampling' if abs(ratio - 1) < 1e-9 else f'resampled {ratio:.4f}:1'}), "
        f"the peer ({info['reader']}) level {info['level']}, {info['read_px']} px resized to 224"
    )
    order = np.random.default_rng(0).permutation(len(tiles))
    cursor = 0

    def take(n: int) -> np.ndarray:
        nonlocal cursor
        if cursor + n > len(order):
            raise SystemExit(f"{path} at {mpp} µm/px: too few tissue tiles for the runs asked")
        part = np.sort(order[cursor : cursor + n])
        cursor += n
        _raw_tiles(path, tiles, part)[0].close()  # its bytes into the page cache
        return part

    # the same tiles from both: mean absolute difference per tile
    check = tiles.subset(take(8))
    peer(op="tiles", key="check", xy=_xy(check))
    out = Path(tempfile.mkdtemp())
    peer(op="save", key="check", out=str(out / "check.npy"))
    theirs = np.load(out / "check.npy").astype(np.int16)
    ours = np.stack([read_tile(slide, check, i) for i in range(len(check))]).astype(np.int16)
    mad = np.abs(ours - theirs).mean(axis=(1, 2, 3))
    # the peer's geometry (whole-pixel corner and read size) resampled by ours: what is left
    # is the two resamplers; the rest of the difference is the peer's rounding of the box
    read_px, plevel = info["read_px"], info["level"]
    pds = slide.downsamples[plevel][0]
    same_box = np.stack(
        [
            area_resize(
                slide.read_level(plevel, (r, c, r + read_px, c + read_px)),
                (0.0, 0.0), (read_px / 224, read_px / 224), 224,
            )
            for r, c in zip(
                (check["row0"] // pds).astype(int), (check["col0"] // pds).astype(int), strict=True
            )
        ]
    ).astype(np.int16)  # fmt: skip
    box_mad = np.abs(same_box - theirs).mean(axis=(1, 2, 3))
    print(
        f"same tiles, ours - peer: mean |difference| per tile {mad.mean():.2f} "
        f"(max over 8 tiles {mad.max():.2f}; 0..255); ours on the peer's whole-pixel box "
        f"({read_px} px of level {plevel} from its corner) - peer: {box_mad.mean():.2f} "
        f"(max {box_mad.max():.2f})"
    )

    names = [
        f"ours iter_tiles, {args.threads} threads",
        "ours read_tile, 1 thread",
        "peer iter.tile_images, 1 thread",
        f"peer DataLoader, {args.threads} workers",
    ]

    def run(name: str, sub, key: str) -> float:
        t0 = time.perf_counter()
        if name.startswith("ours iter_tiles"):
            for _ in iter_tiles(slide, sub, threads=args.threads, read_ahead=4 * args.threads):
                pass
        elif name.startswith("ours read_tile"):
            for i in range(len(sub)):
                read_tile(slide, sub, i)
        elif name.startswith("peer iter"):
            return peer(op="read", key=key, mode="iter")["seconds"]
        else:
            return peer(op="read", key=key, mode="loader", workers=args.threads, batch=BATCH)[
                "seconds"
            ]
        return time.perf_counter() - t0

    plan = {}
    for k, name in enumerate(names):  # warm-up on tiles of its own (imports, first reads)
        sub = tiles.subset(take(BATCH))
        peer(op="tiles", key=f"warm{k}", xy=_xy(sub))
        run(name, sub, f"warm{k}")
        for r in range(args.runs):
            plan[name, r] = take(args.tiles)
            peer(op="tiles", key=f"r{k}_{r}", xy=_xy(tiles.subset(plan[name, r])))
    rates: dict[str, list[float]] = {}
    for r in range(args.runs):
        for k in [(j + r) % len(names) for j in range(len(names))]:
            name = names[k]
            seconds = run(name, tiles.subset(plan[name, r]), f"r{k}_{r}")
            rates.setdefault(name, []).append(args.tiles / seconds)
            if k == 0:
                floor = _decode_floor(path, tiles, plan[name, r], args.threads)
                rates.setdefault(f"decode floor, {args.threads} threads", []).append(
                    args.tiles / floor
                )
    print(f"reading only, {args.tiles} tiles per reader per run, {args.runs} runs:")
    _table(rates, names[0])
    print(f"load: {os.getloadavg()}")
    if model is None:
        slide.close()
        return

    onnx_model, twin = model
    names = ["ours embed_tiles, ONNX", "ours embed_tiles, torch twin", "peer feature_extraction"]
    feats_check = tiles.subset(take(BATCH * 2))
    peer(op="tiles", key="fcheck", xy=_xy(feats_check))
    answer = peer(
        op="embed", key="fcheck", workers=args.threads, batch=BATCH, out=str(out / "f.npy")
    )
    a = embed_tiles(slide, feats_check, onnx_model, batch_size=BATCH, read_threads=args.threads).X
    b = np.load(out / "f.npy")
    print(f"peer's model path: {answer['path']}")
    rel = np.abs(a - b).max(axis=1) / np.abs(a).max(axis=1)
    print(
        f"features of the same {len(a)} tiles, ours (ONNX) vs peer (torch): max |diff| / max "
        f"|feature| per tile: median {np.median(rel):.4f}, max {rel.max():.4f}"
    )
    plan = {}
    for k, name in enumerate(names):
        plan[name, -1] = take(BATCH)  # warm-up: the runtimes' first calls
        peer(op="tiles", key=f"e{k}_-1", xy=_xy(tiles.subset(plan[name, -1])))
        for r in range(args.runs):
            plan[name, r] = take(args.embed_tiles)
            peer(op="tiles", key=f"e{k}_{r}", xy=_xy(tiles.subset(plan[name, r])))
    rates = {}
    for r in range(-1, args.runs):
        for k in [(j + r) % len(names) for j in range(len(names))]:
            name = names[k]
            sub = tiles.subset(plan[name, r])
            t0 = time.perf_counter()
            if name.startswith("peer"):
                seconds = peer(
                    op="embed", key=f"e{k}_{r}", workers=args.threads, batch=BATCH,
                    out=str(out / "e.npy"),
                )["seconds"]  # fmt: skip
            else:
                m = onnx_model if "ONNX" in name else twin
                embed_tiles(slide, sub, m, batch_size=BATCH, read_threads=args.threads)
                seconds = time.perf_counter() - t0
            if r >= 0:
                rates.setdefault(name, []).append(args.embed_tiles / seconds)
    print(
        f"tiles to features, {args.embed_tiles} tiles per run, batch {BATCH}, "
        f"{args.runs} runs (CPU):"
    )
    _table(rates, names[0])
    print(f"load: {os.getloadavg()}")
    slide.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("slides", nargs="+")
    ap.add_argument("--peer-python", default=os.environ.get("SLIDESCOPE_PEER_PYTHON"))
    ap.add_argument("--mpp", type=float, nargs="+", default=[0.5, 1.0])
    ap.add_argument("--tiles", type=int, default=160, help="tiles per reader per run")
    ap.add_argument("--embed-tiles", type=int, default=128, help="tiles per embedding run")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--skip-embed", action="store_true")
    args = ap.parse_args()
    if not args.peer_python:
        ap.error("--peer-python (or SLIDESCOPE_PEER_PYTHON): the peer venv's python")
    print(f"load before: {os.getloadavg()}")
    peer = Peer(args.peer_python)
    model = None
    if not args.skip_embed:
        from napari_slidescope.tiles.embed import load_model

        onnx_path = _tiny_onnx(Path(tempfile.mkdtemp()) / "tiny.onnx")
        npz, twin = _torch_twin(onnx_path)
        info = peer(op="model", weights=str(npz))
        print(f"peer: torch {info['torch']}, {info['threads']} threads")
        model = (load_model(onnx_path, device="cpu"), twin)
    try:
        for path in args.slides:
            for mpp in args.mpp:
                _bench(args, peer, path, mpp, model)
    finally:
        peer.close()


if __name__ == "__main__":
    main()
