"""Nuclei segmenters: the protocol, the registry, the resolution rule and the adapters.

GUI-free; between :mod:`napari_slidescope.pipeline` (which runs segmenters) and
:mod:`napari_slidescope.analysis` (which holds the built-in methods). One module per
adapter: :mod:`.builtin` (H&E), :mod:`.builtin_fluorescence`, :mod:`.instanseg` (both
models), :mod:`.stardist`, :mod:`.cellpose`; :mod:`.registry` maps names to them.

Examples
--------
>>> from napari_slidescope.segmenters import working_mpp
>>> working_mpp("builtin", slide_mpp=0.499)
0.499
"""

from napari_slidescope.segmenters.base import (
    IDENTITY_KEYS,
    INPUTS,
    Input,
    Segmenter,
    SegmenterBase,
    SegmenterInfoWarning,
    SegmenterMismatchWarning,
    SegmenterUnavailableError,
    as_segmenter,
    identity_of,
)
from napari_slidescope.segmenters.registry import (
    AUTO,
    auto_note,
    available_segmenters,
    get_segmenter,
    missing_reason,
    register_segmenter,
    registered_segmenters,
    resolve_auto,
    segmenter_identity,
    segmenter_input,
    segmenter_target_mpp,
)
from napari_slidescope.segmenters.resolution import (
    UncalibratedWarning,
    segmenter_mpp,
    working_mpp,
)
from napari_slidescope.segmenters.stain import (
    ImageKind,
    column_name,
    image_kind,
    is_fluorescence,
    signal_channel,
    slide_is_fluorescence,
)

__all__ = [
    "AUTO",
    "IDENTITY_KEYS",
    "INPUTS",
    "ImageKind",
    "Input",
    "Segmenter",
    "SegmenterBase",
    "SegmenterInfoWarning",
    "SegmenterMismatchWarning",
    "SegmenterUnavailableError",
    "UncalibratedWarning",
    "as_segmenter",
    "auto_note",
    "available_segmenters",
    "column_name",
    "get_segmenter",
    "identity_of",
    "image_kind",
    "is_fluorescence",
    "missing_reason",
    "register_segmenter",
    "registered_segmenters",
    "resolve_auto",
    "segmenter_identity",
    "segmenter_input",
    "segmenter_mpp",
    "segmenter_target_mpp",
    "signal_channel",
    "slide_is_fluorescence",
    "working_mpp",
]
