"""TAPE (issue 46 §3; VITA-Group/TAPE): the lab's model equals the official model re-typed here from
`models/llama/adape.py` (AdaRotaryEmbedding's duplicated cos/sin of every head, apply_rotary_pos_emb's half-split
turn of q and k by the position states, PELlamaAttention's softmax over q·k/√d that also averages the position states,
the decoder layer's 'bqnd,qe->bqnd' einsum and residual, PELayer's three einsums gated by the MLP output) on random
weights, in float64 and float32, with and without grouped-query attention, prefilled and decoded through the lab's KV
cache (the official model has none); the official training shift of every position changes nothing (equivariance);
at its init it is RoPE; it trains, dumps and resumes exactly, and every attention path equals the dense one."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F

from hdrope.errors import UserError
from trainer.model.llama import KVCache, Llama, ModelArgs
from trainer.model.position import pe_config_class

THETA = 10000.0


def _args(**fields) -> ModelArgs:
    base = {"vocab_size": 40, "dim": 32, "n_layers": 3, "n_heads": 4, "n_kv_heads": 4, "ffn_hidden": 48,
            "max_seq_len": 64, "pe": pe_config_class("tape")(kind="tape", position_size=6)}
    return ModelArgs(**{**base, **fields})


def _model(dtype: torch.dtype = torch.float64, **fields) -> Llama:
    """The lab's model on random weights, the encoding's included (N(0, 0.3²): W_u and W_r are zero at the init)."""
    torch.manual_seed(3)
    model = Llama(_args(**fields)).to(dtype).eval()
    gen = torch.Generator().manual_seed(4)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() > 1:
                p.copy_(torch.randn(p.shape, generator=gen, dtype=dtype) * (0.3 if name.startswith("pe.") else 0.15))
    return model


def _rms(norm, x):
    """LlamaRMSNorm: in float32 whatever the input's dtype, as the official (and the lab's) norm."""
    xf = x.to(torch.float32)
    return norm.weight * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + norm.eps)).to(x.dtype)


def _rotate_half(x):
    return torch.cat((-x[..., x.shape[-1] // 2:], x[..., :x.shape[-1] // 2]), dim=-1)


def official_logits(model: Llama, tokens: torch.Tensor, shift: int = 0) -> torch.Tensor:
    """The official AdaLlama's logits for `tokens` (batch, seq), re-typed from adape.py with the lab model's
    weights (W_k and W_v rows repeated for each query head of a group), positions shift..shift+seq-1."""
    a, pe = model.args, model.pe
    heads, d = a.n_heads, a.resolved_head_dim
    b, s = tokens.shape
    dtype = model.output.weight.dtype
    t = torch.arange(shift, s + shift, dtype=torch.float32)  # AdaRotaryEmbedding: float32 positions and inv_freq
    inv_freq = 1.0 / (THETA ** (torch.arange(0, d, 2).float() / d))
    emb = torch.cat((torch.outer(t, inv_freq),) * 2, dim=-1)
    if dtype == torch.float64:  # the reference in float64 forms its phases in float64 as well
        emb = torch.cat((torch.outer(t.double(), 1.0 / (THETA ** (torch.arange(0, d, 2).double() / d))),) * 2, -1)
    states = tuple(f(emb)[None, None].repeat(1, heads, 1, 1).expand(b, -1, -1, -1).to(dtype) for f in (torch.cos,
                                                                                                      torch.sin))
    mask = torch.full((s, s), float("-inf"), dtype=dtype).triu(1)
    group = heads // a.n_kv_heads
    x = model.tok_embeddings(tokens)
    for i, layer in enumerate(model.layers):
        att = layer.attention
        h = _rms(layer.attention_norm, x)
        wk = att.wk.weight.view(a.n_kv_heads, d, -1).repeat_interleave(group, dim=0).reshape(heads * d, -1)
        wv = att.wv.weight.view(a.n_kv_heads, d, -1).repeat_interleave(group, dim=0).reshape(heads * d, -1)
        q, k, v = ((h @ w.T).view(b, s, heads, d).transpose(1, 2) for w in (att.wq.weight, wk, wv))
        q = q * states[0] + _rotate_half(q) * states[1]
        k = k * states[0] + _rotate_half(k) * states[1]
        # the official softmax upcasts to float32 (a float32 model's dtype); a float64 check keeps float64 here
        weights = torch.softmax(q @ k.transpose(2, 3) / math.sqrt(d) + mask, dim=-1)
        pos_output = (weights @ states[0], weights @ states[1])
        x = x + (weights @ v).transpose(1, 2).reshape(b, s, heads * d) @ att.wo.weight.T
        states = tuple(torch.einsum("bqnd,qe->bqnd", pos_output[j], pe.w_r[i]) + states[j] for j in range(2))
        ffn = layer.feed_forward
        f = _rms(layer.ffn_norm, x)
        f = (F.silu(f @ ffn.w1.weight.T) * (f @ ffn.w3.weight.T)) @ ffn.w2.weight.T
        up_e = tuple(torch.einsum("bqnd,eq->bend", e, pe.w_u[i]) for e in states)
        x_e = tuple(F.silu(f @ pe.w_x[i].T).transpose(1, 2).unsqueeze(-1) * e for e in up_e)
        states = tuple(torch.einsum("bend,qe->bqnd", e, pe.w_d[i]) + r for e, r in zip(x_e, states, strict=True))
        x = x + f
    return _rms(model.norm, x) @ model.output.weight.T


def _tokens(seq: int = 21, batch: int = 2) -> torch.Tensor:
    return torch.randint(0, 40, (batch, seq), generator=torch.Generator().manual_seed(0))


def _decoded(model: Llama, tokens: torch.Tensor, prefix: int = 12) -> torch.Tensor:
    cache = KVCache(model.args.n_layers)
    parts = [model(tokens[:, :prefix], cache=cache)]
    parts += [model(tokens[:, j:j + 1], cache=cache) for j in range(prefix, tokens.shape[1])]
    return torch.cat(parts, dim=1)


@pytest.mark.parametrize(("dtype", "tol"), [(torch.float64, 1e-12), (torch.float32, 5e-5)])
@pytest.mark.parametrize("kv_heads", [4, 2])
def test_tape_agrees_with_the_official_model_prefilled_and_decoded(dtype, tol, kv_heads):
    model = _model(dtype, n_kv_heads=kv_heads)
    tokens = _tokens()
    with torch.no_grad():
        want = official_logits(model, tokens)
        assert want.abs().max() > 1.0  # the check reads logits of size, not a model near zero
        torch.testing.assert_close(model(tokens), want, atol=tol, rtol=0)
        torch.testing.assert_close(_decoded(model, tokens), want, atol=tol, rtol=0)


def test_the_official_training_shift_of_every_position_changes_nothing():
    """adape.py shifts every position by a random k in [0, 2·max_position_embeddings] while training; the model is
    equivariant, so the lab trains at shift 0."""
    model = _model()
    tokens = _tokens()
    with torch.no_grad():
        base = model(tokens)
        for shift in (1, 37, 2048):
            torch.testing.assert_close(official_logits(model, tokens, shift), base, atol=1e-9, rtol=0)
            torch.testing.assert_close(model(tokens, torch.arange(shift, shift + tokens.shape[1])), base, atol=1e-9,
                                       rtol=0)


def test_at_its_init_it_is_rope_and_its_features_move_once_trained():
    model = _model()
    rope = Llama(dataclasses.replace(model.args, pe=pe_config_class("rope")(kind="rope", theta=THETA))).double()
    rope.load_state_dict({k: v for k, v in model.state_dict().items() if not k.startswith("pe.")})
    tokens = _tokens()
    with torch.no_grad():
        assert (model(tokens) - rope(tokens)).abs().max() > 1e-3
        model.pe.w_u.zero_()
        model.pe.w_r.zero_()
        torch.testing.assert_close(model(tokens), rope(tokens), atol=1e-12, rtol=0)
        fresh = Llama(model.args).double()
    assert fresh.pe.w_u.abs().max() == 0 and fresh.pe.w_r.abs().max() == 0 and fresh.pe.w_x.std() > 0


@pytest.mark.parametrize("mask", ["causal", "documents", "window"])
def test_every_attention_path_equals_the_dense_one_in_values_and_gradients(mask):
    fields = {"window": 7} if mask == "window" else {}
    dense = _model(**fields)
    tokens = _tokens(23)
    if mask == "documents":
        from trainer.model.attention.documents import Documents

        dense.documents = Documents(eos_id=int(tokens[0, 5]))
    out = dense(tokens)
    out.square().sum().backward()
    for path in ("tiled", "flex"):
        other = Llama(dataclasses.replace(dense.args, attention=path, attention_block=5)).double()
        other.load_state_dict(dense.state_dict())
        other.documents = dense.documents
        if path == "flex":  # FlexAttention's CPU reference has no backward: its forward, then a cached decode
            with torch.no_grad():
                torch.testing.assert_close(other(tokens), out.detach(), atol=1e-10, rtol=0)
                torch.testing.assert_close(_decoded(other, tokens), out.detach(), atol=1e-10, rtol=0)
            continue
        got = other(tokens)
        torch.testing.assert_close(got, out, atol=1e-10, rtol=0)
        got.square().sum().backward()
        for (name, p), q in zip(dense.named_parameters(), other.parameters(), strict=True):
            torch.testing.assert_close(q.grad, p.grad, atol=1e-9, rtol=0, msg=name)


def test_a_hybrid_stack_or_a_schedule_with_tape_is_refused_naming_the_layers_and_why(tiny_cfg):
    from trainer.model.pe_layers import stack_problems

    a = _args(pe_layers=[{"layers": "every 3rd", "pe": {"kind": "nope"}}])
    problems = stack_problems(a)
    assert any("layers 0, 1 take tape, which cannot share a model with nope" in p and "flow from each layer" in p
               for p in problems), problems
    with pytest.raises(UserError, match="cannot share a model"):
        Llama(a)
    other = _args(pe_layers=[{"layers": "every 3rd", "pe": {"kind": "tape", "position_size": 4}}])
    assert any("layers 2 take tape with other settings than the rest" in p and "the same tape settings" in p
               for p in stack_problems(other)), stack_problems(other)
    with pytest.raises(UserError, match=r"model.pe \(kind tape\) holds 6536 trained values, which cannot carry over"):
        tiny_cfg("model.pe.kind=tape", "train.steps=12", "train.pe_schedule=[{step: 6, pe: {kind: nope}}]")


@pytest.mark.parametrize(("field", "value", "expected"), [
    ("position_size", 0, "model.pe.position_size=0: must be an integer >= 1, e.g. 48"),
    ("init_std", -1.0, "model.pe.init_std=-1.0: must be a finite number > 0"),
    ("theta", 1.0, "model.pe.theta=1.0: must be a finite number > 1"),
])
def test_bad_settings_are_refused_naming_the_field_the_value_and_the_fix(field, value, expected):
    with pytest.raises(UserError, match=expected.replace(".", r"\.").replace("(", r"\(")):
        Llama(_args(pe=pe_config_class("tape")(kind="tape", **{field: value})))


def test_it_trains_dumps_the_attention_it_used_and_resumes_exactly(tiny_cfg):
    from tests.test_train import trains_dumps_and_resumes

    trains_dumps_and_resumes(tiny_cfg, "model.pe.kind=tape")
