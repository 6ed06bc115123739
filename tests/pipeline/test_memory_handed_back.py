"""A nuclei run hands the memory its tiles freed back to the system as it goes (#33).

The tiles' arrays are allocated and freed by the runner's threads, each with its own
glibc arena; without ``malloc_trim`` the freed chunks stayed resident, so a whole-slide
``segment_nuclei`` peaked higher the more tiles it ran. The child process runs one
region tile by tile and reads its RSS right after the call and again after a
``malloc_trim`` of its own: what the trim still finds to hand back is what the run kept.
"""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from napari_slidescope.pipeline.runner import _libc_malloc_trim

SRC = str(Path(__file__).parents[2] / "src")

CHILD = textwrap.dedent(
    """
    import ctypes, gc, json, sys
    import psutil
    from napari_slidescope.pipeline.nuclei import segment_nuclei

    proc = psutil.Process()
    res = segment_nuclei(
        sys.argv[1], tissue=False, workers=2, segmenter="builtin", labels=False,
        tile_size_um=256,
    )
    gc.collect()
    after_run = proc.memory_info().rss
    ctypes.CDLL(None).malloc_trim(0)
    after_trim = proc.memory_info().rss
    print(json.dumps([res.count, after_run, after_trim]))
    """
)


@pytest.mark.skipif(
    not sys.platform.startswith("linux") or _libc_malloc_trim() is None,
    reason="glibc malloc_trim (not musl), RSS",
)
def test_segment_nuclei_hands_freed_memory_back(sample_slide):
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    env["PYTHONPATH"] = SRC
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, str(sample_slide[0])],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    count, after_run, after_trim = json.loads(proc.stdout.strip().splitlines()[-1])
    assert count > 100
    kept = (after_run - after_trim) / 2**20
    # measured: 15 MiB with a trim after each tile, 62 MiB without (24 tiles of 256 µm)
    assert kept < 32, f"{kept:.1f} MiB freed by the run but still resident"


@pytest.mark.parametrize("platform", ["darwin", "win32", "linux-musl"])
def test_release_freed_memory_is_a_no_op_without_glibc(monkeypatch, platform):
    """macOS, Windows and musl have no ``malloc_trim``: found as None, the call does nothing."""
    import ctypes

    from napari_slidescope.pipeline import runner

    if platform == "linux-musl":  # a C library without the symbol
        monkeypatch.setattr(sys, "platform", "linux")

        class NoTrim:
            def __init__(self, name):
                pass

        monkeypatch.setattr(ctypes, "CDLL", NoTrim)
    else:
        monkeypatch.setattr(sys, "platform", platform)
    assert runner._libc_malloc_trim() is None
    monkeypatch.setattr(runner, "_MALLOC_TRIM", None)
    assert runner.release_freed_memory() is None


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc malloc_trim")
def test_release_freed_memory_calls_malloc_trim_where_there_is_one(monkeypatch):
    from napari_slidescope.pipeline import runner

    if runner._libc_malloc_trim() is None:
        pytest.skip("this Linux's C library has no malloc_trim (musl)")
    calls = []
    monkeypatch.setattr(runner, "_MALLOC_TRIM", lambda pad: calls.append(pad) or 1)
    runner.release_freed_memory()
    assert calls == [0]
