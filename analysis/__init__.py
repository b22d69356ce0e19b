"""analysis: effective attention rank, Fourier attention magnitudes, theory curves, the paper's tables and figures.

Reads stored results (dumps, results tables, MLflow) and never needs a live trial. Public names:
`effective_rank`, `row_entropy`, `distance_profile`, `fourier_magnitude`, `rope_band_magnitude`;
over a run's heads × samples `layerwise_rank`, over seeds `per_seed` / `seed_interval` / `rank_difference`;
the calibrated `compare` / `mean_interval` / `proportion_interval` / `adjust` of `analysis.stats`; plus the
loaders in `analysis.load` and the theory curves in `analysis.theory` (modules, not re-exported).
"""

from pathlib import Path

from analysis.fourier import distance_profile, fourier_magnitude, rope_band_magnitude
from analysis.rank import effective_rank, layerwise_rank, per_seed, rank_difference, row_entropy, seed_interval
from analysis.stats import adjust, compare, mean_interval, proportion_interval

NOTEBOOKS_DIR = Path(__file__).resolve().parent / "notebooks"

__all__ = [
    "NOTEBOOKS_DIR",
    "adjust",
    "compare",
    "distance_profile",
    "effective_rank",
    "fourier_magnitude",
    "layerwise_rank",
    "mean_interval",
    "per_seed",
    "proportion_interval",
    "rank_difference",
    "rope_band_magnitude",
    "row_entropy",
    "seed_interval",
]
