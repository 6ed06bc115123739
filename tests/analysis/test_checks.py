"""Argument checks shared by the analysis functions."""

import dataclasses
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


#: The defaults as the two classes document them (their docstrings).
DOCUMENTED = {
    NucleiParams: {
        "target_mpp": 0.25,  # 40x
        "background_radius_um": 8.0,
        "sigma_um": 1.0,
        "min_area_um2": 10.0,  # a 3.6 µm disc
        "max_area_um2": 400.0,  # a 22 µm disc
        "threshold": None,  # Otsu
        "seed_radii_um": (2.8, 4.2),  # lymphocytes, epithelial/tumour nuclei
    },
    FluorescenceParams: {"target_mpp": 0.5, "threshold": None},  # a 6 µm nucleus 12 px across
}


@pytest.mark.parametrize("cls", [NucleiParams, FluorescenceParams])
def test_defaults_pass(cls):
    params = cls()  # the defaults pass the checks
    for field, value in DOCUMENTED[cls].items():
        assert getattr(params, field) == value, field
    # and so does every default given explicitly, to the same parameters
    assert cls(**dataclasses.asdict(params)) == params
    # the checks do run on these defaults: one of them made invalid is refused
    with pytest.raises(ValueError, match=f"^{cls.__name__}.sigma_um must be a positive number"):
        dataclasses.replace(params, sigma_um=0.0)


def test_nuclei_default_area_range_is_a_22_um_disc_at_most():
    assert NucleiParams().max_diameter_um == pytest.approx(22.568, abs=1e-3)  # 2 sqrt(400/pi)


def test_each_method_keeps_its_own_checks():
    with pytest.raises(ValueError, match="threshold_range"):
        NucleiParams(threshold_range=(2.0, 1.0))
    with pytest.raises(ValueError, match="NucleiParams.threshold must be > 0"):
        NucleiParams(threshold=0.0)
