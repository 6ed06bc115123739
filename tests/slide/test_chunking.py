import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from napari_slidescope.slide.chunking import choose_chunks, default_chunk_bytes, parse_bytes


def test_svs_tiles_grow_to_square_chunks():
    chunks = choose_chunks((40000, 40000, 3), (256, 256, 3), 1, spatial=(0, 1), budget=4 * 2**20)
    assert chunks == (1024, 1024, 3)


def test_ndpi_band_grows_in_rows_only():
    chunks = choose_chunks((23040, 30720, 3), (8, 3840, 3), 1, spatial=(0, 1), budget=4 * 2**20)
    assert chunks[1] == 3840
    assert chunks[2] == 3
    assert chunks[0] % 8 == 0
    assert chunks[0] * 3840 * 3 <= 4 * 2**20 < (chunks[0] + 8) * 3840 * 3


def test_native_chunk_larger_than_budget_is_kept_whole():
    assert choose_chunks((100, 5000, 3), (16, 5000, 3), 1, spatial=(0, 1), budget=1000) == (
        16,
        5000,
        3,
    )


def test_small_image_is_one_chunk():
    assert choose_chunks((16, 16, 3), (64, 64, 3), 1, spatial=(0, 1)) == (16, 16, 3)


def test_channel_axis_keeps_native_chunk():
    chunks = choose_chunks((3, 1440, 1920), (1, 16, 1920), 1, spatial=(1, 2), budget=2**20)
    assert chunks[0] == 1
    assert chunks[2] == 1920
    assert chunks[1] % 16 == 0


def test_parse_bytes():
    assert parse_bytes("4 MiB") == 4 * 2**20
    assert parse_bytes("512KiB") == 512 * 2**10
    assert parse_bytes(1000) == 1000
    for bad in ("lots", "-1", 0, "4 parsecs"):
        with pytest.raises(ValueError):
            parse_bytes(bad)


def test_env_overrides_default(monkeypatch):
    monkeypatch.setenv("SLIDESCOPE_CHUNK_BYTES", "1 MiB")
    assert default_chunk_bytes() == 2**20


@settings(max_examples=300, deadline=None)
@given(
    h=st.integers(1, 300_000),
    w=st.integers(1, 300_000),
    ny=st.sampled_from([8, 16, 128, 240, 256, 512, 1024]),
    nx=st.sampled_from([128, 240, 256, 512, 1024, 3840, 4096]),
    s=st.sampled_from([1, 3, 4]),
    itemsize=st.sampled_from([1, 2, 4]),
    budget=st.integers(2**10, 2**26),
)
def test_chunks_are_whole_multiples_within_budget(h, w, ny, nx, s, itemsize, budget):
    chunks = choose_chunks((h, w, s), (ny, nx, s), itemsize, spatial=(0, 1), budget=budget)
    cy, cx, cs = chunks
    assert cs == s
    # whole multiples of the native chunk, or the whole (shorter) axis
    assert cy == h or cy % ny == 0
    assert cx == w or cx % nx == 0
    assert 0 < cy <= h
    assert 0 < cx <= w
    native_bytes = min(ny, h) * min(nx, w) * s * itemsize
    assert cy * cx * s * itemsize <= max(budget, native_bytes)
    # the budget is used: growing both axes by one native step would not fit, and an axis
    # that is already whole leaves the other one grown to the budget
    per_px = s * itemsize
    full_y, full_x = cy == h, cx == w
    if cy * cx * s * itemsize <= budget:
        if not full_y and not full_x:
            assert (cy + ny) * (cx + nx) * per_px > budget
        elif full_y and not full_x:
            assert cy * (cx + nx) * per_px > budget
        elif full_x and not full_y:
            assert (cy + ny) * cx * per_px > budget
