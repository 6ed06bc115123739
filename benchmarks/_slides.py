"""The big synthetic slides the reader benchmark needs, written once into a cache folder.

* ``svs_40k.svs``: 40000 x 40000 Aperio-SVS-like, 256 x 256 JPEG tiles, 4x pyramid
  (``../shared/tools/make_svs.py --width 40000 --height 40000 --seed 0``, ~4 min, 2.4 GB peak);
* ``ndpi_30k.ndpi``: 30720 x 23040 Hamamatsu-NDPI-faithful, one JPEG per level with a
  restart marker every 3840 px (``make_ndpi.py --subsampling 444``, ~5 min);
* ``tiles_10k.tif``, ``tiles_550.tif`` and ``tiles_1m.tif``: one-level BigTIFFs of 100 x 100,
  550 x 550 and 1024 x 1024 tiles of 256 x 256 px (10 000, 302 500 and 1 048 576 native
  chunks; 550 x 550 tiles are the pixel count of the largest real slides) whose tile table points,
  cyclically, at 256 real JPEG tiles copied from the SVS: the pixels of a big slide for the
  price of a small file (16 MiB of tile table), written in about a second.

Each file is written to ``NAME.part`` and renamed when complete, so an interrupted run
never leaves a file that looks finished. If another process is already writing a slide
with the same generator (``pgrep -af make_svs``), we wait for it instead of writing twice.
"""

from __future__ import annotations

import os
import struct
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

#: Where the slides are kept (override with $SLIDESCOPE_BENCH_CACHE).
CACHE_ENV = "SLIDESCOPE_BENCH_CACHE"

#: The shared generators (override with $SLIDESCOPE_TOOLS).
TOOLS_ENV = "SLIDESCOPE_TOOLS"


def cache_dir() -> Path:
    """Return the benchmark cache folder, created if needed."""
    root = os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "napari-slidescope" / "bench"
    path = Path(root)
    path.mkdir(parents=True, exist_ok=True)
    return path


def tools_dir() -> Path:
    """Return the folder holding make_svs.py and make_ndpi.py."""
    env = os.environ.get(TOOLS_ENV)
    if env:
        return Path(env)
    cand = Path(__file__).resolve().parents[2] / "shared" / "tools"  # ../shared beside the repo
    if (cand / "make_svs.py").is_file():
        return cand
    raise FileNotFoundError(f"cannot find make_svs.py; set ${TOOLS_ENV} to the shared tools folder")


def _log(msg: str) -> None:
    print(f"[slides {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def _writers_of(name: str, script: str) -> list[str]:
    """Command lines of running generator processes that mention `name`."""
    try:
        out = subprocess.run(["pgrep", "-af", script], capture_output=True, text=True, check=False)
    except FileNotFoundError:
        return []
    me = str(os.getpid())
    return [
        line
        for line in out.stdout.splitlines()
        if name in line and not line.startswith(me + " ") and "pgrep" not in line
    ]


def _wait_for_others(name: str, script: str) -> None:
    waited = False
    while _writers_of(name, script):
        if not waited:
            _log(f"another process is writing {name} ({script}); waiting for it")
            waited = True
        time.sleep(5)


def _generate(path: Path, script: str, args: list[str]) -> Path:
    _wait_for_others(path.name, script)
    if path.is_file():
        return path
    part = path.with_name(path.name + ".part")
    cmd = [sys.executable, str(tools_dir() / script), str(part), *args]
    _log(f"writing {path} once: {' '.join(cmd)}")
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True)
    part.rename(path)
    _log(f"wrote {path} in {time.perf_counter() - t0:.0f} s")
    return path


def svs_40k() -> Path:
    """The 40000 x 40000 SVS-like slide (written on first use, ~4 min)."""
    path = cache_dir() / "svs_40k.svs"
    return _generate(path, "make_svs.py", ["--width", "40000", "--height", "40000", "--seed", "0"])


def svs_24k() -> Path:
    """The 24000 x 30000 (rows x cols) SVS-like slide the fastslide comparison was reported on."""
    path = cache_dir() / "svs_24k.svs"
    return _generate(path, "make_svs.py", ["--width", "30000", "--height", "24000", "--seed", "0"])


def ndpi_30k() -> Path:
    """The 30720 x 23040 NDPI-like slide with 3840-px restart bands (written on first use)."""
    path = cache_dir() / "ndpi_30k.ndpi"
    return _generate(path, "make_ndpi.py", ["--subsampling", "444"])


def many_tiles(tiles_per_side: int) -> Path:
    """A one-level tiled BigTIFF of ``tiles_per_side**2`` 256 x 256 JPEG tiles (see module doc)."""
    name = {100: "tiles_10k.tif", 1024: "tiles_1m.tif"}.get(
        tiles_per_side, f"tiles_{tiles_per_side}.tif"
    )
    path = cache_dir() / name
    if path.is_file():
        return path
    import tifffile

    with tifffile.TiffFile(svs_40k()) as tif:
        page = tif.pages[0]
        nx = -(-page.imagewidth // page.tilewidth)
        picks = [(ty + 60) * nx + tx + 60 for ty in range(16) for tx in range(16)]  # tissue
        tiles = [
            data
            for data, _ in tif.filehandle.read_segments(
                [page.dataoffsets[i] for i in picks], [page.databytecounts[i] for i in picks]
            )
        ]
        tags = {
            "photometric": int(page.photometric),
            "subsampling": tuple(page.subsampling or (1, 1)),
            "jpegtables": page.jpegtables,
        }
    part = path.with_name(path.name + ".part")
    _write_repeated_tiles(part, tiles, tiles_per_side, 256, **tags)
    part.rename(path)
    _log(f"wrote {path}")
    return path


def _write_repeated_tiles(
    path: Path,
    tiles: list[bytes],
    per_side: int,
    tile: int,
    *,
    photometric: int,
    subsampling: tuple[int, int],
    jpegtables: bytes | None,
) -> None:
    """Write a little-endian BigTIFF whose tile table cycles through `tiles`."""
    n = per_side * per_side
    size = per_side * tile
    blob = b"".join(tiles)
    starts = np.cumsum([0] + [len(t) for t in tiles[:-1]])
    data_at = 16
    entries: list[tuple[int, int, int, bytes]] = []  # tag, type, count, value bytes

    def add(tag: int, typ: int, values: list[int] | bytes, fmt: str = "") -> None:
        if isinstance(values, bytes):
            entries.append((tag, typ, len(values), values))
        else:
            entries.append((tag, typ, len(values), struct.pack("<" + fmt * len(values), *values)))

    table_at = data_at + len(blob)
    offsets = (data_at + starts[np.arange(n) % len(tiles)]).astype("<u8")
    counts = np.array([len(t) for t in tiles], "<u8")[np.arange(n) % len(tiles)]
    counts_at = table_at + offsets.nbytes
    extra_at = counts_at + counts.nbytes
    add(256, 4, [size], "I")
    add(257, 4, [size], "I")
    add(258, 3, [8, 8, 8], "H")
    add(259, 3, [7], "H")
    add(262, 3, [photometric], "H")
    add(277, 3, [3], "H")
    entries.append((282, 5, 1, struct.pack("<II", 40000, 1)))  # 0.25 µm/px, in pixels per cm
    entries.append((283, 5, 1, struct.pack("<II", 40000, 1)))
    add(284, 3, [1], "H")
    add(296, 3, [3], "H")
    add(322, 3, [tile], "H")
    add(323, 3, [tile], "H")
    entries.append((324, 16, n, struct.pack("<Q", table_at)))
    entries.append((325, 16, n, struct.pack("<Q", counts_at)))
    extra = b""
    if jpegtables:
        entries.append((347, 7, len(jpegtables), struct.pack("<Q", extra_at)))
        extra = jpegtables
    if photometric == 6:
        add(530, 3, list(subsampling), "H")
    ifd_at = extra_at + len(extra) + (-(extra_at + len(extra)) % 8)
    with open(path, "wb") as fh:
        fh.write(b"II" + struct.pack("<HHHQ", 43, 8, 0, ifd_at))
        fh.write(blob)
        fh.write(offsets.tobytes())
        fh.write(counts.tobytes())
        fh.write(extra)
        fh.write(b"\0" * (ifd_at - fh.tell()))
        fh.write(struct.pack("<Q", len(entries)))
        for tag, typ, count, value in sorted(entries):
            fh.write(struct.pack("<HHQ", tag, typ, count) + value.ljust(8, b"\0"))
        fh.write(struct.pack("<Q", 0))


def all_slides() -> dict[str, Path]:
    """Make sure every benchmark slide exists; return them by name."""
    return {
        "svs": svs_40k(),
        "ndpi": ndpi_30k(),
        "tiles_10k": many_tiles(100),
        "tiles_550": many_tiles(550),
        "tiles_1m": many_tiles(1024),
    }


if __name__ == "__main__":
    for key, value in all_slides().items():
        print(key, value)
