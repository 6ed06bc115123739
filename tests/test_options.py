"""The options model: one check and one message style per option, pickles, digests differ."""

from __future__ import annotations

import hashlib
import json
import pickle

import pytest

from napari_slidescope.options import NucleiOptions, TissueOptions, option_fields


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"tile_size_um": 0}, "tile_size_um: expected a positive number of µm, got 0"),
        ({"tile_size_um": "512"}, "tile_size_um: expected a positive number of µm, got '512'"),
        ({"stain": "HE"}, "stain: expected one of 'auto', 'H&E', 'H-DAB', got 'HE'"),
        ({"target_mpp": float("nan")}, "target_mpp: expected a positive number of µm/px or None"),
        ({"cell_expansion_um": True}, "cell_expansion_um: expected a positive number of µm"),
        ({"channel": -1}, "channel: expected a channel index >= 0"),
        ({"segmenter_options": 3}, "segmenter_options: expected a mapping"),
    ],
)
def test_nuclei_options_refuse_bad_values(changes: dict, message: str) -> None:
    with pytest.raises(ValueError, match="^" + message.replace("(", r"\(")):
        NucleiOptions(**changes)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"threshold": 1.5}, "threshold: expected a number in [0, 1] or None, got 1.5"),
        ({"mode": "dark"}, "mode: expected one of 'auto', 'brightfield', 'fluorescence'"),
        ({"min_tissue_um2": -1}, "min_tissue_um2: expected a number >= 0 of µm², got -1"),
        ({"outer_only": 1}, "outer_only: expected True or False, got 1"),
    ],
)
def test_tissue_options_refuse_bad_values(changes: dict, message: str) -> None:
    with pytest.raises(ValueError) as err:
        TissueOptions(**changes)
    assert str(err.value).startswith(message)


def test_numbers_are_normalised_and_options_frozen() -> None:
    opts = NucleiOptions(tile_size_um=256, segmenter_options={"min_area_um2": 5})
    assert opts.tile_size_um == 256.0
    assert isinstance(opts.tile_size_um, float)
    with pytest.raises(AttributeError):
        opts.tile_size_um = 1.0  # type: ignore[misc]
    with pytest.raises(TypeError):
        opts.segmenter_options["min_area_um2"] = 6  # type: ignore[index]


def test_options_pickle_hash_and_compare_by_value() -> None:
    opts = NucleiOptions(segmenter_options={"b": 1, "a": [1, 2]}, channel="DAPI")
    back = pickle.loads(pickle.dumps(opts))
    assert back == opts
    assert hash(back) == hash(opts)
    assert back.segmenter_options == {"a": [1, 2], "b": 1}


def test_digest_is_sha256_of_sorted_json_and_changes_with_any_option() -> None:
    opts = TissueOptions()
    text = json.dumps(
        {
            "max_hole_um2": 1000.0,
            "min_tissue_um2": 2500.0,
            "mode": "auto",
            "outer_only": False,
            "reject_artifacts": True,
            "smooth_um": None,
            "target_mpp": 8.0,
            "threshold": None,
        },
        separators=(",", ":"),
    )
    assert opts.digest() == hashlib.sha256(text.encode()).hexdigest()
    digests = {opts.digest()}
    for name, default, info in option_fields(TissueOptions):
        other = {"bool": not default, "str": "fluorescence"}.get(info.kind, 0.5)
        digests.add(opts.replace(**{name: other}).digest())
    assert len(digests) == 1 + len(list(option_fields(TissueOptions)))


def test_from_mapping_names_unknown_keys() -> None:
    with pytest.raises(
        ValueError, match=r"^settings: unknown TissueOptions option\(s\) \['tile'\]"
    ):
        TissueOptions.from_mapping({"tile": 1}, where="settings")
    assert TissueOptions.from_mapping({"target_mpp": 4}).target_mpp == 4.0


def test_merged_applies_keywords_on_top_and_names_unknown_ones() -> None:
    base = NucleiOptions(tile_size_um=256, stain="H&E")
    merged = NucleiOptions.merged(base, {"tile_size_um": 128}, where="f")
    assert merged.tile_size_um == 128.0  # the keyword wins
    assert merged.stain == "H&E"  # the rest of the object stays
    assert NucleiOptions.merged(None, {}, where="f") == NucleiOptions()
    with pytest.raises(TypeError, match=r"^f\(\) got unexpected keyword argument\(s\) \['tile'\]"):
        NucleiOptions.merged(None, {"tile": 1}, where="f")
    with pytest.raises(TypeError, match=r"^f: options: expected a NucleiOptions"):
        NucleiOptions.merged(TissueOptions(), {}, where="f")  # type: ignore[arg-type]


def test_numpy_numbers_are_accepted_as_python_numbers() -> None:
    import numpy as np

    opts = NucleiOptions(cell_expansion_um=np.float32(2.5), tile_size_um=np.int64(300))
    assert opts.cell_expansion_um == 2.5
    assert type(opts.cell_expansion_um) is float
    assert opts.tile_size_um == 300.0
    with pytest.raises(ValueError, match=r"^tile_size_um: expected a positive number"):
        NucleiOptions(tile_size_um=np.bool_(True))


def test_tissue_mask_defaults_are_the_tissue_options_defaults() -> None:
    """analysis.tissue (numpy-only, below options) keeps its own keyword defaults: the same."""
    import inspect

    from napari_slidescope.analysis.tissue import tissue_mask

    params = inspect.signature(tissue_mask).parameters
    shared = ["threshold", "smooth_um", "min_tissue_um2", "max_hole_um2", "outer_only"]
    shared.append("reject_artifacts")  # (mode: tissue_mask needs a concrete one)
    for name, default, _info in option_fields(TissueOptions):
        if name in shared:
            assert params[name].default == default, name


def test_regions_envelope_is_checked_and_one_digest_per_radius() -> None:
    """An int radius digests as its float (one computation, one hash); bad radii fail at once."""
    from napari_slidescope.options import RegionsOptions

    assert RegionsOptions(envelope_um=64).digest() == RegionsOptions().digest()
    assert type(RegionsOptions(envelope_um=64).envelope_um) is float
    assert RegionsOptions(envelope_um=0).digest() != RegionsOptions().digest()
    for bad in (-1.0, float("nan"), True, "64"):
        with pytest.raises(ValueError, match=r"^envelope_um: expected a number >= 0 of µm"):
            RegionsOptions(envelope_um=bad)
