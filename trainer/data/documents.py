"""`data.documents`: the run's document policy (the model's `Documents`, from the tokenizer's end-of-document token)
and how many of the training split's documents are longer than a training window, which the windows cut."""

from __future__ import annotations

from typing import Any

import numpy as np

from hdrope.errors import UserError
from trainer.config import DataConfig
from trainer.model.attention.documents import Documents

__all__ = ["document_policy", "document_stats"]

_SCAN = 1 << 24  # tokens read at a time when counting documents (a shard set can be larger than memory)


def document_policy(cfg: DataConfig, tok: Any) -> Documents | None:
    """The model's document policy for data.documents (None when masking is off); UserError when the tokenizer has
    no end-of-document token to find the documents by."""
    if not cfg.documents.mask:
        return None
    if getattr(tok, "eos_id", None) is None:
        raise UserError(f"data.documents.mask=true: the tokenizer (data.tokenizer={cfg.tokenizer!r}) has no "
                        "end-of-document token, so the token streams hold no document boundaries to mask; use a "
                        "tokenizer with one (bytes has <eos>), or set data.documents.mask=false")
    return Documents(int(tok.eos_id), cfg.documents.positions == "restart")


def document_stats(stream: Any, eos_id: int, window: int) -> dict[str, int]:
    """How many documents the token stream (documents each ended by eos_id) holds, and how many are longer than a
    window of `window` tokens (the windows cut those); UserError when it holds a single document, with nothing to
    mask between documents."""
    ends: list[np.ndarray] = []
    for start in range(0, len(stream), _SCAN):
        part = np.asarray(stream[start:start + _SCAN])
        ends.append(np.flatnonzero(part == eos_id) + start)
    cuts = np.concatenate(ends) if ends else np.zeros(0, dtype=np.int64)
    lengths = np.diff(np.concatenate([[-1], cuts])) if len(cuts) else np.asarray([len(stream)])
    if len(cuts) < 2:
        raise UserError(f"data.documents.mask=true: the training split is one document ({len(stream)} tokens, "
                        f"{len(cuts)} end-of-document token{'s' if len(cuts) != 1 else ''}), so there is no "
                        "boundary to mask; give a corpus of several documents, or set data.documents.mask=false")
    return {"documents": len(lengths), "longer_than_window": int((lengths > window).sum()),
            "window": int(window), "longest": int(lengths.max())}
