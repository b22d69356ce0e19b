"""The attention-bias kinds (FIRE, KERPLE, T5 bias) and CoPE: their formulas from our own derivations, their checks,
their counts, and each trains on the tiny preset, dumps its attention and is refused by export with its reason."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from hdrope.errors import UserError
from trainer.model.attention.simple import attend, logits
from trainer.model.encodings.base import EncodingShape
from trainer.model.encodings.t5_bias import t5_bucket
from trainer.model.position import (
    build_position_encoding,
    check_exportable,
    encoding_flops,
    encoding_identity,
    encoding_problems,
    pe_config_class,
)
from trainer.presets import load_config

SHAPE = EncodingShape(head_dim=8, n_heads=2, n_kv_heads=1, n_layers=3, max_seq_len=64)
NEW = ("fire", "kerple", "t5_bias", "cope")


def _build(kind: str, **fields):
    return build_position_encoding(pe_config_class(kind)(kind=kind, **fields), SHAPE)


# --- T5 ---------------------------------------------------------------------------------------------------------

def test_t5_buckets_are_exact_below_half_and_log_spaced_to_max_distance():
    # 32 buckets, max 128: 16 exact; n >= 16 -> 16 + floor(16·log(n/16)/log 8), capped at 31
    dist = torch.tensor([0, 1, 15, 16, 22, 32, 45, 64, 90, 127, 128, 5000])
    want = [0, 1, 15, 16, 18, 21, 23, 26, 29, 31, 31, 31]
    assert t5_bucket(dist, 32, 128).tolist() == want
    for n in (16, 22, 32, 45, 64, 90):
        assert want[dist.tolist().index(n)] == 16 + math.floor(16 * math.log(n / 16) / math.log(8))
    assert t5_bucket(torch.arange(10), 2, 2).tolist() == [0] + [1] * 9  # 1 exact bucket, then everything far


def test_t5_bias_reads_its_table_by_bucket_and_is_shared_or_per_layer():
    enc = _build("t5_bias", num_buckets=8, max_distance=16)
    assert enc.weight.shape == (1, 8, 2)
    bias = enc.score_bias(torch.arange(20), 20, 2)  # shared: any layer reads table 0
    for i, j in [(5, 5), (7, 4), (19, 0), (3, 9)]:  # a key after the query reads bucket 0 (masked anyway)
        bucket = int(t5_bucket(torch.tensor(max(i - j, 0)), 8, 16))
        torch.testing.assert_close(bias[:, i, j], enc.weight[0, bucket])
    per_layer = _build("t5_bias", shared=False)
    assert per_layer.weight.shape == (3, 32, 2)
    assert not torch.equal(per_layer.score_bias(torch.arange(4), 4, 0), per_layer.score_bias(torch.arange(4), 4, 1))


# --- KERPLE ------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("variant", ["log", "power"])
def test_kerple_is_its_kernel_of_the_distance_with_projected_parameters(variant):
    enc = _build("kerple", variant=variant)
    with torch.no_grad():
        enc.a.copy_(torch.tensor([[0.5, -3.0]]))  # -3 is projected to 0.01
        enc.p.copy_(torch.tensor([[1.5, 7.0]]))  # 7 stays for log, becomes 2 for power
    enc.tables(torch.arange(12), torch.float32)
    bias = enc.score_bias(torch.arange(12), 12, 1).detach()
    a, p = [0.5, 0.01], [1.5, 7.0 if variant == "log" else 2.0]
    for h in range(2):
        for i, j in [(0, 0), (5, 2), (11, 0)]:
            d = i - j
            want = -p[h] * math.log(1 + a[h] * d) if variant == "log" else -a[h] * d ** p[h]
            assert float(bias[h, i, j]) == pytest.approx(want, rel=1e-6, abs=1e-7)
    assert enc.a.min() >= 0.01 and enc.p.min() >= 0.01


# --- FIRE --------------------------------------------------------------------------------------------------------

def test_fire_is_an_mlp_of_the_interpolated_log_distance():
    enc = _build("fire", init_threshold=6.0, mlp_width=4)
    with torch.no_grad():
        enc.c[1], enc.multiplier[1] = -0.3, 1.5  # |c| = 0.3, L = 9
    bias = enc.score_bias(torch.arange(20), 20, 1)
    w1, b1, w2, b2 = (t[1].detach().double() for t in (enc.w1, enc.b1, enc.w2, enc.b2))
    for i, j in [(0, 0), (4, 1), (9, 2), (19, 3), (19, 19)]:
        x = math.log(1 + 0.3 * (i - j)) / (math.log(1 + 0.3 * max(i, 9)) + 1e-6)
        hidden = torch.relu(w1[:, 0] * x + b1)
        torch.testing.assert_close(bias[:, i, j].double(), w2 @ hidden + b2, atol=1e-6, rtol=1e-6)


def test_fire_is_translation_invariant_below_its_threshold_only():
    enc = _build("fire", init_threshold=10.0)
    bias = enc.score_bias(torch.arange(40), 40, 0)
    torch.testing.assert_close(bias[:, 7, 3], bias[:, 9, 5])  # i < L: normaliser ψ(L) for both
    assert not torch.allclose(bias[:, 20, 16], bias[:, 30, 26])  # i > L: normaliser ψ(i)


def test_fire_counts_the_flops_of_its_mlp():
    pe = pe_config_class("fire")()
    enc = build_position_encoding(pe, SHAPE)
    with FlopCounterMode(display=False) as counter:
        enc.score_bias(torch.arange(SHAPE.max_seq_len), SHAPE.max_seq_len, 0)
    per_token_forward = counter.get_total_flops() / SHAPE.max_seq_len
    assert encoding_flops(pe, SHAPE) == pytest.approx(3 * per_token_forward * SHAPE.n_layers)


# --- CoPE --------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("npos", [8, 64])
def test_cope_counts_positions_by_gates_and_interpolates_its_embeddings(npos):
    """k = 0 makes every gate σ(0) = 1/2, so key j's position from query i is (i - j + 1)/2; embeddings with
    q·e[n] = n make the interpolated term exactly that position (capped at npos - 1; at 64, past any count here, so
    only the positions a count can reach are read)."""
    enc = _build("cope", npos=npos)
    with torch.no_grad():
        enc.emb.zero_()
        enc.emb[1, 0] = torch.arange(float(npos))
    q = torch.zeros(1, 2, 10, 8)
    q[..., 0] = 1.0
    k, v = torch.zeros(1, 1, 10, 8), torch.randn(1, 1, 10, 8)
    got = logits(enc, q, k, 0, 1)
    i, j = torch.meshgrid(torch.arange(10.0), torch.arange(10.0), indexing="ij")
    want = ((i - j + 1) / 2).clamp(max=npos - 1) / math.sqrt(8)
    causal = j <= i
    torch.testing.assert_close(got[0, 0][causal], want[causal])
    assert torch.isinf(got[0, 0][~causal]).all()
    out = attend(enc, q, k, v, 0, 1)
    probs = torch.softmax(want.masked_fill(~causal, float("-inf")), dim=-1)
    torch.testing.assert_close(out[0, 1], probs @ v[0, 0])
    assert logits(enc, q, k, 0, 0).masked_fill(~causal, 0).abs().max() == 0  # layer 0's embeddings are still zero


def test_cope_counts_every_held_key_when_its_gates_saturate():
    """Gates of 1 count key j from query i as i - j + 1, the most a count can be: the last query's first key reads the
    last position a query block keeps (the tiled path's 3-token blocks and queries after a past, too)."""
    enc = _build("cope", npos=64)
    with torch.no_grad():
        enc.emb.zero_()
        enc.emb[1, 0] = torch.arange(64.0)
    s, past = 9, 4
    q = torch.zeros(1, 2, s, 8)
    q[..., 0] = 1.0
    k = torch.zeros(1, 1, s + past, 8)
    k[..., 0] = 200.0  # σ(200 / √8) is 1 in float32
    got = logits(enc, q, k, past, 1)
    i, j = torch.meshgrid(torch.arange(past, past + s, dtype=torch.float32),
                          torch.arange(s + past, dtype=torch.float32), indexing="ij")
    causal = j <= i
    want = (200.0 + (i - j + 1)) / math.sqrt(8)
    torch.testing.assert_close(got[0, 0][causal], want[causal])
    from trainer.model.attention.paths import run_attention
    from trainer.model.attention.simple import simple_call

    call = simple_call(q, k, torch.randn(1, 1, s + past, 8), past, 1)
    torch.testing.assert_close(run_attention(enc, call, "tiled", block=3), run_attention(enc, call, "dense"))


def test_cope_reads_of_one_shared_table_have_the_gathers_gradients():
    """The tiles' reads of a query block's q·e table add their gradients into one buffer (not one zeroed table per
    read): the table's and the positions' gradients equal plain gathers', read twice as two tiles do, in float64."""
    from trainer.model.encodings.cope import interpolated, shared_table

    gen = torch.Generator().manual_seed(3)
    table = torch.randn(2, 3, 5, 9, dtype=torch.float64, generator=gen, requires_grad=True)
    pos = [(torch.rand(2, 3, 5, 4, dtype=torch.float64, generator=gen) * 8).requires_grad_() for _ in range(2)]
    weights = [torch.randn(2, 3, 5, 4, dtype=torch.float64, generator=gen) for _ in range(2)]

    def plain(source: torch.Tensor, p: torch.Tensor) -> torch.Tensor:  # autograd's own gathers, the reference
        low = p.floor()
        return source.gather(-1, p.ceil().long()) * (p - low) + source.gather(-1, low.long()) * (1 - (p - low))

    def loss(shared: bool) -> torch.Tensor:
        source, box = shared_table(table * 2) if shared else (table * 2, None)
        read = (lambda p: interpolated(source, p, box)) if shared else (lambda p: plain(source, p))
        return sum((read(p) * w).sum() for p, w in zip(pos, weights, strict=True))

    got = torch.autograd.grad(loss(True), [table, *pos])
    want = torch.autograd.grad(loss(False), [table, *pos])
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w)
    assert got[0].abs().sum() > 0
    again = torch.autograd.grad(loss(True), [table])[0]  # a second backward starts from an empty buffer
    torch.testing.assert_close(again, want[0])


def test_cope_counts_the_flops_of_its_position_logits():
    pe = pe_config_class("cope")()
    enc = build_position_encoding(pe, SHAPE)
    s = SHAPE.max_seq_len  # a window of the train length reads all npos positions (a shorter one, fewer)
    q, k = torch.randn(1, 2, s, 8), torch.randn(1, 1, s, 8)
    with FlopCounterMode(display=False) as counter:
        logits(enc, q, k, 0, 0)
    attention = 2 * 2 * s * s * 8  # q·k of both heads, the attention's own product
    per_token_forward = (counter.get_total_flops() - attention) / s
    assert encoding_flops(pe, SHAPE) == pytest.approx(3 * per_token_forward * SHAPE.n_layers)


# --- bad input, identity, export ---------------------------------------------------------------------------------

@pytest.mark.parametrize(("overrides", "message"), [
    (["model.pe.kind=t5_bias", "model.pe.num_buckets=1"], r"model\.pe\.num_buckets=1: must be an integer >= 2"),
    (["model.pe.kind=t5_bias", "model.pe.max_distance=16"],
     r"model\.pe\.max_distance=16: must be an integer >= model\.pe\.num_buckets=32"),
    (["model.pe.kind=fire", "model.pe.init_threshold=0"],
     r"model\.pe\.init_threshold=0\.0: must be a finite number > 0"),
    (["model.pe.kind=fire", "model.pe.init_threshold=-5"], r"model\.pe\.init_threshold=-5\.0"),
    (["model.pe.kind=fire", "model.pe.mlp_width=0"], r"model\.pe\.mlp_width=0: must be an integer >= 1"),
    (["model.pe.kind=kerple", "model.pe.variant=cubic"],
     r"model\.pe\.variant='cubic': choose one of \['log', 'power'\]"),
    (["model.pe.kind=cope", "model.pe.npos=-1"], r"model\.pe\.npos=-1: must be an integer >= 0"),
    (["model.pe.kind=fire", "model.pe.theta=10000"], r"'model\.pe\.theta'.*'fire' has the keys"),  # a rotary option
    (["model.pe.kind=t5_bias", "model.pe.rotation_dim=4"], r"'model\.pe\.rotation_dim'.*'t5_bias' has the keys"),
])
def test_bad_settings_are_user_errors_naming_the_field(overrides, message):
    with pytest.raises(UserError, match=message):
        load_config("tiny", overrides)


def test_the_checks_find_every_problem_without_building():
    pe = pe_config_class("fire")(init_c=0.0, init_threshold=float("inf"), mlp_width=2)
    assert [p.split(":")[0] for p in encoding_problems(pe, SHAPE)] == ["model.pe.init_c=0.0",
                                                                       "model.pe.init_threshold=inf"]


@pytest.mark.parametrize("kind", NEW)
def test_each_is_labelled_and_refused_by_export_with_its_reason(kind):
    pe = pe_config_class(kind)(kind=kind)
    row = encoding_identity(pe)
    assert row["pe_label"] == {"fire": "FIRE", "kerple": "KERPLE log", "t5_bias": "T5 bias", "cope": "CoPE"}[kind]
    assert row["rotation_dim"] == 0 and row["theta"] is None
    flipped = encoding_identity(pe_config_class(kind)(kind=kind, shared=not pe.shared))["pe_label"]
    assert flipped == row["pe_label"] + (", per layer" if pe.shared else ", shared")
    reason = "cannot express" if kind == "cope" else "no additive position bias"
    with pytest.raises(UserError, match=f"kind='{kind}' is not exportable to HF Llama: .*{reason}"):
        check_exportable(pe)


def test_building_a_learned_bias_leaves_the_global_rng_alone():
    torch.manual_seed(3)
    _build("fire")
    _build("t5_bias")
    _build("kerple")
    after = torch.rand(3)
    torch.manual_seed(3)
    assert torch.equal(after, torch.rand(3))  # the model's other weights start as in a RoPE run of the same seed


# --- real training -----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", NEW)
def test_each_trains_on_the_tiny_preset_dumps_its_attention_and_is_refused_by_export(kind, tiny_cfg, tmp_path):
    import pyarrow.parquet as pq

    from trainer.export.hf_export import export_checkpoint
    from trainer.run.loop import train

    run = train(tiny_cfg(f"model.pe.kind={kind}", "train.steps=4", "train.eval_every=4", "train.ckpt_every=4",
                         "eval.passkey.enabled=false", "dump.enabled=true", "dump.layers=[1]", "dump.samples=1"))
    assert len(run.losses) == 4 and all(math.isfinite(x) for x in run.losses)
    assert math.isfinite(run.metrics["val_loss"])
    attn = pq.read_table(run.artifacts["attention"]).to_pandas()  # each stored map is a causal softmax
    length = int(attn["seq_len"].iloc[0])
    maps = attn["attn"].iloc[0].reshape(length, length).astype("float64")
    assert abs(maps.sum(-1) - 1).max() < 1e-2 and abs(maps[~(np.tri(length, dtype=bool))]).max() == 0
    with pytest.raises(UserError, match=f"kind='{kind}' is not exportable"):
        export_checkpoint(run.checkpoint, tmp_path / "hf")


# --- sweeps ------------------------------------------------------------------------------------------------------

def test_a_sweep_over_the_bias_kinds_plans_one_labelled_run_per_cell(tmp_path):
    from sweeps.plan import make_plan
    from sweeps.spec import load_spec

    spec = tmp_path / "bias.yaml"
    spec.write_text(f"name: b\nbase: tiny\nstorage: {tmp_path}\naxes:\n  model.pe.kind: [{', '.join(NEW)}]\n"
                    "  model.pe.shared: [true, false]\n  seed: [1]\n")
    plan = make_plan(load_spec(spec))
    labels = {encoding_identity(c.config.model.pe)["pe_label"] for c in plan.to_run}
    assert len(plan.cells) == len(plan.to_run) == len(labels) == 8
    assert {"FIRE, shared", "KERPLE log, per layer", "T5 bias", "CoPE"} <= labels


def test_the_rivals_table_plans_once_every_kind_is_registered():
    from pathlib import Path

    from sweeps.plan import make_plan
    from sweeps.spec import load_spec
    from trainer.model.position import POSITION_ENCODINGS

    spec = load_spec(Path(__file__).parent.parent / "experiments" / "tables" / "rivals_compact.yaml")
    encodings = spec.axes["model.pe"]
    assert {e["kind"] for e in encodings} <= set(POSITION_ENCODINGS)
    plan = make_plan(spec)
    labels = {encoding_identity(c.config.model.pe)["pe_label"] for c in plan.to_run}
    assert len(plan.to_run) == len(encodings) * len(spec.axes["seed"]) and len(labels) == len(encodings)
    # FIRE's threshold inside the evaluated lengths, 128 windows, no starved rotation, and 10 seeds for its family of
    # 10 (the 7 of its first run were too few: the last 3 ran as a stage of their own, issue 47 §32)
    assert plan.warnings == []
