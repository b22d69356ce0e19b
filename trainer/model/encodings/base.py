"""What every position-encoding module provides, and the one cos/sin cache the rotary kinds share."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from trainer.model.attention.call import AttentionCall, Prepared, Tile, compute_dtype

__all__ = ["CosSinCache", "EncodingShape", "PhaseTable", "PositionModule", "compute_dtype", "kv_group",
           "positions_bound", "rope_freqs", "rotate_half", "rotate_pairs"]


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
    """Base of the encodings: `tables` once per forward pass, then per layer `rotate`, and what the kind's attention
    scores are for one tile of queries and keys, which every attention path (`trainer.model.attention`) composes.

    A kind overrides only what it needs. `tile_bias` adds a bias on the scaled logits q'·k'·scale: of positions
    (ALiBi, the bias kinds) or of content (FoX's gates, GRAPE-A), read from what `prepare` computed once per call.
    A kind whose scores are more than q·k plus a bias overrides `tile_scores` (DAPE mixes the heads, CoPE counts
    positions by gates, PaTH carries queries through Householder products), passing a carry from one tile to the
    next: the path gives a query block its tiles from its own keys back to the earliest. `normalised` False says
    the scores are already log-weights of a distribution (stick-breaking), and `self_weight` the weight the
    query's own value takes besides. `score_mod` is the same bias for FlexAttention. A data-dependent kind reads
    the attention input through `token_state`; the KV cache keeps that state beside the keys."""

    normalised = True  # False: tile_scores are log-weights already normalised over the keys (stick-breaking)
    carries = False  # True: a tile's scores need the carry of the tiles before it (CoPE, stick-breaking, PaTH)
    state_reach = 0  # earlier tokens a token's state reads (PaTH's convolution): a windowed KV cache keeps them
    widens = False  # True: q and k leave `rotate` wider than v (PoPE), which fused SDPA's flash kernel does not take
    # True: position features flow from layer to layer (TAPE): the attention averages `stream_values` beside the
    # values, so v is wider than q, and the layer's feed-forward output updates them
    streams = False

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

    def layer_view(self, tables: Any, layer: int) -> tuple[PositionModule, Any, int]:
        """The module that serves model layer `layer`, its tables (from `tables`) and the layer's index within it:
        this module, its tables and `layer`, except in a hybrid stack (`LayeredEncoding`), where each layer is its
        part's."""
        return self, tables, layer

    def token_state(self, x: torch.Tensor, layer: int = 0) -> torch.Tensor | None:
        """What the kind reads from the attention input x (batch, seq, dim) at `layer`: floats (batch, heads, seq, ...)
        per token that the KV cache keeps beside its key (FoX's log forget gates, PaTH's Householder directions), or
        None (a kind of positions alone)."""
        return None

    def stream_values(self, tables: Any, layer: int) -> torch.Tensor | None:
        """A streaming kind's features (batch or 1, heads or 1, seq, w) that the attention at `layer` averages with
        its weights beside the values; None for the other kinds."""
        return None

    def stream_attended(self, tables: Any, layer: int, attended: torch.Tensor) -> None:
        """Take the attention's average of `stream_values` (batch, heads, seq, w) at `layer` into the stream held
        in `tables`."""

    def stream_feed_forward(self, tables: Any, layer: int, out: torch.Tensor) -> None:
        """Take the feed-forward output (batch, seq, dim) of `layer` into the stream held in `tables`."""

    def softmax_scale(self, width: int) -> float:
        """The factor on q'·k' before the softmax, for transformed q/k of `width` channels: 1/√width (SDPA's
        default) unless the kind widens q and k (PoPE: 1/√head_dim)."""
        return width**-0.5

    def fold(self, layer: int) -> torch.Tensor | None:
        """The orthogonal B (KV heads or 1, d, d) with this transform = B·R(m)·Bᵀ at `layer`, R the kind's
        `hf_rotary`, so HF's W_q/W_k rows are Bᵀ·W (exact export); None: B = I (rope, hdrope)."""
        return None

    def prepare(self, call: AttentionCall, block: int) -> Prepared:
        """What this call's tiles read, computed once per call (with gradients) over its whole queries and keys; the
        tiled path cuts it into blocks of `block` tokens at token indices that are multiples of `block` (0: one
        tile holds every query and key)."""
        return Prepared()

    def tile_bias(self, t: Tile) -> torch.Tensor | None:
        """The additive bias (batch or 1, heads, queries, keys) on the tile's scaled logits, or None (a kind of q·k
        alone). Entries the mask hides are ignored."""
        return None

    def tile_scores(self, t: Tile, carry: Any = None) -> tuple[torch.Tensor, Any]:
        """The tile's scores (batch, heads, queries, keys) in the score dtype and the carry for the next tile
        (earlier keys): logits q'·k'·scale plus `tile_bias`, or, with `normalised` False, log-weights. Entries the
        mask hides are ignored (the path hides them)."""
        out = t.qk() * self.softmax_scale(t.q.shape[-1])
        bias = self.tile_bias(t)
        return (out if bias is None else out + bias.to(out.dtype)), carry

    def self_weight(self, carry: Any) -> torch.Tensor | None:
        """The weight (batch, heads, queries) each query's own value takes besides its tiles' weights, from the
        last carry (stick-breaking's leftover stick); None for a softmax."""
        return None

    def score_mod(self, call: AttentionCall, prep: Prepared) -> Callable | None:
        """FlexAttention's score_mod for this call (score, b, h, q_idx, kv_idx) -> score, the same logits as
        `tile_scores`; None for a kind of q·k alone."""
        return None

    @classmethod
    def fuses(cls) -> bool:
        """Whether q, k and v reach the attention equally wide, as fused SDPA's flash kernel takes them: not when the
        kind widens q and k (PoPE) or carries its stream beside v (TAPE)."""
        return not (cls.widens or cls.streams)

    @classmethod
    def scores_kind(cls) -> str:
        """What the kind's scores are: 'plain' (q·k), 'bias' (q·k plus `tile_bias`; 'flex-bias' when it also has a
        `score_mod`), or 'own' (its own `tile_scores`)."""
        if cls.tile_scores is not PositionModule.tile_scores:
            return "own"
        if cls.tile_bias is PositionModule.tile_bias:
            return "plain"
        return "flex-bias" if cls.score_mod is not PositionModule.score_mod else "bias"


def positions_bound(positions: torch.Tensor, length: int | None = None) -> int:
    """One past the largest position: `length` when the caller knows it, else read from the tensor (a sync)."""
    if length is not None:
        return int(length)
    return int(positions.max().item()) + 1 if positions.numel() else 1


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
