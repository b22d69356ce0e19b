"""Summary statistics with uncertainty: seeded percentile-bootstrap confidence intervals of a mean."""

from __future__ import annotations

import numpy as np

__all__ = ["bootstrap_ci", "contrast_ci", "excludes_zero", "mean_ci"]


def bootstrap_ci(values: np.ndarray, level: float = 0.95, n_boot: int = 2000, seed: int = 42) -> tuple[float, float]:
    """Percentile bootstrap CI of the mean of values (nan, nan for fewer than 2 values)."""
    v = np.asarray(values, dtype=np.float64)
    v = v[np.isfinite(v)]
    if len(v) < 2:
        return float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    means = v[rng.integers(0, len(v), size=(n_boot, len(v)))].mean(axis=1)
    alpha = (1 - level) / 2
    lo, hi = np.quantile(means, [alpha, 1 - alpha])
    return float(lo), float(hi)


def mean_ci(values: np.ndarray, level: float = 0.95, n_boot: int = 2000, seed: int = 42) -> dict[str, float]:
    """{mean, lo, hi, n} of values."""
    v = np.asarray(values, dtype=np.float64)
    lo, hi = bootstrap_ci(v, level, n_boot, seed)
    mean = float(np.nanmean(v)) if np.isfinite(v).any() else float("nan")
    return {"mean": mean, "lo": lo, "hi": hi, "n": int(np.isfinite(v).sum())}


def contrast_ci(groups: list[np.ndarray], weights: list[float], level: float = 0.95, n_boot: int = 2000,
                seed: int = 42) -> dict[str, float]:
    """{value, lo, hi} of Σ wᵢ·mean(groupᵢ) (e.g. a difference of means, or a difference of two gaps),
    each group resampled independently; lo/hi are nan when a group has fewer than 2 values."""
    vs = [np.asarray(g, dtype=np.float64) for g in groups]
    vs = [v[np.isfinite(v)] for v in vs]
    if any(len(v) == 0 for v in vs):
        return {"value": float("nan"), "lo": float("nan"), "hi": float("nan")}
    value = float(sum(w * v.mean() for w, v in zip(weights, vs, strict=True)))
    if any(len(v) < 2 for v in vs):
        return {"value": value, "lo": float("nan"), "hi": float("nan")}
    rng = np.random.default_rng(seed)
    boot = sum(w * v[rng.integers(0, len(v), size=(n_boot, len(v)))].mean(axis=1)
               for w, v in zip(weights, vs, strict=True))
    alpha = (1 - level) / 2
    lo, hi = np.quantile(boot, [alpha, 1 - alpha])
    return {"value": value, "lo": float(lo), "hi": float(hi)}


def excludes_zero(ci: dict[str, float]) -> bool:
    """Whether a contrast's CI lies wholly on one side of 0 (False when there is no CI)."""
    return bool(np.isfinite(ci["lo"]) and np.isfinite(ci["hi"]) and (ci["lo"] > 0 or ci["hi"] < 0))
