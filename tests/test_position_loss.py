"""Loss by position: one pass gives both the binned per-position loss and the validation losses, on a real tiny run;
the window count; and an evaluation length the validation data cannot supply (exit 2, nothing written)."""

from __future__ import annotations

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


def test_an_evaluation_length_the_validation_split_cannot_supply_exits_2_and_writes_nothing(cache_dir, tmp_path,
                                                                                           hdrope_here):
    out = tmp_path / "run"
    proc = hdrope_here(["train", "tiny", f"data.cache_dir={cache_dir}", f"train.out_dir={out}",
                        "eval.extrapolation=[2,4,100000]"])
    assert proc.returncode == 2, proc.stderr
    line = proc.stderr.strip().splitlines()[-1]
    assert "eval.extrapolation=[2, 4, 100000]" in line and "largest factor that fits is" in line
    assert "use eval.extrapolation=[2, 4]" in line and "Traceback" not in proc.stderr
    largest = int(line.split("largest factor that fits is ")[1].split(":")[0])
    assert 4 <= largest < 100000
    assert not out.exists()


def _brute_sliding(model, windows, context):
    """Every position's loss with exactly its last min(p + 1, context) tokens as input, one forward each."""
    import torch.nn.functional as F

    seq = windows.shape[1] - 1
    sums = np.zeros(seq)
    for p in range(seq):
        begin = max(0, p + 1 - context)
        logits = model(windows[:, begin : p + 1])[:, -1]
        sums[p] = F.cross_entropy(logits.float(), windows[:, p + 1], reduction="sum").item()
    return sums


@pytest.mark.parametrize("kind", ["rope", "alibi"])
def test_sliding_loss_sees_at_most_the_train_length_and_equals_full_context_within_it(kind):
    import contextlib

    import torch

    from trainer.evals.evaluate import position_loss, sliding_position_loss
    from trainer.model.llama import Llama
    from trainer.presets import load_config

    cfg = load_config("tiny", ["model.max_seq_len=8", f"model.pe={{kind: {kind}}}"])
    torch.manual_seed(0)
    model = Llama(cfg.model).eval()
    windows = torch.randint(0, cfg.model.vocab_size, (3, 25))  # 24 positions: 3x the context of 8
    null = contextlib.nullcontext
    with torch.no_grad():
        brute = _brute_sliding(model, windows, 8)
        one = sliding_position_loss(model, windows, 8, 1, 2, null)  # stride 1: every prediction sees exactly 8
        assert np.allclose(one.sums, brute, rtol=1e-5, atol=1e-5) and (one.tokens == 3).all()
        full = position_loss(model, windows, 2, null)
        assert np.allclose(full.sums[:8], brute[:8], rtol=1e-5, atol=1e-5)  # within the context: the same
        assert not np.allclose(full.sums[8:], brute[8:], rtol=1e-3)  # past it the full context differs
        for stride in (3, 8):  # position p sees between 8 - stride + 1 and 8 tokens: chunk by chunk by hand
            got = sliding_position_loss(model, windows, 8, stride, 3, null)
            assert (got.tokens == 3).all() and np.allclose(got.sums[:8], brute[:8], rtol=1e-5, atol=1e-5)
            done, want = 0, np.zeros(24)
            for begin in range(0, 24, stride):
                end = min(begin + 8, 24)
                part = position_loss(model, windows[:, begin : end + 1], 3, null).sums
                want[done:end] = part[done - begin :]
                done = end
                if end == 24:
                    break
            assert np.allclose(got.sums, want, rtol=1e-5, atol=1e-5)
        short = torch.randint(0, cfg.model.vocab_size, (2, 9))  # the train length: one chunk, the full-context loss
        assert np.allclose(sliding_position_loss(model, short, 8, 4, 2, null).sums,
                           position_loss(model, short, 2, null).sums, rtol=1e-6, atol=1e-6)


def test_sliding_loss_is_reported_per_extrapolation_factor_and_a_bad_stride_is_refused(tiny_cfg):
    from hdrope.errors import UserError
    from trainer.config import metric_names

    cfg = tiny_cfg("train.steps=4", "eval.passkey.enabled=false", "eval.extrapolation=[2]",
                   "eval.extrapolation_batches=1", "eval.windows=3", "eval.sliding_stride=32")
    assert "val_loss_sw_x2" in metric_names(cfg)
    r = train(cfg)
    assert np.isfinite(r.metrics["val_loss_sw_x2"]) and r.metrics["val_loss_sw_x2"] != r.metrics["val_loss_x2"]
    assert "val_loss_sw_x2" in (r.run_dir / "result.json").read_text()
    # the paired columns (format version 2): per bin, full minus train-length context of the same windows
    table = read_position_loss(r.artifacts["position_loss"])
    assert table.schema.metadata[b"hdrope.position_loss_version"] == b"2"
    rows = table.to_pandas()
    x2, x1 = rows[rows["length_factor"] == 2.0], rows[rows["length_factor"] == 1.0]
    assert (x2["windows"] == 3).all() and x2["diff_se"].notna().all() and x1["diff"].isna().all()
    assert float((x2["diff"] * x2["tokens"]).sum() / x2["tokens"].sum()) == pytest.approx(
        r.metrics["val_loss_x2"] - r.metrics["val_loss_sw_x2"], abs=1e-9)
    assert x2["diff"][x2["position"] < 64].abs().max() < 1e-5  # inside L both see the same context
    assert np.isfinite(x1["gain"]).all() and (x1["gain_se"] > 0).all()
    before = config_hash(tiny_cfg())
    assert config_hash(tiny_cfg("eval.sliding_stride=0")) == before  # off: stored runs keep their hashes
    with pytest.raises(UserError, match=r"eval.sliding_stride=65: .*model.max_seq_len=64.*e.g. 32"):
        tiny_cfg("eval.sliding_stride=65")
    with pytest.raises(UserError, match=r"eval\.sliding_stride=-1"):
        tiny_cfg("eval.sliding_stride=-1")
