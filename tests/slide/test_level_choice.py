"""The two level-choice rules, and where they disagree."""

import pytest

from napari_slidescope import open_slide
from napari_slidescope.slide.level_choice import coarsest_level_not_coarser, nearest_level

PYRAMID = [(1.0, 1.0), (4.0, 4.0), (16.0, 16.0)]


@pytest.mark.parametrize(
    "target,nearest,not_coarser",
    [
        (1.0, 0, 0),  # on a level: both agree
        (4.0, 1, 1),
        (16.0, 2, 2),
        (40.0, 2, 2),  # coarser than every level: the coarsest
        (3.0, 1, 0),  # disagree: 4x is nearer, but coarser than asked
        (12.0, 2, 1),  # disagree again one level up
        (2.0, 0, 0),  # a log-scale tie goes to the finer level
        (2.1, 1, 0),  # just past the tie: nearest turns coarser, the other never does
        (3.97, 1, 1),  # within 1 % of 4x counts as not coarser (shape rounding)
        (3.9, 1, 0),  # beyond 1 % does not
        (0.5, 0, 0),  # finer than level 0: level 0
    ],
)
def test_rules_agree_on_levels_and_disagree_between_them(target, nearest, not_coarser):
    assert nearest_level(PYRAMID, (target, target)) == nearest
    assert coarsest_level_not_coarser(PYRAMID, (target, target)) == not_coarser


def test_not_coarser_checks_both_axes_while_nearest_follows_x():
    # level 1 is 4x in y but 4.2x in x: too coarse in x for a 4x target
    pyramid = [(1.0, 1.0), (4.0, 4.2)]
    assert coarsest_level_not_coarser(pyramid, (4.0, 4.0)) == 0
    assert nearest_level(pyramid, (4.0, 4.0)) == 1


@pytest.mark.parametrize("rule", [nearest_level, coarsest_level_not_coarser])
@pytest.mark.parametrize("target", [(0.0, 1.0), (1.0, -2.0), (float("nan"), 1.0)])
def test_rules_refuse_a_non_positive_target(rule, target):
    with pytest.raises(ValueError, match="positive"):
        rule(PYRAMID, target)


#: The sample slide's levels: 2048 x 3072 px at 0.5 µm/px, then 512 x 768 and 128 x 192
#: (each a 4x block mean), so 0.5, 2 and 8 µm/px. On a log scale the boundary between two
#: levels is their geometric mean: 1 µm/px between levels 0 and 1, 4 µm/px between 1 and 2;
#: a target exactly on a boundary goes to the finer level.
LEVEL_FOR_MPP = [
    (0.1, 0),  # finer than level 0: level 0
    (0.4, 0),
    (0.5, 0),  # on level 0
    (0.9, 0),  # 1.8x: below the 2x boundary
    (1.0, 0),  # 2x, the boundary: the finer level
    (1.1, 1),  # 2.2x: past the boundary, the coarser level (the other rule would say 0)
    (1.5, 1),
    (2.0, 1),  # on level 1
    (2.5, 1),
    (4.0, 1),  # 8x, the boundary between 4x and 16x: the finer level
    (4.5, 2),
    (8.0, 2),  # on level 2
    (100.0, 2),  # coarser than every level: the coarsest
]


@pytest.mark.parametrize("mpp, level", LEVEL_FOR_MPP)
def test_slide_level_for_mpp_picks_the_nearest_level(sample_slide, mpp, level):
    path, _ = sample_slide
    with open_slide(path) as slide:
        assert slide.mpp == (0.5, 0.5)
        assert slide.downsamples == [(1.0, 1.0), (4.0, 4.0), (16.0, 16.0)]
        assert slide.nearest_level(mpp) == level
        assert slide.level_for_mpp(mpp) == level


def test_slide_level_for_mpp_reads_the_coarser_level_where_the_rules_part(sample_slide):
    path, _ = sample_slide
    with open_slide(path) as slide:
        # 1.6 µm/px is 3.2x: nearer 4x (level 1) on a log scale, but coarser than level 0
        assert slide.level_for_mpp(1.6) == 1
        assert coarsest_level_not_coarser(slide.downsamples, (3.2, 3.2)) == 0
        with pytest.raises(ValueError, match="positive"):
            slide.level_for_mpp(0)


def test_nearest_factor_is_nearest_on_a_log_scale():
    from napari_slidescope.slide.level_choice import nearest_factor

    assert nearest_factor(4.0432, 8.0) == 2  # an Aperio level at 4.04 µm/px, 8 wanted
    assert nearest_factor(8.0, 8.0) == 1
    assert nearest_factor(16.0, 8.0) == 1  # never upsampled
    assert nearest_factor(0.499, 8.0) == 16
    # between 2 and 3 the log midpoint is sqrt(6) = 2.449...
    assert nearest_factor(1.0, 2.44) == 2
    assert nearest_factor(1.0, 2.46) == 3
    with pytest.raises(ValueError, match="positive"):
        nearest_factor(0.0, 8.0)
