"""RoPE-Mixed (Heo et al., ECCV 2024, arXiv 2403.13298): RoPE with learned frequencies per layer and head, as the
official code (naver-ai/rope-vit, `compute_mixed_cis`) on one axis."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from trainer.model.encodings.base import (
    EncodingShape,
    PositionModule,
    compute_dtype,
    kv_group,
    rope_freqs,
    rotate_pairs,
)
from trainer.model.encodings.kind import EncodingKind, identity_row, problems_of
from trainer.model.encodings.rotary import check_theta


@dataclass
class RoPEMixedConfig:
    """RoPE-Mixed on a sequence: every layer and KV head learns its own d/2 frequencies, initialised at RoPE's."""

    kind: str = "rope_mixed"
    theta: float = 10000.0


class RoPEMixed(PositionModule):
    """Pair i of KV head h in layer l turns by m·f[l, h, i] (pairs i, i + d/2), f learned, from θ^(-2i/d).

    The official 2-D angle t_x·f_x + t_y·f_y with one axis is m·f; its per-head random direction has no
    1-D meaning, so each head starts at RoPE (the axial frequencies with the direction on the axis). Phases
    in float32 as the official code (float64 for float64 inputs); exactly RoPE at initialisation."""

    def __init__(self, pe: RoPEMixedConfig, s: EncodingShape) -> None:
        super().__init__()
        base = rope_freqs(check_theta(pe.theta), s.head_dim // 2).float()
        self.freqs = nn.Parameter(base.expand(s.n_layers, s.n_kv_heads, -1).clone())
        self.group = kv_group(s.n_heads, s.n_kv_heads)

    def tables(self, positions, dtype, length=None):
        pos = positions if positions.dim() == 2 else positions.unsqueeze(0)
        return pos.to(compute_dtype(dtype))

    def rotate(self, q, k, tables, layer=0):
        f = self.freqs[layer].to(tables.dtype)  # (KV heads, d/2)
        angles = tables.to(f.device)[:, None, :, None] * f[None, :, None, :]  # (batch, KV heads, seq, d/2)
        cos, sin = torch.cos(angles), torch.sin(angles)
        cq, sq = cos.repeat_interleave(self.group, dim=1), sin.repeat_interleave(self.group, dim=1)
        return rotate_pairs(q, cq, sq), rotate_pairs(k, cos, sin)


KIND = EncodingKind(
    "rope_mixed", RoPEMixedConfig, RoPEMixed,
    lambda pe: identity_row("rope_mixed", "RoPE-Mixed", 2, "learned-freqs", None, pe.theta), identity_keys=(),
    is_rope=lambda row: False,
    no_export=("its frequencies are learned per layer and head, while HF Llama has one inv_freq list for every "
                   "layer and head"),
    translation_invariant=True,
    problems=lambda c, s: problems_of("rope_mixed", lambda: check_theta(c.theta)),
    params=lambda c, s: s.n_layers * s.n_kv_heads * (s.head_dim // 2))
