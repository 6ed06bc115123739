"""Peak resident memory of embed_tiles over N tiles and over 16 x N tiles of a larger slide.

Usage::

    python benchmarks/tiles_memory.py SMALL_SLIDE LARGE_SLIDE [--factor 16]

Each measurement is a fresh process (``--child``) that cuts 0.5 µm/px, 224 px tissue tiles,
embeds them with a callable model (the mean colour: no model memory to speak of) and prints
its peak RSS (``ru_maxrss``), the tiles and the seconds. The small slide's tiles are all its
tissue tiles; the large slide's are its first ``factor`` times as many (raster order). Memory
is flat when the peak does not grow with the tiles (the decoded-tile cache is bounded at
256 MiB, read-ahead and the batch queue are bounded; the AnnData grows by a few hundred
bytes per tile). The process's peak also holds tissue detection and the tile grid of the
whole slide, which grow with the slide's area, not with the tiles read: hence RSS is also
sampled (psutil, every 20 ms) from just before embedding to its end.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path


def child(path: str, max_tiles: int) -> None:
    import numpy as np

    from napari_slidescope import embed_tiles, open_slide, tile_slide

    t0 = time.perf_counter()
    with open_slide(path) as slide:
        tiles = tile_slide(slide, tile_um=112, mpp=0.5)
        if max_tiles:
            tiles = tiles.subset(np.arange(min(max_tiles, len(tiles))))
        import threading

        import psutil

        proc = psutil.Process()
        base = proc.memory_info().rss / 2**20
        during = [base]
        stop = threading.Event()

        def sample() -> None:  # resident memory while embedding, every 20 ms
            while not stop.wait(0.02):
                during.append(proc.memory_info().rss / 2**20)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        adata = embed_tiles(slide, tiles, lambda b: b.mean(axis=(2, 3)), batch_size=32)
        stop.set()
        sampler.join()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    rt = adata.uns["slidescope_tiles"]["runtime"]
    print(json.dumps({
        "tiles": len(tiles), "peak_mib": peak, "before_embed_mib": base,
        "embed_peak_mib": max(during),
        "seconds": time.perf_counter() - t0, "tiles_per_s": rt["tiles_per_s"],
    }))  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("small", nargs="?")
    ap.add_argument("large", nargs="?")
    ap.add_argument("--factor", type=int, default=16)
    ap.add_argument("--child", nargs=2, metavar=("SLIDE", "MAX_TILES"))
    args = ap.parse_args()
    if args.child:
        child(args.child[0], int(args.child[1]))
        return

    def run(path: str, n: int) -> dict:
        out = subprocess.run(
            [sys.executable, __file__, "--child", path, str(n)],
            capture_output=True, text=True, check=True, env=os.environ,
        )  # fmt: skip
        return json.loads(out.stdout.strip().splitlines()[-1])

    print(f"load before: {os.getloadavg()}")
    small = run(str(Path(args.small)), 0)
    large = run(str(Path(args.large)), small["tiles"] * args.factor)
    for name, r in (("small", small), ("large", large)):
        print(
            f"{name}: {r['tiles']} tiles, process peak RSS {r['peak_mib']:.0f} MiB; RSS "
            f"{r['before_embed_mib']:.0f} MiB before embedding, at most "
            f"{r['embed_peak_mib']:.0f} MiB while embedding; {r['seconds']:.0f} s, "
            f"{r['tiles_per_s']:.1f} tiles/s"
        )
    ratio_t = large["tiles"] / small["tiles"]
    grow = (large["embed_peak_mib"] - large["before_embed_mib"]) / max(
        1.0, small["embed_peak_mib"] - small["before_embed_mib"]
    )
    print(
        f"tiles x{ratio_t:.1f}; process peak x{large['peak_mib'] / small['peak_mib']:.2f}; "
        f"growth while embedding x{grow:.2f}"
    )
    print(f"load after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
