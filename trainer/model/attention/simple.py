"""Causal attention calls built from q, k and v alone (token indices and positions 0.. for the keys, the queries at
the end): what tests and scripts call an encoding's attention with; the model builds its own calls."""

from __future__ import annotations

from typing import Any

import torch

from trainer.model.attention.call import AttentionCall, AttentionMask
from trainer.model.attention.dense import dense_logits, dense_weights
from trainer.model.attention.paths import run_attention

__all__ = ["attend", "logits", "simple_call", "weights"]


def simple_call(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor | None = None, past: int = 0, layer: int = 0,
                state: torch.Tensor | None = None) -> AttentionCall:
    """The call of queries q at token indices and positions past.. over keys (and values) at 0.., causal alone."""
    s, n = q.shape[-2], k.shape[-2]
    q_pos = torch.arange(past, past + s, device=q.device)[None]
    k_pos = torch.arange(n, device=q.device)[None]
    return AttentionCall(q, k, k if v is None else v, q_pos, k_pos, AttentionMask(past, 0), state, layer)


def attend(pe: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, past: int = 0, layer: int = 0,
           state: torch.Tensor | None = None, path: str = "dense") -> torch.Tensor:
    """Causal attention (batch, heads, seq, dv) of queries at positions past.. over keys and values at 0.. on
    `path` (for tests and scripts; the model builds its own calls)."""
    return run_attention(pe, simple_call(q, k, v, past, layer, state), path)


def logits(pe: Any, q: torch.Tensor, k: torch.Tensor, past: int = 0, layer: int = 0,
           state: torch.Tensor | None = None) -> torch.Tensor:
    """`dense_logits` of queries at positions past.. over keys at 0.., causal alone."""
    return dense_logits(pe, simple_call(q, k, None, past, layer, state))


def weights(pe: Any, q: torch.Tensor, k: torch.Tensor, past: int = 0, layer: int = 0,
            state: torch.Tensor | None = None) -> torch.Tensor:
    """`dense_weights` of queries at positions past.. over keys at 0.., causal alone."""
    return dense_weights(pe, simple_call(q, k, None, past, layer, state))
