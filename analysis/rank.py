"""Layer-wise effective attention rank from stored dumps, with intervals over seeds.

`effective_rank` is the shared definition in `hdrope.diagnostics` (float64 SVD; `roy_vetterli` is
exp(H(σ/Σσ))). Threshold ranks are not offered: a causal softmax map always has full rank.

Heads and probe samples within one run are not replicates of the experiment (they share its one
trained model), so intervals are taken over seeds: each seed's value per layer is the mean over its
heads × samples, and the interval (and a difference to another variant, paired by seed where both ran
the same seeds) comes from `analysis.stats` over those per-seed values.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from analysis.stats import adjust, compare, mean_interval
from hdrope.diagnostics import RANK_KINDS, effective_rank, row_entropy

__all__ = ["RANK_KINDS", "effective_rank", "layerwise_rank", "per_seed", "rank_difference", "row_entropy",
           "seed_interval"]


def layerwise_rank(stats: pd.DataFrame, value: str = "erank") -> pd.DataFrame:
    """One run's layers: mean and spread (sd) of `value` over its heads × samples -> layer, mean, sd, n.

    A description of one trained model, not an inference: see `seed_interval` for intervals."""
    g = stats.groupby("layer", sort=True)[value]
    out = pd.DataFrame({"mean": g.mean(), "sd": g.std(ddof=1), "n": g.count()}).reset_index()
    out["layer"] = out["layer"].astype(int)
    return out


def per_seed(stats: pd.DataFrame, value: str = "erank", seed_column: str = "seed") -> pd.DataFrame:
    """seed, layer, value: each seed's mean of `value` over its heads × samples (stats carry a seed column)."""
    return (stats.groupby([seed_column, "layer"], sort=True)[value].mean().reset_index()
            .rename(columns={seed_column: "seed"}))


def seed_interval(seeded: pd.DataFrame, value: str = "erank", level: float = 0.95) -> pd.DataFrame:
    """Per layer: the mean over seeds with its Student-t interval -> layer, mean, lo, hi, n (seeds)."""
    rows = []
    for layer, g in seeded.groupby("layer", sort=True):
        iv = mean_interval(g[value].to_numpy(dtype=np.float64), level)
        rows.append({"layer": int(layer), "mean": iv.estimate, "lo": iv.lo, "hi": iv.hi, "n": iv.n})
    return pd.DataFrame(rows, columns=["layer", "mean", "lo", "hi", "n"])


def rank_difference(a: pd.DataFrame, b: pd.DataFrame, value: str = "erank", level: float = 0.95,
                    correction: str = "holm") -> pd.DataFrame:
    """Per layer: a − b over seeds (per-seed tables from `per_seed`), paired when both ran the same seeds, else
    Welch -> layer, diff, lo, hi, p, p_adj (corrected over the layers), n, paired, testable."""
    rows = []
    for layer in sorted(set(a["layer"]) & set(b["layer"])):
        va = a[a["layer"] == layer].set_index("seed")[value]
        vb = b[b["layer"] == layer].set_index("seed")[value]
        paired = set(va.index) == set(vb.index) and len(va) >= 1
        c = (compare(va.sort_index().to_numpy(), vb.sort_index().to_numpy(), paired=True, level=level) if paired
             else compare(va.to_numpy(), vb.to_numpy(), paired=False, level=level))
        rows.append({"layer": int(layer), "diff": c.delta, "lo": c.lo, "hi": c.hi, "p": c.p, "n": c.n,
                     "paired": c.paired, "testable": c.testable})
    out = pd.DataFrame(rows, columns=["layer", "diff", "lo", "hi", "p", "n", "paired", "testable"])
    out["p_adj"] = adjust(out["p"].tolist(), correction) if len(out) else []
    return out
