"""The verdict line under a comparison says only what its numbers support."""

from __future__ import annotations

import pandas as pd

from analysis.comparisons import verdict


def _row(**over) -> pd.Series:
    row = {"metric": "efflen_loss", "theta": 10000.0, "variant": "4D Paley", "reference": "RoPE", "delta": 0.0,
           "lo": 0.0, "hi": 0.0, "n": 6, "paired": True, "method": "sign-flip (exact)", "p": 1.0, "p_adj": 1.0,
           "family": 1, "correction": "holm", "testable": True, "significant": False, "mde": 0.0, "level": 0.95}
    return pd.Series({**row, **over})


def test_identical_differences_in_every_seed_get_no_power_sentence():
    text = verdict(_row())
    assert "every seed gave the same difference" in text and "would likely go unseen" not in text


def test_a_spread_gets_the_detectable_difference():
    text = verdict(_row(delta=0.01, lo=-0.02, hi=0.03, p=0.6, p_adj=0.6, mde=0.0223))
    assert "differences under 0.0223 would likely go unseen" in text
