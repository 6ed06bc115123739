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


def test_slide_level_for_mpp_is_the_nearest_rule(sample_slide):
    path, _ = sample_slide
    with open_slide(path) as slide:  # 0.5 µm/px, levels 1x 4x 16x (or as written)
        assert len(slide.downsamples) >= 2
        base = slide.mpp[1]
        for mpp in (0.4, 0.5, 0.9, 1.1, 1.5, 2.0, 2.5, 5.0, 100.0):
            want = nearest_level(slide.downsamples, (mpp / base, mpp / base))
            assert slide.nearest_level(mpp) == want
            assert slide.level_for_mpp(mpp) == want
        # somewhere between two levels the rules part: nearest reads the coarser level
        ds1 = slide.downsamples[1][1]
        between = base * ds1 * 0.8
        assert slide.level_for_mpp(between) == 1
        assert coarsest_level_not_coarser(slide.downsamples, (ds1 * 0.8, ds1 * 0.8)) == 0
        with pytest.raises(ValueError, match="positive"):
            slide.level_for_mpp(0)
