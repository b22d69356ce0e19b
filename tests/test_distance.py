"""Accuracy by distance on synthetic rows: the bins, the one-sided rule, the effective length's edge cases and the
stability simulation."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from analysis.distance import DistanceRule, distance_bins, distance_effective_length, stability


def _rows(right: dict[int, list[bool]], trained: int = 10, reach: int = 80) -> pd.DataFrame:
    rows = [{"distance": d, "correct": c} for d, cs in right.items() for c in cs]
    return pd.DataFrame(rows).assign(trained_distance=trained, reach=reach, token_skill=0.0)


def test_bins_are_multiples_of_the_trained_distance_cut_at_the_reach():
    assert distance_bins(10, 80) == [(0, 10, 1.0), (11, 15, 1.5), (16, 20, 2.0), (21, 40, 4.0), (41, 80, 8.0)]
    assert distance_bins(10, 55)[-1] == (41, 55, 5.5)
    assert distance_bins(10, 7) == [(0, 7, 1.0)]
    with pytest.raises(ValueError, match="positive"):
        distance_bins(0, 10)


def test_the_rule_holds_the_accuracy_against_its_noise():
    rule = DistanceRule()
    assert rule.kept(3, 3) and not rule.kept(2, 2)  # two right prompts do not show 0.5
    assert not rule.kept(6, 10)  # 60% of 10: its lower bound is below 0.5, where a raw threshold would keep it
    assert rule.kept(58, 100) is False and rule.kept(59, 100) is True
    assert list(rule.kept_many(np.array([3, 2, 0]), np.array([3, 2, 0]))) == [True, False, False]
    with pytest.raises(ValueError, match="threshold"):
        DistanceRule(1.5)


def test_effective_length_edge_cases():
    ok, bad = [True] * 6, [False] * 6
    assert distance_effective_length(_rows({5: ok, 12: ok, 18: ok, 30: ok, 60: ok})) == 8.0
    assert distance_effective_length(_rows({5: ok, 12: ok, 18: ok, 30: bad, 60: ok})) == 2.0  # the first drop ends
    assert distance_effective_length(_rows({5: ok, 30: ok, 60: bad})) == 4.0  # empty bins are skipped
    assert distance_effective_length(_rows({5: bad, 12: ok})) == 0.0
    assert distance_effective_length(_rows({5: ok, 50: ok}, reach=55)) == 5.5  # capped at the longest evaluated
    assert math.isnan(distance_effective_length(_rows({})))


def test_stability_of_an_oracle_and_of_a_model_at_090():
    reaches = [21, 37, 53, 117, 245]
    assert stability(lambda d: np.ones(len(d)), 22, reaches, 64, 40, np.random.default_rng(0)) == 1.0
    assert stability(lambda d: np.full(len(d), 0.9), 22, reaches, 16, 40, np.random.default_rng(0)) < 0.9
