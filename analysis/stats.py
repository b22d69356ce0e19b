"""Summary statistics with uncertainty: seeded percentile-bootstrap confidence intervals of a mean."""

from __future__ import annotations

import numpy as np

__all__ = ["bootstrap_ci", "mean_ci"]


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
