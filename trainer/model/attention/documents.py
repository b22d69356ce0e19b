"""Documents packed in one window, ended by the tokenizer's end-of-document token: each token's document id
(`segments`), and positions that restart at each document's first token."""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["DocumentState", "Documents"]


@dataclass
class DocumentState:
    """Where a row's stream stands after its last token (what a KV cache keeps between calls): that token's document
    id, whether it ended its document, and the token index its document began at."""

    segment: torch.Tensor  # (batch,) int64
    ended: torch.Tensor  # (batch,) bool
    start: torch.Tensor  # (batch,) int64


@dataclass(frozen=True)
class Documents:
    """Attention never crosses the token after `eos_id` (which ends its document); with `restart`, positions count
    from 0 at each document's first token."""

    eos_id: int
    restart: bool = True

    def split(self, tokens: torch.Tensor, first: int, before: DocumentState | None
              ) -> tuple[torch.Tensor, torch.Tensor | None, DocumentState]:
        """(segments (batch, seq) int64, positions (batch, seq) int64 or None to keep the token indices, and the
        state after) of tokens (batch, seq) whose first has token index `first`, continuing `before`."""
        b, s = tokens.shape
        device = tokens.device
        ended = tokens == self.eos_id
        if before is None:
            before = DocumentState(torch.zeros(b, dtype=torch.int64, device=device),
                                   torch.zeros(b, dtype=torch.bool, device=device),
                                   torch.full((b,), first, dtype=torch.int64, device=device))
        begins = torch.cat([before.ended[:, None], ended[:, :-1]], dim=1)  # the token after an end begins a document
        segments = before.segment[:, None] + begins.cumsum(dim=1)
        index = torch.arange(first, first + s, device=device).expand(b, s)
        starts = torch.cat([before.start[:, None], torch.where(begins, index, -1)], dim=1).cummax(dim=1).values[:, 1:]
        after = DocumentState(segments[:, -1], ended[:, -1], starts[:, -1]) if s else before
        return segments, (index - starts) if self.restart else None, after
