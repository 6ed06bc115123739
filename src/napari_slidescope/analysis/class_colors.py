"""One colour per cell class name, the same in every dock, legend, canvas and export.

Before, three places chose class colours by position (the "Cell classifier" dock's list,
the learned classifier's sorted class names, the phenotype rules' order), so one class
could be orange in the dock and teal in the legend. Here a colour depends on the name
alone:

- names QuPath knows get QuPath's default colours (Tumor, Stroma, Immune cells, Necrosis,
  Positive, Negative, 1+, 2+, 3+), so a GeoJSON export opens in QuPath in the colours
  its users know;
- a few more names this package proposes (Lymphocyte, Other) have fixed colours;
- any other name takes a colour of :data:`PALETTE` chosen by a checksum of the name,
  so it is the same in every session, in every order; within one set of classes a
  colour already taken moves on to the next free one (in sorted name order, so the set
  decides, never the order it comes in).

A colour given explicitly (the user's pick in a dock, a classifier file's colours) always
wins: :func:`class_colors` takes them as ``given``.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Mapping, Sequence

__all__ = [
    "IHC_COLORS",
    "KNOWN_COLORS",
    "NUCLEUS_COLOR",
    "OTHER_COLOR",
    "PALETTE",
    "RGB",
    "class_color",
    "class_colors",
]

#: An (r, g, b) colour, 0-255.
RGB = tuple[int, int, int]

#: QuPath's colours of the IHC classes (Negative blue, 1+ yellow, 2+ orange, 3+ red).
IHC_COLORS: dict[str, RGB] = {
    "Negative": (112, 112, 225),
    "1+": (255, 215, 0),
    "2+": (225, 150, 50),
    "3+": (200, 50, 50),
}
#: Colour of "Other", the class of a cell that matches no phenotype rule.
OTHER_COLOR: RGB = (160, 160, 160)
#: Colour of an unclassified nucleus in exports (QuPath GeoJSON ``classification.color``).
NUCLEUS_COLOR: RGB = (30, 30, 200)
#: Fixed colours of well-known class names: QuPath's defaults, then this package's own.
KNOWN_COLORS: dict[str, RGB] = {
    **IHC_COLORS,
    "Positive": (200, 50, 50),
    "Tumor": (200, 0, 0),
    "Stroma": (150, 200, 150),
    "Immune cells": (160, 90, 160),
    "Necrosis": (50, 50, 50),
    "Lymphocyte": (86, 180, 233),
    "Other": OTHER_COLOR,
}
#: Colours of other names (Okabe-Ito, distinguishable with colour blindness, then
#: ColorBrewer Set1 and a few more; none equal to a colour of :data:`KNOWN_COLORS`).
PALETTE: tuple[RGB, ...] = (
    (230, 159, 0),
    (0, 158, 115),
    (240, 228, 66),
    (0, 114, 178),
    (213, 94, 0),
    (204, 121, 167),
    (228, 26, 28),
    (55, 126, 184),
    (77, 175, 74),
    (152, 78, 163),
    (255, 127, 0),
    (166, 86, 40),
    (247, 129, 191),
    (0, 190, 190),
    (180, 180, 30),
    (100, 60, 200),
)


def _slot(name: str) -> int:
    """Return the palette index of a name: a CRC-32 of its UTF-8 bytes (stable everywhere)."""
    return zlib.crc32(name.encode("utf-8")) % len(PALETTE)


def class_color(name: str) -> RGB:
    """Return the colour of one class name, on its own (no other class to avoid).

    Examples
    --------
    >>> class_color("Tumor")
    (200, 0, 0)
    >>> class_color("CD8 T cell") == class_color("CD8 T cell")
    True
    """
    known = KNOWN_COLORS.get(name)
    return known if known is not None else PALETTE[_slot(name)]


def class_colors(
    names: Iterable[str], given: Mapping[str, Sequence[int]] | None = None
) -> dict[str, RGB]:
    """Return one colour per class name, in the order of `names`, no two alike if avoidable.

    Parameters
    ----------
    names : iterable of str
        The classes (legend order).
    given : mapping of str to (r, g, b), optional
        Colours chosen already (the user's, a classifier file's); they are kept as they are.

    Returns
    -------
    dict of str to (int, int, int)
        ``given`` colours, then :data:`KNOWN_COLORS`, then palette colours by name; a
        palette colour another class of the set holds moves on to the next free one.

    Raises
    ------
    ValueError
        If a given colour is not three integers in 0-255.

    Examples
    --------
    >>> class_colors(["Tumor", "Other"])
    {'Tumor': (200, 0, 0), 'Other': (160, 160, 160)}
    >>> class_colors(["A", "B"]) == dict(reversed(class_colors(["B", "A"]).items()))
    True
    """
    order = list(dict.fromkeys(str(n) for n in names))
    out: dict[str, RGB] = {}
    for name, rgb in (given or {}).items():
        if name not in order:
            continue
        vals = tuple(int(v) for v in rgb)
        if len(vals) != 3 or not all(0 <= v <= 255 for v in vals):
            raise ValueError(f"class colour of {name!r}: expected (r, g, b) in 0-255, got {rgb!r}")
        out[name] = (vals[0], vals[1], vals[2])
    for name in order:
        if name not in out and name in KNOWN_COLORS:
            out[name] = KNOWN_COLORS[name]
    taken = set(out.values())
    for name in sorted(n for n in order if n not in out):
        k = _slot(name)
        for step in range(len(PALETTE)):
            rgb = PALETTE[(k + step) % len(PALETTE)]
            if rgb not in taken:
                break
        else:  # more classes than palette colours: share, by name
            rgb = PALETTE[k]
        out[name] = rgb
        taken.add(rgb)
    return {name: out[name] for name in order}
