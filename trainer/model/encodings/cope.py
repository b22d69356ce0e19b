"""CoPE (Golovneva et al. 2024): contextual positions counted by sigmoid gates, with interpolated embeddings."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from trainer.model.encodings.base import EncodingShape, PositionModule, causal_mask
from trainer.model.encodings.bias import bias_identity, int_problem, table_count
from trainer.model.encodings.kind import EncodingKind


@dataclass
class CoPEConfig:
    """CoPE as the official code's defaults: gates from q·k, npos position embeddings of head_dim channels shared
    by a layer's heads, one set per layer unless `shared`; npos 0 means max_seq_len + 1 (the official default)."""

    kind: str = "cope"
    npos: int = 0
    shared: bool = False


def cope_positions(qk: torch.Tensor, visible: torch.Tensor, npos: int) -> torch.Tensor:
    """Contextual position of each key for each query: p_ij = Σ_{t=j..i} σ(q_i·k_t/√d) over the visible keys,
    capped at npos - 1. qk holds the scaled logits q·k/√d (..., seq, kv_len); visible the causal mask."""
    gates = torch.sigmoid(qk) * visible
    return gates.flip(-1).cumsum(-1).flip(-1).clamp(max=npos - 1)


def interpolated(table: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """table (..., npos) read at fractional positions pos (..., kv_len): linear between ⌊p⌋ and ⌈p⌉."""
    low, high = pos.floor(), pos.ceil()
    weight = pos - low
    return table.gather(-1, high.long()) * weight + table.gather(-1, low.long()) * (1 - weight)


class CoPE(PositionModule):
    """logits_ij = (q_i·k_j + q_i·e[p_ij]) / √d with p_ij the contextual position (`cope_positions`) and q·e[p]
    interpolated between the integer positions' q·e; no q/k rotation. The positions need q and k, so this kind
    computes its logits and softmax itself (`own_attention`): (batch, heads, seq, kv_len) floats several times over
    per layer, no fused SDPA. Nothing reads absolute positions, so shifting every position changes nothing."""

    own_attention = True

    def __init__(self, npos: int, shared: bool, shape: EncodingShape) -> None:
        super().__init__()
        self.npos = int(npos) or shape.max_seq_len + 1
        self.shared = bool(shared)
        self.emb = nn.Parameter(torch.zeros(1 if shared else shape.n_layers, shape.head_dim, self.npos))

    def extra_repr(self) -> str:
        return f"npos={self.npos}, shared={self.shared}"

    def logits(self, q, k, past, layer=0, state=None):
        s, d = q.shape[-2], q.shape[-1]
        keys = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
        qf = q.float()
        qk = qf @ keys.float().transpose(-1, -2)
        visible = causal_mask(s, past, q.device)
        pos = cope_positions(qk / math.sqrt(d), visible, self.npos)
        at_integers = qf @ self.emb[0 if self.shared else layer].float()  # (batch, heads, seq, npos)
        out = (qk + interpolated(at_integers, pos)) / math.sqrt(d)
        return out.masked_fill(~visible, float("-inf"))  # float32: the softmax reads them unrounded


def _npos(pe: CoPEConfig, s: EncodingShape) -> int:
    return int(pe.npos) or s.max_seq_len + 1


NO_EXPORT = "its positions are counted by q·k gates inside the attention, which HF Llama's attention cannot express"

KIND = EncodingKind(
    "cope", CoPEConfig, lambda c, s: CoPE(c.npos, c.shared, s),
    lambda pe: bias_identity("cope", "CoPE", pe, default_shared=False),
    identity_keys=("shared",), is_rope=lambda row: False, no_export=NO_EXPORT, translation_invariant=True,
    problems=lambda pe, s: [p for p in [int_problem(pe.npos, "npos", 0, 64)] if p], tables=False,
    cost_keys=("npos",),
    params=lambda c, s: table_count(c, s.n_layers) * s.head_dim * _npos(c, s),
    # q·e for every integer position, per head and layer: 2·head_dim·npos FLOPs forward, three times that with
    # the backward (the gates' q·k is the attention's own product)
    flops=lambda c, s: 6.0 * s.head_dim * _npos(c, s) * s.n_heads * s.n_layers)
