"""Paired loss by position: the same tokens scored with full context and with at most the train length of it.

For each window w and bin b, d[w, b] is the window's mean loss over the bin's positions with the full context minus
the same positions' loss when no prediction sees more than the train length (`sliding_position_loss`). The text's
own difficulty is the same in both, so it cancels; what remains is what the context past the train length costs
(d > 0) or earns (d < 0). Windows are independent units: a bin's standard error is the SD of d[·, b] over windows
over √windows. The context gain is the other paired quantity the loss instrument needs: per window, the mean over
its in-distribution positions [L/2, L) of each target's surprisal under the windows' own unigram distribution (a
predictor without context) minus the model's loss on it; a model that never learned gains nothing over it.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["context_gain", "paired_bins", "unigram_surprisal", "window_differences"]


def _mean_se(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mean over axis 0 and its standard error (nan with fewer than 2 rows)."""
    mean = values.mean(axis=0)
    if len(values) < 2:
        return mean, np.full_like(mean, math.nan)
    return mean, values.std(axis=0, ddof=1) / math.sqrt(len(values))


def window_differences(full: np.ndarray, limited: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """d[w, b]: window w's mean over bin b (first positions `starts`) of its full-context loss minus its
    limited-context loss, from per-window losses (windows × positions)."""
    if full.shape != limited.shape:
        raise ValueError("paired_bins: both losses need per-window rows of the same windows")
    widths = np.diff(np.append(starts, full.shape[1]))
    return np.add.reduceat(full - limited, starts, axis=1) / widths


def paired_bins(full: np.ndarray, limited: np.ndarray, starts: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """Per bin (first positions `starts`) of per-window losses (windows × positions) with the full context and with
    the limited one: the mean over windows of their difference, its standard error over windows, and the number of
    windows."""
    d = window_differences(full, limited, starts)
    mean, se = _mean_se(d)
    return mean, se, len(d)


def unigram_surprisal(targets: np.ndarray) -> np.ndarray:
    """-log q(t) of each target token, q the frequencies of all the targets given (same shape as targets)."""
    _, inverse, counts = np.unique(targets, return_inverse=True, return_counts=True)
    return -np.log(counts / targets.size)[inverse].reshape(targets.shape)


def context_gain(losses: np.ndarray, unigram: np.ndarray, train_length: int) -> tuple[float, float, int]:
    """Of per-window losses and their targets' unigram surprisal (windows × positions): the mean over windows of
    (unigram surprisal − model loss) over positions [L/2, L), its standard error over windows, and the number of
    windows."""
    inside = slice(train_length // 2, train_length)
    gain = (unigram[:, inside] - losses[:, inside]).mean(axis=1)
    mean, se = _mean_se(gain[:, None])
    return float(mean[0]), float(se[0]), len(gain)
