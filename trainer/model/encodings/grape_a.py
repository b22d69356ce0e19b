"""GRAPE-A (Zhang et al., ICLR 2026): additive GRAPE, as the official query-gated model
(`model/llama-mha-grape-a-querygated.py`, `QueryGatedAdditiveBias`): an ALiBi-like distance penalty whose slope
each query scales by a learned gate of its own content."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from trainer.model.attention.call import Prepared
from trainer.model.encodings.alibi import alibi_slopes
from trainer.model.encodings.base import EncodingShape, PositionModule
from trainer.model.encodings.bias import generator, positive_problem
from trainer.model.encodings.kind import EncodingKind, identity_row


@dataclass
class GrapeAConfig:
    """GRAPE-A query-gated with the official defaults: ω starts at `omega_init` (1: ALiBi's slopes), the gate
    direction v_h at N(0, 1/√head_dim) from `seed`'s own generator, normalised to unit length; one set per layer."""

    kind: str = "grape_a"
    omega_init: float = 1.0
    seed: int = 0


class GrapeA(PositionModule):
    """b_h(i, j) = -(i - j) · softplus(ω̃_h) · slope_h · softplus(v̂_h·q_i / √d), slope_h ALiBi's and v̂_h = v_h/‖v_h‖,
    added to the logits of query i (the gate once per call in `prepare`, the bias per tile in `tile_bias`). The
    gate reads the query after the model's projection: the official model normalises q first (its QK RMSNorm), the
    lab's backbone has no QK norm. Nothing reads absolute positions, so shifting every position changes nothing."""

    def __init__(self, omega_init: float, seed: int, shape: EncodingShape) -> None:
        super().__init__()
        start = math.log(math.expm1(max(float(omega_init), 1e-8)))  # softplus⁻¹, as the official init
        self.omega = nn.Parameter(torch.full((shape.n_layers, shape.n_heads), start))
        size = (shape.n_layers, shape.n_heads, shape.head_dim)
        self.v = nn.Parameter(torch.randn(size, generator=generator(seed)) / math.sqrt(shape.head_dim))
        self.register_buffer("slopes", alibi_slopes(shape.n_heads).float(), persistent=False)

    def extra_repr(self) -> str:
        return f"layers={self.omega.shape[0]}, heads={self.omega.shape[1]}"

    def prepare(self, call, block):
        dtype = call.dtype  # float32 as the official code; float64 for float64 q
        q, layer = call.q, call.layer
        v = F.normalize(self.v[layer].to(dtype), p=2, dim=-1, eps=1e-6)
        gate = F.softplus((q.to(dtype) * v[None, :, None, :]).sum(-1) / math.sqrt(q.shape[-1]))  # (b, h, queries)
        slope = F.softplus(self.omega[layer].to(dtype)) * self.slopes.to(dtype)  # (heads,)
        return Prepared(queries={"gate": gate}, other={"slope": slope})

    def tile_bias(self, t):
        return -t.distance() * t.other["slope"][:, None, None] * t.pq["gate"][..., None]

    def score_mod(self, call, prep):
        b = call.q.shape[0]
        query, key = call.q_pos.expand(b, -1), call.k_pos.expand(b, -1)
        gate, slope = prep.queries["gate"], prep.other["slope"]

        def mod(score, batch, head, q_idx, kv_idx):
            dist = (query[batch, q_idx] - key[batch, kv_idx]).clamp(min=0).to(gate.dtype)
            return score - (dist * slope[head] * gate[batch, head, q_idx]).to(score.dtype)

        return mod


NO_EXPORT = "its distance penalty is gated by each query's content, and HF Llama's attention takes no additive bias"

KIND = EncodingKind(
    "grape_a", GrapeAConfig, lambda c, s: GrapeA(c.omega_init, c.seed, s),
    lambda pe: identity_row("grape_a", "GRAPE-A", 0, "none", None, None),
    identity_keys=(), is_rope=lambda row: False, no_export=NO_EXPORT, translation_invariant=True,
    problems=lambda c, s: [p for p in [positive_problem(c.omega_init, "omega_init", 1.0)] if p], tables=False,
    params=lambda c, s: s.n_layers * s.n_heads * (s.head_dim + 1),
    # the gate's v·q per query and head, every layer: 2·head_dim FLOPs forward, three times that with the backward
    flops=lambda c, s: 6.0 * s.head_dim * s.n_heads * s.n_layers)
