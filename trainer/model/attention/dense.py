"""The dense attention path, the reference every other path is tested against: the whole (queries × keys) score
matrix as one tile. A kind of q·k alone, or of q·k plus a bias, goes through PyTorch's fused SDPA (the bias and the
mask as one float mask); a kind with its own scores takes its weights explicitly. `dense_logits` and
`dense_weights` are what the attention sees and does, which the attention dump and the tests read."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from trainer.model.attention.call import AttentionCall, Tile

__all__ = ["dense_attention", "dense_logits", "dense_weights", "full_tile", "grouped_values"]


def full_tile(pe: Any, call: AttentionCall) -> Tile:
    """The tile of every query and key of the call, with the kind's prepared pieces (`prepare` at block 0)."""
    prep = pe.prepare(call, 0)
    s, n = call.q.shape[-2], call.k.shape[-2]
    return Tile(call.q, call.k, call.q_pos, call.k_pos, 0, 0, call.mask.visible(0, s, 0, n, call.q.device),
                call.layer, prep.queries, prep.keys, prep.other, call.mask)


def grouped_values(p: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """p (batch, heads, queries, keys) @ v (batch, kv_heads, keys, dv), each KV head's values shared by its group
    of query heads: (batch, heads, queries, dv) in v's dtype."""
    b, h, s, n = p.shape
    kvh = v.shape[1]
    out = p.to(v.dtype).view(b, kvh, h // kvh, s, n) @ v[:, :, None]
    return out.view(b, h, s, v.shape[-1])


def _own_scores(pe: Any, call: AttentionCall) -> tuple[torch.Tensor, torch.Tensor | None, Tile]:
    """The kind's scores over the whole call (hidden entries -inf for a softmax) and its self weight."""
    t = full_tile(pe, call)
    scores, carry = pe.tile_scores(t, None)
    if pe.normalised and t.visible is not None:
        scores = scores.masked_fill(~t.visible, float("-inf"))
    return scores, pe.self_weight(carry), t


def dense_logits(pe: Any, call: AttentionCall) -> torch.Tensor:
    """The scores (batch, heads, queries, keys) the attention weights are made from: the logits a softmax takes
    (-inf where the mask hides a key), or a non-softmax kind's log-weights (stick-breaking)."""
    return _own_scores(pe, call)[0]


def dense_weights(pe: Any, call: AttentionCall) -> torch.Tensor:
    """The attention weights (batch, heads, queries, keys), each row summing to 1: the softmax of `dense_logits`,
    or a non-softmax kind's weights with the query's own value's share on its own key."""
    scores, own, _ = _own_scores(pe, call)
    if pe.normalised:
        return torch.softmax(scores, dim=-1)
    weights = torch.exp(scores)
    if own is not None:
        s = scores.shape[-2]
        idx = torch.arange(call.mask.q_index - call.mask.k_index, call.mask.q_index - call.mask.k_index + s,
                           device=scores.device)
        weights = weights.scatter_add(-1, idx.view(1, 1, s, 1).expand(*weights.shape[:-1], 1), own[..., None])
    return weights


def dense_attention(pe: Any, call: AttentionCall) -> torch.Tensor:
    """Attention output (batch, heads, queries, dv) of the call: fused SDPA for q·k (plus a bias), the kind's own
    weights otherwise."""
    q, k, v, mask = call.q, call.k, call.v, call.mask
    s, n = q.shape[-2], k.shape[-2]
    kind = type(pe).scores_kind()
    gqa, scale = k.shape[1] != q.shape[1], pe.softmax_scale(q.shape[-1])
    if kind != "own":
        visible = mask.visible(0, s, 0, n, q.device)
        bias = pe.tile_bias(full_tile(pe, call)) if kind != "plain" else None
        if bias is None:
            if visible is None:
                return F.scaled_dot_product_attention(q, k, v, enable_gqa=gqa, scale=scale)
            if mask.plain and s == n and mask.q_index == mask.k_index:
                return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa, scale=scale)
            return F.scaled_dot_product_attention(q, k, v, attn_mask=visible, enable_gqa=gqa, scale=scale)
        float_mask = bias.to(q.dtype)
        if visible is not None:
            float_mask = float_mask.masked_fill(~visible, float("-inf"))
        return F.scaled_dot_product_attention(q, k, v, attn_mask=float_mask, enable_gqa=gqa, scale=scale)
    scores, own, _ = _own_scores(pe, call)
    weights = torch.softmax(scores, dim=-1) if pe.normalised else torch.exp(scores)
    out = grouped_values(weights, v)
    if own is not None:
        offset = mask.q_index - mask.k_index
        mine = v[:, :, offset:offset + s].repeat_interleave(call.group, dim=1)
        out = out + (own[..., None] * mine.to(own.dtype)).to(out.dtype)
    return out

