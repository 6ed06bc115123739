"""Write a large synthetic slide with known tissue regions (for benchmarks/regions_*.py).

Usage: python benchmarks/regions_data.py OUT.svs [--height 24000 --width 30000 --mpp 0.5
--seed 0 --region-um 400 --workers 2]

Level 0 is drawn in bands of 256 rows (napari_slidescope.sample_regions.render_regions, on
`--workers` processes) and streamed to tifffile as 256 x 256 JPEG tiles; 4x levels follow,
as an Aperio SVS. OUT.truth.npz holds the truth map (8 µm per pixel) and the parameters,
from which ``RegionTruth`` is rebuilt. Nothing of the slide is held whole in memory but its
4x level.
"""

from __future__ import annotations

import argparse
import math
import multiprocessing as mp
import time
from pathlib import Path

import numpy as np

from napari_slidescope.sample_regions import RegionTruth, make_region_truth, render_regions

TILE = 256
_TRUTH: RegionTruth | None = None


def _init(truth: RegionTruth) -> None:
    global _TRUTH
    _TRUTH = truth


def _band(args: tuple[int, int, int]) -> np.ndarray:
    y0, y1, w = args
    assert _TRUTH is not None
    return render_regions(_TRUTH, (y0, 0, y1, w))


def _down4(img: np.ndarray) -> np.ndarray:
    h, w = img.shape[0] // 4 * 4, img.shape[1] // 4 * 4
    b = img[:h, :w].reshape(h // 4, 4, w // 4, 4, 3).astype(np.uint16)
    return (b.sum((1, 3)) // 16).astype(np.uint8)


def load_truth(path: str | Path) -> RegionTruth:
    """Rebuild the truth written beside a slide (``OUT.truth.npz``)."""
    with np.load(Path(str(path) + ".truth.npz")) as z:
        return RegionTruth(z["labels"], float(z["mpp"]), tuple(z["shape"].tolist()), int(z["seed"]))


def main(argv: list[str] | None = None) -> None:
    import tifffile

    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("out")
    ap.add_argument("--height", type=int, default=24000)
    ap.add_argument("--width", type=int, default=30000)
    ap.add_argument("--mpp", type=float, default=0.5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--region-um", type=float, default=400.0)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--quality", type=int, default=85)
    a = ap.parse_args(argv)
    h, w = a.height, a.width
    t0 = time.perf_counter()
    truth = make_region_truth((h, w), mpp=a.mpp, seed=a.seed, region_um=a.region_um)
    np.savez_compressed(
        a.out + ".truth.npz", labels=truth.labels, mpp=a.mpp, shape=np.array([h, w]), seed=a.seed
    )
    l1 = np.zeros((h // 4, w // 4, 3), np.uint8)
    bands = [(y, min(y + TILE, h), w) for y in range(0, h, TILE)]

    def tiles():
        with mp.get_context("fork").Pool(a.workers, _init, (truth,)) as pool:
            for r, row in enumerate(pool.imap(_band, bands, chunksize=1)):
                y0 = bands[r][0]
                d = _down4(row)
                l1[y0 // 4 : y0 // 4 + d.shape[0], : d.shape[1]] = d
                for c in range(math.ceil(w / TILE)):
                    t = row[:, c * TILE : (c + 1) * TILE]
                    if t.shape[:2] != (TILE, TILE):
                        pad = np.full((TILE, TILE, 3), 255, np.uint8)
                        pad[: t.shape[0], : t.shape[1]] = t
                        t = pad
                    yield t
                if r % 10 == 0:
                    print(f"band {r + 1}/{len(bands)} {time.perf_counter() - t0:.0f}s", flush=True)

    desc = (
        "Aperio Image Library v12.0.15 \r\n"
        f"{w}x{h} [0,0 {w}x{h}] ({TILE}x{TILE}) JPEG/RGB Q={a.quality}"
        f"|AppMag = {round(10 / a.mpp)}|MPP = {a.mpp:.4f}|Filename = regions"
    )
    opts = dict(
        photometric="rgb", compression="jpeg", compressionargs={"level": a.quality}, metadata=None
    )
    with tifffile.TiffWriter(a.out, bigtiff=True) as tw:
        tw.write(
            tiles(), shape=(h, w, 3), dtype=np.uint8, tile=(TILE, TILE), description=desc, **opts
        )
        levels = [l1]
        while min(levels[-1].shape[:2]) // 4 >= 512:
            levels.append(_down4(levels[-1]))
        tw.write(
            levels[-1][::2, ::2], description=desc.replace("JPEG/RGB", "thumbnail JPEG/RGB"), **opts
        )
        for lv in levels:
            tw.write(lv, tile=(TILE, TILE), description=desc, **opts)
    print(f"wrote {a.out} in {time.perf_counter() - t0:.0f}s", flush=True)


if __name__ == "__main__":
    main()
