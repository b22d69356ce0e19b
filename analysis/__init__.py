"""analysis: effective attention rank, Fourier attention magnitudes, theory curves, the paper's tables and figures.

Reads stored results (dumps, results tables, MLflow) and never needs a live trial. Public names:
`effective_rank`, `distance_profile`, `fourier_magnitude`, `rope_band_magnitude`, the calibrated
`compare` / `mean_interval` / `proportion_interval` of `analysis.stats`, plus the loaders
in `analysis.load` and the theory curves in `analysis.theory`.
"""

from pathlib import Path

from analysis.fourier import distance_profile, fourier_magnitude, rope_band_magnitude
from analysis.rank import effective_rank, layerwise_rank, rank_difference, row_entropy
from analysis.stats import compare, mean_interval, proportion_interval

NOTEBOOKS_DIR = Path(__file__).resolve().parent / "notebooks"

__all__ = [
    "NOTEBOOKS_DIR",
    "compare",
    "distance_profile",
    "effective_rank",
    "fourier_magnitude",
    "layerwise_rank",
    "mean_interval",
    "proportion_interval",
    "rank_difference",
    "rope_band_magnitude",
    "row_entropy",
]
