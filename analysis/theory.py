"""Theory curves computed from the rotation alone (no training).

- RoFormer's long-term decay: |Σ_j h_j e^{iΔθ_j}| ≤ max_j|h_{j+1} − h_j| · Σ_j |S_j(Δ)| with
  S_j = Σ_{k<j} e^{iΔθ_k}; `decay_curve` returns the relative bound (2/d)·Σ_{j=1}^{d/2} |S_j(Δ)|.
  HD-RoPE gives each of its d/N frequencies to N/2 pairs. A basis Q changes nothing here:
  R_N = Q·R_pair·Qᵀ is orthogonally similar to R_pair, so the bound depends on (N, θ) only.
- Men et al.'s B(Δ) = Σ_j cos(Δθ_j) over the pair frequencies, and its first zero.
- Each block frequency's wavelength 2π/θ_j against the train length.
- K's mixing density and coherence for each basis (from `hdrope.describe_basis`).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from hdrope import HDRotary, describe_basis
from hdrope.errors import UserError

__all__ = ["b_curve", "decay_curve", "first_zero", "mixing_table", "pair_frequencies", "theory_table", "wavelengths"]


def pair_frequencies(head_dim: int, rotation_dim: int, theta: float) -> np.ndarray:
    """The frequency of each of the d/2 rotation pairs (rad/token), block frequencies repeated N/2 times."""
    freqs = np.asarray(HDRotary(head_dim, rotation_dim, theta, basis="identity").frequencies, dtype=np.float64)
    return np.repeat(freqs, rotation_dim // 2)


def decay_curve(head_dim: int, rotation_dim: int, theta: float, distances: np.ndarray) -> np.ndarray:
    """RoFormer's relative upper bound (2/d)·Σ_j |S_j(Δ)| at each distance Δ."""
    f = pair_frequencies(head_dim, rotation_dim, theta)
    phases = np.exp(1j * np.outer(np.asarray(distances, dtype=np.float64), f))  # (Δ, d/2)
    partial = np.cumsum(phases, axis=1)  # S_{j+1} = Σ_{k<=j}
    return np.abs(partial).mean(axis=1)


def b_curve(head_dim: int, rotation_dim: int, theta: float, distances: np.ndarray) -> np.ndarray:
    """B(Δ) = Σ_j cos(Δ·θ_j) over the pair frequencies."""
    f = pair_frequencies(head_dim, rotation_dim, theta)
    return np.cos(np.outer(np.asarray(distances, dtype=np.float64), f)).sum(axis=1)


def first_zero(values: np.ndarray, distances: np.ndarray) -> float | None:
    """The first distance where a curve drops to or below zero, or None."""
    below = np.flatnonzero(np.asarray(values) <= 0)
    return float(np.asarray(distances)[below[0]]) if len(below) else None


def wavelengths(head_dim: int, rotation_dim: int, theta: float) -> np.ndarray:
    """2π/θ_j (tokens) of each block frequency."""
    return 2 * np.pi / np.asarray(HDRotary(head_dim, rotation_dim, theta, basis="identity").frequencies)


def theory_table(rotation_dims: list[int], thetas: list[float], head_dim: int = 64, train_len: int = 256,
                 max_distance: int = 8192) -> pd.DataFrame:
    """One row per (N, θ): frequencies, wavelength range, how many exceed the train length, B's first zero."""
    d = np.arange(max_distance + 1)
    rows = []
    for n in rotation_dims:
        for theta in thetas:
            wl = wavelengths(head_dim, n, theta)
            b = b_curve(head_dim, n, theta, d)
            rows.append({"rotation_dim": n, "theta": theta, "n_frequencies": len(wl),
                         "min_wavelength": float(wl.min()), "max_wavelength": float(wl.max()),
                         "frequencies_beyond_train_len": int((wl > train_len).sum()),
                         "b_first_zero": first_zero(b, d),
                         "decay_at_train_len": float(decay_curve(head_dim, n, theta, np.array([train_len]))[0])})
    return pd.DataFrame(rows)


def mixing_table(rotation_dims: list[int], bases: tuple[str, ...] = ("identity", "random", "paley")) -> pd.DataFrame:
    """Density and coherence of K = Q·J·Qᵀ per (N, basis); a basis without that order is skipped."""
    rows = []
    for n in rotation_dims:
        for kind in bases:
            try:
                r = describe_basis(kind, n)
            except UserError:
                continue
            rows.append({"rotation_dim": n, "basis": kind, "k_nonzero": r.k_nonzero,
                         "k_nonzero_fraction": r.k_nonzero_fraction, "mu_k": r.mu_k, "mu_q": r.mu_q, "det": r.det})
    return pd.DataFrame(rows)
