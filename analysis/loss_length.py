"""The loss effective length, paired by content: where full context starts to cost more than the train length's.

Reads one cell's position_loss.parquet rows (format version 2, trainer.evals.position_loss). At the longest
evaluated factor, each bin holds d, the mean over windows of the same tokens' full-context loss minus their
train-length-context loss, with its standard error over windows (trainer.evals.paired_loss). The effective length,
in multiples of the train length L, is the first tested bin at or past L whose d exceeds the tolerance by more than
its noise: d − tolerance > c · SE, with c the one-sided Student-t critical value (windows − 1 degrees of freedom) at
alpha / (the number of bins tested) (Bonferroni), so a model that never loses more than the tolerance reads
censored, at its window length, in at least 1 − alpha of window sets whatever the number of bins. A tested bin
joins consecutive stored bins until it holds MIN_TEST_TOKENS tokens (windows × positions; its SE is the mean of
theirs, which can only overstate it): with few windows the instrument trades resolution for power. A cell whose
in-distribution loss (positions [L/2, L)) is not below the unigram surprisal of the same tokens by more than
GAIN_TOLERANCE plus the same kind of one-sided bound never learned to use context: it reads nan, "not learned".
Files without the paired columns (written before them, or without eval.sliding_stride) read nan, "not available".
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import stats

__all__ = ["GAIN_TOLERANCE", "LOSS_ALPHA", "MIN_TEST_TOKENS", "LossReading", "context_learned", "false_alarm_rate",
           "loss_reading", "paired_effective_length", "resolution_width"]

LOSS_ALPHA = 0.05  # the chance that a model within the tolerance everywhere reads shorter than its window
GAIN_TOLERANCE = 0.1  # nats the in-distribution loss must lie below the unigram surprisal, beyond noise
MIN_TEST_TOKENS = 128  # tokens (windows × positions) a tested bin holds at least

NOT_AVAILABLE = ("not available: the file has no paired columns; re-evaluate the checkpoint with eval.sliding_stride "
                 "set (e.g. half the train length)")


@dataclass(frozen=True)
class LossReading:
    """An effective length (× train length; nan when there is none) and why: "crossed at <position>", "censored",
    "not learned" or "not available: …"."""

    value: float
    reason: str


@functools.lru_cache(maxsize=256)
def _critical(windows: int, alpha: float) -> float:
    return float(stats.t.ppf(1 - alpha, windows - 1)) if windows >= 2 else math.inf


def paired_effective_length(positions: Sequence[int], diff: Sequence[float], diff_se: Sequence[float], windows: int,
                            train_length: int, length: int, tolerance: float, alpha: float = LOSS_ALPHA) -> float:
    """In multiples of train_length: the start of the first tested bin (stored bins at or past train_length,
    joined to MIN_TEST_TOKENS tokens) whose paired difference exceeds `tolerance` by more than the Bonferroni
    one-sided bound over the bins tested; length / train_length (censored) when none does."""
    p = np.asarray(positions, dtype=np.int64)
    order = np.argsort(p)
    p, d, se = p[order], np.asarray(diff, dtype=float)[order], np.asarray(diff_se, dtype=float)[order]
    width = np.diff(np.append(p, length)).astype(float)
    tested = p >= train_length
    if tested.any():
        p, d, se, width = p[tested], d[tested], se[tested], width[tested]
        group = round(resolution_width(windows, int(width.min())) / width.min())
        cut = np.arange(0, len(p), group)
        w = np.add.reduceat(width, cut)
        d, se = np.add.reduceat(d * width, cut) / w, np.add.reduceat(se * width, cut) / w
        c = _critical(windows, alpha / len(cut))
        excess = d - tolerance
        alarm = (excess > 0) & ((se == 0) | (excess > c * se))
        if alarm.any():
            return float(p[cut][np.argmax(alarm)]) / train_length
    return max(1.0, length / train_length)


def resolution_width(windows: int, width: int) -> int:
    """The positions a tested bin spans: stored bins of `width` positions joined until windows × positions reaches
    MIN_TEST_TOKENS (the resolution of the effective length)."""
    return width * max(1, math.ceil(MIN_TEST_TOKENS / (max(windows, 1) * width)))


def context_learned(gain: Sequence[float], gain_se: Sequence[float], windows: Sequence[int],
                    tolerance: float = GAIN_TOLERANCE, alpha: float = LOSS_ALPHA) -> bool:
    """Whether the context gain (unigram surprisal − loss at positions [L/2, L)), pooled over length factors
    (weights: windows), exceeds `tolerance` by more than its one-sided 1 − alpha bound."""
    g, se, n = (np.asarray(x, dtype=float) for x in (gain, gain_se, windows))
    total = n.sum()
    mean, pooled_se = float((n * g).sum() / total), float(np.sqrt((n**2 * se**2).sum()) / total)
    excess = mean - tolerance
    return bool(excess > 0 and (pooled_se == 0 or excess > _critical(int(total) - len(n) + 1, alpha) * pooled_se))


def loss_reading(rows: pd.DataFrame, tolerance: float, alpha: float = LOSS_ALPHA) -> LossReading:
    """One cell's loss effective length from its position_loss rows (columns of trainer.evals.position_loss)."""
    if "diff" not in rows or rows["gain"].isna().all():
        return LossReading(math.nan, NOT_AVAILABLE)
    factors = rows.drop_duplicates("length_factor")
    if not context_learned(factors["gain"], factors["gain_se"], factors["windows"], alpha=alpha):
        return LossReading(math.nan, "not learned")
    longest = rows[rows["length_factor"] == rows["length_factor"].max()]
    if longest["diff"].isna().any():
        return LossReading(math.nan, NOT_AVAILABLE)
    length = int(longest["length"].iloc[0])
    train_length = round(length / float(longest["length_factor"].iloc[0]))
    value = paired_effective_length(longest["position"], longest["diff"], longest["diff_se"],
                                    int(longest["windows"].iloc[0]), train_length, length, tolerance, alpha)
    censored = value == max(1.0, length / train_length)
    return LossReading(value, "censored" if censored else f"crossed at {round(value * train_length)}")


def false_alarm_rate(windows: int, bins: int, sets: int, tolerance: float, alpha: float = LOSS_ALPHA,
                     width: int = 1, correlation: float = 0.5, df: float = math.inf, seed: int = 0) -> float:
    """Simulation: the share of `sets` window sets in which a model whose paired difference is exactly `tolerance`
    in every bin (the worst case that must read censored) reads shorter than its window. `bins` stored bins of
    `width` positions lie past the train length; each window's bin values are tolerance + noise, correlated
    `correlation` between bins, Student-t with `df` degrees of freedom (normal when infinite)."""
    rng = np.random.default_rng(seed)
    shared = rng.standard_normal((sets, windows, 1))
    own = rng.standard_normal((sets, windows, bins))
    noise = math.sqrt(correlation) * shared + math.sqrt(1 - correlation) * own
    if math.isfinite(df):
        noise = noise / np.sqrt(rng.chisquare(df, (sets, windows, 1)) / df)
    d = tolerance + noise
    positions = width * np.arange(1, bins + 1)  # train length `width`: every bin is tested
    length = width * (bins + 1)
    alarms = 0
    for one in d:
        mean, se = one.mean(axis=0), one.std(axis=0, ddof=1) / math.sqrt(windows)
        alarms += paired_effective_length(positions, mean, se, windows, width, length, tolerance, alpha) < bins + 1
    return alarms / sets
