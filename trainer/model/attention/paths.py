"""The attention paths, chosen by `model.attention` (`auto | dense | tiled | flex`): the registry the model dispatches
on and the config validator reads.

`auto` takes the fastest path that serves the kind, device and length: `dense` while the whole score matrix is at
most one tile (queries × keys <= block²), and always for a kind of q·k alone without a document mask or window
whose q and v are equally wide (fused SDPA's flash kernel then keeps memory linear; PoPE's 2·head_dim-wide q and k
send SDPA to its quadratic math path); else FlexAttention on CUDA for the kinds it serves; else `tiled`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from trainer.model.attention.call import AttentionCall
from trainer.model.attention.dense import dense_attention
from trainer.model.attention.flex import flex_attention_path, flex_refusal
from trainer.model.attention.tiled import DEFAULT_BLOCK, tiled_attention

__all__ = ["ATTENTION_CHOICES", "ATTENTION_PATHS", "AttentionPath", "choose_path", "path_problem", "run_attention"]


@dataclass(frozen=True)
class AttentionPath:
    """One attention path: how it runs a call, and why it cannot serve a kind, device and mode (None: it can)."""

    name: str
    run: Callable[[Any, AttentionCall], torch.Tensor]
    refusal: Callable[[str, str, bool], str | None]  # (scores kind, device type, training) -> why not, or None
    about: str


def _serves_all(scores: str, device: str, training: bool) -> str | None:
    return None


ATTENTION_PATHS: dict[str, AttentionPath] = {
    "dense": AttentionPath("dense", dense_attention, _serves_all,
                           "the whole score matrix at once (fused SDPA where the kind allows): the reference"),
    "tiled": AttentionPath("tiled", tiled_attention, _serves_all,
                           "query blocks × key tiles with an online softmax and a recomputing backward: memory "
                           f"O(seq × block), block {DEFAULT_BLOCK}"),
    "flex": AttentionPath("flex", flex_attention_path, flex_refusal,
                          "PyTorch's FlexAttention with the kind's score_mod and a block mask (compiled on CUDA)"),
}
ATTENTION_CHOICES = ("auto", *ATTENTION_PATHS)


def path_problem(requested: str, scores: str, device: str, training: bool) -> str | None:
    """Why `model.attention=requested` cannot serve a kind whose scores are `scores` (`PositionModule.scores_kind`)
    on `device` ('cpu' or 'cuda'), training or not; None when it can."""
    if requested not in ATTENTION_CHOICES:
        return f"model.attention={requested!r}: choose one of {', '.join(ATTENTION_CHOICES)}"
    if requested == "auto":
        return None
    why = ATTENTION_PATHS[requested].refusal(scores, device, training)
    if why is None:
        return None
    works = [name for name, p in ATTENTION_PATHS.items() if p.refusal(scores, device, training) is None]
    return f"model.attention={requested!r}: {why}; use model.attention=auto or one of {', '.join(works)}"


def choose_path(requested: str, scores: str, device: str, training: bool, queries: int, keys: int,
                plain_mask: bool, block: int = DEFAULT_BLOCK, fused: bool = True) -> str:
    """The path a call runs on: `requested` unless it is auto, then the module docstring's rule (`fused`: q and v
    are equally wide, so SDPA's flash kernel serves a plain kind)."""
    if requested != "auto":
        return requested
    if scores == "plain" and plain_mask and fused:
        return "dense"
    if queries * keys <= block * block:
        return "dense"
    if device == "cuda" and flex_refusal(scores, device, training) is None:
        return "flex"
    return "tiled"


def run_attention(pe: Any, call: AttentionCall, requested: str = "auto", block: int = 0) -> torch.Tensor:
    """The call's attention output on the path `requested` chooses (module docstring), tiles of `block` tokens (0:
    the default)."""
    block = block or DEFAULT_BLOCK
    name = choose_path(requested, type(pe).scores_kind(), call.q.device.type,
                       torch.is_grad_enabled() and call.q.requires_grad, call.q.shape[-2], call.k.shape[-2],
                       call.mask.plain, block, call.q.shape[-1] == call.v.shape[-1])
    if name == "tiled":
        return tiled_attention(pe, call, block)
    return ATTENTION_PATHS[name].run(pe, call)
