"""Loss by position: one pass gives both the binned per-position loss and the validation losses, on a real tiny run;
the window count; and an evaluation length the validation data cannot supply (exit 2, nothing written)."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from trainer.config import EvalConfig, config_hash, validation_windows
from trainer.evals.position_loss import POSITION_SPACINGS, PositionLoss, bin_starts, read_position_loss
from trainer.run.loop import train


def test_position_loss_averages_to_the_validation_losses_of_the_same_windows(tiny_cfg):
    r = train(tiny_cfg("train.steps=6", "eval.passkey.enabled=false", "eval.extrapolation=[2,4]",
                       "eval.extrapolation_batches=1", "eval.windows=5", "eval.position_bins=16"))
    path = r.artifacts["position_loss"]
    assert path == r.run_dir / "position_loss.parquet"
    table = read_position_loss(path).to_pandas()
    assert {"run_name", "config_hash", "pe_kind", "rotation_dim"} <= set(table.columns)
    assert sorted(table["length_factor"].unique()) == [1.0, 2.0, 4.0]
    for factor, metric in ((1.0, "val_loss"), (2.0, "val_loss_x2"), (4.0, "val_loss_x4")):
        rows = table[table["length_factor"] == factor]
        length = 64 * int(factor)
        assert rows["position"].iloc[0] == 0 and rows["position"].is_monotonic_increasing
        assert len(rows) == 16 and rows["position"].max() < length
        assert rows["tokens"].sum() == 5 * length  # every position of every window, once
        mean = float((rows["loss"] * rows["tokens"]).sum() / rows["tokens"].sum())
        assert mean == pytest.approx(r.metrics[metric], rel=1e-9, abs=0)
    assert r.metrics["eval_s"] > 0
    assert "eval_s" in (r.run_dir / "result.json").read_text()


@pytest.mark.parametrize("spacing", sorted(POSITION_SPACINGS))
@pytest.mark.parametrize("length,bins", [(64, 16), (64, 64), (10, 64), (2048, 64), (1, 8)])
def test_bins_cover_every_position_once(spacing, length, bins):
    starts = bin_starts(length, bins, spacing)
    assert starts[0] == 0 and (np.diff(starts) > 0).all() and starts[-1] < length and len(starts) <= bins
    sums = np.arange(length, dtype=float)
    pl = PositionLoss(sums, np.ones(length, dtype=np.int64))
    first, loss, tokens = pl.binned(bins, spacing)
    assert (first == starts).all()
    assert tokens.sum() == length and (loss * tokens).sum() == pytest.approx(sums.sum())
    if spacing == "log" and length >= 64:
        assert np.diff(starts)[-1] > np.diff(starts)[0]  # wider bins far out


def test_window_counts_keep_stored_runs_and_a_set_count_applies_at_every_length(tiny_cfg):
    e = EvalConfig(val_batches=8, batch_size=8, extrapolation=[2, 4, 8], extrapolation_batches=2)
    assert [validation_windows(e, f) for f in (1, 2, 4, 8)] == [64, 8, 4, 2]  # the compact preset's counts
    e.windows = 256
    assert [validation_windows(e, f) for f in (1, 2, 4, 8)] == [256] * 4
    cfg = tiny_cfg()
    before = config_hash(cfg)
    cfg.eval.windows = 256
    assert config_hash(cfg) != before


def test_an_evaluation_length_the_validation_split_cannot_supply_exits_2_and_writes_nothing(cache_dir, tmp_path):
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "sweeps.console", "train", "tiny", f"data.cache_dir={cache_dir}",
                           f"train.out_dir={out}", "eval.extrapolation=[2,4,100000]"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr
    line = proc.stderr.strip().splitlines()[-1]
    assert "eval.extrapolation=[2, 4, 100000]" in line and "largest factor that fits is" in line
    assert "use eval.extrapolation=[2, 4]" in line and "Traceback" not in proc.stderr
    largest = int(line.split("largest factor that fits is ")[1].split(":")[0])
    assert 4 <= largest < 100000
    assert not out.exists()
