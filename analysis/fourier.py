"""Attention logits as a function of relative distance, and their spectrum (NOTES §4).

`distance_profile` averages causal logits by distance Δ; `fourier_magnitude` is the uniform
spectrum |rFFT(hann · (ℓ − mean ℓ))| in rad/token; `rope_band_magnitude` evaluates the same
windowed, centred profile at the model's own block frequencies θ_j (a non-uniform DFT).
"""

from __future__ import annotations

import numpy as np

__all__ = ["distance_profile", "fourier_magnitude", "rope_band_magnitude"]


def distance_profile(logits: np.ndarray) -> np.ndarray:
    """Mean logit by relative distance Δ = i − j ≥ 0 over the causal part of (..., L, L) maps -> (..., L)."""
    x = np.asarray(logits, dtype=np.float64)
    if x.ndim < 2 or x.shape[-1] != x.shape[-2]:
        raise ValueError(f"logits must be (..., L, L); got shape {x.shape}")
    length = x.shape[-1]
    return np.stack([np.diagonal(x, offset=-d, axis1=-2, axis2=-1).mean(-1) for d in range(length)], axis=-1)


def _window(profile: np.ndarray) -> np.ndarray:
    p = np.asarray(profile, dtype=np.float64)
    if p.shape[-1] < 2:
        raise ValueError(f"a profile needs at least 2 distances; got shape {p.shape}")
    centred = p - p.mean(-1, keepdims=True)
    return centred * np.hanning(p.shape[-1])


def fourier_magnitude(profile: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(frequencies in rad/token, |rFFT(hann · (profile − mean))|) along the last axis."""
    w = _window(profile)
    n = w.shape[-1]
    return 2 * np.pi * np.fft.rfftfreq(n), np.abs(np.fft.rfft(w, axis=-1))


def rope_band_magnitude(profile: np.ndarray, frequencies: np.ndarray) -> np.ndarray:
    """|Σ_Δ hann·(ℓ(Δ) − mean) · e^{−iθΔ}| at each block frequency θ (rad/token) -> (..., len(frequencies))."""
    w = _window(profile)
    delta = np.arange(w.shape[-1])
    basis = np.exp(-1j * np.outer(delta, np.asarray(frequencies, dtype=np.float64)))
    return np.abs(w @ basis)
