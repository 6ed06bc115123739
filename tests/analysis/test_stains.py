"""Stain estimation on synthetic Beer-Lambert mixtures of known stains."""

from __future__ import annotations

import numpy as np
import pytest

from napari_slidescope import SlidescopeWarning
from napari_slidescope.analysis.stains import RUIFROK_HE, StainMatrix, estimate_stains, rgb_to_od

H_TRUE = np.array([0.60, 0.72, 0.35]) / np.linalg.norm([0.60, 0.72, 0.35])
E_TRUE = np.array([0.18, 0.86, 0.48]) / np.linalg.norm([0.18, 0.86, 0.48])


def _mix(c_h: np.ndarray, c_e: np.ndarray, seed: int = 0) -> np.ndarray:
    """RGB by Beer-Lambert from H and E concentrations (OD units)."""
    od = c_h[..., None] * H_TRUE + c_e[..., None] * E_TRUE
    rgb = 255.0 * 10.0 ** (-od)
    rgb += np.random.default_rng(seed).normal(0, 0.5, rgb.shape)
    return np.clip(np.round(rgb), 0, 255).astype(np.uint8)


def _angle(a: np.ndarray, b: np.ndarray) -> float:
    return float(
        np.degrees(np.arccos(np.clip(a @ b / np.linalg.norm(a) / np.linalg.norm(b), -1, 1)))
    )


def _synthetic(n: int = 30_000) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(3)
    kind = rng.integers(0, 3, n)  # pure H, pure E, mixture
    c_h = np.where(kind == 1, 0.0, rng.uniform(0.2, 1.2, n))
    c_e = np.where(kind == 0, 0.0, rng.uniform(0.2, 1.0, n))
    return _mix(c_h, c_e).reshape(150, 200, 3), c_h.reshape(150, 200), c_e.reshape(150, 200)


def test_rgb_to_od_values():
    od = rgb_to_od(np.array([[255, 0, 1]], np.uint8))
    assert od.dtype == np.float32
    assert od[0] == pytest.approx([0.0, np.log10(255), np.log10(255)], abs=1e-6)


def test_recovers_known_vectors():
    rgb, _, _ = _synthetic()
    s = estimate_stains(rgb)
    assert s.estimated
    assert _angle(s.hematoxylin, H_TRUE) < 3.0
    assert _angle(s.eosin, E_TRUE) < 3.0
    assert abs(s.residual @ s.hematoxylin) < 1e-6
    assert abs(s.residual @ s.eosin) < 1e-6
    assert np.linalg.norm(s.residual) == pytest.approx(1.0)


def test_separate_recovers_concentrations():
    rgb, c_h, c_e = _synthetic()
    stains = StainMatrix(
        H_TRUE, E_TRUE, np.cross(H_TRUE, E_TRUE) / np.linalg.norm(np.cross(H_TRUE, E_TRUE))
    )
    hed = stains.separate(rgb)
    assert hed.dtype == np.float32
    assert hed.shape == (150, 200, 3)
    assert np.abs(hed[..., 0] - c_h).mean() < 0.01
    assert np.abs(hed[..., 1] - c_e).mean() < 0.01


def test_ignores_glass():
    rgb, _, _ = _synthetic()
    framed = np.full((400, 400, 3), 250, np.uint8)  # mostly glass
    framed[:150, :200] = rgb
    s = estimate_stains(framed)
    assert _angle(s.hematoxylin, H_TRUE) < 3.0


def test_hematoxylin_is_the_bluer_vector_whatever_the_order():
    rgb, _, _ = _synthetic()
    s = estimate_stains(rgb[:, ::-1])  # pixel order must not matter
    assert s.hematoxylin[0] > s.eosin[0]


def test_fallback_on_glass_only():
    with pytest.warns(SlidescopeWarning, match="tissue pixels"):
        s = estimate_stains(np.full((64, 64, 3), 245, np.uint8))
    assert s is RUIFROK_HE
    assert not s.estimated


def test_fallback_on_single_stain():
    rng = np.random.default_rng(0)
    rgb = _mix(rng.uniform(0.3, 1.0, 10_000), np.zeros(10_000)).reshape(100, 100, 3)
    with pytest.warns(SlidescopeWarning, match="Ruifrok"):
        s = estimate_stains(rgb)
    assert s is RUIFROK_HE


@pytest.mark.parametrize(
    ("arr", "match"),
    [(np.zeros((8, 8, 3), np.float32), "uint8"), (np.zeros((8, 8), np.uint8), "grayscale")],
)
def test_invalid_input(arr, match):
    with pytest.raises(ValueError, match=match):
        estimate_stains(arr)
