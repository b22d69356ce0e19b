"""TAPE (Zhu, Wang, Cai, Lee, Li, Wang, ICML 2025, arXiv 2501.00712; VITA-Group/TAPE): position features that every
layer updates, as the official model (`models/llama/adape.py`, the `adape` configuration).

Each token carries, per head and channel pair j, a position feature z = (c, s) that starts as RoPE's
(cos ω_j t, sin ω_j t), ω_j = θ^(-2j/d). In every layer:

- q and k are turned by the layer's features as RoPE turns them by (cos, sin): (a, b) -> (a·c - b·s, b·c + a·s) on
  the half split (channels j, j + d/2), with |z| no longer 1 once the features have moved;
- the attention averages the features with its own weights beside the values, ẑ_i = Σ_j A_ij z_j, and the layer
  adds r_h·ẑ to z, r_h the sum of row h of a heads × heads matrix W_r (the official einsum 'bqnd,qe->bqnd' sums the
  matrix's second index away, so each head's features are scaled by one number rather than mixed across heads);
- the feed-forward output f gates a mix across heads: z += W_d (silu(W_x f) ⊙ W_u z), W_u (P × heads), W_x
  (P × dim), W_d (heads × P), one gate per token and channel p of P (`position_size`), shared by every pair j. The
  lab forms the heads × heads matrix W_d diag(silu(W_x f)) W_u per token and turns z by it: the same sum, without
  the P × d features per token the official einsums hold.

Every update is real-linear in z with coefficients that do not depend on positions, so shifting every position by
Δ turns every layer's features by ω_j Δ and the logits do not change: the encoding is equivariant, its scores
translation-invariant. W_u and W_r start at zero (the official `_init_weights`), so an untrained TAPE is RoPE.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from trainer.model.encodings.base import EncodingShape, PhaseTable, PositionModule, kv_group, rope_freqs
from trainer.model.encodings.bias import generator, int_problem, positive_problem
from trainer.model.encodings.kind import EncodingKind, identity_row, problems_of
from trainer.model.encodings.rotary import check_theta


@dataclass
class TAPEConfig:
    """TAPE with the official configuration (`config/adape.json`): RoPE's ladder at `theta` (the model's
    rope_theta, 10000 there), `position_size` P = 48 gate channels; W_x and W_d N(0, init_std) (the official
    initializer_range 0.02), W_u and W_r zero, from `seed`'s own generator."""

    kind: str = "tape"
    theta: float = 10000.0
    position_size: int = 48
    init_std: float = 0.02
    seed: int = 0


@dataclass
class PositionStream:
    """The position features of one forward pass, replaced layer by layer: their cos and sin parts (batch or 1,
    heads or 1, seq, d/2)."""

    cos: torch.Tensor
    sin: torch.Tensor


class TAPE(PositionModule):
    """`tables` starts the stream at RoPE's (cos, sin) of the positions; `rotate` turns q and k by the stream as it
    stands at the layer; the attention averages `stream_values` beside the values and hands the average back
    (`stream_attended`); the feed-forward output updates the stream (`stream_feed_forward`).

    Under grouped-query attention each query head turns its group's shared key by its own features, so keys and
    values leave `rotate` with one row per query head: the official layer (which asserts as many KV heads as heads)
    with each KV head's rows of W_k and W_v repeated for its query heads."""

    streams = True

    def __init__(self, pe: TAPEConfig, shape: EncodingShape) -> None:
        super().__init__()
        gen, std = generator(pe.seed), float(pe.init_std)
        layers, heads, size = shape.n_layers, shape.n_heads, int(pe.position_size)
        self.group = kv_group(shape.n_heads, shape.n_kv_heads)
        self.w_x = nn.Parameter(torch.randn(layers, size, shape.input_dim, generator=gen) * std)
        self.w_d = nn.Parameter(torch.randn(layers, heads, size, generator=gen) * std)
        self.w_u = nn.Parameter(torch.zeros(layers, size, heads))
        self.w_r = nn.Parameter(torch.zeros(layers, heads, heads))
        self.table = PhaseTable(rope_freqs(check_theta(pe.theta), shape.head_dim // 2), shape.max_seq_len)

    def extra_repr(self) -> str:
        return f"position_size={self.w_x.shape[1]}"

    def tables(self, positions, dtype, length=None):
        cos, sin = self.table.lookup(positions, dtype, length)
        return PositionStream(cos, sin)

    def rotate(self, q, k, tables, layer=0):
        k = k.repeat_interleave(self.group, dim=1) if self.group > 1 else k
        return _turn(q, tables.cos, tables.sin), _turn(k, tables.cos, tables.sin)

    def stream_values(self, tables: PositionStream, layer: int) -> torch.Tensor:
        return torch.cat((tables.cos, tables.sin), dim=-1)

    def stream_attended(self, tables: PositionStream, layer: int, attended: torch.Tensor) -> None:
        scale = self.w_r[layer].sum(dim=1).to(tables.cos.dtype)[:, None, None]  # r_h: row sums of W_r
        cos, sin = attended.to(tables.cos.dtype).chunk(2, dim=-1)
        tables.cos, tables.sin = tables.cos + scale * cos, tables.sin + scale * sin

    def stream_feed_forward(self, tables: PositionStream, layer: int, out: torch.Tensor) -> None:
        dtype = tables.cos.dtype
        gate = F.silu(F.linear(out.to(dtype), self.w_x[layer].to(dtype)))  # (batch, seq, P)
        # W_d diag(gate) W_u: one heads × heads matrix per token, so nothing P wide is kept per pair
        mix = torch.einsum("hp,bsp,pg->bshg", self.w_d[layer].to(dtype), gate, self.w_u[layer].to(dtype))
        heads = mix.shape[-1]
        tables.cos, tables.sin = (z + torch.einsum("bshg,bgsj->bhsj", mix, z.expand(-1, heads, -1, -1))
                                  for z in (tables.cos, tables.sin))


def _turn(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x's channel pairs (j, j + d/2) times the features (cos, sin) as complex numbers, in x's dtype: RoPE's turn,
    written on the halves so that its backward keeps nothing but x and the features (which need gradients here)."""
    a, b = x.to(cos.dtype).chunk(2, dim=-1)
    return torch.cat((a * cos - b * sin, b * cos + a * sin), dim=-1).to(x.dtype)


def _check(pe: TAPEConfig, s: EncodingShape) -> None:
    from hdrope.errors import UserError

    if s.head_dim % 2:
        raise UserError(f"head_dim={s.head_dim}: TAPE turns channel pairs as RoPE does; use an even head_dim")
    check_theta(pe.theta)


def _problems(pe: TAPEConfig, s: EncodingShape) -> list[str]:
    found = [int_problem(pe.position_size, "position_size", 1, 48), positive_problem(pe.init_std, "init_std", 0.02)]
    return [p for p in found if p] + problems_of("tape", lambda: _check(pe, s))


def _params(pe: TAPEConfig, s: EncodingShape) -> int:
    return s.n_layers * (pe.position_size * (s.input_dim + 2 * s.n_heads) + s.n_heads * s.n_heads)


NO_EXPORT = "its position features are updated in every layer from the content, a state HF Llama's rotary does not have"
WHOLE_MODEL = ("its position features flow from each layer to the next, so a layer of another kind would break the "
               "stream")

KIND = EncodingKind(
    "tape", TAPEConfig, TAPE,
    lambda pe: identity_row("tape", "TAPE", 2, "identity", None, pe.theta),
    identity_keys=(), is_rope=lambda row: False, no_export=NO_EXPORT, translation_invariant=True,
    problems=_problems, cost_keys=("position_size",), params=_params, whole_model=WHOLE_MODEL,
    # per token and layer, forward: W_x 2·P·dim, the heads × heads mix W_d diag(gate) W_u 2·P·heads², and its turn
    # of the d channels of cos and sin 2·heads²·d; three times that with the backward. The attention's d extra value
    # channels (6·heads·d·seq) are not counted.
    flops=lambda c, s: 6.0 * s.n_layers * (c.position_size * (s.input_dim + s.n_heads ** 2)
                                           + s.n_heads ** 2 * s.head_dim))
