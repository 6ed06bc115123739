"""Tiles per second: ours (iter_tiles, read_tile) against OpenSlide and tiffslide loops and
the decode floor, on the same slide and the same tiles; then embedding with a small ONNX model.

Usage::

    python benchmarks/tiles_read.py SLIDE [--tiles 120] [--runs 5] [--threads 2]

SLIDE: a tiled JPEG SVS (e.g. the shared ``rgb16k.svs``). Two tile sets, both 224 px and
cut by ``tile_slide`` with tissue gating:

* ``0.5 µm/px``: 112 µm tiles resampled from level 0 (a fractional level-0 footprint on a
  0.2527 µm/px slide). Peers: ``read_region`` of the covering level-0 box, then PIL's
  ``BOX`` resize of the exact footprint (area averaging, as ours), RGB.
* ``native``: the mpp of level 1 (no resampling). Peers: ``read_region`` at level 1.

Each run takes a fresh, disjoint slice of the tissue tiles (no reader gets another run's
tiles from its cache; the file is in the page cache); the readers' order rotates per run.
Reported: medians over runs of tiles/s, and ratios against ours (iter_tiles).

The decode floor decodes, once each, the native JPEG tiles the run's tiles touch (raw
bytes read with plain file reads, ``TiffPage.decode``, on the same number of threads), in
our tiles per second: no reader can beat it without decoding less.

The embedding part runs ``embed_tiles`` with a small ONNX model (two strided convolutions,
pooling and a linear layer: ~20 MFLOP per 224 px tile) against the same work done
sequentially (read a batch, then run it), and reports how long the model waited on reading.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np


def _peer_openslide(path: str):
    import openslide

    s = openslide.OpenSlide(path)

    def read(level: int, y: int, x: int, h: int, w: int) -> np.ndarray:
        ds = s.level_downsamples[level]
        img = s.read_region((int(x * ds), int(y * ds)), level, (w, h))
        return img

    return s, read


def _peer_tiffslide(path: str):
    import tiffslide

    s = tiffslide.TiffSlide(path)

    def read(level: int, y: int, x: int, h: int, w: int):
        ds = s.level_downsamples[level]
        return s.read_region((int(x * ds), int(y * ds)), level, (w, h))

    return s, read


def _peer_tile(read, tiles, i: int, level: int):
    """Read tile `i` the way a user of a peer would: covering box, then an area resize."""
    from PIL import Image

    c = tiles.columns
    ds = float(c["downsample"][i])
    mpp0 = tiles.slide_mpp[0]
    fy, fx = c["y_um"][i] / mpp0 / ds, c["x_um"][i] / mpp0 / ds
    side = tiles.tile_px * tiles.mpp / mpp0 / ds
    y0, x0 = int(np.floor(fy)), int(np.floor(fx))
    h, w = int(np.ceil(fy + side)) - y0, int(np.ceil(fx + side)) - x0
    img = read(level, y0, x0, h, w)
    if not isinstance(img, Image.Image):
        img = Image.fromarray(np.asarray(img))
    img = img.convert("RGB")
    if abs(side - tiles.tile_px) < 1e-9 and fy == y0 and fx == x0:
        return np.asarray(img)[: tiles.tile_px, : tiles.tile_px]
    box = (fx - x0, fy - y0, fx - x0 + side, fy - y0 + side)
    return np.asarray(img.resize((tiles.tile_px, tiles.tile_px), Image.BOX, box=box))


def _raw_tiles(path: str, tiles, idx: np.ndarray):
    """The native tiles the tiles `idx` touch (at their level): page and (bytes, index) pairs.

    Reading them also puts exactly those bytes in the page cache (the warm-up).
    """
    import tifffile

    level = int(tiles["level"][idx[0]])
    tif = tifffile.TiffFile(path)
    page = tif.series[0].levels[level].pages[0]
    th, tw = page.tilelength, page.tilewidth
    across = -(-page.imagewidth // tw)
    ds = float(tiles["downsample"][idx[0]])
    need = set()
    for i in idx:
        y0, x0 = tiles["row0"][i] / ds, tiles["col0"][i] / ds
        y1, x1 = tiles["row1"][i] / ds, tiles["col1"][i] / ds
        for ty in range(int(y0) // th, int(np.ceil(y1) - 1) // th + 1):
            for tx in range(int(x0) // tw, int(np.ceil(x1) - 1) // tw + 1):
                need.add(ty * across + tx)
    offsets, counts = page.dataoffsets, page.databytecounts
    raw = []
    with open(path, "rb") as fh:
        for k in sorted(k for k in need if k < len(offsets)):
            fh.seek(offsets[k])
            raw.append((fh.read(counts[k]), k))
    return tif, page, raw


def _decode_floor(path: str, tiles, idx: np.ndarray, threads: int) -> float:
    """Seconds to decode once each native tile the tiles `idx` touch, on `threads` threads."""
    tif, page, raw = _raw_tiles(path, tiles, idx)
    try:
        t0 = time.perf_counter()
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(lambda it: page.decode(it[0], it[1], jpegtables=page.jpegtables), raw))
        return time.perf_counter() - t0
    finally:
        tif.close()


def _tiny_onnx(path: Path) -> Path:
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(rng.normal(size=(32, 3, 4, 4)).astype(np.float32) * 0.1, "w1"),
        numpy_helper.from_array(rng.normal(size=(64, 32, 2, 2)).astype(np.float32) * 0.1, "w2"),
        numpy_helper.from_array(rng.normal(size=(64, 128)).astype(np.float32) * 0.1, "w3"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], strides=[4, 4]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2"], ["c2"], strides=[2, 2]),
        helper.make_node("Relu", ["c2"], ["r2"]),
        helper.make_node("GlobalAveragePool", ["r2"], ["p"]),
        helper.make_node("Flatten", ["p"], ["f"]),
        helper.make_node("MatMul", ["f", "w3"], ["features"]),
    ]
    graph = helper.make_graph(
        nodes, "tiny", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 224, 224])],
        [helper.make_tensor_value_info("features", TensorProto.FLOAT, ["N", 128])], inits,
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("slide", type=Path)
    ap.add_argument("--tiles", type=int, default=120, help="tiles per reader per run")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--skip-embed", action="store_true")
    args = ap.parse_args()

    from napari_slidescope import open_slide
    from napari_slidescope.tiles import iter_tiles, read_tile, tile_slide

    path = str(args.slide)
    print(f"load before: {os.getloadavg()}")
    slide = open_slide(path)
    mpp0 = slide.mpp[0]
    sets = {
        "0.5 µm/px": tile_slide(slide, tile_um=112, mpp=0.5, min_tissue_fraction=0.5),
        "native L1": tile_slide(
            slide, tile_um=224 * mpp0 * 4, mpp=mpp0 * 4, min_tissue_fraction=0.5
        ),
    }
    peers = {"openslide": _peer_openslide(path), "tiffslide": _peer_tiffslide(path)}
    pool = ThreadPoolExecutor(args.threads)
    for label, tiles in sets.items():
        n_all = len(tiles)
        names = ["ours iter_tiles", "ours read_tile, 1 thread"]
        for peer in peers:
            names += [f"{peer} 1 thread", f"{peer} {args.threads} threads"]
        per = min(args.tiles, n_all // (len(names) * args.runs))
        level = int(tiles["level"][0])
        print(
            f"\n## {label}: {n_all} tissue tiles of {tiles.tile_px} px, level {level}, "
            f"{per} per reader per run, {args.runs} runs, {args.threads} threads"
        )
        order = np.random.default_rng(0).permutation(n_all)
        rates: dict[str, list[float]] = {}

        def run_reader(name: str, sub, level=level) -> None:
            if name == "ours iter_tiles":
                for _ in iter_tiles(slide, sub, threads=args.threads, read_ahead=4 * args.threads):
                    pass
            elif name == "ours read_tile, 1 thread":
                for i in range(len(sub)):
                    read_tile(slide, sub, i)
            else:
                read = peers[name.split()[0]][1]
                if name.endswith("1 thread"):
                    for i in range(len(sub)):
                        _peer_tile(read, sub, i, level)
                else:
                    list(pool.map(lambda i: _peer_tile(read, sub, i, level), range(len(sub))))

        # disjoint tiles for every reader and run; their bytes read once beforehand, so
        # every reader finds them in the page cache and none in its own decoded-tile cache
        parts = [np.sort(order[k * per : (k + 1) * per]) for k in range(len(names) * args.runs)]
        for part in parts:
            _raw_tiles(path, tiles, part)[0].close()
        slot = 0
        for run in range(args.runs):
            k = run % len(names)
            # every reader gets tiles of its own in every run: no reader finds another's
            # (or its own earlier run's) tiles in a cache; the same tiles go to the decode floor
            for name in names[k:] + names[:k]:
                part = parts[slot]
                slot += 1
                sub = tiles.subset(part)
                t0 = time.perf_counter()
                run_reader(name, sub)
                rates.setdefault(name, []).append(per / (time.perf_counter() - t0))
                if name == "ours iter_tiles":
                    floor = _decode_floor(path, tiles, part, args.threads)
                    rates.setdefault(f"decode floor, {args.threads} threads", []).append(
                        per / floor
                    )
        ref = statistics.median(rates["ours iter_tiles"])
        print("| reader | tiles/s (median) | min | max | ours iter_tiles / this |")
        print("|---|---|---|---|---|")
        for name, v in rates.items():
            m = statistics.median(v)
            print(f"| {name} | {m:.1f} | {min(v):.1f} | {max(v):.1f} | {ref / m:.2f} |")
        # same pixels? (ours against openslide + PIL BOX, first tile)
        a = read_tile(slide, tiles, 0).astype(int)
        b = _peer_tile(peers["openslide"][1], tiles, 0, level).astype(int)
        print(
            f"max |ours - openslide+PIL BOX| on tile 0: {np.abs(a - b).max()}, "
            f"mean {np.abs(a - b).mean():.3f}"
        )
    print(f"load after reading: {os.getloadavg()}")
    if args.skip_embed:
        return
    from napari_slidescope.tiles import embed_tiles
    from napari_slidescope.tiles.embed import IMAGENET_MEAN, IMAGENET_STD, _prepare, load_model

    tiles = sets["0.5 µm/px"]
    onnx_path = _tiny_onnx(Path(tempfile.mkdtemp()) / "tiny.onnx")
    model = load_model(onnx_path, device="cpu")
    n_all = len(tiles)
    per = min(args.tiles * 2, n_all // args.runs)
    order = np.random.default_rng(1).permutation(n_all)
    out: dict[str, list[float]] = {}
    waits: list[float] = []
    batch = 16
    for k in range(2 * args.runs + 3):
        _raw_tiles(path, tiles, np.sort(order[(k * per) % n_all :][:per]))[0].close()
    for run in range(args.runs):
        for j, name in enumerate(
            ["overlapped", "sequential"] if run % 2 == 0 else ["sequential", "overlapped"]
        ):
            part = np.sort(order[((2 * run + j) * per) % n_all :][:per])
            if len(part) < per:
                part = np.sort(order[:per])
            sub = tiles.subset(part)
            t0 = time.perf_counter()
            if name == "overlapped":
                ad = embed_tiles(slide, sub, model, batch_size=batch, read_threads=args.threads)
                waits.append(
                    ad.uns["slidescope_tiles"]["runtime"]["model_wait_s"]
                    / ad.uns["slidescope_tiles"]["runtime"]["seconds"]
                )
                out.setdefault("model alone", []).append(
                    per / ad.uns["slidescope_tiles"]["runtime"]["model_s"]
                )
            else:
                mean, std = np.float32(IMAGENET_MEAN), np.float32(IMAGENET_STD)
                for s in range(0, len(sub), batch):
                    imgs = [read_tile(slide, sub, i) for i in range(s, min(s + batch, len(sub)))]
                    model.run(_prepare(imgs, 224, mean, std))
            out.setdefault(name, []).append(per / (time.perf_counter() - t0))
    print(
        f"\n## embed_tiles, tiny ONNX model (CPU, ONNX Runtime), {per} tiles per run, batch {batch}"
    )
    print("| | tiles/s (median) | min | max |")
    print("|---|---|---|---|")
    for name, v in out.items():
        print(f"| {name} | {statistics.median(v):.1f} | {min(v):.1f} | {max(v):.1f} |")
    gain = statistics.median(out["overlapped"]) / statistics.median(out["sequential"])
    print(
        f"overlapped / sequential: {gain:.2f}x; "
        f"model waited on reading {100 * statistics.median(waits):.0f} % of the run (median)"
    )

    # a model slower than reading, as a GPU running a foundation model is: it sleeps
    # (no CPU) 0.25 s per batch of 16 (64 tiles/s); the wait after the first batch is what
    # reading costs it
    def slow_model(x: np.ndarray) -> np.ndarray:
        time.sleep(0.25 * len(x) / batch)
        return x.mean(axis=(2, 3))

    slow_waits = []
    for run in range(3):
        part = np.sort(order[((2 * args.runs + run) * per) % n_all :][:per])
        rt = embed_tiles(slide, tiles.subset(part), slow_model, batch_size=batch)
        rt = rt.uns["slidescope_tiles"]["runtime"]
        slow_waits.append(
            (rt["model_wait_s"] - rt["first_batch_wait_s"], rt["seconds"], rt["first_batch_wait_s"])
        )
    w = statistics.median(v[0] for v in slow_waits)
    print(
        f"model at 64 tiles/s (sleep, as a busy GPU): waited {w:.3f} s after the first batch "
        f"in {statistics.median(v[1] for v in slow_waits):.1f} s runs (first batch "
        f"{statistics.median(v[2] for v in slow_waits):.2f} s), median of 3"
    )
    print(f"load after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
