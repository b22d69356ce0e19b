"""The paired loss instrument's power on real per-window noise (issue 47 case 38): the smallest break it finds at the
shipped 128 windows, as the docs and the plan's window warning state it, and the noise file read through its schema."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from analysis.loss_length import LOSS_ALPHA
from analysis.loss_power import POWER, STEPS, power_markdown, smallest_breaks, step_power
from analysis.window_noise import MODELS, NOISE_FILE, read_window_noise
from hdrope.errors import UserError

DOCS = Path(__file__).resolve().parents[1] / "docs" / "length-generalisation.md"


@pytest.fixture(scope="module")
def breaks():
    return smallest_breaks()


@pytest.fixture(scope="module")
def noises():
    return {n.model: n for n in read_window_noise()}


def test_the_docs_quote_the_power_block_as_the_module_prints_it(breaks):
    found = re.search(r"<!-- known-answers:power -->\n(?P<body>.*?)<!-- /known-answers -->", DOCS.read_text(), re.S)
    assert found, "docs/length-generalisation.md has no known-answers:power block"
    assert found["body"] == power_markdown(breaks)


def test_the_plan_window_warning_quotes_the_measured_breaks(breaks):
    from sweeps.design_warnings import SMALLEST_BREAK_128

    assert SMALLEST_BREAK_128 == breaks[0]
    assert set(breaks[0]) == set(MODELS)


def test_a_break_at_the_smallest_size_is_found_and_one_step_smaller_is_not(breaks):
    """The known answer at the instrument's edge: a step of the stated size at 2.5 L is read at 2.5 L in at least 80%
    of the resampled window sets and in 7 of the 8 real ones, one grid step smaller is not, and no step reads early more
    often than the instrument's α."""
    smallest, rows = breaks
    for model, size in smallest.items():
        mine = {r.step: r for r in rows if r.model == model}
        assert mine[size].found >= POWER and mine[size].found_real >= 7, mine[size]
        below = STEPS[STEPS.index(size) - 1]
        assert mine[below].found < POWER, mine[below]
        assert all(r.early <= LOSS_ALPHA and r.early_real == 0 for r in mine.values()), model


def test_no_break_reads_censored_on_real_noise(noises):
    for noise in noises.values():
        none = step_power(noise, 0.0, resamples=200)
        assert none.censored >= 1 - LOSS_ALPHA and none.early_real == 0, none


def _damaged(tmp_path: Path, change) -> Path:
    table = pq.read_table(NOISE_FILE)
    path = tmp_path / "noise.parquet"
    pq.write_table(change(table), path)
    return path


@pytest.mark.parametrize("change, said", [
    (lambda t: t.slice(1), "rows, expected"),
    (lambda t: pa.concat_tables([t, t.slice(0, 1)]), "more than once"),
    (lambda t: t.set_column(4, "diff", pa.array([math.nan, *t["diff"].to_pylist()[1:]])), "not finite"),
    (lambda t: t.replace_schema_metadata({}), "metadata is missing"),
    (lambda t: t.replace_schema_metadata({"hdrope.window_noise": json.dumps(
        {**json.loads(t.schema.metadata[b"hdrope.window_noise"]), "version": "0"})}), "version '0'"),
    (lambda t: t.drop_columns(["window"]), "columns"),
    (lambda t: t.filter(pa.compute.equal(t["model"], "RoPE")), "models ['RoPE']"),
])
def test_a_damaged_noise_file_is_refused_naming_the_fault(tmp_path, change, said):
    path = _damaged(tmp_path, change)
    with pytest.raises(UserError) as err:
        read_window_noise(path)
    text = str(err.value)
    assert str(path) in text and said in text and "python -m analysis.window_noise" in text


def test_the_noise_was_measured_at_the_quickstart_design(noises):
    """A redesigned quickstart (train length, longest factor, windows, bins) makes the measured noise stale."""
    from analysis.known_answers import design, design_windows

    d = design("quickstart / rivals")
    windows, width = design_windows(d)
    for noise in noises.values():
        assert (noise.train_length, noise.length) == (d.train_length, d.max_factor * d.train_length)
        assert noise.diff.shape[1] == windows
        assert int(min(noise.positions[1:] - noise.positions[:-1])) == width
    meta = json.loads(pq.read_schema(NOISE_FILE).metadata[b"hdrope.window_noise"])
    assert meta["sliding_stride"] == d.eval.sliding_stride and meta["spec"] == "sweeps/quickstart.yaml"
