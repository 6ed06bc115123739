"""Hypothesis mutates the header bytes of a small slide; every entry point must cope.

Run as ``python _fuzz_child.py WORKDIR N``: writes a small synthetic slide, lists the
bytes that hold its structure (TIFF header, every IFD, the out-of-line tag values), then
lets hypothesis overwrite up to 8 of them at random for N examples. Each mutated file goes
through the corpus checks of ``_corpus_child.py`` (open_slide + reads, the npe2 reader,
detect_tissue) under the same 5 s alarm and 1 GiB address-space cap. Exits non-zero with
hypothesis' shrunk example when a file gives anything but a SlideError naming it, or
pixels identical to the intact file's (blank where a warning says so).
"""

import importlib.util
import os
import resource
import signal
import struct
import sys
from pathlib import Path

import tifffile
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from napari_slidescope.sample_data import write_sample_slide

spec = importlib.util.spec_from_file_location(
    "_corpus_child", Path(__file__).with_name("_corpus_child.py")
)
corpus = importlib.util.module_from_spec(spec)
spec.loader.exec_module(corpus)


def structure_bytes(path: Path) -> list[int]:
    """Positions of the bytes that describe the file (not pixel data)."""
    spans = [(0, 8)]
    with tifffile.TiffFile(path) as tif:
        entry = 20 if tif.is_bigtiff else 12
        for page in tif.pages:
            n = len(page.tags)
            spans.append((page.offset, page.offset + 2 + n * entry + 4))
            for tag in page.tags.values():
                fmt = tifffile.TIFF.DATA_FORMATS[int(tag.dtype)]
                nbytes = tag.count * struct.calcsize(fmt)
                if tag.valueoffset != tag.offset + entry - (8 if entry == 20 else 4):
                    spans.append((tag.valueoffset, tag.valueoffset + min(nbytes, 4096)))
    return sorted({i for a, b in spans for i in range(a, b)})


def main() -> None:
    work, n = Path(sys.argv[1]), int(sys.argv[2])
    intact = work / "intact.svs"
    write_sample_slide(intact, shape=(768, 1024), mpp=0.5, seed=2, tile=128)
    data = intact.read_bytes()
    positions = structure_bytes(intact)
    refs = {}
    for entry, fn in corpus.ENTRY.items():
        refs[(str(intact), entry)] = fn(str(intact))[0]
    with open("/proc/self/statm") as fh:
        vsize = int(fh.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    resource.setrlimit(resource.RLIMIT_AS, (vsize + corpus.LIMIT_BYTES, resource.RLIM_INFINITY))
    signal.signal(signal.SIGALRM, corpus._alarm)
    count = [0]

    @settings(
        max_examples=n,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(
        st.lists(st.tuples(st.sampled_from(positions), st.integers(0, 255)), min_size=1, max_size=8)
    )
    def check(edits):
        raw = bytearray(data)
        for pos, value in edits:
            raw[pos] = value
        count[0] += 1
        path = work / f"mutant-{count[0]}.svs"
        path.write_bytes(bytes(raw))
        try:
            out = corpus.run_case({"path": str(path), "intact": str(intact)}, refs)
        finally:
            path.unlink()
        bad = {
            k: v
            for k, v in out.items()
            if k in corpus.ENTRY and v not in ("error", "same", "warned")
        }
        assert not bad, (edits, bad, out)

    check()
    print(f"ok {count[0]} mutants of {len(positions)} structure bytes")


if __name__ == "__main__":
    main()
