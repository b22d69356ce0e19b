"""What every position-encoding module provides, and the one cos/sin cache the rotary kinds share."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class EncodingShape:
    """The model dimensions an encoding is built for."""

    head_dim: int
    n_heads: int
    n_kv_heads: int
    n_layers: int
    max_seq_len: int
    model_dim: int = 0  # the attention input's width (ModelArgs.dim); 0: n_heads * head_dim

    @property
    def input_dim(self) -> int:
        """The width of the hidden state the attention reads (what a data-dependent kind projects from)."""
        return self.model_dim or self.n_heads * self.head_dim


class PositionModule(nn.Module):
    """Base of the encodings: `tables` once per forward pass, then per layer `rotate` and `attend`.

    `attend` is the layer's causal attention: PyTorch's fused SDPA, with the kind's `score_bias` (if any) merged
    with the causal mask into one additive float mask. A kind whose logits depend on q and k beyond q·k (CoPE)
    overrides `logits` and sets `own_attention`, and `attend` then applies its `weights` (the softmax of those
    logits unless the kind says otherwise: stick-breaking) itself. A data-dependent kind (FoX) reads the attention
    input through `token_state`; the KV cache keeps that state beside the keys, and `logits`, `weights` and
    `attend` take it. `logits` and `weights` are the one definition of what the attention sees and does, which the
    attention dump reads for every kind."""

    own_attention = False  # True: attention is this module's explicit weights over its logits, not fused SDPA

    def tables(self, positions: torch.Tensor, dtype: torch.dtype, length: int | None = None) -> Any:
        """Whatever `rotate` needs for these positions ((seq,) or (batch, seq)), computed once per forward.

        `length`, when the caller knows it, bounds the positions (all < length), so a cached table need
        not read the tensor to see whether it must grow (no device sync on a GPU)."""
        return None

    def rotate(
        self, q: torch.Tensor, k: torch.Tensor, tables: Any, layer: int = 0
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """q (batch, heads, seq, d) and k (batch, kv_heads, seq, d) after the encoding's transform at `layer`."""
        return q, k

    def token_state(self, x: torch.Tensor, layer: int = 0) -> torch.Tensor | None:
        """What the kind reads from the attention input x (batch, seq, dim) at `layer`: floats (batch, heads, seq, ...)
        per token that the KV cache keeps beside its key (FoX's log forget gates, PaTH's Householder directions), or
        None (a kind of positions alone)."""
        return None

    def score_bias(self, q_positions: torch.Tensor, kv_len: int, layer: int = 0) -> torch.Tensor | None:
        """Additive float bias (heads, seq, kv_len) on the scaled attention logits of queries at q_positions (seq,)
        over keys 0..kv_len-1 at `layer`, or None (most kinds)."""
        return None

    def content_bias(self, q: torch.Tensor, past: int, layer: int = 0,
                     state: torch.Tensor | None = None) -> torch.Tensor | None:
        """Additive float bias (batch, heads, seq, past + seq) that depends on the content, of queries q (batch,
        heads, seq, d) at positions past.. over keys 0.., from q itself (GRAPE-A) or the keys' token state (FoX);
        None (most kinds). Its entries above the causal diagonal are ignored."""
        return None

    def softmax_scale(self, width: int) -> float:
        """The factor on q'·k' before the softmax, for transformed q/k of `width` channels: 1/√width (SDPA's
        default) unless the kind widens q and k (PoPE: 1/√head_dim)."""
        return width**-0.5

    def fold(self, layer: int) -> torch.Tensor | None:
        """The orthogonal B (KV heads or 1, d, d) with this transform = B·R(m)·Bᵀ at `layer`, R the kind's
        `hf_rotary`, so HF's W_q/W_k rows are Bᵀ·W (exact export); None: B = I (rope, hdrope)."""
        return None

    def logits(self, q: torch.Tensor, k: torch.Tensor, past: int, layer: int = 0,
               state: torch.Tensor | None = None) -> torch.Tensor:
        """The attention logits (batch, heads, seq, past + seq) the softmax sees, -inf where the causal mask hides a
        key: q·k times `softmax_scale` plus the score bias. q (batch, heads, seq, d) sits at positions past..,
        k (batch, kv_heads, past + seq, d) at 0.. (grouped-query keys are shared by their query heads); state, the
        keys' `token_state` (batch, heads, past + seq, ...) where the kind has one."""
        s, kv = q.shape[-2], k.shape[-2]
        keys = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
        out = q @ keys.transpose(-1, -2) * self.softmax_scale(q.shape[-1])
        bias = self.score_bias(torch.arange(past, kv, device=q.device), kv, layer)
        if bias is not None:
            out = out + bias.to(out.dtype)
        extra = self.content_bias(q, past, layer, state)
        if extra is not None:
            out = out + extra.to(out.dtype)
        return out.masked_fill(~causal_mask(s, past, q.device), float("-inf"))

    def bias_key(self, layer: int) -> int:
        """Layers with the same key see the same score bias: within one forward pass its mask is built once for
        all of them (a bias shared by every layer, or a parameter-free one, answers 0)."""
        return layer

    def weights(self, q: torch.Tensor, k: torch.Tensor, past: int, layer: int = 0,
                state: torch.Tensor | None = None) -> torch.Tensor:
        """The attention weights (batch, heads, seq, past + seq), float32 (float64 for float64 q), each row summing
        to 1: the softmax of `logits` (arguments as there) unless the kind attends otherwise."""
        logits = self.logits(q, k, past, layer, state)
        return torch.softmax(logits.to(compute_dtype(q.dtype)), dim=-1)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, past: int, layer: int = 0,
               masks: dict | None = None, state: torch.Tensor | None = None) -> torch.Tensor:
        """Causal attention output (batch, heads, seq, d) of queries at positions past.. over keys and values at
        0..past+seq-1 (k, v with kv_heads heads): fused SDPA (the bias as a float mask) unless `own_attention`.
        `masks`, one dict per forward pass, keeps the bias masks built in it for the layers after; state is the
        keys' `token_state` where the kind has one."""
        s, gqa, scale = q.shape[-2], k.shape[1] != q.shape[1], self.softmax_scale(q.shape[-1])
        if self.own_attention:
            probs = self.weights(q, k, past, layer, state).to(v.dtype)
            return probs @ v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)
        mask = self._bias_mask(s, past, layer, q.dtype, q.device, masks)
        extra = self.content_bias(q, past, layer, state)
        if extra is not None:  # a bias of the content (one per batch row) joins the causal mask and any score bias
            causal = causal_mask(s, past, q.device)
            mask = extra.to(q.dtype).masked_fill(~causal, float("-inf")) if mask is None else extra.to(q.dtype) + mask
        if mask is not None:  # attention-bias encodings: causal mask and bias as one float mask
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa, scale=scale)
        if past == 0:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa, scale=scale)
        # queries sit at the end of the keys: causal mask aligned bottom-right
        return F.scaled_dot_product_attention(q, k, v, attn_mask=causal_mask(s, past, q.device), enable_gqa=gqa,
                                              scale=scale)

    def _bias_mask(self, s: int, past: int, layer: int, dtype: torch.dtype, device: torch.device,
                   masks: dict | None) -> torch.Tensor | None:
        """The score bias with the causal mask as one additive float mask, or None for a kind without a bias."""
        key = ("bias", self.bias_key(layer), s, past, dtype)
        if masks is not None and key in masks:
            return masks[key]
        bias = self.score_bias(torch.arange(past, past + s, device=device), past + s, layer)
        mask = None if bias is None else bias.to(dtype).masked_fill(~causal_mask(s, past, device), float("-inf"))
        if masks is not None:
            masks[key] = mask
        return mask


def causal_mask(seq: int, past: int, device: torch.device | str | None = None) -> torch.Tensor:
    """(seq, past + seq) bool, True where query past + i may see key j (j <= past + i): bottom-right aligned."""
    return torch.ones(seq, past + seq, dtype=torch.bool, device=device).tril(diagonal=past)


def positions_bound(positions: torch.Tensor, length: int | None = None) -> int:
    """One past the largest position: `length` when the caller knows it, else read from the tensor (a sync)."""
    if length is not None:
        return int(length)
    return int(positions.max().item()) + 1 if positions.numel() else 1


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """float64 stays float64 (reference tests); everything else computes phases' cos/sin in float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


class CosSinCache(nn.Module):
    """cos/sin rows per position, cached as non-persistent float32 buffers up to the longest position seen.

    The cache holds positions 0..L-1 (L a power of two, at least min_len); float64 requests, and requests for
    which `fresh` says so, are computed afresh. Subclasses say what a row is (`compute`).
    """

    def __init__(self, width: int, min_len: int, prefill: bool = True) -> None:
        super().__init__()
        self.register_buffer("cos", torch.empty(0, width), persistent=False)
        self.register_buffer("sin", torch.empty(0, width), persistent=False)
        self.min_len = int(min_len)
        if prefill:  # the train length is cached at construction; longer inputs extend it
            self._extend(self.min_len)

    def extra_repr(self) -> str:
        return f"cached_len={self.cos.shape[0]}"

    def compute(self, pos: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """(cos, sin) of shape (batch, seq, width) for integer positions (batch, seq), in float64 for a float64
        dtype, else float32 (or what the row's own computation gives for dtype)."""
        raise NotImplementedError

    def fresh(self, dtype: torch.dtype) -> bool:
        """Whether a request in dtype is computed afresh rather than read from the cache."""
        return compute_dtype(dtype) == torch.float64

    def _extend(self, needed: int) -> None:
        length = max(self.min_len, 1 << max(needed - 1, 0).bit_length())
        cos, sin = self.compute(torch.arange(length, device=self.cos.device).unsqueeze(0), torch.float32)
        self.cos, self.sin = cos[0], sin[0]

    def lookup(self, positions: torch.Tensor, dtype: torch.dtype,
               length: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(cos, sin) of shape (1 or batch, 1, seq, width) for integer positions (all < length if given)."""
        pos = positions if positions.dim() == 2 else positions.unsqueeze(0)
        if self.fresh(dtype):
            cos, sin = self.compute(pos, dtype)
            return cos.unsqueeze(1), sin.unsqueeze(1)
        needed = positions_bound(pos, length)
        if needed > self.cos.shape[0]:
            self._extend(needed)
        pos = pos.to(self.cos.device)
        return self.cos[pos].unsqueeze(1), self.sin[pos].unsqueeze(1)


class PhaseTable(CosSinCache):
    """cos/sin of position × frequency: phases formed in float64, cached in float32."""

    def __init__(self, freqs: torch.Tensor, min_len: int, prefill: bool = True) -> None:
        super().__init__(freqs.numel(), min_len, prefill=False)
        self.register_buffer("freqs", freqs.to(torch.float64), persistent=False)
        if prefill:
            self._extend(self.min_len)

    def extra_repr(self) -> str:
        return f"n_freqs={self.freqs.numel()}, {super().extra_repr()}"

    def angles(self, pos: torch.Tensor) -> torch.Tensor:
        """Phases (..., n_freqs) in float64 for float64 positions: position × frequency."""
        return pos.unsqueeze(-1) * self.freqs.to(pos.device)

    def compute(self, pos, dtype):
        ang = self.angles(pos.to(torch.float64))
        return torch.cos(ang).to(compute_dtype(dtype)), torch.sin(ang).to(compute_dtype(dtype))


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """NeoX half split: (x1, x2) -> (-x2, x1) along the last dim."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def rotate_pairs(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate channel pairs (j, j + d/2) of x by angles with the given cos/sin (width d/2); keeps x's dtype."""
    xc = x.to(cos.dtype)
    full_cos, full_sin = torch.cat((cos, cos), dim=-1), torch.cat((sin, sin), dim=-1)
    return (xc * full_cos + rotate_half(xc) * full_sin).to(x.dtype)


def rope_freqs(theta: float, n_pairs: int) -> torch.Tensor:
    """RoPE inverse frequencies θ^(-2i/(2·n_pairs)), i = 0..n_pairs-1, in float64."""
    return float(theta) ** (-torch.arange(n_pairs, dtype=torch.float64) * 2 / (2 * n_pairs))


def kv_group(n_heads: int, n_kv_heads: int) -> int:
    """How many query heads share one KV head (grouped-query attention)."""
    return n_heads // n_kv_heads
