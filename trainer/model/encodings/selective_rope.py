"""Selective RoPE (Movahedi, Carstensen et al., ICLR 2026, arXiv 2511.17388; timurcarstensen/selective-rope): RoPE
whose angles are read from the input, as the official `SelectiveRoPE` module (`modules/rotary.py`, its PyTorch path)
in its softmax-attention layer (`layers/attn.py`).

Per layer, token t's hidden state x_t is cut into n_heads chunks, each L2-normalised (fla's l2_norm), and projected
through a rank-r bottleneck to one angle increment per head and channel pair, z_t = W_up W_down x̂_t; a depthwise
causal convolution of `conv_size` taps (fla's ShortConvolution, no bias, no activation) mixes the increments of the
last tokens, φ_t = Σ_i c_i z_{t-i} (+ e^b with the optional bias); the phase is their cumulative sum, Φ_t = Σ_{s<=t}
φ_s, and pair j of q_t and k_t is turned by τ_j Φ_t,j, τ_j = temp_max · θ^(-2j/d) (RoPE's ladder as fixed
"temperatures"). The pairs are the half split (channels j, j + d/2), as the official rotation.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from trainer.model.attention.call import Prepared
from trainer.model.encodings.base import EncodingShape, PositionModule, rope_freqs, rotate_pairs
from trainer.model.encodings.bias import generator, int_problem, positive_problem
from trainer.model.encodings.kind import EncodingKind, identity_row, problems_of
from trainer.model.encodings.path import L2_EPS, causal_conv
from trainer.model.encodings.rotary import check_theta


@dataclass
class SelectiveRoPEConfig:
    """Selective RoPE with the official configuration its paper's synthetic tasks train (`configs/mad/model/
    position_embedding/selective_rope.yaml`): a low-rank projection of rank `rank` (32), a causal convolution of
    `conv_size` taps (4, the module's d_conv), temperatures RoPE's ladder at `theta` (500000) times `temp_max` (1),
    fixed; no phase gate; `bias` adds the official use_bias, e^b with b per head and pair (0 at the start: every
    increment 1 more, RoPE's positions). Weights N(0, init_std) (the official initializer_range 0.02, which the
    models' init gives the projections and the convolution), from `seed`'s own generator."""

    kind: str = "selective_rope"
    rank: int = 32
    conv_size: int = 4
    theta: float = 500000.0
    temp_max: float = 1.0
    bias: bool = False
    init_std: float = 0.02
    seed: int = 0


class SelectiveRoPE(PositionModule):
    """logits_ij = (R(τ Φ_i) q_i)·(R(τ Φ_j) k_j)/√d = q_i·R(τ (Φ_i − Φ_j)) k_j/√d, Φ the cumulative input-dependent
    increments, per KV head (a group's query heads share their KV head's phases; the official layer has no
    grouped-query attention). The token state is each token's increments before the convolution, so the KV cache
    recomputes the convolution over the cached prefix (`state_reach` tokens back) and the cumulative sum over the
    held keys (`prepare`): the scores read only Φ_i − Φ_j, which the sum's origin cannot change. The convolution
    restarts at each document (fla's, given cu_seqlens); the sum need not."""

    def __init__(self, pe: SelectiveRoPEConfig, shape: EncodingShape) -> None:
        super().__init__()
        gen, std = generator(pe.seed), float(pe.init_std)
        layers, rank = shape.n_layers, int(pe.rank)
        self.kv_heads, self.pairs, self.chunks = shape.n_kv_heads, shape.head_dim // 2, shape.n_heads
        channels = self.kv_heads * self.pairs

        def normal(*size: int) -> nn.Parameter:
            return nn.Parameter(torch.randn(layers, *size, generator=gen) * std)

        self.w_down, self.w_up = normal(rank, shape.input_dim), normal(channels, rank)
        self.conv = normal(channels, int(pe.conv_size))
        self.phase_bias = nn.Parameter(torch.zeros(layers, self.kv_heads, self.pairs)) if pe.bias else None
        temperature = float(pe.temp_max) * rope_freqs(check_theta(pe.theta), self.pairs)
        self.register_buffer("temperature", temperature, persistent=False)
        self.state_reach = int(pe.conv_size) - 1

    def extra_repr(self) -> str:
        return f"rank={self.w_down.shape[1]}, conv_size={self.conv.shape[-1]}, bias={self.phase_bias is not None}"

    def token_state(self, x, layer=0):
        b, s, _ = x.shape
        chunks = x.view(b, s, self.chunks, -1)
        unit = (chunks * torch.rsqrt((chunks * chunks).sum(-1, keepdim=True) + L2_EPS)).view(b, s, -1)
        z = F.linear(F.linear(unit, self.w_down[layer]), self.w_up[layer])  # (batch, seq, kv heads · pairs)
        return z.view(b, s, self.kv_heads, self.pairs).transpose(1, 2)

    def phases(self, state: torch.Tensor, layer: int, segments: torch.Tensor | None = None) -> torch.Tensor:
        """τ Φ (batch, kv_heads, keys, pairs): the angles of every held key, from their pre-convolution increments
        `state` (batch, kv_heads, keys, pairs), the convolution restarting at each document of `segments`."""
        weight = self.conv[layer].to(state.dtype).view(self.kv_heads, self.pairs, -1)
        phi = causal_conv(state, weight, segments)
        if self.phase_bias is not None:
            phi = phi + torch.exp(self.phase_bias[layer]).to(phi.dtype)[None, :, None, :]
        return torch.cumsum(phi, dim=-2) * self.temperature.to(phi.dtype)

    def prepare(self, call, block):
        angle = self.phases(call.state.to(call.dtype), call.layer, call.mask.segments)
        cos, sin = angle.cos(), angle.sin()
        s, group = call.q.shape[-2], call.group
        q_cos, q_sin = (x[..., -s:, :].repeat_interleave(group, dim=1) for x in (cos, sin))  # the last keys' phases
        q = rotate_pairs(call.q.to(call.dtype), q_cos, q_sin)
        return Prepared(queries={"q": q}, keys={"k": rotate_pairs(call.k.to(call.dtype), cos, sin)})

    def tile_scores(self, t, carry=None):
        rotated = dataclasses.replace(t, q=t.pq["q"], k=t.pk["k"])
        return rotated.qk() * self.softmax_scale(t.q.shape[-1]), carry


def _check(pe: SelectiveRoPEConfig, s: EncodingShape) -> None:
    from hdrope.errors import UserError

    if s.head_dim % 2:
        raise UserError(f"head_dim={s.head_dim}: Selective RoPE rotates channel pairs; use an even head_dim")
    if s.input_dim % s.n_heads:
        raise UserError(f"model.dim={s.input_dim}: Selective RoPE normalises the hidden state in model.n_heads="
                        f"{s.n_heads} equal chunks; use a model.dim divisible by model.n_heads")
    if not isinstance(pe.bias, bool):
        raise UserError(f"model.pe.bias={pe.bias!r}: must be true or false, e.g. false")
    check_theta(pe.theta)


def _problems(pe: SelectiveRoPEConfig, s: EncodingShape) -> list[str]:
    found = [int_problem(pe.rank, "rank", 1, 32), int_problem(pe.conv_size, "conv_size", 1, 4),
             positive_problem(pe.temp_max, "temp_max", 1.0), positive_problem(pe.init_std, "init_std", 0.02)]
    return [p for p in found if p] + problems_of("selective_rope", lambda: _check(pe, s))


def _channels(s: EncodingShape) -> int:
    return s.n_kv_heads * (s.head_dim // 2)


def _params(pe: SelectiveRoPEConfig, s: EncodingShape) -> int:
    c = _channels(s)
    return s.n_layers * (pe.rank * (s.input_dim + c) + c * pe.conv_size + (c if pe.bias else 0))


NO_EXPORT = "its rotation angles are read from each token's hidden state, which HF Llama's fixed rotary cannot express"

KIND = EncodingKind(
    "selective_rope", SelectiveRoPEConfig, SelectiveRoPE,
    lambda pe: identity_row("selective_rope", "Selective RoPE" + (" +bias" if pe.bias else ""), 2, "identity", None,
                            pe.theta),
    identity_keys=("bias",), is_rope=lambda row: False, no_export=NO_EXPORT, translation_invariant=True,
    problems=_problems, tables=False, cost_keys=("rank", "conv_size"), params=_params,
    # per token and layer: the rank-r projection 2·r·(dim + channels) and the convolution 2·taps·channels FLOPs
    # forward, three times that with the backward (the rotation is elementwise)
    flops=lambda c, s: 6.0 * s.n_layers * (c.rank * (s.input_dim + _channels(s)) + c.conv_size * _channels(s)))
