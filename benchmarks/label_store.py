"""The whole-slide label pyramid's store: zarr (OME-NGFF labels) against the old zlib files.

Both stores get the same work in the same run, interleaved, ``--reps`` times each:

* paste: ``--tiles`` tiles of 1024 x 1024 level-0 labels (about 700 disc nuclei each,
  ids unique per tile) into a ``--side`` px square pyramid, every level updated (what a
  whole-slide run does); figure: level-0 megapixels pasted per second;
* viewport: a 1920 x 1080 box of level 0 over painted tiles, read from a cold cache (the
  decoded-chunk cache emptied: every chunk read from disk and decompressed) and warm
  (the median of 20 reads from the cache);
* disk: bytes of the store's files after the pastes.

The baseline is the previous ``pipeline/label_pyramid.py`` (hand-written zlib chunk
files), loaded from a file given by ``--baseline`` (e.g. a ``git show`` of main before
the zarr store landed). Printed: medians per store and the ratios zarr / baseline.

``--codecs STORE`` instead compares chunk codecs on the level-0 chunks of an existing
label store (e.g. a batch folder's ``labels.zarr/labels/nuclei``): mean encoded size,
encode and decode time per chunk (numcodecs, one thread), the median of ``--reps`` runs.

Usage::

    python benchmarks/label_store.py --codecs OUT/<slide>/labels.zarr/labels/nuclei
    git show 1a0715f:src/napari_slidescope/pipeline/label_pyramid.py > /tmp/old_pyramid.py
    python benchmarks/label_store.py --baseline /tmp/old_pyramid.py [--reps 5]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np


def _load(path: str) -> Any:
    spec = importlib.util.spec_from_file_location("baseline_label_pyramid", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _tile(seed: int, n: int = 700, side: int = 1024) -> np.ndarray:
    from skimage.draw import disk

    rng = np.random.default_rng(seed)
    out = np.zeros((side, side), np.int32)
    for i in range(n):
        r = rng.uniform(4, 9)
        cy, cx = rng.uniform(r, side - r, 2)
        rr, cc = disk((cy, cx), r, shape=out.shape)
        sub = out[rr, cc]
        out[rr[sub == 0], cc[sub == 0]] = i + 1
    return out


def _du(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _run(cls: Any, root: Path, side: int, tiles: list[np.ndarray], n: int) -> dict[str, float]:
    pyr = cls((side, side), root=root)
    per_row = side // 1024
    t0 = time.perf_counter()
    for k in range(n):
        y, x = divmod(k, per_row)
        lab = tiles[k % len(tiles)]
        box = (y * 1024, x * 1024, y * 1024 + 1024, x * 1024 + 1024)
        pyr.paste(box, lab + k * 1000 * (lab > 0))
    paste = time.perf_counter() - t0
    box = (300, 300, 300 + 1080, 300 + 1920)
    pyr._cache.clear()
    if hasattr(pyr, "_cached_bytes"):
        pyr._cached_bytes = 0
    t0 = time.perf_counter()
    cold_arr = pyr.levels[0][box[0] : box[2], box[1] : box[3]]
    cold = time.perf_counter() - t0
    warms = []
    for _ in range(20):
        t0 = time.perf_counter()
        warm_arr = pyr.levels[0][box[0] : box[2], box[1] : box[3]]
        warms.append(time.perf_counter() - t0)
    warm = statistics.median(warms)
    assert np.array_equal(cold_arr, warm_arr) and cold_arr.any()
    size = _du(pyr.path)
    pyr.close()
    return {
        "paste_mpx_s": n * 1024 * 1024 / 1e6 / paste,
        "cold_ms": 1e3 * cold,
        "warm_ms": 1e3 * warm,
        "disk_mib": size / 2**20,
    }


def codecs(store: str, reps: int) -> None:
    from numcodecs import Blosc, Zlib, Zstd

    from napari_slidescope.pipeline.label_pyramid import LabelPyramid

    pyr = LabelPyramid.open(store)
    c = pyr.chunk
    h, w = pyr.levels[0].shape
    chunks = []
    for cy in range(h // c):
        for cx in range(w // c):
            a = np.ascontiguousarray(pyr.levels[0][cy * c : (cy + 1) * c, cx * c : (cx + 1) * c])
            if a.any():
                chunks.append(a)
            if len(chunks) >= 64:
                break
        if len(chunks) >= 64:
            break
    candidates = {
        "zstd 1 (ours)": Zstd(level=1),
        "blosc zstd 3 shuffle": Blosc("zstd", 3, Blosc.SHUFFLE),
        "blosc lz4 5 shuffle": Blosc("lz4", 5, Blosc.SHUFFLE),
        "zlib 1 (old store)": Zlib(1),
    }
    print(f"{len(chunks)} non-empty {c} x {c} int32 chunks of {store}; load {os.getloadavg()}")
    print(f"{'codec':24s}{'KiB/chunk':>12s}{'encode ms':>12s}{'decode ms':>12s}")
    for name, codec in candidates.items():
        enc_t, dec_t = [], []
        for _ in range(reps):
            t0 = time.perf_counter()
            enc = [codec.encode(a) for a in chunks]
            enc_t.append((time.perf_counter() - t0) / len(chunks))
            t0 = time.perf_counter()
            for e in enc:
                codec.decode(e)
            dec_t.append((time.perf_counter() - t0) / len(chunks))
        kib = statistics.fmean(len(e) for e in enc) / 1024
        print(
            f"{name:24s}{kib:12.1f}{1e3 * statistics.median(enc_t):12.2f}"
            f"{1e3 * statistics.median(dec_t):12.2f}"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--baseline", help="the old label_pyramid.py")
    ap.add_argument("--codecs", help="compare chunk codecs on this label store instead")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--side", type=int, default=16384, help="level-0 side, px")
    ap.add_argument("--tiles", type=int, default=64, help="1024 px tiles pasted")
    args = ap.parse_args()
    if args.codecs:
        codecs(args.codecs, args.reps)
        return
    if not args.baseline:
        ap.error("--baseline is required (or --codecs)")

    import zarr

    from napari_slidescope.pipeline.label_pyramid import LabelPyramid

    old = _load(args.baseline).LabelPyramid
    stores = {"zlib-files (baseline)": old, f"zarr {zarr.__version__}": LabelPyramid}
    tiles = [_tile(s) for s in range(4)]
    results: dict[str, list[dict[str, float]]] = {k: [] for k in stores}
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_TMP")) as tmp:
        for rep in range(args.reps):
            order = list(stores.items()) if rep % 2 == 0 else list(stores.items())[::-1]
            for name, cls in order:
                results[name].append(_run(cls, Path(tmp), args.side, tiles, args.tiles))
    print(f"load average: {os.getloadavg()}; {args.reps} reps, {args.tiles} tiles of 1024^2")
    med = {
        name: {k: statistics.median(r[k] for r in rows) for k in rows[0]}
        for name, rows in results.items()
    }
    keys = ["paste_mpx_s", "cold_ms", "warm_ms", "disk_mib"]
    print(f"{'store':28s}" + "".join(f"{k:>14s}" for k in keys))
    for name, m in med.items():
        print(f"{name:28s}" + "".join(f"{m[k]:14.2f}" for k in keys))
    base, new = med[list(stores)[0]], med[list(stores)[1]]
    print(f"{'ratio zarr / baseline':28s}" + "".join(f"{new[k] / base[k]:14.2f}" for k in keys))


if __name__ == "__main__":
    main()
