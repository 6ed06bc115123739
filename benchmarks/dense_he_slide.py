"""Write a slide densely filled with real H&E: MoNuSeg crops tiled as an Aperio scanner encodes.

The 13 MoNuSeg 2018 training images (``$SLIDESCOPE_TESTDATA/nuclei_gt/monuseg_train``,
1000 x 1000 px H&E at 40x, CC BY-NC-SA: the slide is for local benchmarks only) are cut
into 256 x 256 px crops (9 per image) in their 8 rotations and flips: 936 tiles of real
tissue. Each level-0 tile of the slide is one of them, drawn at random (``--seed``), apart
from a ``--margin`` of glass around the tissue. The file is written by
``/work/shared/tools/make_svs_huge.py`` (imported: Aperio's BigTIFF layout, RGB-coded JPEG
tiles with shared JPEGTables, 4x-reduced levels, thumbnail, label, macro), whose tissue and
tile choice are replaced here; the tiles of each reduced level are 24 mosaics of 4 x 4
tiles of the level above, 4x smaller (tissue at the right scale for tissue detection,
not the exact pyramid of level 0).

Usage::

    python benchmarks/dense_he_slide.py OUT.svs [--width 16384 --height 12288 --levels 3]
        [--margin 0 --seed 33 --quality 80]

Prints the tissue area (µm², the tiles that are not glass) the batch should report.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np
import tifffile

#: ../shared beside the repository (as .ci/run expects it), unless the environment says otherwise
SHARED = Path(__file__).resolve().parents[2] / "shared"
TOOLS = Path(os.environ.get("SLIDESCOPE_TOOLS", SHARED / "tools"))
TILE = 256


def library(data: Path) -> list[np.ndarray]:
    """The 936 real-H&E tiles: 9 crops x 8 orientations of each MoNuSeg image."""
    images = sorted(p for p in data.glob("*.tif") if not p.stem.endswith("_instances"))
    if not images:
        raise SystemExit(f"{data}: no MoNuSeg images (<id>.tif) found")
    tiles = []
    for p in images:
        img = tifffile.imread(p)[..., :3]
        h, w = img.shape[:2]
        for y in np.linspace(0, h - TILE, 3).astype(int):
            for x in np.linspace(0, w - TILE, 3).astype(int):
                crop = img[y : y + TILE, x : x + TILE]
                for k in range(4):
                    r = np.rot90(crop, k)
                    tiles += [np.ascontiguousarray(r), np.ascontiguousarray(r[:, ::-1])]
    return tiles


def mosaic(tiles: list[np.ndarray], rng: np.random.Generator) -> np.ndarray:
    """A tile of the next reduced level: 4 x 4 random `tiles`, each 4x smaller (box mean)."""
    out = np.empty((TILE, TILE, 3), np.uint8)
    q = TILE // 4
    for r in range(4):
        for c in range(4):
            t = tiles[int(rng.integers(len(tiles)))].astype(np.float32)
            small = t.reshape(q, 4, q, 4, 3).mean(axis=(1, 3))
            out[r * q : (r + 1) * q, c * q : (c + 1) * q] = np.round(small).astype(np.uint8)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--width", type=int, default=16384)
    ap.add_argument("--height", type=int, default=12288)
    ap.add_argument("--levels", type=int, default=3)
    ap.add_argument("--margin", type=int, default=0, help="glass around the tissue, px")
    ap.add_argument("--seed", type=int, default=33)
    ap.add_argument("--quality", type=int, default=80)
    ap.add_argument("--mpp", type=float, default=0.2457)
    data = Path(os.environ.get("SLIDESCOPE_TESTDATA", SHARED / "testdata"))
    ap.add_argument("--data", type=Path, default=data / "nuclei_gt" / "monuseg_train")
    a = ap.parse_args()

    sys.path.insert(0, str(TOOLS))
    sys.dont_write_bytecode = True
    import huge_common as hc
    import make_svs_huge as msh

    rng = np.random.default_rng(a.seed)
    libraries = [library(a.data)]
    for _ in range(1, a.levels):  # reduced levels: mosaics of 4 x 4 tiles of the level above
        libraries.append([mosaic(libraries[-1], rng) for _ in range(24)])
    glass = hc.glass_texture(TILE, TILE, rng)
    level = [0]

    def kinds_images(h: int, w: int, rng: np.random.Generator, tex_h: int | None = None) -> list:
        return [*libraries[level[0]], glass]

    def choose(seed: int, k: int, R: np.ndarray, C: np.ndarray, t: np.ndarray) -> np.ndarray:
        n = len(libraries[k])
        rng = np.random.default_rng([seed, k, 7])
        kinds = rng.integers(0, n, R.shape)
        fp = TILE * 4**k  # glass: tiles whose level-0 footprint lies in the margin
        y0, x0 = R * fp, C * fp
        y1, x1 = np.minimum(y0 + fp, a.height), np.minimum(x0 + fp, a.width)
        inside = (y1 > a.margin) & (y0 < a.height - a.margin)
        inside &= (x1 > a.margin) & (x0 < a.width - a.margin)
        whole = (y0 >= a.margin) & (y1 <= a.height - a.margin)
        whole &= (x0 >= a.margin) & (x1 <= a.width - a.margin)
        edge = ~inside if k else ~whole
        kinds[edge] = n
        return kinds

    plan_tiled = msh.plan_tiled

    def plan_level(k: int, *args: object) -> dict:
        level[0] = k
        return plan_tiled(k, *args)

    hc.kinds_images = kinds_images
    hc.choose = choose
    msh.plan_tiled = plan_level
    a.out.parent.mkdir(parents=True, exist_ok=True)
    rc = msh.main(
        [
            str(a.out),
            f"--width={a.width}",
            f"--height={a.height}",
            f"--levels={a.levels}",
            f"--quality={a.quality}",
            f"--seed={a.seed}",
            f"--mpp={a.mpp}",
            "--no-verify",
        ]
    )
    m = -(-a.margin // TILE)
    h_end, w_end = a.height - a.margin, a.width - a.margin
    rows = sum(1 for r in range(-(-a.height // TILE)) if r >= m and (r + 1) * TILE <= h_end)
    cols = sum(1 for c in range(-(-a.width // TILE)) if c >= m and (c + 1) * TILE <= w_end)
    area = rows * cols * (TILE * a.mpp) ** 2
    print(
        f"{a.out}: {a.width} x {a.height} px, tissue {rows} x {cols} tiles = {area / 1e6:.2f} mm²"
    )
    return int(rc or 0)


if __name__ == "__main__":
    sys.exit(main())
