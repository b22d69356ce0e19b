"""CoPE (Golovneva et al. 2024): contextual positions counted by sigmoid gates, with interpolated embeddings."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from trainer.model.encodings.base import EncodingShape, PositionModule
from trainer.model.encodings.bias import bias_identity, int_problem, table_count
from trainer.model.encodings.kind import EncodingKind


@dataclass
class CoPEConfig:
    """CoPE as the official code's defaults: gates from q·k, npos position embeddings of head_dim channels shared
    by a layer's heads, one set per layer unless `shared`; npos 0 means max_seq_len + 1 (the official default)."""

    kind: str = "cope"
    npos: int = 0
    shared: bool = False


def interpolated(table: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """table (..., npos) read at fractional positions pos (..., kv_len): linear between ⌊p⌋ and ⌈p⌉."""
    low, high = pos.floor(), pos.ceil()
    weight = pos - low
    return table.gather(-1, high.long()) * weight + table.gather(-1, low.long()) * (1 - weight)


class CoPE(PositionModule):
    """logits_ij = (q_i·k_j + q_i·e[p_ij]) / √d with p_ij = Σ_{t=j..i} σ(q_i·k_t/√d) over the visible keys, capped at
    npos - 1 (the contextual position), and q·e[p] interpolated between the integer positions' q·e; no q/k rotation.
    Tiles come from the query back, so a tile's carry is the gate sum of its later keys (and the query block's q·e).
    Nothing reads absolute positions, so shifting every position changes nothing."""

    carries = True

    def __init__(self, npos: int, shared: bool, shape: EncodingShape) -> None:
        super().__init__()
        self.npos = int(npos) or shape.max_seq_len + 1
        self.shared = bool(shared)
        self.emb = nn.Parameter(torch.zeros(1 if shared else shape.n_layers, shape.head_dim, self.npos))

    def extra_repr(self) -> str:
        return f"npos={self.npos}, shared={self.shared}"

    def tile_scores(self, t, carry=None):
        scale = 1 / math.sqrt(t.q.shape[-1])
        qk = t.qk()
        gates = torch.sigmoid(qk * scale)
        if t.visible is not None:
            gates = gates * t.visible
        later, at_integers = carry if carry is not None else (None, None)
        if at_integers is None:  # q·e at every integer position, once per query block
            at_integers = t.q.to(t.dtype) @ self.emb[0 if self.shared else t.layer].to(t.dtype)
        counted = gates.flip(-1).cumsum(-1).flip(-1)
        total = gates.sum(-1, keepdim=True)
        if later is not None:
            counted, total = counted + later, total + later
        pos = counted.clamp(max=self.npos - 1)
        return (qk + interpolated(at_integers, pos)) * scale, (total, at_integers)


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
