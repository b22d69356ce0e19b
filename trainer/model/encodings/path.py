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
    transforms); no other position signal. The transforms depend on the tokens, so this kind computes its logits
    itself (`own_attention`): one rank-one update per key and query, O(seq · kv_len · d) per head, by chunks
    (`chunked_path_scores`) over a whole sequence and by one pass over the keys after a cached prefix. Its token
    state is each token's pre-convolution projection and β, so the KV cache can recompute the convolution across the
    cached prefix."""

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
        if past == 0 and kv > CHUNK:
            out = chunked_path_scores(q.to(dtype), keys, w, beta, CHUNK)
        else:
            out = path_scores(q.to(dtype), keys, w, beta, past)
        out = out * self.softmax_scale(q.shape[-1])
        return out.masked_fill(~causal_mask(s, past, q.device), float("-inf"))


CHUNK = 32  # positions per chunk of the chunked product: about √ of the compact lengths


def _reflect(x: torch.Tensor, w: torch.Tensor, beta: torch.Tensor) -> torch.Tensor:
    """H x = x - β (w·x) w for rows x (..., d), directions w (..., d) and β (...) broadcast against them."""
    return x - beta[..., None] * (x * w).sum(-1, keepdim=True) * w


def path_scores(q: torch.Tensor, keys: torch.Tensor, w: torch.Tensor, beta: torch.Tensor, past: int) -> torch.Tensor:
    """q_iᵀ H_i ⋯ H_{j+1} k_j (unscaled, unmasked; (batch, heads, seq, kv_len)) for queries at positions past..:
    one pass over the keys from the last back, each key's H_{j+1} applied to the queries it reaches first."""
    s, kv = q.shape[-2], keys.shape[-2]
    u, cols = q, []
    for j in range(kv - 1, -1, -1):
        t, first = j + 1, max(j + 1 - past, 0)  # H_t reaches the queries at positions >= t
        if t < kv and first < s:
            u = torch.cat([u[..., :first, :], _reflect(u[..., first:, :], w[..., t, None, :], beta[..., t, None])], -2)
        cols.append((u * keys[..., j, None, :]).sum(-1))
    return torch.stack(cols[::-1], dim=-1)


def chunked_path_scores(q: torch.Tensor, keys: torch.Tensor, w: torch.Tensor, beta: torch.Tensor,
                        chunk: int) -> torch.Tensor:
    """`path_scores` at past 0, by chunks of `chunk` positions: within a chunk the pass above (every chunk at once);
    across chunks each query, carried to its chunk's start, meets each earlier chunk's keys carried to their chunk's
    end through the d × d products of the chunks between. Python steps: about 3·chunk + seq/chunk, and the backward
    keeps seq/chunk copies of the queries, not seq."""
    seq = q.shape[-2]
    pad = -seq % chunk
    q, keys, w = (F.pad(x, (0, 0, 0, pad)) for x in (q, keys, w))
    beta = F.pad(beta, (0, pad))  # β 0: the padding's H is the identity
    n, d = (seq + pad) // chunk, q.shape[-1]
    q, keys, w = (x.unflatten(-2, (n, chunk)) for x in (q, keys, w))  # (..., n, chunk, d)
    beta = beta.unflatten(-1, (n, chunk))
    # within each chunk: the same pass, and each query carried on through its chunk's first H (q̃ = H_a ⋯ H_i q_i)
    u, cols = q, []
    for r in range(chunk - 1, -1, -1):
        if r + 1 < chunk:
            moved = _reflect(u[..., r + 1:, :], w[..., r + 1, None, :], beta[..., r + 1, None])
            u = torch.cat([u[..., :r + 1, :], moved], -2)
        cols.append((u * keys[..., r, None, :]).sum(-1))
    local = torch.stack(cols[::-1], dim=-1)  # (..., n, chunk, chunk)
    q_start = _reflect(u, w[..., :1, :], beta[..., :1])
    # each key carried to its chunk's end: k̃_j = H_e ⋯ H_{j+1} k_j
    k_end = keys
    for r in range(1, chunk):
        k_end = torch.cat([_reflect(k_end[..., :r, :], w[..., r, None, :], beta[..., r, None]), k_end[..., r:, :]], -2)
    # each chunk's product G_m = H_first ⋯ H_last as a d × d matrix
    g = torch.eye(d, dtype=q.dtype, device=q.device).expand(*q.shape[:-2], d, d)
    for r in range(chunk - 1, -1, -1):
        wr = w[..., r, :]
        g = g - beta[..., r, None, None] * wr[..., :, None] * (wr[..., None, :] @ g)
    out = torch.zeros(*q.shape[:-3], n, chunk, n, chunk, dtype=q.dtype, device=q.device)
    idx = torch.arange(n, device=q.device)
    out[..., idx, :, idx, :] = local.movedim(-3, 0)
    carried = q_start  # queries of chunk c carried down to the end of chunk c - Δ
    for delta in range(1, n):
        scores = carried[..., delta:, :, :] @ k_end[..., :n - delta, :, :].transpose(-1, -2)
        out[..., idx[delta:], :, idx[:n - delta], :] = scores.movedim(-3, 0)
        if delta + 1 < n:  # through chunk c - Δ's product, to the end of chunk c - Δ - 1
            between = g[..., 1:n - delta, :, :]  # chunk c - Δ for c = Δ + 1 .. n - 1
            carried = torch.cat([carried[..., :delta + 1, :, :],
                                 carried[..., delta + 1:, :, :] @ between.transpose(-1, -2)], -3)
    return out.flatten(-4, -3).flatten(-2, -1)[..., :seq, :seq]


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
