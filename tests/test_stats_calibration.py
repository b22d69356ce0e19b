"""Calibration of the report's statistics by simulation: the false-positive rate, the interval coverage and the
paired design's power of `analysis.stats.compare`, at the seed counts studies here use (2, 3, 5, 10).

The simulated studies look like seed replicates: each seed shares a large component between the two variants
(same data order and initialisation) plus a smaller per-variant component."""

import numpy as np
import pytest

from analysis.stats import (
    adjust,
    compare,
    detectable_difference,
    mean_interval,
    min_attainable_p,
    proportion_interval,
    seeds_needed,
    seeds_to_reach,
)

STUDIES = 1000
# one-sided 99% Monte Carlo margin on a 5% rate over STUDIES studies
MC_MARGIN = 2.33 * np.sqrt(0.05 * 0.95 / STUDIES)


def _studies(n: int, paired: bool, effect: float, seed_sd: float, noise_sd: float, rng: np.random.Generator):
    for _ in range(STUDIES):
        shared = rng.normal(0, seed_sd, n) if paired else None
        t = (shared if paired else rng.normal(0, seed_sd, n)) + effect + rng.normal(0, noise_sd, n)
        r = (shared if paired else rng.normal(0, seed_sd, n)) + rng.normal(0, noise_sd, n)
        yield compare(t, r, paired=paired)


@pytest.mark.parametrize("paired", [True, False])
@pytest.mark.parametrize("n", [2, 3, 5, 10])
def test_no_effect_is_marked_at_most_at_the_nominal_rate_and_intervals_cover(n, paired):
    rng = np.random.default_rng([n, paired])
    results = list(_studies(n, paired, effect=0.0, seed_sd=1.0, noise_sd=0.3, rng=rng))
    false_positive = np.mean([c.testable and c.p < 0.05 for c in results])
    coverage = np.mean([c.lo <= 0.0 <= c.hi for c in results])
    assert false_positive <= 0.05 + MC_MARGIN, false_positive
    assert coverage >= 0.93, coverage
    assert all(c.n == n and c.paired == paired for c in results)


@pytest.mark.parametrize("n", [3, 10])
def test_intervals_cover_a_true_nonzero_difference(n):
    rng = np.random.default_rng(n)
    for paired in (True, False):
        results = list(_studies(n, paired, effect=0.7, seed_sd=1.0, noise_sd=0.3, rng=rng))
        assert np.mean([c.lo <= 0.7 <= c.hi for c in results]) >= 0.93
        assert np.mean([c.delta for c in results]) == pytest.approx(0.7, abs=0.05)


def test_a_paired_design_detects_an_effect_an_unpaired_one_cannot():
    """Seeds move both variants together (sd 1) while the effect (0.3) is larger than the per-variant noise (0.1):
    pairing by seed removes the shared part; Welch on the same numbers sees only the seed spread."""
    rng = np.random.default_rng(7)
    n = 10
    paired_hits = unpaired_hits = 0
    for _ in range(300):
        shared = rng.normal(0, 1.0, n)
        t = shared + 0.3 + rng.normal(0, 0.1, n)
        r = shared + rng.normal(0, 0.1, n)
        paired_hits += compare(t, r, paired=True).p < 0.05
        unpaired_hits += compare(t, r, paired=False).p < 0.05
    assert paired_hits / 300 >= 0.9 and unpaired_hits / 300 <= 0.2, (paired_hits, unpaired_hits)


def test_few_seeds_are_flagged_untestable_instead_of_marked():
    # an exact sign-flip over n seeds cannot go below 2/2^n: 2..5 paired seeds never reach 5%
    for n in (2, 3, 4, 5):
        c = compare(np.arange(n) + 1.0, np.zeros(n), paired=True)  # every seed better: the most extreme outcome
        assert not c.testable and c.p == pytest.approx(min_attainable_p(n, True)) and c.method == "sign-flip (exact)"
    six = compare(np.arange(6) + 1.0, np.zeros(6), paired=True)
    assert six.testable and six.p == pytest.approx(2 / 64)
    assert seeds_to_reach(0.05, paired=True) == 6 and seeds_to_reach(0.05, paired=False) == 2
    one = compare([1.0], [0.0], paired=True)
    assert np.isnan(one.lo) and np.isnan(one.p) and not one.testable
    with pytest.raises(ValueError, match="one value per seed"):
        compare([1.0, 2.0], [1.0], paired=True)


def test_intervals_are_never_zero_width_unless_the_data_have_no_spread():
    assert mean_interval([0.0667, 0.0667]).half_width == 0  # truly no spread
    iv = mean_interval([0.06, 0.07])
    assert iv.half_width > 0.03  # t with 1 degree of freedom: 12.7 standard errors
    k_of_n = proportion_interval(4, 60)  # 4/60 correct prompts: Wilson, never ± 0
    assert k_of_n.estimate == pytest.approx(4 / 60) and 0.02 < k_of_n.lo < k_of_n.estimate < k_of_n.hi < 0.17
    zero = proportion_interval(0, 30)
    assert zero.lo == 0 and zero.hi > 0.1


def test_family_correction_and_power():
    assert adjust([0.01, 0.04, 0.03, float("nan")]) == pytest.approx([0.03, 0.06, 0.06, float("nan")], nan_ok=True)
    assert adjust([0.01, 0.04], "fdr_bh") == pytest.approx([0.02, 0.04])
    with pytest.raises(ValueError, match="correction 'bonferonni'"):
        adjust([0.1], "bonferonni")
    # the detectable difference shrinks with seeds, is infinite where the test cannot reach the level
    assert detectable_difference(0.014, 5, paired=True) == float("inf")
    d6, d10 = detectable_difference(0.014, 6, paired=True), detectable_difference(0.014, 10, paired=True)
    assert d10 < d6 < 0.05
    # seeds_needed inverts it: at the measured spread, the returned n reaches 80% power and n - 1 does not
    n = seeds_needed(0.02, 0.03, paired=True)
    assert n is not None and detectable_difference(0.03, n, paired=True) <= 0.02
    assert detectable_difference(0.03, n - 1, paired=True) > 0.02
    assert seeds_needed(0.02, 0.03, paired=False) > n  # the unpaired spread here is the same, the test weaker


@pytest.mark.parametrize("method", ["holm", "fdr_bh"])
def test_the_corrections_equal_statsmodels_multipletests(method, monkeypatch):
    """The lab's Holm (numpy, without statsmodels' garbage collection per call) and Benjamini-Hochberg (scipy) give
    statsmodels' adjusted p-values, on families with ties, zeros, ones and nan entries (left out of the family)."""
    import gc

    from statsmodels.stats.multitest import multipletests

    monkeypatch.setattr(gc, "collect", lambda *args: 0)  # statsmodels collects on each call: 0.6 s in a test worker
    rng = np.random.default_rng(7)
    for _ in range(12):
        m = int(rng.integers(1, 25))
        p = rng.random(m) ** rng.uniform(0.3, 4.0)
        p[rng.random(m) < 0.2] = p[0]  # ties
        p[rng.random(m) < 0.05] = rng.choice([0.0, 1.0])
        with_nan = np.where(rng.random(m) < 0.1, np.nan, p)
        ok = np.isfinite(with_nan)
        got = np.asarray(adjust(list(with_nan), method))
        assert np.isnan(got[~ok]).all()
        if ok.any():
            assert np.allclose(got[ok], multipletests(with_nan[ok], method=method)[1], rtol=0, atol=1e-14)


def _marked(c) -> bool:
    return c.p < 1 - c.level


def _excludes_zero(c) -> bool:
    return c.lo > 0 or c.hi < 0


@pytest.mark.parametrize("paired", [True, False])
def test_interval_and_mark_come_from_one_test(paired):
    """Over simulated studies at 2–20 seeds (with and without an effect, ties included): the interval excludes 0
    exactly when p < 1 − level, at two levels."""
    rng = np.random.default_rng([27, paired])
    studies = 0
    for n in (2, 3, 5, 6, 7, 8, 10, 16, 17, 20):
        for effect in (0.0, 0.4, 1.0):
            for _ in range(40):
                t = rng.normal(effect, 1.0, n)
                r = rng.normal(0.0, 1.0, n)
                if rng.random() < 0.2:  # coarse values: ties between subset means and 0
                    t, r = np.round(t), np.round(r)
                for level in (0.95, 0.9):
                    c = compare(t, r, paired=paired, level=level)
                    assert _excludes_zero(c) == _marked(c), (n, level, t - r if paired else (t, r), c)
                    studies += 1
    assert studies == 2400


def test_the_issue_example_has_no_interval_without_its_mark():
    """Issue 27: 6 seeds, one disagreeing. The exact sign-flip p is 4/64 and its 95% interval is [min, max] of the
    differences, which holds 0: neither a mark nor an interval that excludes 0."""
    c = compare([0.30, 0.32, 0.28, 0.31, 0.29, -0.01], np.zeros(6), paired=True)
    assert c.p == pytest.approx(4 / 64) and (c.lo, c.hi) == pytest.approx((-0.01, 0.32))
    assert c.testable and not _marked(c) and not _excludes_zero(c)
    agree = compare([0.30, 0.32, 0.28, 0.31, 0.29, 0.01], np.zeros(6), paired=True)
    assert agree.p == pytest.approx(2 / 64) and agree.lo == pytest.approx(0.01) and _marked(agree)


def test_the_sign_flip_p_is_scipys_and_the_interval_is_exact():
    """p equals scipy's exact permutation test; a shift just inside the interval is not rejected, just outside is."""
    from scipy import stats as sps

    rng = np.random.default_rng(11)
    for n in (3, 6, 9):
        d = rng.normal(0.5, 1.0, n)
        c = compare(d, np.zeros(n), paired=True)
        ref = sps.permutation_test((d,), np.mean, permutation_type="samples", n_resamples=np.inf,
                                   alternative="two-sided", vectorized=True, axis=-1).pvalue
        assert c.p == pytest.approx(min(1.0, ref), abs=1e-12)
        if not np.isfinite(c.lo):
            assert n <= 5 and not c.testable
            continue
        # the ends themselves are where a subset sum of d − d0 is 0, which rounding can put on either side
        for d0, rejected in ((c.lo + 1e-9, False), (c.hi - 1e-9, False), (c.lo - 1e-9, True), (c.hi + 1e-9, True)):
            shifted = compare(d - d0, np.zeros(n), paired=True)
            assert _marked(shifted) == rejected, (n, d0)


def test_seeds_needed_falls_with_the_spread_where_the_power_saturates():
    """A large effect against a small spread is detected by as few seeds as the test can reach the level with:
    statsmodels' two-sided power is nan there (scipy's noncentral t underflows in the far tail), which once made
    `--detect 0.2` ask for 8 seeds at a paired sd of 0.069 and 7 at a wider 0.119 (Holm over 2: alpha 0.025)."""
    floor = seeds_to_reach(0.025, paired=True)
    assert floor == 7
    wide = seeds_needed(0.2, 0.119, paired=True, alpha=0.025)
    narrow = seeds_needed(0.2, 0.069, paired=True, alpha=0.025)
    assert wide == floor and narrow == floor
    assert [seeds_needed(0.2, sd, paired=True, alpha=0.025) for sd in (0.02, 0.05, 0.08, 0.12, 0.2)] == sorted(
        seeds_needed(0.2, sd, paired=True, alpha=0.025) for sd in (0.02, 0.05, 0.08, 0.12, 0.2))
    assert detectable_difference(0.069, floor, paired=True, alpha=0.025) < 0.2
