"""PaTH attention (Yang et al., NeurIPS 2025): positions as a cumulative product of data-dependent Householder-like
transforms between key and query, as the official layer (`fla/layers/path_attn.py`) without its optional forget
gate: q_iᵀ H_i ⋯ H_{j+1} k_j with H_t = I - β_t w_t w_tᵀ, w_t and β_t read from token t."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from trainer.model.encodings.base import EncodingShape, PositionModule, causal_mask, compute_dtype, kv_group
from trainer.model.encodings.bias import generator, int_problem, positive_problem
from trainer.model.encodings.kind import EncodingKind, identity_row

L2_EPS = 1e-6  # fla's l2_norm: x / sqrt(Σx² + eps)


@dataclass
class PaTHConfig:
    """PaTH with the official defaults: w from a rank-`w_rank` projection of the hidden state (32), a causal depthwise
    convolution of `conv_size` (3) with SiLU, and an L2 norm per head; β = 2σ(linear(x)) per KV head (in (0, 2):
    negative eigenvalues allowed). Weights N(0, init_std) (the official initializer_range 0.02), biases 0, from
    `seed`'s own generator."""

    kind: str = "path"
    w_rank: int = 32
    conv_size: int = 3
    init_std: float = 0.02
    seed: int = 0


class PaTH(PositionModule):
    """logits_ij = q_iᵀ H_i ⋯ H_{j+1} k_j / √d, H_t = I - β_t w_t w_tᵀ, per KV head (a group's query heads share its
    transforms); no other position signal. The transforms depend on the tokens, so this kind computes its logits
    itself (`own_attention`): a loop over the keys from the last back, applying one rank-one update to every query
    per key, O(seq · kv_len · d) per head. Its token state is each token's pre-convolution projection and β, so the
    KV cache can recompute the convolution across the cached prefix."""

    own_attention = True

    def __init__(self, pe: PaTHConfig, shape: EncodingShape) -> None:
        super().__init__()
        gen, std = generator(pe.seed), float(pe.init_std)
        layers, kv_dim, rank = shape.n_layers, shape.n_kv_heads * shape.head_dim, int(pe.w_rank)

        def normal(*size: int) -> nn.Parameter:
            return nn.Parameter(torch.randn(layers, *size, generator=gen) * std)

        self.w_down, self.w_up = normal(rank, shape.input_dim), normal(kv_dim, rank)
        self.conv = normal(kv_dim, int(pe.conv_size))
        self.beta_weight = normal(shape.n_kv_heads, shape.input_dim)
        self.beta_bias = nn.Parameter(torch.zeros(layers, shape.n_kv_heads))
        self.kv_heads, self.head_dim = shape.n_kv_heads, shape.head_dim
        self.group = kv_group(shape.n_heads, shape.n_kv_heads)

    def extra_repr(self) -> str:
        return f"w_rank={self.w_down.shape[1]}, conv_size={self.conv.shape[-1]}"

    def token_state(self, x, layer=0):
        b, s, _ = x.shape
        z = F.linear(F.linear(x, self.w_down[layer]), self.w_up[layer])  # (batch, seq, kv_dim), before the conv
        z = z.view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        logit = F.linear(x, self.beta_weight[layer], self.beta_bias[layer])
        beta = 2 * torch.sigmoid(logit.to(compute_dtype(logit.dtype)))  # float32, as the official code
        return torch.cat([z.to(beta.dtype), beta.transpose(1, 2).unsqueeze(-1)], dim=-1)  # (b, kv heads, s, d + 1)

    def directions(self, state: torch.Tensor, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(w, β): unit directions (batch, kv_heads, kv_len, d) and β (batch, kv_heads, kv_len) of every cached token:
        the causal convolution (with SiLU) over the pre-convolution projections, then the L2 norm per head."""
        z, beta = state[..., :-1], state[..., -1]
        taps = self.conv.shape[-1]
        weight = self.conv[layer].to(z.dtype).view(self.kv_heads, self.head_dim, taps)  # channel (head, dim)
        padded = F.pad(z, (0, 0, taps - 1, 0))  # causal: token t reads tokens t - taps + 1 .. t
        mixed = sum(padded[..., i:i + z.shape[-2], :] * weight[None, :, None, :, i] for i in range(taps))
        w = F.silu(mixed)
        return w * torch.rsqrt((w * w).sum(-1, keepdim=True) + L2_EPS), beta

    def logits(self, q, k, past, layer=0, state=None):
        s, kv = q.shape[-2], k.shape[-2]
        dtype = compute_dtype(q.dtype)
        w, beta = self.directions(state.to(dtype), layer)
        w, beta = w.repeat_interleave(self.group, dim=1), beta.repeat_interleave(self.group, dim=1)
        keys = k.to(dtype).repeat_interleave(self.group, dim=1)
        u, cols = q.to(dtype), []
        for j in range(kv - 1, -1, -1):
            t = j + 1  # H_t reaches the queries at positions >= t, before they read key j
            first = max(t - past, 0)
            if t < kv and first < s:
                rows = u[..., first:, :]
                along = (rows * w[..., t, None, :]).sum(-1, keepdim=True)
                u = torch.cat([u[..., :first, :], rows - beta[..., t, None, None] * along * w[..., t, None, :]], -2)
            cols.append((u * keys[..., j, None, :]).sum(-1))
        out = torch.stack(cols[::-1], dim=-1) * self.softmax_scale(q.shape[-1])
        return out.masked_fill(~causal_mask(s, past, q.device), float("-inf"))


def _problems(pe: PaTHConfig, s: EncodingShape) -> list[str]:
    found = [int_problem(pe.w_rank, "w_rank", 1, 32), int_problem(pe.conv_size, "conv_size", 1, 3),
             positive_problem(pe.init_std, "init_std", 0.02)]
    return [p for p in found if p]


def _params(pe: PaTHConfig, s: EncodingShape) -> int:
    kv_dim = s.n_kv_heads * s.head_dim
    per_layer = pe.w_rank * (s.input_dim + kv_dim) + kv_dim * pe.conv_size + s.n_kv_heads * (s.input_dim + 1)
    return s.n_layers * per_layer


NO_EXPORT = "its Householder transforms are read from each token's hidden state, which HF Llama cannot express"

KIND = EncodingKind(
    "path", PaTHConfig, PaTH, lambda pe: identity_row("path", "PaTH", 0, "none", None, None),
    identity_keys=(), is_rope=lambda row: False, no_export=NO_EXPORT, translation_invariant=True,
    problems=_problems, tables=False, cost_keys=("w_rank", "conv_size"), params=_params,
    # per token and layer: the w projection 2·r·(dim + kv_dim) and β 2·kv_heads·dim FLOPs forward, three times that
    # with the backward (the per-key rank-one updates are the attention's own cost)
    flops=lambda c, s: 6.0 * s.n_layers * (c.w_rank * (s.input_dim + s.n_kv_heads * s.head_dim)
                                           + s.n_kv_heads * s.input_dim))
