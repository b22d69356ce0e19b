"""MLA's decoupled RoPE (DeepSeek-V2/V3: `qk_rope_head_dim`, one rotated key part shared by the heads) is partial
RoPE whose rotated key channels are projected once for all heads (issue 46 §3): a constraint on W_k, not another
encoding, so the lab adds no kind for it. The reference below is re-typed from the papers' equations, DeepSeek's
layout included: each head is [no-RoPE part, RoPE part], the RoPE part rotated in interleaved pairs (2i, 2i+1) at
θ^(-2i/r)."""

from __future__ import annotations

import torch

from trainer.model.llama import Llama, ModelArgs
from trainer.model.position import pe_config_class

HEADS, HEAD_DIM, ROPE_DIM, DIM, THETA = 4, 16, 8, 64, 10000.0


def _interleaved_rope(x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """DeepSeek's rotary on the last dim of x (..., seq, r): pairs (2i, 2i+1) turned by position·θ^(-2i/r)."""
    r = x.shape[-1]
    freqs = THETA ** (-torch.arange(0, r, 2, dtype=torch.float64) / r)
    angle = positions[:, None].double() * freqs
    pairs = torch.view_as_complex(x.reshape(*x.shape[:-1], r // 2, 2).contiguous())
    return torch.view_as_real(pairs * torch.polar(torch.ones_like(angle), angle)).flatten(-2)


def test_mla_decoupled_rope_is_partial_rope_with_its_rotated_key_rows_shared_by_the_heads():
    torch.manual_seed(0)
    # MLA's position-carrying projections: per head W^QR (r x dim) and W^UQ (nope x dim), per head W^UK, one W^KR
    w_qr, w_qc = torch.randn(HEADS, ROPE_DIM, DIM).double(), torch.randn(HEADS, HEAD_DIM - ROPE_DIM, DIM).double()
    w_kc, w_kr = torch.randn(HEADS, HEAD_DIM - ROPE_DIM, DIM).double(), torch.randn(ROPE_DIM, DIM).double()
    x = torch.randn(1, 11, DIM).double()
    positions = torch.arange(11)
    q_r = _interleaved_rope(torch.einsum("hrd,bsd->bhsr", w_qr, x), positions)
    k_r = _interleaved_rope(torch.einsum("rd,bsd->bsr", w_kr, x), positions)[:, None]  # one for every head
    q_c, k_c = torch.einsum("hcd,bsd->bhsc", w_qc, x), torch.einsum("hcd,bsd->bhsc", w_kc, x)
    mla = q_c @ k_c.mT + q_r @ k_r.mT

    # the lab's partial RoPE rotates the first r channels in half-split pairs (j, j + r/2): pair i of the interleaved
    # layout, channels (2i, 2i+1), is its channels (i, i + r/2)
    half = torch.cat([torch.arange(0, ROPE_DIM, 2), torch.arange(1, ROPE_DIM, 2)])
    wq = torch.cat([w_qr[:, half], w_qc], dim=1).reshape(HEADS * HEAD_DIM, DIM)
    wk = torch.cat([w_kr[half].expand(HEADS, -1, -1), w_kc], dim=1).reshape(HEADS * HEAD_DIM, DIM)
    pe = pe_config_class("partial_rope")(kind="partial_rope", theta=THETA, fraction=ROPE_DIM / HEAD_DIM)
    model = Llama(ModelArgs(vocab_size=8, dim=DIM, n_layers=1, n_heads=HEADS, n_kv_heads=HEADS, head_dim=HEAD_DIM,
                            ffn_hidden=8, max_seq_len=16, pe=pe)).double()
    attention = model.layers[0].attention
    with torch.no_grad():
        attention.wq.weight.copy_(wq)
        attention.wk.weight.copy_(wk)
        q = attention.wq(x).view(1, 11, HEADS, HEAD_DIM).transpose(1, 2)
        k = attention.wk(x).view(1, 11, HEADS, HEAD_DIM).transpose(1, 2)
        q, k = model.pe.rotate(q, k, model.pe.tables(positions, torch.float64, 11))
    torch.testing.assert_close(q @ k.mT, mla, atol=1e-9, rtol=1e-9)

    # and the sharing is what makes it MLA: with per-head rotated key rows the scores are another model's
    wk_free = wk.clone()
    wk_free[HEAD_DIM: HEAD_DIM + ROPE_DIM] += 0.5
    with torch.no_grad():
        attention.wk.weight.copy_(wk_free)
        k_free = attention.wk(x).view(1, 11, HEADS, HEAD_DIM).transpose(1, 2)
        q2, k2 = model.pe.rotate(attention.wq(x).view(1, 11, HEADS, HEAD_DIM).transpose(1, 2), k_free,
                                 model.pe.tables(positions, torch.float64, 11))
    assert not torch.allclose(q2 @ k2.mT, mla, atol=1e-3)
