"""RoPE++ (issue 46 §3; OpenMOSS/rope_pp, `rope_pp/modeling_llama_rope_pp.py`): its attention layer equals the
official computation re-typed here from that file (imag2 = EC, imag1 = EH), on random weights, in float64; without
its imaginary heads' share of W_o it is RoPE; its parameter count is what its mode says."""

from __future__ import annotations

import pytest
import torch

from hdrope.errors import UserError
from trainer.model.llama import Llama, ModelArgs, _Context
from trainer.model.position import pe_config_class
from trainer.model.throughput import param_count

THETA = 10000.0


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    return torch.cat((-x[..., x.shape[-1] // 2:], x[..., : x.shape[-1] // 2]), dim=-1)


def _official_layer(x, wq, wk, wv, wo, head_dim: int, imaginary: bool) -> torch.Tensor:
    """The official LlamaAttention of RoPE++ (and, without `imaginary`, of RoPE), eager path, causal mask."""
    b, s, _ = x.shape
    q = (x @ wq.T).view(b, s, -1, head_dim).transpose(1, 2)
    k = (x @ wk.T).view(b, s, -1, head_dim).transpose(1, 2)
    v = (x @ wv.T).view(b, s, -1, head_dim).transpose(1, 2)
    inv_freq = 1.0 / (THETA ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    freqs = torch.arange(s, dtype=torch.float64)[:, None] * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos()[None, None], emb.sin()[None, None]
    q_rope, k_rope = q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin
    if imaginary:
        q_imag = q * sin - _rotate_half(q) * cos
        heads = q_rope.shape[1]
        q_rope = torch.stack([q_rope, q_imag], dim=2).reshape(b, heads * 2, s, head_dim)
    groups = q_rope.shape[1] // k_rope.shape[1]
    k_rope, v = k_rope.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    scores = q_rope @ k_rope.transpose(2, 3) * head_dim**-0.5
    scores = scores.masked_fill(torch.ones(s, s, dtype=torch.bool).triu(1), float("-inf"))
    out = torch.softmax(scores, dim=-1) @ v
    return out.transpose(1, 2).reshape(b, s, -1) @ wo.T


def _model(kind: str, **pe) -> Llama:
    torch.manual_seed(0)
    cfg = pe_config_class(kind)(kind=kind, **pe)
    return Llama(ModelArgs(vocab_size=16, dim=32, n_layers=1, n_heads=4, n_kv_heads=2, head_dim=8, ffn_hidden=16,
                           max_seq_len=32, pe=cfg)).double()


def _lab_layer(model: Llama, x: torch.Tensor) -> torch.Tensor:
    positions = torch.arange(x.shape[1])
    ctx = _Context(None, None, "dense", 0, positions[None], None, 0)
    return model.layers[0].attention(x, model.pe, model.pe.tables(positions, x.dtype, x.shape[1]), ctx)


@pytest.mark.parametrize("mode", ["ec", "eh"])
def test_rope_pp_equals_its_official_attention(mode):
    model = _model("rope_pp", mode=mode)
    a = model.layers[0].attention
    assert (a.wq.out_features, a.wk.out_features, a.wo.in_features) == \
        ((32, 16, 64) if mode == "ec" else (16, 8, 32))  # EC: 2 x 4 attention heads; EH: half the projections
    x = torch.randn(2, 19, 32, dtype=torch.float64)
    want = _official_layer(x, a.wq.weight, a.wk.weight, a.wv.weight, a.wo.weight, 8, imaginary=True)
    torch.testing.assert_close(_lab_layer(model, x), want, atol=1e-12, rtol=1e-12)


def test_rope_pp_without_its_imaginary_heads_is_rope():
    pp, rope = _model("rope_pp", mode="ec"), _model("rope")
    with torch.no_grad():
        for name in ("wq", "wk", "wv"):
            getattr(rope.layers[0].attention, name).weight.copy_(getattr(pp.layers[0].attention, name).weight)
        wo = pp.layers[0].attention.wo.weight.view(32, 4, 2, 8)  # (dim, query head, real | imaginary, d)
        wo[:, :, 1] = 0.0
        rope.layers[0].attention.wo.weight.copy_(wo[:, :, 0].reshape(32, 32))
    x = torch.randn(1, 23, 32, dtype=torch.float64)
    torch.testing.assert_close(_lab_layer(pp, x), _lab_layer(rope, x), atol=1e-12, rtol=1e-12)
    a = rope.layers[0].attention
    official_rope = _official_layer(x, a.wq.weight, a.wk.weight, a.wv.weight, a.wo.weight, 8, imaginary=False)
    torch.testing.assert_close(_lab_layer(rope, x), official_rope, atol=1e-12, rtol=1e-12)


def test_rope_pp_counts_its_parameters_and_refuses_what_it_cannot_halve(tiny_cfg):
    for mode in ("ec", "eh"):
        cfg = tiny_cfg("model.pe.kind=rope_pp", f"model.pe.mode={mode}", "model.n_heads=4", "model.n_kv_heads=2")
        assert param_count(cfg.model) == Llama(cfg.model).num_params()
    with pytest.raises(UserError, match=r"model\.pe\.mode='eh' halves the query and KV heads"):
        tiny_cfg("model.pe.kind=rope_pp", "model.pe.mode=eh")  # tiny: 2 heads, 1 KV head
    with pytest.raises(UserError, match=r"model\.pe\.mode='ex': choose one of ec, eh"):
        tiny_cfg("model.pe.kind=rope_pp", "model.pe.mode=ex")


@pytest.mark.parametrize("mode", ["ec", "eh"])
def test_rope_pp_trains_dumps_and_resumes_exactly(tiny_cfg, mode):
    from tests.test_train import FAST, Interrupt, StopAt
    from trainer.run.loop import train

    overrides = ["model.pe.kind=rope_pp", f"model.pe.mode={mode}", "model.n_heads=4", "model.n_kv_heads=2",
                 "train.steps=12", "train.ckpt_every=6", "dump.enabled=true", *FAST]
    whole = train(tiny_cfg(*overrides, out="whole"))
    assert whole.losses[-1] < whole.losses[0] and (whole.run_dir / "attention" / "attention.parquet").is_file()
    with pytest.raises(Interrupt):
        train(tiny_cfg(*overrides, out="cut"), StopAt(6))
    resumed = train(tiny_cfg(*overrides, out="cut"))
    assert resumed.resumed_from == 6 and resumed.losses == whole.losses
