"""PaTH attention (Yang et al., NeurIPS 2025): positions as a cumulative product of data-dependent Householder-like
transforms between key and query, as the official layer (`fla/layers/path_attn.py`) without its optional forget
gate: q_iᵀ H_i ⋯ H_{j+1} k_j with H_t = I - β_t w_t w_tᵀ, w_t and β_t read from token t."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from trainer.model.attention.call import Prepared
from trainer.model.encodings.base import EncodingShape, PositionModule, compute_dtype
from trainer.model.encodings.bias import generator, int_problem, positive_problem
from trainer.model.encodings.kind import EncodingKind, identity_row

L2_EPS = 1e-6  # fla's l2_norm: x / sqrt(Σx² + eps)


@dataclass
class PaTHConfig:
    """PaTH with the official defaults: w from a rank-`w_rank` projection of the hidden state (32), a causal
    depthwise convolution of `conv_size` (3) with SiLU, and an L2 norm per head; β = 2σ(linear(x)) per KV head (in
    (0, 2): negative eigenvalues allowed). Weights N(0, init_std) (the official initializer_range 0.02), biases 0,
    from `seed`'s own generator."""

    kind: str = "path"
    w_rank: int = 32
    conv_size: int = 3
    init_std: float = 0.02
    seed: int = 0


class PaTH(PositionModule):
    """logits_ij = q_iᵀ H_i ⋯ H_{j+1} k_j / √d, H_t = I - β_t w_t w_tᵀ, per KV head (a group's query heads share its
    transforms); no other position signal. The transforms depend on the tokens, so this kind has its own scores,
    by the UT transform of the Householder products (`tile_scores`): within a tile one triangular solve gives every
    query's products over the tile's keys, and a query carried to its tile's start meets each earlier tile's keys,
    carried to that tile's end (`prepare`), through the tiles between, O(seq · kv_len · d) per head in all. Its token
    state is each token's pre-convolution projection and β, so the KV cache can recompute the convolution across the
    cached prefix (`state_reach` tokens back); the convolution restarts at each document."""

    carries = True

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
        self.state_reach = int(pe.conv_size) - 1

    def extra_repr(self) -> str:
        return f"w_rank={self.w_down.shape[1]}, conv_size={self.conv.shape[-1]}"

    def token_state(self, x, layer=0):
        b, s, _ = x.shape
        z = F.linear(F.linear(x, self.w_down[layer]), self.w_up[layer])  # (batch, seq, kv_dim), before the conv
        z = z.view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        logit = F.linear(x, self.beta_weight[layer], self.beta_bias[layer])
        beta = 2 * torch.sigmoid(logit.to(compute_dtype(logit.dtype)))  # float32, as the official code
        return torch.cat([z.to(beta.dtype), beta.transpose(1, 2).unsqueeze(-1)], dim=-1)  # (b, kv heads, s, d + 1)

    def directions(self, state: torch.Tensor, layer: int, segments: torch.Tensor | None = None
                   ) -> tuple[torch.Tensor, torch.Tensor]:
        """(w, β): unit directions (batch, kv_heads, kv_len, d) and β (batch, kv_heads, kv_len) of every cached token:
        the causal convolution (with SiLU) over the pre-convolution projections, restarting at each document of
        `segments` (batch, kv_len), then the L2 norm per head."""
        z, beta = state[..., :-1], state[..., -1]
        weight = self.conv[layer].to(z.dtype).view(self.kv_heads, self.head_dim, -1)  # channel (head, dim)
        w = F.silu(causal_conv(z, weight, segments))
        return w * torch.rsqrt((w * w).sum(-1, keepdim=True) + L2_EPS), beta

    def prepare(self, call, block):
        w, beta = self.directions(call.state.to(call.dtype), call.layer, call.mask.segments)
        keys = {"w": w, "beta": beta}
        if block:  # each key carried to its tile's end, and what carries a query through the tile
            keys["k_end"], keys["c"] = tile_ends(call.k.to(call.dtype), w, beta, call.mask.k_index, block)
        return Prepared(keys=keys)

    def tile_scores(self, t, carry=None):
        b, h, s, d = t.q.shape
        kvh = t.k.shape[1]
        w, beta = t.pk["w"], t.pk["beta"]
        if t.diagonal:  # the products within the tile, and each query carried to the tile's start
            own = t.mask.q_index + t.i0 - (t.mask.k_index + t.j0)  # the first query's own key in the tile
            q = t.q.to(t.dtype).view(b, kvh, h // kvh, s, d)
            scores, carry = within_tile(q, t.k.to(t.dtype), w, beta, own)
        else:  # a query carried to this tile's end meets its keys carried there, then moves on through the tile
            u = carry
            scores = u @ t.pk["k_end"][:, :, None].transpose(-1, -2)
            carry = u - ((u @ t.pk["c"][:, :, None].transpose(-1, -2)) * beta[:, :, None, None, :]) @ w[:, :, None]
        return scores.reshape(b, h, s, -1) * self.softmax_scale(d), carry


def causal_conv(z: torch.Tensor, weight: torch.Tensor, segments: torch.Tensor | None = None) -> torch.Tensor:
    """The depthwise causal convolution of z (batch, heads, seq, c) by weight (heads, c, taps), as fla's
    ShortConvolution without its activation: token t reads tokens t - taps + 1 .. t (tap taps - 1 on token t), none
    before its document's start in `segments` (batch, seq) and none before the first."""
    taps, n = weight.shape[-1], z.shape[-2]
    padded = F.pad(z, (0, 0, taps - 1, 0))
    mixed = torch.zeros_like(z)
    for i in range(taps):
        term = padded[..., i:i + n, :] * weight[None, :, None, :, i]
        back = taps - 1 - i  # how many tokens back this tap reads
        if segments is not None and back:
            same = torch.zeros_like(segments, dtype=torch.bool)
            same[:, back:] = segments[:, back:] == segments[:, :-back]
            term = term * same[:, None, :, None]
        mixed = mixed + term
    return mixed


def _strict_lower(x: torch.Tensor) -> torch.Tensor:
    return x.tril(diagonal=-1)


def within_tile(q: torch.Tensor, k: torch.Tensor, w: torch.Tensor, beta: torch.Tensor, own: int
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """q_iᵀ H_i ⋯ H_{j+1} k_j (unscaled; (batch, kv heads, group, queries, keys)) for queries q (batch, kv heads,
    group, queries, d) whose own keys are the tile's keys own.., over the tile's keys k, directions w and β (batch,
    kv heads, keys, ...), and each query carried to the tile's start, q_iᵀ H_i ⋯ H_first.

    With a_it = q_iᵀ H_i ⋯ H_{t+1} w_t for t <= i: a_it = q_i·w_t - Σ_{t<r<=i} a_ir β_r (w_r·w_t), so
    A (I + β U) = (q·w, t <= i), U the strictly lower w·w; then q_iᵀ H_i ⋯ H_{j+1} k_j = q_i·k_j - Σ_{j<t<=i}
    a_it β_t (w_t·k_j) and the carried query is q_i - Σ_{t<=i} a_it β_t w_t."""
    n, s = k.shape[-2], q.shape[-2]
    rows = torch.arange(own, own + s, device=q.device)[:, None]
    upto = torch.arange(n, device=q.device)[None, :] <= rows  # t <= i
    qw = (q @ w[:, :, None].transpose(-1, -2)) * upto
    eye = torch.eye(n, dtype=q.dtype, device=q.device)
    system = eye + beta[..., :, None] * _strict_lower(w @ w.transpose(-1, -2))  # I + β U, unit lower triangular
    a = torch.linalg.solve_triangular(system[:, :, None], qw, upper=False, left=False, unitriangular=True)
    ab = a * beta[:, :, None, None, :]
    scores = q @ k[:, :, None].transpose(-1, -2) - ab @ _strict_lower(w @ k.transpose(-1, -2))[:, :, None]
    return scores, q - ab @ w[:, :, None]


def tile_ends(k: torch.Tensor, w: torch.Tensor, beta: torch.Tensor, first: int, block: int
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """For tiles of `block` tokens at token indices that are multiples of it (the first key's index `first`): each
    key carried to its tile's end, H_e ⋯ H_{j+1} k_j, and c_t = H_e ⋯ H_{t+1} w_t, with which a row vector u moves
    through the tile as u - Σ_t β_t (u·c_t) w_t; both (batch, kv heads, keys, d).

    c solves (I + Uᵀ β) C = W (U the strictly lower w·w), and k̃_j = k_j - Σ_{t>j} (w_t·k_j) β_t c_t."""
    n = k.shape[-2]
    front = first % block
    back = -(front + n) % block
    k, w = (F.pad(x, (0, 0, front, back)) for x in (k, w))
    beta = F.pad(beta, (front, back))  # β 0: a padding token's H is the identity
    tiles = (front + n + back) // block
    k, w = (x.unflatten(-2, (tiles, block)) for x in (k, w))
    beta = beta.unflatten(-1, (tiles, block))
    eye = torch.eye(block, dtype=k.dtype, device=k.device)
    system = eye + _strict_lower(w @ w.transpose(-1, -2)).transpose(-1, -2) * beta[..., None, :]  # I + Uᵀ β
    c = torch.linalg.solve_triangular(system, w, upper=True, unitriangular=True)
    k_end = k - _strict_lower(w @ k.transpose(-1, -2)).transpose(-1, -2) @ (beta[..., None] * c)
    return (x.flatten(-3, -2)[..., front:front + n, :] for x in (k_end, c))


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
