"""Run damaged and hostile files through every entry point, under time and memory limits.

Run as ``python _corpus_child.py MANIFEST.json``; prints one JSON line per case. Each case
is ``{"path", "intact", "expect"}``. Every entry point (``open_slide`` + a region read + the
smallest level + the associated images; the same with ``on_error="blank"``, the lenient
API; the npe2 reader's layer data, read where napari reads it at full zoom over the
top-left corner and zoomed out; ``detect_tissue``) runs under a
5 s alarm, after the address space was capped at what the warm process uses plus 1 GiB.
The outcome of an entry point is one of

* ``"error"``: a :class:`SlideError` whose message names the file;
* ``"same"``: no warning, and everything read equals the intact file's;
* ``"warned"``: a SlidescopeWarning naming the file, and every pixel read equals the
  intact file's or is blank (a left-out tile), or the level was left out;
* anything else (``"WRONG ..."``, ``"TIMEOUT"``, ``"CRASH ..."``) is a failure.

Each entry point's measured peak memory is reported as ``<entry>_peak_mib``: the peak
resident set size while it ran (VmHWM, reset before it through ``/proc/self/clear_refs``)
minus the resident set size before it.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import sys
import time
import traceback
import warnings
from pathlib import Path

import numpy as np

from napari_slidescope import SlideError, SlidescopeWarning, open_slide
from napari_slidescope._napari.reader import get_reader
from napari_slidescope.pipeline.tissue import detect_tissue

LIMIT_S = 5.0
LIMIT_BYTES = 1 << 30
BOX = (0, 0, 700, 900)


class Timeout(BaseException):
    pass


def _alarm(signum, frame):
    raise Timeout()


def _open_reads(path):
    with open_slide(path) as s:
        region = s.read_region(BOX)
        small = np.asarray(s.levels[-1])
        assoc = {k: np.asarray(s.associated[k]) for k in s.associated}
        text = json.dumps(s.metadata, default=str)
        return {"region": region, "small": small, "assoc": assoc, "nlevels": len(s.levels)}, text


def _lenient_reads(path):
    with open_slide(path, on_error="blank") as s:
        region = s.read_region(BOX)
        small = np.asarray(s.levels[-1])
        return {"region": region, "small": small, "nlevels": len(s.levels)}, ""


def _reader_reads(path):
    reader = get_reader(path)
    if reader is None:
        return None, ""
    data, kwargs, _ = reader(path)[0]
    levels = data if isinstance(data, list) else [data]
    # what napari shows at full zoom over the top-left corner, and when zoomed out
    y, x = slice(BOX[0], BOX[2]), slice(BOX[1], BOX[3])
    first = levels[0][y, x] if kwargs.get("rgb") else levels[0][..., y, x]
    got = {"region0": np.asarray(first), "small": np.asarray(levels[-1])}
    return got, json.dumps(kwargs.get("metadata"), default=str)


def _tissue_reads(path):
    res = detect_tissue(path)
    return {"mask": np.asarray(res.mask)}, ""


ENTRY = {
    "open": _open_reads,
    "lenient": _lenient_reads,
    "reader": _reader_reads,
    "tissue": _tissue_reads,
}


def _same(a, b):
    return a.shape == b.shape and a.dtype == b.dtype and np.array_equal(a, b)


def _compare(got, ref, warned):
    """Return None when `got` is acceptable against the intact `ref`, else the reason."""
    for key, value in got.items():
        want = ref.get(key)
        if isinstance(value, dict):
            if warned:
                continue
            for name, arr in value.items():
                if name in want and _same(arr, want[name]):
                    continue
                # a damaged description can make an SVS a generic TIFF: its thumbnail is
                # then "series 1", the same pixels under the generic name; acceptable
                if not any(_same(arr, other) for other in want.values()):
                    return f"associated {name!r} differs"
            if len(value) != len(want):
                return f"associated images {sorted(value)} != {sorted(want)}"
            continue
        if isinstance(value, int):
            if not warned and value != want:
                return f"{key}: {value} != {want}"
            continue
        if _same(value, want):
            continue
        if not warned:
            return f"{key} differs from the intact file without any warning"
        if value.shape == want.shape and value.dtype == want.dtype:
            ok = (value == want) | (value == 0)
            if not ok.all():
                return f"{key}: {int((~ok).sum())} pixels differ and are not blank"
    return None


def _status_kib(field):
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


def _reset_peak():
    """Reset this process's peak RSS (VmHWM) to its current RSS; False where unsupported."""
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


def run_case(case, refs):
    path, name = case["path"], Path(case["path"]).name
    out = {}
    for entry, fn in ENTRY.items():
        ref = refs.get((case["intact"], entry))
        if _reset_peak():  # the measured peak: what this entry point added to the RSS
            rss0 = _status_kib("VmRSS")
            out[entry + "_peak_mib"] = None  # filled in below unless the entry crashed
        t0 = time.perf_counter()
        signal.setitimer(signal.ITIMER_REAL, LIMIT_S)
        try:
            with warnings.catch_warnings(record=True) as record:
                warnings.simplefilter("always")
                got, text = fn(path)
        except Timeout:
            out[entry] = "TIMEOUT"
            continue
        except SlideError as exc:
            signal.setitimer(signal.ITIMER_REAL, 0)
            msg = str(exc)
            if name not in msg or msg.rstrip().endswith("()"):
                out[entry] = f"WRONG message {msg!r}"
            else:
                out[entry] = "error"
            out[entry + "_msg"] = msg[:300]
            continue
        except MemoryError:
            signal.setitimer(signal.ITIMER_REAL, 0)
            out[entry] = "CRASH MemoryError"
            continue
        except Exception as exc:  # anything but a SlideError is a failure
            signal.setitimer(signal.ITIMER_REAL, 0)
            tb = traceback.format_exc(limit=-3)
            out[entry] = f"CRASH {type(exc).__name__}: {str(exc)[:200]} {tb[-600:]}"
            continue
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            if entry + "_peak_mib" in out:
                out[entry + "_peak_mib"] = round((_status_kib("VmHWM") - rss0) / 1024, 1)
        out[entry + "_s"] = round(time.perf_counter() - t0, 3)
        if "root:" in text or "LOL" * 50 in text:
            out[entry] = "WRONG: an XML entity was expanded into the metadata"
            continue
        if got is None:  # the reader declined the file: napari's own readers get it
            out[entry] = "declined"
            continue
        ours = [str(w.message) for w in record if issubclass(w.category, SlidescopeWarning)]
        # the intact files of the corpus are uncalibrated or calibrated alike: that
        # warning says nothing about damage
        warned = any(name in m and "no pixel size" not in m for m in ours)
        if ref is None:
            out[entry] = "WRONG: opened, but the intact file could not be read"
            continue
        why = _compare(got, ref, warned)
        out[entry] = ("warned" if warned else "same") if why is None else f"WRONG {why}"
        if warned:
            out[entry + "_msg"] = " | ".join(ours)[:300]
    return out


def main():
    cases = json.loads(Path(sys.argv[1]).read_text())
    refs = {}
    for intact in sorted({c["intact"] for c in cases}):
        for entry, fn in ENTRY.items():
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                try:
                    refs[(intact, entry)] = fn(intact)[0]
                except Exception as exc:
                    print(json.dumps({"intact_error": intact, "entry": entry, "msg": str(exc)}))
    # from here on: what the warm process uses plus 1 GiB of address space
    with open("/proc/self/statm") as fh:
        vsize = int(fh.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    resource.setrlimit(resource.RLIMIT_AS, (vsize + LIMIT_BYTES, resource.RLIM_INFINITY))
    signal.signal(signal.SIGALRM, _alarm)
    for case in cases:
        result = run_case(case, refs)
        result["case"] = case["name"]
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
