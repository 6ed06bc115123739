"""Stand-ins shared by the tests: one of each kind, defined once.

Import them as ``from tests.fakes import ThresholdSegmenter`` (the repository root is on
``sys.path``: ``python -m pytest`` puts it there, and so does the ``pythonpath`` option in
``pyproject.toml`` for a bare ``pytest``).

- :class:`ThresholdSegmenter`: a fast, deterministic segmenter (dark pixels, labelled).
- :class:`FakeLearned`: the same, registered under a learned model's name with an identity.
- :class:`GatedSegmenter`: wraps a segmenter so that a run stays in flight until the test
  releases it (no sleeping, no clock).
- :data:`BAD_RULES_FILES`: phenotype-rules files that must be refused, and the words of the
  refusal.
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import numpy as np
from scipy import ndimage as ndi


class ThresholdSegmenter:
    """A fast stand-in for a real segmenter: dark-green pixels, labelled.

    Each connected region of pixels whose green value is below 130 (after a binary opening
    that removes one-pixel specks and bridges, unless `opening` is off) is one nucleus.

    Parameters
    ----------
    delay : float
        Seconds each ``predict`` sleeps, where a test wants a run that lasts (never a
        figure any test asserts; use :class:`GatedSegmenter` to hold a run in flight).
    min_overlap_um : float
        Tile overlap the segmenter asks for.
    stains : optional
        Stain vectors the pipeline measures with (the built-in segmenter's attribute).
    opening : bool
        Open the mask before labelling (off: every dark pixel counts, outlines stay exact).
    """

    name = "threshold"
    target_mpp = 0.5
    min_overlap_um = 8.0

    def __init__(
        self,
        delay: float = 0.0,
        *,
        min_overlap_um: float | None = None,
        stains: Any = None,
        opening: bool = True,
    ) -> None:
        self.delay = delay
        self.opening = opening
        if min_overlap_um is not None:
            self.min_overlap_um = min_overlap_um
        if stains is not None:
            self.stains = stains

    def predict(self, tiles, *, mpp):
        if self.delay:
            time.sleep(self.delay)
        return (tiles[..., 1] < 130)[..., None].astype(np.float32)

    def postprocess(self, raw, *, mpp):
        mask = raw[..., 0] > 0.5
        return ndi.label(ndi.binary_opening(mask) if self.opening else mask)[0].astype(np.int32)


#: What :class:`FakeLearned` says of its weights (tests may patch its values).
FAKE_MODEL = {"model": "fake_nuclei", "model_version": "1", "weights_sha256": "ab" * 32}


class FakeLearned(ThresholdSegmenter):
    """A stand-in for a learned model: registered as ``"instanseg"``, with an identity.

    ``identity()`` returns :data:`FAKE_MODEL` as it is when called.
    """

    name = "instanseg"
    input = "brightfield"

    def identity(self):
        return dict(FAKE_MODEL)


class GatedSegmenter:
    """Wraps a segmenter: after `free` tiles, each ``predict`` waits for `gate`.

    So a test sees a run in flight however loaded the machine is, and can tell whether the
    run waited for a held tile: ``late`` counts the held calls that went on past the gate.
    The wait gives up after `timeout` seconds, a hang guard only. ``name``, ``prepare``,
    ``stains``, ``identity`` and the like are the wrapped segmenter's.

    Parameters
    ----------
    inner : segmenter
    free : int
        Tiles that pass without waiting.
    gate : threading.Event, optional
        Set it to let every held and later tile through (a new event by default).
    timeout : float
    """

    def __init__(self, inner, free: int, gate: threading.Event | None = None, timeout=30.0):
        self.inner, self.free = inner, free
        self.gate = threading.Event() if gate is None else gate
        self.timeout = timeout
        self.seen = 0  # tiles predicted or being predicted
        self.late = 0  # held calls that went on
        self.held = threading.Event()  # set once a tile waits at the gate
        self._lock = threading.Lock()
        # what the pipeline reads of a segmenter (it looks at declared attributes only)
        for attr in ("name", "target_mpp", "min_overlap_um", "input", "stains", "identity"):
            if hasattr(inner, attr):
                setattr(self, attr, getattr(inner, attr))
        if hasattr(inner, "prepare"):
            self.prepare = inner.prepare

    def predict(self, tiles, *, mpp):
        with self._lock:
            waits = self.seen >= self.free
            self.seen += len(tiles)
        if waits:
            self.held.set()
            self.gate.wait(self.timeout)
            with self._lock:
                self.late += 1
        return self.inner.predict(tiles, mpp=mpp)

    def postprocess(self, raw, *, mpp):
        return self.inner.postprocess(raw, mpp=mpp)


_RULES_KIND = "slidescope-phenotype-rules"

#: ``(file content, words of the refusal)`` of phenotype-rules files that must be refused,
#: by ``load_rules`` and by ``slidescope batch --classify`` alike; the refusal also names
#: the file. (A JSON file without the rules' "kind" is refused in words of its own by each:
#: the command also accepts a classifier file.)
BAD_RULES_FILES = [
    ("{not json", "not JSON"),
    (json.dumps({"kind": _RULES_KIND}), "no marker"),
    (json.dumps({"kind": _RULES_KIND, "dab": [0.6, 0.4, 0.2]}), "must increase"),
]
