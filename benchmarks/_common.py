"""Helpers every reader benchmark shares: timing, medians, rotation, page cache, reports."""

from __future__ import annotations

import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from _readers import Reader


def warm_page_cache(path: Path) -> None:
    """Read the whole file once so every reader finds it in the page cache."""
    with open(path, "rb") as fh:
        while fh.read(16 * 2**20):
            pass


def timed(reader: Reader, level: int, y: int, x: int, h: int, w: int) -> float:
    reader.prepare(level, y, x, h, w)
    t0 = time.perf_counter()
    reader.read(level, y, x, h, w)
    return time.perf_counter() - t0


def rotate(items: list[Any], k: int) -> list[Any]:
    k %= len(items)
    return items[k:] + items[:k]


def med_ms(values: list[float]) -> float:
    return 1e3 * statistics.median(values)


def pass_summary(per_pass: list[list[float]]) -> dict[str, float]:
    """Median of the per-pass medians, with the lowest and highest pass median."""
    meds = [med_ms(v) for v in per_pass if v]
    return {
        "median": statistics.median(meds),
        "lo": min(meds),
        "hi": max(meds),
        "n": sum(map(len, per_pass)),
    }


def level_map(readers: dict[str, Reader]) -> dict[str, list[int | None]]:
    """For each of our levels, the index of the reader's level with the same shape."""
    ours = readers["ours"].levels()
    out: dict[str, list[int | None]] = {}
    for name, r in readers.items():
        theirs = [tuple(s) for s in r.levels()]
        out[name] = [theirs.index(tuple(s)) if tuple(s) in theirs else None for s in ours]
    return out


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def pan_path(y: int, x: int, s: int) -> list[tuple[int, int]]:
    q = s // 4
    path = [(y, x)]
    for dy, dx in [(0, q)] * 8 + [(q, 0)] * 8 + [(0, -q)] * 8:
        y, x = y + dy, x + dx
        path.append((y, x))
    return path


def machine() -> str:
    cpu = platform.processor() or "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        ncpu = len(os.sched_getaffinity(0))
    except AttributeError:
        ncpu = os.cpu_count() or 0
    mem = "?"
    try:
        import psutil

        mem = f"{psutil.virtual_memory().total / 2**30:.0f} GiB"
    except ImportError:
        pass
    return f"{cpu}, {ncpu} cores available, {mem} RAM, {platform.system()} {platform.release()}"


def versions() -> str:
    import importlib.metadata as md

    names = [
        "napari-slidescope",
        "tifffile",
        "zarr",
        "dask",
        "imagecodecs",
        "numpy",
        "openslide-python",
        "openslide-bin",
        "tiffslide",
        "napari-tiff",
    ]
    parts = [f"Python {platform.python_version()}"]
    for n in names:
        try:
            parts.append(f"{n} {md.version(n)}")
        except md.PackageNotFoundError:
            parts.append(f"{n} (missing)")
    try:
        import imagecodecs

        parts.append(imagecodecs.jpeg8_version())
    except Exception:
        pass
    return ", ".join(parts)


def fmt(v: float) -> str:
    return f"{v:.1f}" if v >= 1 else f"{v:.2f}"


def table(rows: list[list[str]], head: list[str]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def write_results(path: Path, text: str, start: str, end: str) -> None:
    """Replace the block between the ``start`` and ``end`` markers of ``path`` by ``text``."""
    block = f"{start}\n{text}\n{end}"
    old = path.read_text() if path.is_file() else "# Benchmark results\n"
    if start in old and end in old:
        head, rest = old.split(start, 1)
        tail = rest.split(end, 1)[1]
        new = head + block + tail
    else:
        new = old.rstrip("\n") + "\n\n" + block + "\n"
    path.write_text(new)
