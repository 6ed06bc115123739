"""The tissue gate of region classification: why fat at a section's edge was lost, and the fix.

Usage: python benchmarks/regions_gate.py [--data DIR] [--large SYNTH24K.svs] [--runs 5]

DIR (default $SLIDESCOPE_BENCH_DATA/regions, else ./bench-data-regions) holds the 2 x 2 mm
synthetic slides of benchmarks/regions_accuracy.py (written there when absent). SYNTH24K is a
slide of benchmarks/regions_data.py (24000 x 30000 px) for the time of the gate.

Prints:
1. why: on the 40x synthetic slide's held-out right half, at the gate's 8 µm/px, the
   brightfield feature of fat and glass against the threshold, and the share of truth fat
   each step keeps (threshold, a manual threshold at the range's low end, every hole
   filled), and the fat's feature at 2 µm/px (the resolution's part);
2. before/after: the share of truth fat kept and of truth glass taken in by
   ``regions_tissue`` with envelopes of 0 (the gate before), 32, 64 and 96 µm, on that half
   and on a composite of real textures (NCT-CRC-HE-100K ADI fat beside STR stroma, open to
   BACK glass, from $SLIDESCOPE_TESTDATA/regions), and the area the envelope adds on two
   real slides of the test data without fat truth (CMU-1-Small-Region, TCGA-CR-7395);
3. time: ``regions_tissue`` with envelope 0 and 64 µm on SYNTH24K, interleaved, medians of
   `--runs`, and their ratio; the tissue tiles and pixels each gives the classification;
4. with ``--classify-runs N``: the whole-slide ``classify_regions`` of SYNTH24K gated by
   each (gate included; classifier from 5 strokes per class of its truth), interleaved,
   medians of N, with pixel accuracy on every truth tissue pixel and the fat's IoU.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))

from napari_slidescope import open_slide, regions_tissue  # noqa: E402
from napari_slidescope.analysis.resample import block_mean  # noqa: E402
from napari_slidescope.analysis.tissue import brightfield_feature, tissue_mask  # noqa: E402
from napari_slidescope.pipeline.region_map import TISSUE_MAX_HOLE_UM2  # noqa: E402

FAT, GLASS = 4, 0
ENVELOPES = (0.0, 32.0, 64.0, 96.0)
SHARED = Path(__file__).resolve().parents[2] / "shared" / "testdata"


def testdata() -> Path:
    return Path(os.environ.get("SLIDESCOPE_TESTDATA", SHARED))


def _texture(prefix: str) -> np.ndarray:
    import tifffile

    folder = testdata() / "regions" / "nct_crc_he_100k_samples" / "images"
    return np.asarray(tifffile.imread(next(folder.glob(f"{prefix}-*.tif"))))


def _tiled(tile: np.ndarray, shape: tuple[int, int]) -> np.ndarray:
    """Mirror-tile a texture (no seams at its borders) to `shape`."""
    m = np.concatenate([tile, tile[:, ::-1]], 1)
    m = np.concatenate([m, m[::-1]], 0)
    reps = (shape[0] // m.shape[0] + 1, shape[1] // m.shape[1] + 1, 1)
    return np.tile(m, reps)[: shape[0], : shape[1]]


def composite(n: int = 4096) -> tuple[np.ndarray, np.ndarray]:
    """Real textures at 0.5 µm/px: stroma, then fat open to glass above, below and right.

    Returns the RGB image and its truth (0 glass, 2 stroma, 4 fat; the classes of
    ``sample_regions``).
    """
    rgb = _tiled(_texture("BACK"), (n, n)).copy()
    truth = np.zeros((n, n), np.uint8)
    yy, xx = np.mgrid[0:n, 0:n]
    section = (np.abs(yy - n / 2) < 0.4 * n) & (xx > 0.1 * n) & (xx < 0.75 * n)
    for k, prefix, m in (
        (2, "STR", section & (xx < 0.45 * n)),
        (4, "ADI", section & (xx >= 0.45 * n)),
    ):
        rgb[m] = _tiled(_texture(prefix), (n, n))[m]
        truth[m] = k
    return rgb, truth


def _on_mask(tissue, truth_at) -> np.ndarray:
    """Truth class at each mask pixel centre (`truth_at(rows, cols)` in level-0 px)."""
    h, w = tissue.mask.shape
    dy, dx = tissue.downsample
    r = tissue.origin[0] + (np.arange(h) + 0.5) * dy
    c = tissue.origin[1] + (np.arange(w) + 0.5) * dx
    return truth_at(r[:, None], c[None, :])


def shares(tissue, want: np.ndarray, region=None) -> dict[int, float]:
    """Share of each truth class's mask pixels inside the gate (within `region` only)."""
    inside = np.ones(want.shape, bool)
    if region is not None:
        y0, x0, y1, x1 = region
        h, w = want.shape
        dy, dx = tissue.downsample
        r = tissue.origin[0] + (np.arange(h) + 0.5) * dy
        c = tissue.origin[1] + (np.arange(w) + 0.5) * dx
        inside = ((r >= y0) & (r < y1))[:, None] & ((c >= x0) & (c < x1))[None, :]
    return {
        int(k): float(tissue.mask[inside & (want == k)].mean()) for k in np.unique(want[inside])
    }


def why(path: Path, truth) -> None:
    print("## 1. why fat at the section's edge is lost (40x synthetic, right half)")
    with open_slide(path) as s:
        t = regions_tissue(s, envelope_um=0)
        f = int(round(t.downsample[0] / s.downsamples[t.level][0]))
        img = block_mean(np.asarray(s.read_level(t.level, (0, 0, *s.level_shapes[t.level]))), f)
        img = img.astype(np.uint8)[: t.mask.shape[0], : t.mask.shape[1]]
        lv2 = s.level_for_mpp(2.0)
        f2 = int(round(2.0 / (s.mpp[0] * s.downsamples[lv2][0])))
        img2 = block_mean(np.asarray(s.read_level(lv2, (0, 0, *s.level_shapes[lv2]))), f2)
    want = _on_mask(t, truth.classes_at)
    right = want.copy()
    right[:, : want.shape[1] // 2] = 255
    feat = brightfield_feature(img)
    print(
        f"gate grid {t.mpp:g} µm/px, automatic threshold {t.threshold:.3f} (clipped to 0.08-0.30)"
    )
    for k, name in ((FAT, "fat"), (GLASS, "glass")):
        v = feat[right == k]
        print(
            f"feature of {name} at 8 µm/px: p10 {np.percentile(v, 10):.3f}, median "
            f"{np.median(v):.3f}, p90 {np.percentile(v, 90):.3f}"
        )
    g2 = truth.grid(2.0 / truth.mpp, img2.shape[:2])
    v2 = brightfield_feature(img2.astype(np.uint8))[
        (g2 == FAT)[:, :] & (np.arange(g2.shape[1]) >= g2.shape[1] // 2)[None, :]
    ]
    print(
        f"feature of fat at 2 µm/px: median {np.median(v2):.3f}, p90 {np.percentile(v2, 90):.3f} "
        f"(membranes: {np.mean(v2 > t.threshold):.1%} of fat pixels above the threshold)"
    )
    steps = {
        "default (threshold, close/open, pieces >= 2500 µm², holes <= 1000 µm²)": dict(),
        "holes <= 250000 µm² (the regions gate before)": dict(max_hole_um2=TISSUE_MAX_HOLE_UM2),
        "every hole filled (outer_only)": dict(outer_only=True),
        "manual threshold 0.08 (the range's low end), holes <= 250000 µm²": dict(
            threshold=0.08, max_hole_um2=TISSUE_MAX_HOLE_UM2
        ),
        "manual threshold 0.05, holes <= 250000 µm²": dict(
            threshold=0.05, max_hole_um2=TISSUE_MAX_HOLE_UM2
        ),
        "envelope 64 µm, holes <= 250000 µm² (the gate now)": dict(
            envelope_um=64.0, max_hole_um2=TISSUE_MAX_HOLE_UM2
        ),
    }
    print("| mask | truth fat kept | truth glass taken in |")
    print("|---|---|---|")
    for label, kw in steps.items():
        m, _ = tissue_mask(img, mpp=t.mpp, **kw)
        print(f"| {label} | {m[right == FAT].mean():.3f} | {m[right == GLASS].mean():.3f} |")


def before_after(path: Path, truth) -> None:
    print("\n## 2. before (envelope 0) / after: share of truth pixels inside the gate")
    print("| data | envelope µm | fat kept | glass taken in | other tissue kept | gate px |")
    print("|---|---|---|---|---|---|")
    h, w = truth.shape
    right = (0, w // 2, h, w)
    with open_slide(path) as s:
        for e in ENVELOPES:
            t = regions_tissue(s, region=right, envelope_um=e)
            sh = shares(t, _on_mask(t, truth.classes_at), right)
            other = statistics.mean(v for k, v in sh.items() if k not in (FAT, GLASS))
            print(
                f"| synthetic 40x, right half | {e:g} | {sh[FAT]:.3f} | {sh[GLASS]:.4f} | "
                f"{other:.3f} | {int(t.mask.sum())} |",
                flush=True,
            )
    rgb, lab = composite()

    def lab_at(r: np.ndarray, c: np.ndarray) -> np.ndarray:
        ri = np.clip(r.astype(np.intp), 0, lab.shape[0] - 1)
        ci = np.clip(c.astype(np.intp), 0, lab.shape[1] - 1)
        return lab[ri, ci]

    for e in ENVELOPES:
        t = regions_tissue(rgb, envelope_um=e, slide_mpp=0.5)
        sh = shares(t, _on_mask(t, lab_at))
        print(
            f"| real textures (ADI fat, STR, BACK glass) | {e:g} | {sh[FAT]:.3f} | "
            f"{sh[GLASS]:.4f} | {sh[2]:.3f} | {int(t.mask.sum())} |",
            flush=True,
        )
    print(
        "\n| real slide (no truth) | envelope µm | gate area, % of the slide "
        "| added by the envelope, % of the tissue |"
    )
    print("|---|---|---|---|")
    for name in ("CMU-1-Small-Region.svs", "TCGA-CR-7395-01A-01-TS1.svs"):
        p = testdata() / name
        if not p.exists():
            print(f"| {name} | absent | | |")
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the TCGA slide has no pixel size
            with open_slide(p) as s:
                base = regions_tissue(s, envelope_um=0).mask
                for e in ENVELOPES[1:]:
                    m = regions_tissue(s, envelope_um=e).mask
                    print(
                        f"| {name} | {e:g} | {m.mean():.1%} | "
                        f"{(m & ~base).sum() / max(base.sum(), 1):.1%} |"
                    )


def timing(path: Path, runs: int) -> None:
    print(f"\n## 3. time of the gate on {path.name} (interleaved, median of {runs})")
    times: dict[float, list[float]] = {0.0: [], 64.0: []}
    with open_slide(path) as s:
        print(f"slide {s.shape0[0]} x {s.shape0[1]} px at {s.mpp[0]:g} µm/px")
        regions_tissue(s, envelope_um=64.0)  # warm: file cache, imports
        for _ in range(runs):
            for e in times:
                t0 = time.perf_counter()
                t = regions_tissue(s, envelope_um=e)
                times[e].append(time.perf_counter() - t0)
                if e:
                    px = t.mask.shape
        work = {}
        for e in times:  # what the classification then reads (512-px tiles at 2 µm/px)
            t = regions_tissue(s, envelope_um=e)
            k = max(1, round(512 * 2.0 / t.mpp))  # mask pixels per tile side
            h, w = t.mask.shape
            pad = np.zeros((-(-h // k) * k, -(-w // k) * k), bool)
            pad[:h, :w] = t.mask
            tiles = int(pad.reshape(pad.shape[0] // k, k, -1, k).any(axis=(1, 3)).sum())
            work[e] = (tiles, t.mask.sum() * (t.mpp / 2.0) ** 2 / 1e6)
    for e, (tiles, mpx) in work.items():
        print(f"envelope {e:g} µm: {tiles} tissue tiles of 512 px, {mpx:.1f} Mpx at 2 µm/px")
    m0, m64 = statistics.median(times[0.0]), statistics.median(times[64.0])
    print(f"gate grid {px[0]} x {px[1]} px")
    print(f"envelope 0 (the gate before): median {m0:.3f} s  {[round(v, 3) for v in times[0.0]]}")
    print(
        f"envelope 64 µm (the gate now): median {m64:.3f} s  {[round(v, 3) for v in times[64.0]]}"
    )
    print(f"ratio now / before: {m64 / m0:.2f}; added {m64 - m0:.3f} s")


def whole_slide(path: Path, runs: int) -> None:
    from napari_slidescope import classify_regions, train_region_classifier
    from regions_data import load_truth

    print(f"\n## 4. whole-slide classify_regions on {path.name}, gate included (median of {runs})")
    truth = load_truth(path)
    clf = train_region_classifier(path, truth.example_lines(per_class=5, seed=0))
    times: dict[float, list[float]] = {0.0: [], 64.0: []}
    score = {}
    with open_slide(path) as s:
        for _ in range(runs):
            for e in times:
                t0 = time.perf_counter()
                rm = classify_regions(s, clf, tissue=regions_tissue(s, envelope_um=e))
                times[e].append(time.perf_counter() - t0)
                want = truth.grid(rm.downsample[0], rm.labels.shape, rm.origin)
                ok = want > 0
                k = rm.classes.index("Fat") + 1
                a, b = rm.labels == k, want == FAT
                score[e] = (
                    float((rm.labels[ok] == want[ok]).mean()),
                    float((a & b).sum() / max((a | b).sum(), 1)),
                    float((rm.labels[want == 0] > 0).mean()),
                )
    print(
        "| gate | median s | runs s | pixel accuracy (truth tissue) | Fat IoU | glass classified |"
    )
    print("|---|---|---|---|---|---|")
    for e, ts in times.items():
        acc, iou, glass = score[e]
        print(
            f"| envelope {e:g} µm | {statistics.median(ts):.1f} | {[round(v, 1) for v in ts]} | "
            f"{acc:.3f} | {iou:.3f} | {glass:.4f} |"
        )
    print(
        f"ratio now / before: {statistics.median(times[64.0]) / statistics.median(times[0.0]):.2f}"
    )
    glass_taken(path, truth)


def glass_taken(path: Path, truth) -> None:
    """Where the glass inside the gate lies: its distance to truth tissue."""
    from scipy import ndimage

    with open_slide(path) as s:
        t = regions_tissue(s, envelope_um=64.0)
    want = _on_mask(t, truth.classes_at)
    far = ndimage.distance_transform_edt(want == GLASS) * t.mpp
    taken = t.mask & (want == GLASS)
    if taken.any():
        p50, p90, top = np.percentile(far[taken], [50, 90, 100])
        print(
            f"glass in the gate now: {int(taken.sum())} of {int((want == GLASS).sum())} gate px; "
            f"distance to truth tissue median {p50:.0f} µm, p90 {p90:.0f} µm, max {top:.0f} µm"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    root = os.environ.get("SLIDESCOPE_BENCH_DATA")
    ap.add_argument("--data", default=str(Path(root) / "regions") if root else "bench-data-regions")
    ap.add_argument("--large", default=None)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--classify-runs", type=int, default=0)
    a = ap.parse_args()
    print(f"load average at start: {os.getloadavg()}", flush=True)
    from regions_accuracy import slides

    p40, t40 = slides(Path(a.data))["40x"]
    why(p40, t40)
    before_after(p40, t40)
    if a.large:
        timing(Path(a.large), a.runs)
        if a.classify_runs:
            whole_slide(Path(a.large), a.classify_runs)
    print(f"load average at end: {os.getloadavg()}")


if __name__ == "__main__":
    main()
