"""What one layer's attention is asked (`AttentionCall`), which keys each query may see (`AttentionMask`), and one
tile of its scores (`Tile`): the vocabulary the attention paths and the encodings share.

Indices are token indices: the first query of a call sits at `q_index`, the first held key at `k_index` (a windowed
KV cache drops older keys), and the queries are the last keys (`k_index + keys == q_index + queries`). Query I sees
key J when J <= I (causal), I - J < window (when the layer has one) and both lie in the same document (when the
call has document segments). Positions, which the encodings read, are separate: they restart at each document when
the run says so, while the mask always works on token indices.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = ["AttentionCall", "AttentionMask", "Prepared", "Tile", "compute_dtype"]


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """float64 stays float64 (reference tests); everything else computes scores in float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


@dataclass
class AttentionMask:
    """Which keys each query sees: causal, within `window` tokens (0: no window), within its document.

    `segments` (batch, keys) holds each held key's document id, non-decreasing along a row; a query's id is its own
    key's (the queries are the last keys)."""

    q_index: int = 0
    k_index: int = 0
    window: int = 0
    segments: torch.Tensor | None = None
    _starts: torch.Tensor | None = field(default=None, repr=False)

    @property
    def plain(self) -> bool:
        """Causal alone: no window, no documents."""
        return self.window == 0 and self.segments is None

    def segment_starts(self) -> torch.Tensor:
        """(batch, keys) local index of the first held key of each key's document."""
        if self._starts is None:
            seg = self.segments
            n = seg.shape[-1]
            index = torch.arange(n, device=seg.device).expand_as(seg)
            new = torch.ones_like(seg, dtype=torch.bool)
            new[:, 1:] = seg[:, 1:] != seg[:, :-1]
            self._starts = torch.where(new, index, 0).cummax(dim=-1).values
        return self._starts

    def visible(self, i0: int, i1: int, j0: int, j1: int, device: torch.device) -> torch.Tensor | None:
        """(batch or 1, 1, i1 - i0, j1 - j0) bool, True where query i (local, i0 <= i < i1) sees key j (local,
        j0 <= j < j1); None when every pair is visible."""
        qi = torch.arange(self.q_index + i0, self.q_index + i1, device=device)[:, None]
        kj = torch.arange(self.k_index + j0, self.k_index + j1, device=device)[None, :]
        if qi.numel() and kj.numel() and (self.k_index + j1 - 1 <= self.q_index + i0) and (
                self.window == 0 or (self.q_index + i1 - 1) - (self.k_index + j0) < self.window) and (
                self.segments is None):
            return None
        vis = kj <= qi
        if self.window:
            vis = vis & (qi - kj < self.window)
        vis = vis[None, None]
        if self.segments is not None:
            offset = self.q_index - self.k_index
            seg_q = self.segments[:, offset + i0:offset + i1]
            vis = vis & (seg_q[:, None, :, None] == self.segments[:, None, None, j0:j1])
        return vis

    def first_keys(self, rows: list[int]) -> list[int]:
        """For each local query row, the smallest local key index any batch row's query there may see (one device
        read for all rows)."""
        offset = self.q_index - self.k_index
        lows = torch.tensor([max(0, offset + r - self.window + 1) if self.window else 0 for r in rows])
        if self.segments is not None and rows:
            starts = self.segment_starts()[:, [offset + r for r in rows]].amin(dim=0).cpu()
            lows = torch.maximum(lows, starts)
        return [int(x) for x in lows]


@dataclass
class AttentionCall:
    """One layer's attention in one forward pass: rotated queries (batch, heads, queries, d) and held keys and values
    (batch, kv_heads, keys, d), their positions ((batch or 1, queries) and (batch or 1, keys), int64), the mask, the
    keys' token state (`PositionModule.token_state`, (batch, state heads, keys, ...)) and the layer."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    q_pos: torch.Tensor
    k_pos: torch.Tensor
    mask: AttentionMask
    state: torch.Tensor | None = None
    layer: int = 0

    @property
    def group(self) -> int:
        """Query heads per KV head."""
        return self.q.shape[1] // self.k.shape[1]

    @property
    def dtype(self) -> torch.dtype:
        """The dtype scores are computed in."""
        return compute_dtype(self.q.dtype)

    def row(self, i: int) -> AttentionCall:
        """The call of batch row i alone."""
        def one(x: torch.Tensor | None) -> torch.Tensor | None:
            return None if x is None else x[i:i + 1] if x.shape[0] > 1 else x

        m = self.mask
        mask = AttentionMask(m.q_index, m.k_index, m.window, one(m.segments))
        return AttentionCall(one(self.q), one(self.k), one(self.v), one(self.q_pos), one(self.k_pos), mask,
                             one(self.state), self.layer)


@dataclass
class Prepared:
    """What an encoding computes once per call for its tiles: tensors with a query axis (`queries`, axis 2 over the
    call's queries), with a key axis (`keys`, axis 2 over the held keys), and anything else (`other`). The tiled path
    cuts the first two into its blocks and tiles."""

    queries: dict[str, torch.Tensor] = field(default_factory=dict)
    keys: dict[str, torch.Tensor] = field(default_factory=dict)
    other: dict[str, Any] = field(default_factory=dict)


@dataclass
class Tile:
    """Queries i0..i1-1 against keys j0..j1-1 of one call (local indices): their tensors, positions, the mask
    (None: all visible) and the prepared pieces of this tile (`pq` per query, `pk` per key, `other`).

    `k` is (batch, kv_heads, keys, d) and is shared by its group's query heads; `qk()` is q·kᵀ per query head
    without copying the keys."""

    q: torch.Tensor
    k: torch.Tensor
    q_pos: torch.Tensor
    k_pos: torch.Tensor
    i0: int
    j0: int
    visible: torch.Tensor | None
    layer: int
    pq: dict[str, torch.Tensor]
    pk: dict[str, torch.Tensor]
    other: dict[str, Any]
    mask: AttentionMask
    diagonal: bool = True  # holds the block's own keys: the first tile the path gives a query block

    @property
    def i1(self) -> int:
        return self.i0 + self.q.shape[-2]

    @property
    def j1(self) -> int:
        return self.j0 + self.k.shape[-2]

    @property
    def dtype(self) -> torch.dtype:
        return compute_dtype(self.q.dtype)

    def qk(self) -> torch.Tensor:
        """q·kᵀ (batch, heads, queries, keys) in the score dtype, grouped-query keys shared by their heads."""
        b, h, s, d = self.q.shape
        kvh = self.k.shape[1]
        q = self.q.to(self.dtype).view(b, kvh, h // kvh, s, d)
        out = q @ self.k.to(self.dtype)[:, :, None].transpose(-1, -2)
        return out.view(b, h, s, self.k.shape[-2])

    def keys_per_head(self) -> torch.Tensor:
        """k repeated to one key per query head (batch, heads, keys, d), in the score dtype."""
        return self.k.to(self.dtype).repeat_interleave(self.q.shape[1] // self.k.shape[1], dim=1)

    def earlier(self) -> torch.Tensor:
        """(batch or 1, 1, queries, keys) bool: visible and strictly before the query (J < I)."""
        qi = torch.arange(self.mask.q_index + self.i0, self.mask.q_index + self.i1, device=self.q.device)[:, None]
        kj = torch.arange(self.mask.k_index + self.j0, self.mask.k_index + self.j1, device=self.q.device)[None, :]
        strict = (kj < qi)[None, None]
        return strict if self.visible is None else strict & self.visible

    def distance(self) -> torch.Tensor:
        """max(m - n, 0) of the query and key positions (batch or 1, 1, queries, keys) in the score dtype."""
        return (self.q_pos[:, None, :, None] - self.k_pos[:, None, None, :]).clamp(min=0).to(self.dtype)
