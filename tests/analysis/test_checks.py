"""Argument checks shared by the analysis functions."""

import math

import pytest

from napari_slidescope.analysis.brightfield_nuclei import NucleiParams
from napari_slidescope.analysis.fluorescence_nuclei import FluorescenceParams


@pytest.mark.parametrize("cls", [NucleiParams, FluorescenceParams])
@pytest.mark.parametrize(
    "field,value,match",
    [
        ("target_mpp", -1.0, r"\.target_mpp must be a positive number; got -1.0"),
        ("sigma_um", 0.0, r"\.sigma_um must be a positive number"),
        ("background_radius_um", math.inf, r"\.background_radius_um must be a positive number"),
        ("min_seed_distance_um", "3", r"\.min_seed_distance_um must be a positive number"),
        ("min_area_um2", 1000.0, r" needs 0 <= min_area_um2 < max_area_um2; got 1000.0"),
        ("min_area_um2", -1.0, r" needs 0 <= min_area_um2 < max_area_um2"),
        ("seed_radii_um", (), r"\.seed_radii_um must be positive radii; got \(\)"),
        ("seed_radii_um", (2.0, 0.0), r"\.seed_radii_um must be positive radii"),
    ],
)
def test_both_nuclei_methods_check_their_shared_parameters_alike(cls, field, value, match):
    with pytest.raises(ValueError, match=f"^{cls.__name__}{match}"):
        cls(**{field: value})


@pytest.mark.parametrize("cls", [NucleiParams, FluorescenceParams])
def test_defaults_pass(cls):
    cls()


def test_each_method_keeps_its_own_checks():
    with pytest.raises(ValueError, match="threshold_range"):
        NucleiParams(threshold_range=(2.0, 1.0))
    with pytest.raises(ValueError, match="NucleiParams.threshold must be > 0"):
        NucleiParams(threshold=0.0)
