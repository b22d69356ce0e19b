"""The loss effective length on models whose answer is known (issue 33, What to build 1): byte 4-gram models scored
by the lab's own evaluation at the shipped studies' train lengths, factors and window counts, on 8 disjoint window
sets each. A perfect length generaliser reads censored at the longest factor, a model that fails past D reads D / L
within one tested bin, a model that never learned reads "not learned"; the unpaired rule it replaced misses them.
The Bonferroni bound's false-alarm rate is checked by simulation."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from analysis.known_answers import DESIGNS, SETS, design, known_answer_readings, ngram_counts, validation_tokens
from analysis.lengthgen import LOSS_TOLERANCE
from analysis.loss_length import LOSS_ALPHA, false_alarm_rate, loss_reading
from trainer.evals.position_loss import PositionLoss, read_position_loss, write_position_loss


@pytest.fixture(scope="module")
def corpus_model(cache_dir):
    """The validation tokens and the 4-gram counts (counted once for the module)."""
    train, val = validation_tokens(cache_dir)
    return val, ngram_counts(train)


@pytest.fixture(scope="module", params=list(DESIGNS))
def readings(request, corpus_model):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny tensors: a second thread only contends
    try:
        d = design(request.param)
        yield d, known_answer_readings(d, corpus_model[1], corpus_model[0])
    finally:
        torch.set_num_threads(threads)


def _of(readings, model: str):
    d, r = readings
    got = r[r["model"].str.startswith(model)]
    assert len(got) == SETS
    return d, got


def _docs_block() -> str:
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "docs" / "length-generalisation.md").read_text()
    found = re.search(r"<!-- known-answers:loss -->\n(?P<body>.*?)<!-- /known-answers -->", text, re.S)
    assert found, "docs/length-generalisation.md has no known-answers block"
    return found["body"]


def test_the_docs_quote_each_designs_readings_as_the_module_prints_them(readings):
    """The docs' table is `python -m analysis.known_answers`'s (issue 47 case 10: it had kept a former design's)."""
    from analysis.known_answers import designs_markdown, table_markdown

    body = _docs_block()
    assert designs_markdown() in body
    for line in table_markdown(readings[1]).splitlines()[2:]:
        assert line in body, line


def test_the_docs_quote_the_simulation_as_the_module_prints_it():
    from analysis.known_answers import simulation_markdown

    assert simulation_markdown() in _docs_block()


def test_perfect_generaliser_reads_censored(readings):
    d, got = _of(readings, "perfect")
    assert (got["new"] == d.max_factor).all() and (got["reason"] == "censored").all(), got


def test_failure_past_d_is_found_within_one_tested_bin(readings):
    d, got = _of(readings, "fails")
    assert (got["new"] - 2.0).abs().le(d.resolution).all(), (d.resolution, got)


def test_never_learned_reads_not_learned(readings):
    _, got = _of(readings, "never")
    assert got["new"].isna().all() and (got["reason"] == "not learned").all(), got


def test_the_unpaired_rule_misses_the_known_answers(readings):
    """What the tests above catch: the rule before issue 33 reads a perfect generaliser short and gives a model
    that never learned a length."""
    d, perfect = _of(readings, "perfect")
    _, never = _of(readings, "never")
    assert (perfect["old"] < d.max_factor).sum() >= SETS // 2
    assert never["old"].notna().all()


@pytest.mark.parametrize("windows,width,df", [(4, 8, 3), (4, 1, math.inf), (128, 4, math.inf), (128, 4, 3)])
def test_a_model_at_the_tolerance_reads_censored_in_95_percent_of_window_sets(windows, width, df):
    """The worst case of a perfect generaliser: its paired difference is exactly the tolerance in every bin past the
    train length (48 stored bins, as 64 bins over 4x leave; 4 windows of 8 positions: quickstart, 128 of 4:
    lengthgen); normal or heavy-tailed (t, 3 df) window noise."""
    sets = 1000
    rate = false_alarm_rate(windows, 48, sets, LOSS_TOLERANCE, width=width, df=df, seed=windows + width)
    assert rate <= LOSS_ALPHA + 2 * math.sqrt(LOSS_ALPHA * (1 - LOSS_ALPHA) / sets), rate


def test_a_file_without_paired_columns_reads_not_available(tmp_path):
    """Version 1 files (no per-window losses, no limited pass) still load, with the fix named."""
    path = write_position_loss({1: PositionLoss(np.full(64, 2.0), np.ones(64, dtype=np.int64)),
                                4: PositionLoss(np.full(256, 2.0), np.ones(256, dtype=np.int64))}, 16, "linear",
                               tmp_path / "position_loss.parquet")
    reading = loss_reading(read_position_loss(path).to_pandas(), LOSS_TOLERANCE)
    assert math.isnan(reading.value) and "eval.sliding_stride" in reading.reason
