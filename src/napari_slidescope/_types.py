"""Types shared by every layer of the package (numpy-free, import-free)."""

from __future__ import annotations

#: A half-open box ``(y0, x0, y1, x1)`` in level-0 pixels, (row, col) order: rows
#: ``y0 <= y < y1`` and columns ``x0 <= x < x1``. Results that live at another resolution
#: say so in their own attribute names (e.g. ``TilePlan.working_to_level0``).
Box = tuple[int, int, int, int]

__all__ = ["Box"]
