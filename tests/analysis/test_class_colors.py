"""The class colour registry: a name's colour never depends on the order or the company."""

import pytest

from napari_slidescope.analysis.class_colors import (
    IHC_COLORS,
    KNOWN_COLORS,
    PALETTE,
    class_color,
    class_colors,
)


def test_a_name_has_one_colour_whatever_the_order():
    names = ["Tumor", "Lymphocyte", "Stroma", "CD8 T cell", "Macrophage", "B cell"]
    a = class_colors(names)
    b = class_colors(sorted(names))
    assert a == b
    assert list(a) == names  # legend order is the caller's
    assert a["Tumor"] == (200, 0, 0) and a["Stroma"] == (150, 200, 150)  # QuPath's
    assert len(set(a.values())) == len(names)  # no two classes alike


def test_ihc_and_other_keep_their_conventional_colours():
    got = class_colors(["Negative", "1+", "2+", "3+", "Other"])
    assert {k: got[k] for k in IHC_COLORS} == IHC_COLORS
    assert got["Other"] == KNOWN_COLORS["Other"]


def test_given_colours_win_and_others_avoid_them():
    taken = class_color("Macrophage")
    got = class_colors(["X", "Macrophage"], given={"X": taken})
    assert got["X"] == taken
    assert got["Macrophage"] != taken
    assert got["Macrophage"] in PALETTE
    with pytest.raises(ValueError, match="0-255"):
        class_colors(["X"], given={"X": (0, 0, 300)})


def test_more_classes_than_colours_still_get_one_each():
    names = [f"class {k}" for k in range(len(PALETTE) + 3)]
    got = class_colors(names)
    assert set(got) == set(names)
    assert len(set(got.values())) == len(PALETTE)
