"""The frontier kinds of issue 36 (FoX, stick-breaking, GRAPE-M, GRAPE-A, DAPE, PaTH): agreement with their official
code, re-typed here from the repositories (FoX: `test_op`'s reference in
`src/forgetting_transformer/ops/forgetting_attention.py`; stick-breaking: `sb_ref.stickbreaking` plus the
leftover term of `tests/test_attn.py::ref_fwd`; GRAPE: `MSGRAPECommuting` and `apply_rotary_emb` of
`model/llama-mha-grape-m-nonctx.py`, `QueryGatedAdditiveBias` of `model/llama-mha-grape-a-querygated.py`; DAPE:
`AliBi_DAPE.forward` and `ParallelKerpleLog_DAPE.forward` of `DAPE.py`; PaTH: the decoding path and the w, β of
`fla/layers/path_attn.py`), their special cases, and the training
loop's exact resume."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from trainer.model.attention.simple import attend, logits, weights
from trainer.model.encodings.alibi import alibi_slopes
from trainer.model.encodings.base import EncodingShape
from trainer.model.encodings.dape import base_config
from trainer.model.llama import KVCache, Llama, ModelArgs
from trainer.model.position import POSITION_ENCODINGS, build_position_encoding, pe_config_class

SHAPE = EncodingShape(head_dim=8, n_heads=4, n_kv_heads=2, n_layers=2, max_seq_len=32, model_dim=24)


def _build(kind: str, **fields):
    return build_position_encoding(pe_config_class(kind)(kind=kind, **fields), SHAPE)


def _qkv(dtype: torch.dtype, seq: int = 19, batch: int = 2, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    q = 0.5 * torch.randn(batch, SHAPE.n_heads, seq, SHAPE.head_dim, generator=gen, dtype=dtype)
    k = 0.5 * torch.randn(batch, SHAPE.n_kv_heads, seq, SHAPE.head_dim, generator=gen, dtype=dtype)
    v = 0.5 * torch.randn(batch, SHAPE.n_kv_heads, seq, SHAPE.head_dim, generator=gen, dtype=dtype)
    return q, k, v


def _heads(t: torch.Tensor) -> torch.Tensor:
    return t.repeat_interleave(SHAPE.n_heads // SHAPE.n_kv_heads, dim=1)


# --- stick-breaking -----------------------------------------------------------------------------------------------

def official_stickbreaking(q, k, v):
    """sb_ref.stickbreaking with the mask and cumulative weight of tests/test_attn.py (attend_current=False), then
    o + rem · v as that test's ref_fwd and the model layers do."""
    length = q.shape[-2]
    mask = torch.ones(length, length).triu(0).bool()
    cum_weight = torch.ones(length, length).tril(-1).to(q)
    logits = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    log_z = F.logsigmoid(logits).masked_fill(mask, -1e5)
    log_beta = F.logsigmoid(-logits).masked_fill(mask, 0)
    att = (log_z + torch.einsum("bhij,jk->bhik", log_beta, cum_weight)).exp()
    return att @ v + (1 - att.sum(dim=-1))[..., None] * v


@pytest.mark.parametrize(("dtype", "tol"), [(torch.float64, 1e-12), (torch.float32, 2e-6)])
def test_stick_breaking_agrees_with_the_official_reference(dtype, tol):
    enc = _build("stickbreaking")
    q, k, v = _qkv(dtype)
    got = attend(enc, q, k, v, 0)
    want = official_stickbreaking(q, _heads(k), _heads(v))
    assert (got - want).abs().max().item() < tol


def test_stick_breaking_weights_are_distributions_that_break_from_the_nearest_key():
    enc = _build("stickbreaking")
    q, k, _ = _qkv(torch.float64)
    w = weights(enc, q, k, 0)
    torch.testing.assert_close(w.sum(-1), torch.ones_like(w[..., 0]))
    assert (w >= 0).all() and (w.triu(1) == 0).all()
    assert (w[..., 0, 0] == 1).all()  # the first token has no earlier key: all its weight is its own value
    # a key the query is sure of takes the whole stick, and the keys before it get nothing
    z = torch.full((1, 1, 1, 3), -30.0, dtype=torch.float64)
    z[..., 2] = 40.0
    from trainer.model.encodings.stickbreaking import stick_breaking_scores

    log_w, rest = stick_breaking_scores(z, torch.ones(1, 1, 1, 3, dtype=torch.bool), None)
    torch.testing.assert_close(log_w.exp()[0, 0, 0], torch.tensor([0.0, 0.0, 1.0], dtype=torch.float64), atol=1e-12,
                               rtol=0)
    assert rest.exp().item() < 1e-12  # nothing is left for the query's own value


def test_stick_breaking_decodes_queries_after_a_cached_prefix_as_in_one_pass():
    enc = _build("stickbreaking")
    q, k, v = _qkv(torch.float64)
    full = attend(enc, q, k, v, 0)
    tail = attend(enc, q[..., 12:, :], k, v, 12)
    torch.testing.assert_close(tail, full[..., 12:, :], atol=1e-12, rtol=0)


# --- FoX ----------------------------------------------------------------------------------------------------------

def official_forgetting_attention(q, k, v, log_fgate, sm_scale):
    """The reference of forgetting_attention.py's test_op: q (M queries) at the end of k, v (N keys)."""
    m, n = q.shape[-2], k.shape[-2]
    mask = torch.tril(torch.ones((m, n)), diagonal=n - m)
    p = torch.matmul(q, k.transpose(2, 3)) * sm_scale
    log_lambda = torch.cumsum(log_fgate, dim=-1)
    p = p + (log_lambda[..., -m:, None] - log_lambda[..., None, :])
    p[:, :, mask == 0] = float("-inf")
    return torch.matmul(torch.softmax(p, dim=-1), v)


@pytest.mark.parametrize(("dtype", "tol"), [(torch.float64, 1e-12), (torch.float32, 2e-6)])
@pytest.mark.parametrize("past", [0, 7])
def test_fox_agrees_with_the_official_reference(dtype, tol, past):
    enc = _build("fox", init_std=0.5).to(dtype)
    with torch.no_grad():
        enc.gate_bias.uniform_(-1.0, 3.0, generator=torch.Generator().manual_seed(3))
    q, k, v = _qkv(dtype)
    x = torch.randn(2, 19, SHAPE.input_dim, dtype=dtype, generator=torch.Generator().manual_seed(4))
    state = enc.token_state(x, layer=1)
    assert state.shape == (2, SHAPE.n_heads, 19) and (state < 0).all()
    got = attend(enc, q[..., past:, :], k, v, past, 1, state)
    want = official_forgetting_attention(q[..., past:, :], _heads(k), _heads(v), state, SHAPE.head_dim**-0.5)
    assert (got - want).abs().max().item() < tol
    # its logits, which the attention dump reads, are the ones this attention takes the softmax of
    probs = torch.softmax(logits(enc, q[..., past:, :], k, past, 1, state), dim=-1)
    torch.testing.assert_close(probs @ _heads(v), got, atol=10 * tol, rtol=0)


def test_fox_with_a_fixed_gate_is_alibi_and_with_an_open_gate_is_nope():
    """A gate that reads nothing (w = 0) and sits at σ(b_h) = 2^(-8h/H) is ALiBi's slope; a gate held open is NoPE."""
    enc, alibi = _build("fox"), _build("alibi")
    q, k, v = _qkv(torch.float64)
    x = torch.randn(2, 19, SHAPE.input_dim, dtype=torch.float64)
    slopes = alibi_slopes(SHAPE.n_heads)
    with torch.no_grad():
        enc.gate_weight.zero_()
        enc.gate_bias[0] = torch.log(torch.expm1(slopes).reciprocal())  # logit of exp(-slope)
        enc.gate_bias[1] = 40.0
    enc = enc.double()
    fox = attend(enc, q, k, v, 0, 0, enc.token_state(x, 0))
    want = attend(alibi, q, k, v, 0, 0)
    torch.testing.assert_close(fox, want, atol=1e-7, rtol=0)  # ALiBi keeps its slopes and bias in float32
    open_gate = attend(enc, q, k, v, 0, 1, enc.token_state(x, 1))
    nope = F.scaled_dot_product_attention(q, _heads(k), _heads(v), is_causal=True)
    torch.testing.assert_close(open_gate, nope, atol=1e-12, rtol=0)


def test_fox_gates_read_the_hidden_state_and_learn():
    torch.manual_seed(0)
    model = Llama(ModelArgs(vocab_size=32, dim=24, n_layers=2, n_heads=4, n_kv_heads=2, ffn_hidden=48,
                            max_seq_len=32, pe=pe_config_class("fox")()))
    assert model.pe.gate_weight.shape == (2, 4, 24) and (model.pe.gate_bias == 0).all()
    assert abs(model.pe.gate_weight.std().item() - 0.02) < 0.005  # the official initializer_range
    tokens = torch.randint(0, 32, (2, 12))
    model(tokens).square().mean().backward()
    assert model.pe.gate_weight.grad.abs().sum() > 0 and model.pe.gate_bias.grad.abs().sum() > 0
    cache = KVCache(2)
    with torch.no_grad():
        model(tokens[:, :5], cache=cache)
    assert cache.state[0].shape == (2, 4, 5)  # the cache keeps each key's log gate


# --- GRAPE ----------------------------------------------------------------------------------------------------------

def official_grape_m(x, log_freq, log_freq_scale):
    """MSGRAPECommuting.forward on one of q or k, shared spectrum: x (B, T, H, D) at positions 0..T-1."""
    t = torch.arange(x.shape[1], dtype=x.dtype)
    freq = torch.exp(log_freq / log_freq_scale).to(x.dtype)
    angles = t[:, None, None] * freq[None, None, :]
    cos, sin = angles.cos()[None], angles.sin()[None]
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos + x2 * sin, -x1 * sin + x2 * cos], dim=-1)


@pytest.mark.parametrize(("dtype", "tol"), [(torch.float64, 1e-12), (torch.float32, 1e-5)])
def test_grape_m_agrees_with_the_official_rotation(dtype, tol):
    enc = _build("grape_m")
    with torch.no_grad():  # a learned spectrum, not the initial one
        enc.log_freq.add_(torch.randn(enc.log_freq.shape, generator=torch.Generator().manual_seed(2)))
    q, k, _ = _qkv(dtype)
    pos = torch.arange(19)
    rq, rk = enc.rotate(q, k, enc.tables(pos, dtype, 19), 1)
    log_freq = enc.log_freq[1].detach().to(torch.float64 if dtype == torch.float64 else torch.float32)
    want_q = official_grape_m(q.transpose(1, 2), log_freq, 16.0).transpose(1, 2)
    want_k = official_grape_m(k.transpose(1, 2), log_freq, 16.0).transpose(1, 2)
    assert max((rq - want_q).abs().max().item(), (rk - want_k).abs().max().item()) < tol


def test_grape_m_at_its_initial_spectrum_is_rope_with_the_second_half_negated():
    grape, rope = _build("grape_m"), build_position_encoding(pe_config_class("rope")(kind="rope"), SHAPE)
    q, k, _ = _qkv(torch.float64)
    flip = torch.cat([torch.ones(SHAPE.head_dim // 2), -torch.ones(SHAPE.head_dim // 2)]).double()
    pos = torch.arange(19)
    got = logits(grape, *grape.rotate(q, k, grape.tables(pos, torch.float64, 19)), 0)
    want = logits(rope, *rope.rotate(q * flip, k * flip, rope.tables(pos, torch.float64, 19)), 0)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)  # GRAPE's spectrum is a float32 parameter
    assert not _build("grape_m", learnable=False).log_freq.requires_grad


def official_query_gated_bias(q, omega, v, slopes):
    """QueryGatedAdditiveBias.forward: q (B, T, H, D) -> bias (B, H, T, T), the future clamped to distance 0."""
    t = q.shape[1]
    arange = torch.arange(t)
    dist = (arange.view(t, 1) - arange.view(1, t)).clamp_min(0).to(q.dtype).view(1, 1, t, t)
    w = F.softplus(omega).view(1, -1, 1, 1) * slopes.view(1, -1, 1, 1)
    unit = F.normalize(v, p=2, dim=-1, eps=1e-6)
    gate = F.softplus((q * unit.view(1, 1, *unit.shape)).sum(dim=-1) / math.sqrt(q.shape[-1])).transpose(1, 2)
    return -dist * w * gate.view(q.shape[0], q.shape[2], t, 1)


@pytest.mark.parametrize(("dtype", "tol"), [(torch.float64, 1e-12), (torch.float32, 2e-6)])
def test_grape_a_agrees_with_the_official_query_gated_attention(dtype, tol):
    enc = _build("grape_a")
    with torch.no_grad():
        enc.omega.uniform_(-1.0, 2.0, generator=torch.Generator().manual_seed(5))
    enc = enc.to(dtype)
    q, k, v = _qkv(dtype)
    got = attend(enc, q, k, v, 0, 1)
    bias = official_query_gated_bias(q.transpose(1, 2), enc.omega[1].detach(), enc.v[1].detach(),
                                      enc.slopes.to(dtype))
    mask = bias.masked_fill(~torch.ones(19, 19, dtype=torch.bool).tril(), float("-inf"))
    want = F.scaled_dot_product_attention(q, _heads(k), _heads(v), attn_mask=mask)
    assert (got - want).abs().max().item() < tol
    tail = attend(enc, q[..., 12:, :], k, v, 12, 1)  # queries after a cached prefix
    torch.testing.assert_close(tail, got[..., 12:, :], atol=10 * tol, rtol=0)


def test_grape_a_with_its_gate_fixed_is_alibi_and_with_no_slope_is_nope():
    """Queries orthogonal to v_h hold the gate at softplus(0) = ln 2; with softplus(ω̃_h) = 1/ln 2 the penalty is
    ALiBi's. With ω → 0 there is no penalty: NoPE."""
    enc, alibi = _build("grape_a").double(), _build("alibi")
    q, k, v = _qkv(torch.float64)
    q[..., 0] = 0.0
    with torch.no_grad():
        enc.v.zero_()
        enc.v[..., 0] = 1.0
        enc.omega[0] = math.log(math.expm1(1 / math.log(2)))
        enc.omega[1] = -40.0
    torch.testing.assert_close(attend(enc, q, k, v, 0, 0), attend(alibi, q, k, v, 0, 0), atol=1e-7, rtol=0)
    nope = F.scaled_dot_product_attention(q, _heads(k), _heads(v), is_causal=True)
    torch.testing.assert_close(attend(enc, q, k, v, 0, 1), nope, atol=1e-12, rtol=0)


# --- DAPE -----------------------------------------------------------------------------------------------------------

def official_dape(x, a, mlp):
    """The official DAPE forward: x the scaled scores (B, H, T, T), a the base bias (H, T, T), mlp the
    Linear(2H, w) → LeakyReLU → Linear(w, H) stack."""
    both = torch.cat((x, torch.tile(a, (x.shape[0], 1, 1, 1))), dim=1).permute(0, 2, 3, 1)
    return x + a + mlp(both).permute(0, 3, 1, 2)


@pytest.mark.parametrize("base", ["alibi", "kerple", "fire"])
@pytest.mark.parametrize(("dtype", "tol"), [(torch.float64, 1e-12), (torch.float32, 2e-6)])
def test_dape_agrees_with_the_official_forward(base, dtype, tol):
    enc = _build("dape", base=base).to(dtype)
    q, k, v = _qkv(dtype)
    enc.tables(torch.arange(19), dtype, 19)
    got = logits(enc, q, k, 0, 1)
    mlp = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.LeakyReLU(), torch.nn.Linear(32, 4)).to(dtype)
    with torch.no_grad():
        for layer, (w, b) in zip((mlp[0], mlp[2]), ((enc.w1, enc.b1), (enc.w2, enc.b2)), strict=True):
            layer.weight.copy_(w[1])
            layer.bias.copy_(b[1])
        bias = enc.base.score_bias(torch.arange(19), 19, 1).to(dtype)
        want = official_dape(q @ _heads(k).transpose(-1, -2) / math.sqrt(SHAPE.head_dim), bias, mlp)
    visible = torch.ones(19, 19, dtype=torch.bool).tril()
    assert (got - want)[..., visible].abs().max().item() < tol
    assert torch.isinf(got[..., ~visible]).all()
    assert len(dict(enc.named_parameters())) == 4 + len(dict(enc.base.named_parameters()))
    tail = attend(enc, q[..., 12:, :], k, v, 12, 1)  # queries after a cached prefix
    torch.testing.assert_close(tail, attend(enc, q, k, v, 0, 1)[..., 12:, :], atol=10 * tol, rtol=0)


@pytest.mark.parametrize("base", ["alibi", "kerple"])
def test_dape_with_a_silent_mlp_is_its_base_bias(base):
    enc = _build("dape", base=base).double()
    with torch.no_grad():
        enc.w2.zero_()
        enc.b2.zero_()
    plain = build_position_encoding(base_config(pe_config_class("dape")(base=base)), SHAPE)
    plain.load_state_dict(enc.base.state_dict())
    q, k, v = _qkv(torch.float64)
    torch.testing.assert_close(attend(enc, q, k, v, 0, 1), attend(plain.double(), q, k, v, 0, 1), atol=1e-7, rtol=0)


@pytest.mark.parametrize("base", ["kerple", "fire"])
def test_dape_is_translation_invariant_exactly_when_its_base_is(base):
    """One query-key pair three tokens apart, moved along the sequence: its logit stays only over a shift-free base."""
    enc = _build("dape", base=base).double()
    if base == "fire":  # shifts must cross FIRE's threshold to show
        with torch.no_grad():
            enc.base.init_threshold.fill_(4.0)
    q, k, _ = _qkv(torch.float64, seq=1)
    rows = []
    for p in (5, 9, 17):
        keys = torch.zeros(2, SHAPE.n_kv_heads, p + 1, SHAPE.head_dim, dtype=torch.float64)
        keys[..., p - 3, :] = k[..., 0, :]
        enc.tables(torch.arange(p + 1), torch.float64, p + 1)
        rows.append(logits(enc, q, keys, p, 1)[..., 0, p - 3])
    same = all(torch.allclose(rows[0], x, atol=1e-9) for x in rows[1:])
    kind = POSITION_ENCODINGS["dape"]
    assert same == kind.invariant(pe_config_class("dape")(base=base)) == (base == "kerple")


# --- PaTH -----------------------------------------------------------------------------------------------------------

def official_path_inputs(enc, x, layer):
    """w and β as the official PaTHAttention.forward makes them: the low-rank w_proj, the depthwise causal
    ShortConvolution with SiLU, the per-head l2_norm, and β = 2σ(bt_proj(x)); torch's own Conv1d here."""
    kv_dim, taps = enc.conv.shape[1], enc.conv.shape[2]
    z = F.linear(F.linear(x, enc.w_down[layer]), enc.w_up[layer])  # (B, T, kv_dim)
    conv = F.conv1d(z.transpose(1, 2), enc.conv[layer].view(kv_dim, 1, taps), padding=taps - 1, groups=kv_dim)
    w = F.silu(conv[..., :x.shape[1]]).transpose(1, 2).view(*x.shape[:2], enc.kv_heads, enc.head_dim)
    w = w / torch.sqrt((w * w).sum(-1, keepdim=True) + 1e-6)
    beta = 2 * torch.sigmoid(F.linear(x, enc.beta_weight[layer], enc.beta_bias[layer]))
    return w.transpose(1, 2), beta.transpose(1, 2)  # (B, H, T, D), (B, H, T)


def official_path_decoding(q, k, v, w, beta, scale):
    """The official decoding path, one token at a time: every cached key gets the new token's rank-one update
    k - β (k·w) w (`rank_one_update`), the new key joins the cache unchanged, and the query attends by softmax."""
    outs, keys, values = [], k[..., :0, :], v[..., :0, :]
    for t in range(q.shape[-2]):
        wt, bt = w[..., t:t + 1, :], beta[..., t:t + 1, None]
        keys = keys - bt * (keys * wt).sum(-1, keepdim=True) * wt
        keys, values = torch.cat([keys, k[..., t:t + 1, :]], -2), torch.cat([values, v[..., t:t + 1, :]], -2)
        outs.append(torch.softmax(q[..., t:t + 1, :] @ keys.transpose(-1, -2) * scale, -1) @ values)
    return torch.cat(outs, -2)


@pytest.mark.parametrize(("dtype", "tol"), [(torch.float64, 1e-12), (torch.float32, 5e-6)])
@pytest.mark.parametrize("seq", [19, 75])  # one pass (below a chunk) and chunked (three chunks, the last short)
def test_path_agrees_with_the_official_decoding(dtype, tol, seq):
    enc = _build("path", init_std=0.3)
    with torch.no_grad():
        enc.beta_bias.uniform_(-2.0, 2.0, generator=torch.Generator().manual_seed(6))
    enc = enc.to(dtype)
    q, k, v = _qkv(dtype, seq=seq)
    x = torch.randn(2, seq, SHAPE.input_dim, dtype=dtype, generator=torch.Generator().manual_seed(7))
    state = enc.token_state(x, 1)
    with torch.no_grad():
        got = attend(enc, q, k, v, 0, 1, state)
        w, beta = official_path_inputs(enc, x, 1)
        want = official_path_decoding(q, _heads(k), _heads(v), _heads(w), _heads(beta), SHAPE.head_dim**-0.5)
        assert (got - want).abs().max().item() < tol
        # its own directions are the official ones
        mine_w, mine_beta = enc.directions(state, 1)
        assert (mine_w - w).abs().max().item() < tol and (mine_beta - beta).abs().max().item() < tol
        tail = attend(enc, q[..., 12:, :], k, v, 12, 1, state)  # queries after a cached prefix
        torch.testing.assert_close(tail, got[..., 12:, :], atol=10 * tol, rtol=0)


@pytest.mark.parametrize("block", [1, 4, 7, 16])
def test_path_by_tiles_equals_one_tile_with_its_gradients(block):
    """The UT-transform tiles carry each query through the Householder products of the tiles between: any tile size
    gives the one-tile scores, and the same gradients (through w, β and the convolution)."""
    from trainer.model.attention.dense import dense_attention
    from trainer.model.attention.simple import simple_call
    from trainer.model.attention.tiled import tiled_attention

    enc = _build("path", init_std=0.3).double()
    with torch.no_grad():
        enc.beta_bias.uniform_(-2.0, 2.0, generator=torch.Generator().manual_seed(6))
    q, k, v = (t.requires_grad_() for t in _qkv(torch.float64, seq=23))
    x = torch.randn(2, 23, SHAPE.input_dim, dtype=torch.float64, generator=torch.Generator().manual_seed(7))
    outs = []
    for run in (dense_attention, lambda pe, call: tiled_attention(pe, call, block)):
        enc.zero_grad()
        out = run(enc, simple_call(q, k, v, 0, 1, enc.token_state(x, 1)))
        grads = torch.autograd.grad(out.square().sum(), (q, k, v, *enc.parameters()), allow_unused=True)
        outs.append((out, grads))
    torch.testing.assert_close(outs[1][0], outs[0][0], atol=1e-12, rtol=0)
    for a, b in zip(outs[0][1], outs[1][1], strict=True):
        if a is not None:
            torch.testing.assert_close(b, a, atol=1e-10, rtol=0)


def test_path_with_no_reflection_is_nope_and_with_full_reflections_flips_the_keys():
    """β = 0 makes every H the identity: NoPE. β = 2 makes H a reflection, which keeps every key's norm (with w of
    unit length: weights large enough that the norm's ε does not shorten it)."""
    enc = _build("path", init_std=0.5).double()
    q, k, v = _qkv(torch.float64)
    x = torch.randn(2, 19, SHAPE.input_dim, dtype=torch.float64)
    with torch.no_grad():
        enc.beta_bias.fill_(-60.0)
    nope = F.scaled_dot_product_attention(q, _heads(k), _heads(v), is_causal=True)
    torch.testing.assert_close(attend(enc, q, k, v, 0, 0, enc.token_state(x, 0)), nope, atol=1e-12, rtol=0)
    with torch.no_grad():
        enc.beta_bias.fill_(60.0)
    state = enc.token_state(x, 0)
    w, beta = enc.directions(state, 0)
    torch.testing.assert_close(beta, torch.full_like(beta, 2.0))
    keys = k.clone()
    for t in range(1, 19):  # the last query's view of every key: all reflections after it applied
        keys[..., :t, :] -= 2 * (keys[..., :t, :] * w[..., t:t + 1, :]).sum(-1, keepdim=True) * w[..., t:t + 1, :]
    torch.testing.assert_close(keys.norm(dim=-1), k.norm(dim=-1), rtol=1e-4, atol=0)  # ε leaves |w| just below 1
    last = logits(enc, q, k, 0, 0, state)[..., -1, :]
    torch.testing.assert_close(last, (q[..., -1:, :] @ _heads(keys).transpose(-1, -2))[..., 0, :] / math.sqrt(8))


# --- the training loop ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["fox", "stickbreaking", "grape_m", "grape_a", "dape", "path"])
def test_each_trains_dumps_the_attention_it_used_and_resumes_exactly(tiny_cfg, kind):
    import numpy as np

    from tests.test_train import trains_dumps_and_resumes

    maps = trains_dumps_and_resumes(tiny_cfg, f"model.pe.kind={kind}")
    if kind == "stickbreaking":  # its first token keeps the whole stick, on its own value
        assert np.all(maps[:, 0, 0] == 1)
