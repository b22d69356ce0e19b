"""Calibrated inference for few-seed studies: the seed is the unit of replication.

- `compare(treatment, reference, paired=...)`: the difference of two variants' means with a confidence
  interval and a p-value, both from one test, so the interval excludes 0 exactly when p < 1 − level. Paired
  (both variants ran the same seeds, so they share data order and initialisation): the exact sign-flip test
  of the mean per-seed difference (every one of the 2ⁿ sign assignments) while n ≤ 16 seeds, and its
  interval is that test inverted (every shift d0 the test of the differences − d0 does not reject); the
  paired t-test and its interval beyond. Unpaired: Welch's test and interval.
- `mean_interval`: a Student-t interval of one mean; `proportion_interval`: Wilson's interval of k of n.
- `adjust`: a family's p-values corrected by Holm (family-wise error) or Benjamini–Hochberg (FDR).
- `detectable_difference` / `seeds_needed`: power at the measured per-seed spread (80% by default).

Why the sign-flip test for paired seeds: it is exact whenever the per-seed differences are symmetric about
their mean, with no normality assumed, and a handful of seeds cannot show whether they are normal (one seed
that diverged is common); the t-test is exact only under normality. Its price is power at few seeds: it
cannot go below p = 2/2ⁿ, so at n ≤ 5 seeds and level 95% it rejects no shift at all and its interval is the
whole line (−∞, ∞); such a comparison is flagged `testable = False` and tables say "too few seeds to test"
instead of drawing a mark. At 6 seeds the 95% interval is [min, max] of the per-seed differences.

The maths is scipy's and statsmodels' (the sign-flip p equals scipy's exact `permutation_test`, checked in the
suite); `tests/test_stats_calibration.py` checks the false-positive rate, the coverage, the paired design's power
and that every interval agrees with its mark, by simulation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import stats as sps

__all__ = [
    "CORRECTIONS",
    "EXACT_MAX_SEEDS",
    "Comparison",
    "Interval",
    "adjust",
    "compare",
    "detectable_difference",
    "mean_interval",
    "min_attainable_p",
    "proportion_interval",
    "seeds_needed",
    "seeds_to_reach",
    "sign_flip",
]

EXACT_MAX_SEEDS = 16  # the sign-flip test enumerates all 2ⁿ assignments up to here
CORRECTIONS = {"holm": "Holm (family-wise error)", "fdr_bh": "Benjamini–Hochberg (false discovery rate)"}


def _finite(values: object) -> np.ndarray:
    v = np.asarray(values, dtype=np.float64).ravel()
    return v[np.isfinite(v)]


@dataclass(frozen=True)
class Interval:
    """A point estimate with its confidence interval over n units (lo = hi = nan when n cannot give one)."""

    estimate: float
    lo: float
    hi: float
    n: int

    @property
    def half_width(self) -> float:
        """(hi − lo) / 2, nan without an interval."""
        return (self.hi - self.lo) / 2


@dataclass(frozen=True)
class Comparison:
    """treatment − reference: the difference of means, its CI, the test's p-value and how it was made."""

    delta: float
    lo: float
    hi: float
    p: float
    n: int  # seeds: pairs when paired, else the smaller arm
    paired: bool
    method: str  # "sign-flip (exact)", "paired t", "Welch t", or "none"
    n_treatment: int
    n_reference: int
    sd: float  # the per-seed spread the test sees: of the differences (paired) or pooled within arms (Welch)
    min_p: float  # the smallest p-value this design can produce
    level: float = 0.95

    @property
    def testable(self) -> bool:
        """Whether this design can reach the level at all (a sign-flip over n ≤ 5 seeds cannot)."""
        return bool(np.isfinite(self.min_p) and self.min_p <= 1 - self.level)


def min_attainable_p(n: int, paired: bool) -> float:
    """The smallest two-sided p-value the test `compare` uses can give with n seeds (per arm when unpaired)."""
    if n < 2:
        return math.nan
    if paired and n <= EXACT_MAX_SEEDS:
        return 2.0 / 2**n
    return 0.0


def seeds_to_reach(alpha: float, paired: bool) -> int:
    """The fewest seeds (pairs, or per arm) whose test can produce a p-value at or below alpha at all."""
    return next(n for n in range(2, 64) if min_attainable_p(n, paired) <= alpha)


def mean_interval(values: object, level: float = 0.95) -> Interval:
    """The mean of the finite values with its Student-t confidence interval (no interval below 2 values)."""
    v = _finite(values)
    if len(v) == 0:
        return Interval(math.nan, math.nan, math.nan, 0)
    mean = float(v.mean())
    if len(v) < 2:
        return Interval(mean, math.nan, math.nan, 1)
    sem = float(sps.sem(v))
    if sem == 0:
        return Interval(mean, mean, mean, len(v))
    lo, hi = sps.t.interval(level, len(v) - 1, loc=mean, scale=sem)
    return Interval(mean, float(lo), float(hi), len(v))


def proportion_interval(k: int, n: int, level: float = 0.95) -> Interval:
    """k successes of n trials: the proportion with Wilson's score interval."""
    from statsmodels.stats.proportion import proportion_confint

    if n <= 0:
        return Interval(math.nan, math.nan, math.nan, 0)
    lo, hi = proportion_confint(int(k), int(n), alpha=1 - level, method="wilson")
    return Interval(k / n, float(lo), float(hi), int(n))


def _subset_sums(d: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The sum and size of every non-empty subset A of the n differences (2ⁿ − 1 of each)."""
    n = len(d)
    masks = (np.arange(1, 2**n)[:, None] >> np.arange(n)) & 1
    return masks @ d, masks.sum(axis=1)


def sign_flip(d: np.ndarray, level: float = 0.95) -> tuple[float, float, float]:
    """The exact two-sided sign-flip test of mean(d) = 0 and its inversion: (p, lo, hi).

    Flipping the signs of a subset A moves the mean down by 2·sum(d_A)/n, so P(flipped mean ≥ observed) =
    (1 + #{A ≠ ∅: sum((d − d0)_A) ≤ 0}) / 2ⁿ, which rises with the shift d0; the other tail falls with it, and
    p = min(1, 2·min of the tails) (scipy's two-sided permutation p-value). A shift is therefore rejected
    exactly when it lies below the k-th smallest or above the k-th largest subset mean, k = ⌈α·2ⁿ⁻¹⌉ − 1
    (α = 1 − level): those two subset means are the interval, closed, and (−∞, ∞) when k = 0. Both p and the
    interval count the same subset sums, so the interval excludes 0 exactly when p < α."""
    n = len(d)
    sums, sizes = _subset_sums(d)
    tails = 1 + np.array([(sums <= 0).sum(), (sums >= 0).sum()])
    p = float(min(1.0, 2 * tails.min() / 2**n))
    k = math.ceil((1 - level) * 2 ** (n - 1)) - 1
    if k <= 0:
        return p, -math.inf, math.inf
    means = np.sort(sums / sizes)
    return p, float(means[k - 1]), float(means[-k])


def compare(treatment: object, reference: object, *, paired: bool, level: float = 0.95) -> Comparison:
    """treatment − reference over seeds. Paired: the two arrays are aligned by seed (a non-finite value drops
    its pair); the exact sign-flip p-value and its inverted interval (`sign_flip`; the paired t-test and its
    interval beyond EXACT_MAX_SEEDS seeds). Unpaired: Welch's t-test and interval. Interval and p come from
    the same test, so lo > 0 or hi < 0 exactly when p < 1 − level. Fewer than 2 seeds give nan interval/p."""
    t = np.asarray(treatment, dtype=np.float64).ravel()
    r = np.asarray(reference, dtype=np.float64).ravel()
    if paired:
        if len(t) != len(r):
            raise ValueError(f"paired comparison needs one value per seed on each side; got {len(t)} and {len(r)}")
        keep = np.isfinite(t) & np.isfinite(r)
        d = t[keep] - r[keep]
        n = len(d)
        if n == 0:
            return Comparison(math.nan, math.nan, math.nan, math.nan, 0, True, "none", 0, 0, math.nan, math.nan,
                              level)
        delta = float(d.mean())
        if n < 2:
            return Comparison(delta, math.nan, math.nan, math.nan, 1, True, "none", 1, 1, math.nan, math.nan, level)
        sd = float(d.std(ddof=1))
        if n <= EXACT_MAX_SEEDS:
            p, lo, hi = sign_flip(d, level)
        elif sd == 0:  # every seed moved by exactly the same amount
            lo = hi = delta
            p = 1.0 if delta == 0 else 0.0
        else:
            test = sps.ttest_1samp(d, 0.0)
            ci = test.confidence_interval(level)
            lo, hi, p = float(ci.low), float(ci.high), float(test.pvalue)
        method = "sign-flip (exact)" if n <= EXACT_MAX_SEEDS else "paired t"
        return Comparison(delta, lo, hi, p, n, True, method, n, n, sd, min_attainable_p(n, True), level)
    t, r = _finite(t), _finite(r)
    nt, nr = len(t), len(r)
    if nt == 0 or nr == 0:
        return Comparison(math.nan, math.nan, math.nan, math.nan, 0, False, "none", nt, nr, math.nan, math.nan,
                          level)
    delta = float(t.mean() - r.mean())
    if nt < 2 or nr < 2:
        return Comparison(delta, math.nan, math.nan, math.nan, min(nt, nr), False, "none", nt, nr, math.nan,
                          math.nan, level)
    sd = float(math.sqrt(((nt - 1) * t.var(ddof=1) + (nr - 1) * r.var(ddof=1)) / (nt + nr - 2)))
    if t.var() == 0 and r.var() == 0:
        lo = hi = delta
        p = 1.0 if delta == 0 else 0.0
    else:
        test = sps.ttest_ind(t, r, equal_var=False)
        ci = test.confidence_interval(level)
        lo, hi, p = float(ci.low), float(ci.high), float(test.pvalue)
    return Comparison(delta, lo, hi, p, min(nt, nr), False, "Welch t", nt, nr, sd, 0.0, level)


def _holm(p: np.ndarray) -> np.ndarray:
    """Holm's step-down adjusted p-values: the k-th smallest times (m - k + 1), made monotone, at most 1.

    statsmodels' `multipletests(method="holm")` gives the same numbers (tests/test_stats_calibration.py checks it)
    but runs a full garbage collection on every call: 0.15-0.2 s in a small process, 0.6 s in a test worker."""
    order = np.argsort(p, kind="stable")
    stepped = np.maximum.accumulate(p[order] * np.arange(len(p), 0, -1))
    out = np.empty_like(p)
    out[order] = np.minimum(stepped, 1.0)
    return out


def _benjamini_hochberg(p: np.ndarray) -> np.ndarray:
    from scipy.stats import false_discovery_control

    return false_discovery_control(p, method="bh")


# correction -> its adjusted p-values (the keys are CORRECTIONS')
_ADJUSTED = {"holm": _holm, "fdr_bh": _benjamini_hochberg}


def adjust(p_values: list[float], method: str = "holm") -> list[float]:
    """The family's p-values adjusted by `method` (a key of CORRECTIONS); nan entries stay nan and are not counted."""
    if method not in CORRECTIONS:
        raise ValueError(f"correction {method!r}: choose one of {sorted(CORRECTIONS)}")
    p = np.asarray(p_values, dtype=np.float64)
    out = np.full(len(p), math.nan)
    ok = np.isfinite(p)
    if ok.any():
        out[ok] = _ADJUSTED[method](p[ok])
    return [float(x) for x in out]


def _power_model(paired: bool):
    from statsmodels.stats.power import TTestIndPower, TTestPower

    return TTestPower() if paired else TTestIndPower()


def detectable_difference(sd: float, n: int, *, paired: bool, alpha: float = 0.05, power: float = 0.8) -> float:
    """The smallest true difference a two-sided test at alpha detects with the given power from n seeds (per arm
    when unpaired) at per-seed spread sd; inf when the design cannot reach alpha at all, nan without a spread."""
    if not (np.isfinite(sd) and n >= 2):
        return math.nan
    if min_attainable_p(n, paired) > alpha:
        return math.inf
    if sd == 0:
        return 0.0
    if paired:
        effect = _power_model(True).solve_power(effect_size=None, nobs=n, alpha=alpha, power=power)
    else:
        effect = _power_model(False).solve_power(effect_size=None, nobs1=n, ratio=1.0, alpha=alpha, power=power)
    return float(np.asarray(effect).item() * sd)


def seeds_needed(difference: float, sd: float, *, paired: bool, alpha: float = 0.05, power: float = 0.8,
                 max_seeds: int = 10_000) -> int | None:
    """The fewest seeds (pairs, or per arm when unpaired) for which `compare`'s test detects a true `difference`
    with the given power at alpha, at per-seed spread sd; None when even max_seeds do not."""
    if not (difference > 0 and np.isfinite(sd) and sd >= 0):
        raise ValueError(f"need a positive difference and a finite spread; got difference={difference}, sd={sd}")
    for n in range(2, max_seeds + 1):
        if min_attainable_p(n, paired) > alpha:
            continue
        if sd == 0:
            return n
        if _two_sided_power(difference / sd, n, paired=paired, alpha=alpha) >= power:
            return n
    return None


def _two_sided_power(effect: float, n: int, *, paired: bool, alpha: float) -> float:
    """The two-sided t-test's power at standardised effect `effect` with n seeds (pairs, or per arm): the sum of
    its two tails, a tail that scipy's noncentral t cannot resolve (nan, far below 1e-16) counting as 0."""
    model = _power_model(paired)
    size = {"nobs": n} if paired else {"nobs1": n, "ratio": 1.0}
    tails = [model.power(effect_size=effect, alpha=alpha / 2, alternative=side, **size)
             for side in ("larger", "smaller")]
    return float(sum(np.nan_to_num(np.asarray(t, dtype=np.float64)).item() for t in tails))
