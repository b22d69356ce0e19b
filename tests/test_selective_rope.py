"""Selective RoPE (issue 46 §3; timurcarstensen/selective-rope): the lab's attention equals the official computation
re-typed here from `src/selective_rope/modules/rotary.py` (`SelectiveRoPE.forward`, its PyTorch path: per-head
l2_norm of the hidden state, the low-rank phi_proj, fla's ShortConvolution without activation, the optional e^bias,
cumsum, the half-split rotation by temperature · phase) and `layers/attn.py` (causal softmax attention, scale 1/√d),
on random weights, in float64 and float32, prefilled and decoded with the official cache (the convolution's last
inputs and the last phase); with a constant increment of 1 it is RoPE, with none NoPE; it trains, dumps and resumes
exactly."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from hdrope.errors import UserError
from trainer.model.attention.simple import attend, logits
from trainer.model.encodings.base import EncodingShape
from trainer.model.position import build_position_encoding, pe_config_class

SHAPE = EncodingShape(head_dim=8, n_heads=4, n_kv_heads=4, n_layers=2, max_seq_len=32, model_dim=24)
GQA = EncodingShape(head_dim=8, n_heads=4, n_kv_heads=2, n_layers=2, max_seq_len=32, model_dim=24)
LAYER = 1


def _build(shape: EncodingShape = SHAPE, dtype: torch.dtype = torch.float64, **fields):
    """The kind on random weights (not its init): projections and convolution N(0, 0.3²), bias U(-1, 1)."""
    enc = build_position_encoding(pe_config_class("selective_rope")(kind="selective_rope", init_std=0.3, **fields),
                                  shape)
    if enc.phase_bias is not None:
        with torch.no_grad():
            enc.phase_bias.uniform_(-1.0, 1.0, generator=torch.Generator().manual_seed(5))
    return enc.to(dtype)


def _inputs(shape: EncodingShape, dtype: torch.dtype, seq: int = 19, batch: int = 2):
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(batch, shape.n_heads, seq, shape.head_dim, generator=gen, dtype=dtype)
    k = torch.randn(batch, shape.n_kv_heads, seq, shape.head_dim, generator=gen, dtype=dtype)
    v = torch.randn(batch, shape.n_kv_heads, seq, shape.head_dim, generator=gen, dtype=dtype)
    x = torch.randn(batch, seq, shape.input_dim, generator=gen, dtype=dtype)
    return q, k, v, x


# --- the official computation, re-typed ----------------------------------------------------------------------------

def official_rotary(q, k, x, down, up, conv, bias, temperature, heads, cache=None):
    """SelectiveRoPE.forward (PyTorch path, low-rank phi_proj, conv_act None, no gate) on q, k (B, T, H, D) and the
    hidden states x (B, T, dim), from `cache` = (the convolution's earlier inputs (B, C, taps - 1), the last phase
    (B, 1, H, D/2)) or none; returns the rotated q, k and the cache after the last token."""
    b, t, _ = x.shape
    half, taps = q.shape[-1] // 2, conv.shape[-1]
    hs = x.view(b, t, heads, -1)
    hs = hs / torch.sqrt((hs * hs).sum(-1, keepdim=True) + 1e-6)  # fla's l2_norm
    phi = F.linear(F.linear(hs.reshape(b, t, -1), down), up).transpose(1, 2)  # "b (h d) t"
    before = phi.new_zeros(b, phi.shape[1], taps - 1) if cache is None else cache[0]
    inputs = torch.cat([before, phi], dim=-1)  # ShortConvolution: a depthwise causal conv1d, no bias
    phi = F.conv1d(inputs, conv.unsqueeze(1), groups=phi.shape[1])
    phi = phi.transpose(1, 2).reshape(b, t, heads, half)
    if bias is not None:
        phi = phi + torch.exp(bias)
    phi_tilde = torch.cumsum(phi, dim=1)
    if cache is not None:
        phi_tilde = phi_tilde + cache[1]
    qk = torch.cat([q, k], dim=2)
    angle = temperature * torch.cat([phi_tilde, phi_tilde], dim=2)
    qk0, qk1 = qk[..., :half], qk[..., half:]
    rotated = torch.cat([qk0 * angle.cos() - qk1 * angle.sin(), qk0 * angle.sin() + qk1 * angle.cos()], dim=-1)
    q, k = torch.split(rotated, q.shape[2], dim=2)
    return q, k, (inputs[..., inputs.shape[-1] - (taps - 1):], phi_tilde[:, -1:])


def official_attention(q, k, v):
    """flash_attn_func(q, k, v, causal=True) of layers/attn.py on (B, T, H, D), decoding included: the queries are
    the last keys."""
    s, n = q.shape[1], k.shape[1]
    scores = torch.einsum("bihd,bjhd->bhij", q, k) / math.sqrt(q.shape[-1])
    hidden = torch.ones(s, n, dtype=torch.bool).triu(n - s + 1)
    out = torch.softmax(scores.masked_fill(hidden, float("-inf")), -1)
    return torch.einsum("bhij,bjhd->bhid", out, v)


def _official_weights(enc, layer: int, group: int):
    """The lab's parameters as the official module's (phi_proj, phi_conv1d, phi_bias, temperature), a KV head's
    rows repeated for each of its query heads."""
    pairs = enc.pairs

    def per_query_head(rows: torch.Tensor) -> torch.Tensor:
        return rows.view(enc.kv_heads, pairs, *rows.shape[1:]).repeat_interleave(group, 0).flatten(0, 1)

    bias = None if enc.phase_bias is None else enc.phase_bias[layer].repeat_interleave(group, 0)
    return (enc.w_down[layer], per_query_head(enc.w_up[layer]), per_query_head(enc.conv[layer]), bias,
            enc.temperature.to(enc.w_up.dtype))


def _official_layer(enc, q, k, v, x, layer, group: int = 1, split: int | None = None):
    """The official layer's attention output (B, H, T, D) from the lab's layout, prefilled at once or up to `split`
    and then decoded one token at a time through the official cache and a KV cache of rotated keys."""
    q = q.transpose(1, 2)
    k, v = (t.transpose(1, 2).repeat_interleave(group, dim=2) for t in (k, v))
    weights = _official_weights(enc, layer, group)
    seq = q.shape[1]
    chunks = [(0, seq)] if split is None else [(0, split), *((t, t + 1) for t in range(split, seq))]
    cache, keys, outs = None, [], []
    for a, b in chunks:
        rq, rk, cache = official_rotary(q[:, a:b], k[:, a:b], x[:, a:b], *weights, q.shape[2], cache)
        keys.append(rk)
        outs.append(official_attention(rq, torch.cat(keys, dim=1), v[:, :b]))
    return torch.cat(outs, dim=2)


@pytest.mark.parametrize(("dtype", "tol"), [(torch.float64, 1e-12), (torch.float32, 5e-6)])
@pytest.mark.parametrize("bias", [False, True])
def test_selective_rope_agrees_with_the_official_layer_prefilled_and_decoded(dtype, tol, bias):
    enc = _build(bias=bias, dtype=dtype)
    q, k, v, x = _inputs(SHAPE, dtype)
    state = enc.token_state(x, LAYER)
    with torch.no_grad():
        got = attend(enc, q, k, v, 0, LAYER, state)
        want = _official_layer(enc, q, k, v, x, LAYER)
        assert (got - want).abs().max().item() < tol
        decoded = _official_layer(enc, q, k, v, x, LAYER, split=12)  # the official cache carries the phase
        assert (decoded - want).abs().max().item() < tol
        for t in (12, 15, 18):  # the lab's queries after a cached prefix: the phases from the held keys' states
            held = slice(0, t + 1)
            mine = attend(enc, q[..., t:t + 1, :], k[..., held, :], v[..., held, :], t, LAYER, state[..., held, :])
            assert (mine - decoded[..., t:t + 1, :]).abs().max().item() < tol


def test_under_grouped_query_attention_a_groups_query_heads_share_their_kv_heads_phases():
    """The official layer has no grouped-query attention: the lab's equals it with each KV head's projection rows,
    convolution and bias repeated for its query heads, and its keys and values repeated."""
    enc = _build(GQA, bias=True)
    q, k, v, x = _inputs(GQA, torch.float64)
    with torch.no_grad():
        got = attend(enc, q, k, v, 0, LAYER, enc.token_state(x, LAYER))
        want = _official_layer(enc, q, k, v, x, LAYER, group=2)
    torch.testing.assert_close(got, want, atol=1e-12, rtol=0)


def test_increments_of_one_are_rope_and_none_are_nope():
    """With the projection zero and the bias 0, every increment is e^0 = 1, so the phase of token t is t + 1 and
    the angle τ_j (t + 1): RoPE at θ = model.pe.theta (the shift cancels in q·k). With no bias, every phase is 0:
    NoPE."""
    enc = _build(bias=True)
    with torch.no_grad():
        enc.w_up.zero_()
        enc.phase_bias.zero_()
    q, k, _, x = _inputs(SHAPE, torch.float64)
    rope = build_position_encoding(pe_config_class("rope")(kind="rope", theta=500000.0), SHAPE)
    positions = torch.arange(q.shape[-2])
    rq, rk = rope.rotate(q, k, rope.tables(positions, torch.float64, q.shape[-2]), LAYER)
    want = logits(rope, rq, rk, 0, LAYER)
    torch.testing.assert_close(logits(enc, q, k, 0, LAYER, enc.token_state(x, LAYER)), want, atol=1e-12, rtol=0)
    plain = _build(bias=False)
    with torch.no_grad():
        plain.w_up.zero_()
    nope = logits(build_position_encoding(pe_config_class("nope")(kind="nope"), SHAPE), q, k, 0, LAYER)
    torch.testing.assert_close(logits(plain, q, k, 0, LAYER, plain.token_state(x, LAYER)), nope, atol=1e-12, rtol=0)


@pytest.mark.parametrize(("field", "value", "expected"), [
    ("rank", 0, "model.pe.rank=0: must be an integer >= 1"),
    ("conv_size", 1.5, "model.pe.conv_size=1.5: must be an integer >= 1"),
    ("temp_max", -1.0, "model.pe.temp_max=-1.0: must be a finite number > 0"),
    ("theta", 1.0, "model.pe.theta=1.0: must be a finite number > 1"),
    ("bias", "yes", "model.pe.bias='yes': must be true or false"),
])
def test_bad_settings_are_refused_naming_the_field_the_value_and_the_fix(field, value, expected):
    with pytest.raises(UserError) as err:
        build_position_encoding(pe_config_class("selective_rope")(**{field: value}), SHAPE)
    assert expected in str(err.value) and "e.g." in str(err.value)


def test_a_hidden_state_it_cannot_cut_into_head_chunks_is_refused():
    shape = EncodingShape(head_dim=8, n_heads=4, n_kv_heads=4, n_layers=1, max_seq_len=32, model_dim=30)
    with pytest.raises(UserError, match=r"model.dim=30: .* use a model.dim divisible by model.n_heads"):
        build_position_encoding(pe_config_class("selective_rope")(), shape)


def test_it_trains_dumps_the_attention_it_used_and_resumes_exactly(tiny_cfg):
    from tests.test_train import trains_dumps_and_resumes

    trains_dumps_and_resumes(tiny_cfg, "model.pe.kind=selective_rope")
