"""Layer-wise effective attention rank from stored dumps, with bootstrap CIs and cell-vs-cell differences.

`effective_rank` is the shared definition in `hdrope.diagnostics` (float64 SVD; `roy_vetterli` is
exp(H(σ/Σσ))). Threshold ranks are not offered: a causal softmax map always has full rank.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from analysis.stats import bootstrap_ci
from hdrope.diagnostics import RANK_KINDS, effective_rank, row_entropy

__all__ = ["RANK_KINDS", "effective_rank", "layerwise_rank", "rank_difference", "row_entropy"]


def layerwise_rank(stats: pd.DataFrame, value: str = "erank", seed: int = 42) -> pd.DataFrame:
    """Per layer: mean of `value` over heads and samples with a bootstrap 95% CI -> layer, mean, lo, hi, n."""
    rows = []
    for layer, group in stats.groupby("layer", sort=True):
        v = group[value].to_numpy(dtype=np.float64)
        lo, hi = bootstrap_ci(v, seed=seed)
        rows.append({"layer": int(layer), "mean": float(v.mean()), "lo": lo, "hi": hi, "n": len(v)})
    return pd.DataFrame(rows)


def rank_difference(a: pd.DataFrame, b: pd.DataFrame, value: str = "erank", n_boot: int = 2000,
                    seed: int = 42) -> pd.DataFrame:
    """Per layer: mean(a) − mean(b) with a bootstrap 95% CI (each side resampled independently)."""
    rng = np.random.default_rng(seed)
    rows = []
    for layer in sorted(set(a["layer"]) & set(b["layer"])):
        va = a.loc[a["layer"] == layer, value].to_numpy(np.float64)
        vb = b.loc[b["layer"] == layer, value].to_numpy(np.float64)
        boots = (va[rng.integers(0, len(va), (n_boot, len(va)))].mean(1)
                 - vb[rng.integers(0, len(vb), (n_boot, len(vb)))].mean(1))
        lo, hi = np.quantile(boots, [0.025, 0.975])
        rows.append({"layer": int(layer), "diff": float(va.mean() - vb.mean()), "lo": float(lo), "hi": float(hi)})
    return pd.DataFrame(rows)
