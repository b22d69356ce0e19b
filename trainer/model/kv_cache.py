"""The KV cache of incremental decoding: each layer's rotated keys, values and token state, and, for every token
seen, its position and document; a layer with a sliding window keeps only the keys its next queries can see."""

from __future__ import annotations

import torch

from trainer.model.attention.documents import DocumentState

__all__ = ["KVCache"]


class KVCache:
    """Keys and values per layer for incremental decoding, with the keys' token state where the encoding reads one
    (FoX's log forget gates, PaTH's projections); `length` is the number of tokens seen. Layer l holds the keys from
    token index `starts[l]` on (0 unless a window dropped older ones)."""

    def __init__(self, n_layers: int) -> None:
        self.kv: list[tuple[torch.Tensor, torch.Tensor] | None] = [None] * n_layers
        self.state: list[torch.Tensor | None] = [None] * n_layers
        self.starts = [0] * n_layers
        self.length = 0
        self.positions: torch.Tensor | None = None  # (batch or 1, length) int64
        self.segments: torch.Tensor | None = None  # (batch, length) int64 document ids, when documents are masked
        self.documents: DocumentState | None = None

    def extend(self, positions: torch.Tensor, segments: torch.Tensor | None, documents: DocumentState | None) -> None:
        """Record the positions (batch or 1, seq) and documents of the next seq tokens, once per forward pass."""
        if self.positions is None:
            self.positions = positions
        else:
            rows = max(self.positions.shape[0], positions.shape[0])
            self.positions = torch.cat([self.positions.expand(rows, -1), positions.expand(rows, -1)], dim=1)
        if segments is not None:
            self.segments = segments if self.segments is None else torch.cat([self.segments, segments], dim=1)
        self.documents = documents
        self.length += positions.shape[-1]

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor, state: torch.Tensor | None = None,
               keep: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, int]:
        """The layer's held keys, values and token state (batch, heads, keys, ...) with these new ones appended, and
        the token index of the first; with `keep` > 0 only the last `keep` are held for the next call."""
        past, past_state, start = self.kv[layer], self.state[layer], self.starts[layer]
        if past is not None:
            k, v = torch.cat([past[0], k], dim=2), torch.cat([past[1], v], dim=2)
        if past_state is not None and state is not None:
            state = torch.cat([past_state, state], dim=2)
        drop = max(0, k.shape[2] - keep) if keep else 0
        self.kv[layer] = (k[:, :, drop:], v[:, :, drop:])
        self.state[layer] = None if state is None else state[:, :, drop:]
        self.starts[layer] = start + drop
        return k, v, state, start
