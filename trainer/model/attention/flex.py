"""The FlexAttention path: PyTorch's `flex_attention` with the kind's `score_mod` and a block mask of the call's
causal, window and document mask. Compiled on CUDA, where it trains; elsewhere it runs FlexAttention's eager
reference, forward only (torch 2.13 has no FlexAttention backward on CPU)."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch

from trainer.model.attention.call import AttentionCall, AttentionMask

__all__ = ["flex_attention_path", "flex_refusal", "mask_mod"]

_COMPILED: dict[str, Callable] = {}


def flex_refusal(scores: str, device: str, training: bool) -> str | None:
    """Why FlexAttention cannot serve a kind whose scores are `scores` on `device` (None: it can)."""
    if scores == "own":
        return ("FlexAttention takes a score_mod of (head, query, key) alone, and this kind's scores read more than "
                "that (the heads together, a carry along the keys, or its own weights)")
    if scores == "bias":
        return "this kind has no FlexAttention score_mod"
    if device != "cuda" and training:
        return f"FlexAttention has no backward on {device} in torch {torch.__version__.split('+')[0]}"
    return None


def mask_mod(mask: AttentionMask) -> Callable:
    """FlexAttention's mask_mod (b, h, q_idx, kv_idx) -> bool of the mask: causal, window, same document."""
    offset = mask.q_index - mask.k_index
    segments, window = mask.segments, mask.window

    def visible(b, h, q_idx, kv_idx):
        query, key = q_idx + offset, kv_idx
        ok = key <= query
        if window:
            ok = ok & (query - key < window)
        if segments is not None:
            ok = ok & (segments[b, query] == segments[b, key])
        return ok

    return visible


def _flex() -> Callable:
    from torch.nn.attention.flex_attention import flex_attention

    return flex_attention


def flex_attention_path(pe: Any, call: AttentionCall) -> torch.Tensor:
    """Attention output (batch, heads, queries, dv) of the call by FlexAttention."""
    from torch.nn.attention.flex_attention import create_block_mask

    q, k, v = call.q, call.k, call.v
    prep = pe.prepare(call, 0)
    score_mod = pe.score_mod(call, prep)
    batch = q.shape[0] if call.mask.segments is not None else None
    cuda = q.device.type == "cuda"
    block_mask = create_block_mask(mask_mod(call.mask), batch, None, q.shape[-2], k.shape[-2], device=q.device,
                                   _compile=cuda)
    kwargs = {"score_mod": score_mod, "block_mask": block_mask, "scale": pe.softmax_scale(q.shape[-1]),
              "enable_gqa": k.shape[1] != q.shape[1]}
    if cuda:
        if "flex" not in _COMPILED:
            _COMPILED["flex"] = torch.compile(_flex(), dynamic=False)
        return _COMPILED["flex"](q, k, v, **kwargs)
    with warnings.catch_warnings():  # the eager reference warns that it is not the compiled kernel
        warnings.simplefilter("ignore", UserWarning)
        return _flex()(q, k, v, **kwargs)
