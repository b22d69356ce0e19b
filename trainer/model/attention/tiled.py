"""The tiled attention path: memory O(seq × block), not O(seq²), for every kind, on any device.

Queries are cut into blocks and keys into tiles at token indices that are multiples of `block`. Each query block
takes its tiles from its own keys back to the first key any of its queries may see (tiles the mask hides wholly are
skipped), passing the kind's carry from tile to tile, and merges them by an online softmax (or adds them, for a kind
whose scores are log-weights already). With gradients on, each query block runs under activation checkpointing: its
forward keeps nothing, and the backward recomputes the block's tiles and differentiates them (the kind's parameters,
token state and prepared tensors included), so at most one block's tiles are held at a time.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint

from trainer.model.attention.call import AttentionCall, Tile
from trainer.model.attention.dense import grouped_values

__all__ = ["DEFAULT_BLOCK", "block_edges", "tile_weights", "tiled_attention"]

DEFAULT_BLOCK = 256  # tokens per query block and key tile


def block_edges(first: int, count: int, block: int) -> list[tuple[int, int]]:
    """(start, end) local index ranges of `count` tokens whose first has token index `first`, cut where the token
    index is a multiple of `block` (the first and last pieces may be short)."""
    cuts = [0]
    nxt = (first // block + 1) * block - first
    while nxt < count:
        cuts.append(nxt)
        nxt += block
    cuts.append(count)
    return [(a, b) for a, b in itertools.pairwise(cuts) if b > a]


def _split(x: torch.Tensor, edges: list[tuple[int, int]], dim: int) -> list[torch.Tensor]:
    return list(x.split([b - a for a, b in edges], dim=dim))


def _pieces(named: dict[str, torch.Tensor], edges: list[tuple[int, int]]) -> list[dict[str, torch.Tensor]]:
    cut = {name: _split(t, edges, 2) for name, t in named.items()}
    return [{name: parts[i] for name, parts in cut.items()} for i in range(len(edges))]


class _KeyTile:
    """One key tile's pieces: its local range, keys, values, positions and prepared per-key tensors."""

    def __init__(self, j0: int, j1: int, k: torch.Tensor, v: torch.Tensor, pos: torch.Tensor,
                 pk: dict[str, torch.Tensor]) -> None:
        self.j0, self.j1, self.k, self.v, self.pos, self.pk = j0, j1, k, v, pos, pk


def _exp(z: torch.Tensor, visible: torch.Tensor | None) -> torch.Tensor:
    """exp(z), 0 where `visible` is False, with z floored just above where exp's results become subnormal: they add
    under e^-79 of a row's largest weight (below float32's resolution) and cost 5-20 times a normal exp on a CPU."""
    floor = math.log(torch.finfo(z.dtype).tiny) + 8
    out = torch.exp(z.clamp(min=floor))
    return out if visible is None else out.masked_fill(~visible, 0.0)


def _block(pe: Any, call: AttentionCall, other: dict[str, Any], i0: int, q: torch.Tensor, q_pos: torch.Tensor,
           pq: dict[str, torch.Tensor], tiles: list[_KeyTile], with_lse: bool = False) -> Any:
    """The output (batch, heads, block queries, dv) of one query block over its key tiles (nearest first), and with
    `with_lse` each row's log-sum-exp of its scores (batch, heads, block queries, 1)."""
    mask, i1 = call.mask, i0 + q.shape[-2]
    carry: Any = None
    m = total = acc = None  # the running row maximum, weight sum and weighted values
    for n, kt in enumerate(tiles):
        visible = mask.visible(i0, i1, kt.j0, kt.j1, q.device)
        t = Tile(q, kt.k, q_pos, kt.pos, i0, kt.j0, visible, call.layer, pq, kt.pk, other, mask, n == 0)
        scores, carry = pe.tile_scores(t, carry)
        if not pe.normalised:  # log-weights of a distribution already (hidden entries -inf)
            part = grouped_values(_exp(scores, scores > float("-inf")), kt.v).to(scores.dtype)
            acc = part if acc is None else acc + part
            continue
        if visible is not None:
            scores = scores.masked_fill(~visible, float("-inf"))
        top = scores.amax(dim=-1, keepdim=True).detach()  # the result does not depend on it: no gradient
        if m is not None:
            top = torch.maximum(top, m)
        top = torch.where(torch.isinf(top), torch.zeros_like(top), top)  # a row no tile has shown a key yet
        p = _exp(scores - top, visible)
        part = grouped_values(p, kt.v).to(scores.dtype)
        if m is None:
            total, acc = p.sum(dim=-1, keepdim=True), part
        else:
            rescale = torch.exp(m - top)
            total, acc = total * rescale + p.sum(dim=-1, keepdim=True), acc * rescale + part
        m = top
    out = acc if not pe.normalised else acc / total
    own = pe.self_weight(carry)
    if own is not None:  # the query's own value, from the block's own (first) tile
        diag = tiles[0]
        start = mask.q_index + i0 - (mask.k_index + diag.j0)
        mine = diag.v[:, :, start:start + q.shape[-2]].repeat_interleave(call.group, dim=1)
        out = out + own[..., None] * mine.to(out.dtype)
    if with_lse:
        return out.to(call.v.dtype), m + torch.log(total)
    return out.to(call.v.dtype)


def _leaf(x: Any) -> Any:
    """x cut from the graph, a leaf asking for its gradient where x had one (anything not a tensor as it is)."""
    return x.detach().requires_grad_(x.requires_grad) if isinstance(x, torch.Tensor) else x


class _SoftmaxBlock(torch.autograd.Function):
    """One query block of a kind whose scores carry nothing from tile to tile, differentiated as FlashAttention is:
    the forward keeps the output and each row's log-sum-exp, and the backward recomputes each tile's scores (with
    their graph), their weights from the log-sum-exp, and differentiates the tile's scores by dS = P ⊙ (dP - D)."""

    @staticmethod
    def forward(ctx, pe, call, other_names, i0, q_pos, tile_meta, pq_names, pk_names, *tensors):
        q, pq, other, tiles, _ = _SoftmaxBlock.unpack(tensors, other_names, pq_names, pk_names, tile_meta)
        with torch.no_grad():
            out, lse = _block(pe, call, other, i0, q, q_pos, pq, tiles, with_lse=True)
        ctx.meta = (pe, call, other_names, i0, q_pos, tile_meta, pq_names, pk_names)
        ctx.save_for_backward(*tensors, out, lse)
        return out

    @staticmethod
    def unpack(tensors, other_names, pq_names, pk_names, tile_meta):
        """(q, pq, other, tiles, params) from the flat tensors (the order `pack` gives them)."""
        q, rest = tensors[0], list(tensors[1:])
        pq = {name: rest.pop(0) for name in pq_names}
        other = {name: rest.pop(0) for name in other_names}
        tiles = []
        for j0, j1, pos in tile_meta:
            k, v = rest.pop(0), rest.pop(0)
            tiles.append(_KeyTile(j0, j1, k, v, pos, {name: rest.pop(0) for name in pk_names}))
        return q, pq, other, tiles, rest

    @staticmethod
    def backward(ctx, grad_out):
        pe, call, other_names, i0, q_pos, tile_meta, pq_names, pk_names = ctx.meta
        *tensors, out, lse = ctx.saved_tensors
        q, pq, other, tiles, params = _SoftmaxBlock.unpack(tensors, other_names, pq_names, pk_names, tile_meta)
        ql, pql, otherl = _leaf(q), {n: _leaf(t) for n, t in pq.items()}, {n: _leaf(t) for n, t in other.items()}
        dtype = lse.dtype
        g = grad_out.to(dtype)
        delta = (g * out.to(dtype)).sum(-1, keepdim=True)
        b, h, s, dv = g.shape
        kvh = tiles[0].k.shape[1]
        gg = g.view(b, kvh, h // kvh, s, dv)
        shared = [ql, *pql.values(), *otherl.values(), *params]
        grads_shared = [None] * len(shared)
        tile_grads = []
        for n, kt in enumerate(tiles):
            kl, pkl = _leaf(kt.k), {name: _leaf(t) for name, t in kt.pk.items()}
            visible = call.mask.visible(i0, i0 + s, kt.j0, kt.j1, q.device)
            with torch.enable_grad():
                t = Tile(ql, kl, q_pos, kt.pos, i0, kt.j0, visible, call.layer, pql, pkl, otherl, call.mask, n == 0)
                scores, _ = pe.tile_scores(t, None)
            with torch.no_grad():
                p = _exp(scores.detach() - lse, visible)
                pg = p.view(b, kvh, h // kvh, s, -1)
                dv_tile = (pg.transpose(-1, -2) @ gg).sum(2).to(kt.v.dtype)
                dp = (gg @ kt.v.to(dtype)[:, :, None].transpose(-1, -2)).view(b, h, s, -1)
                ds = p * (dp - delta)
            wanted = [kl, *pkl.values(), *shared]
            asked = [x for x in wanted if isinstance(x, torch.Tensor) and x.requires_grad]
            got = iter(torch.autograd.grad(scores, asked, ds, allow_unused=True) if asked else [])
            found = [next(got) if isinstance(x, torch.Tensor) and x.requires_grad else None for x in wanted]
            tile_grads += [found[0], dv_tile, *found[1:1 + len(pkl)]]
            for i, gr in enumerate(found[1 + len(pkl):]):
                if gr is not None:
                    grads_shared[i] = gr if grads_shared[i] is None else grads_shared[i] + gr
        n_q = 1 + len(pql) + len(otherl)
        return (None,) * 8 + (*grads_shared[:n_q], *tile_grads, *grads_shared[n_q:])


def _softmax_block(pe: Any, call: AttentionCall, other: dict[str, Any], i0: int, q: torch.Tensor, q_pos: torch.Tensor,
                   pq: dict[str, torch.Tensor], tiles: list[_KeyTile]) -> torch.Tensor:
    """`_block` through `_SoftmaxBlock`: every tensor the block reads, the kind's parameters included, as its
    inputs, in the order `_SoftmaxBlock.unpack` reads them."""
    other_names = [n for n, x in other.items() if isinstance(x, torch.Tensor)]
    constants = {n: x for n, x in other.items() if not isinstance(x, torch.Tensor)}
    if constants:
        raise TypeError(f"prepared values that are not tensors cannot pass a tiled softmax block: {sorted(constants)}")
    pk_names = sorted(tiles[0].pk) if tiles else []
    flat = [q, *(pq[n] for n in sorted(pq)), *(other[n] for n in other_names)]
    for kt in tiles:
        flat += [kt.k, kt.v, *(kt.pk[n] for n in pk_names)]
    flat += [p for p in pe.parameters()]
    meta = [(kt.j0, kt.j1, kt.pos) for kt in tiles]
    return _SoftmaxBlock.apply(pe, call, other_names, i0, q_pos, meta, sorted(pq), pk_names, *flat)


def tiled_attention(pe: Any, call: AttentionCall, block: int = DEFAULT_BLOCK) -> torch.Tensor:
    """Attention output (batch, heads, queries, dv) of the call by tiles of `block` tokens (equal to
    `dense_attention` up to rounding, in values and gradients)."""
    mask = call.mask
    s, n = call.q.shape[-2], call.k.shape[-2]
    prep = pe.prepare(call, block)
    q_edges, k_edges = block_edges(mask.q_index, s, block), block_edges(mask.k_index, n, block)
    q_blocks, q_pos = _split(call.q, q_edges, 2), _split(call.q_pos, q_edges, 1)
    pq = _pieces(prep.queries, q_edges)
    keys = [_KeyTile(a, b, k, v, pos, pk) for (a, b), k, v, pos, pk in zip(
        k_edges, _split(call.k, k_edges, 2), _split(call.v, k_edges, 2), _split(call.k_pos, k_edges, 1),
        _pieces(prep.keys, k_edges), strict=True)]
    lows = mask.first_keys([a for a, _ in q_edges])
    recompute = torch.is_grad_enabled()
    flash = pe.normalised and not pe.carries
    outs = []
    for (i0, i1), qb, pb, pqb, low in zip(q_edges, q_blocks, q_pos, pq, lows, strict=True):
        last = mask.q_index + i1 - 1 - mask.k_index  # the block's last query's own key
        tiles = [kt for kt in reversed(keys) if kt.j0 <= last and kt.j1 > low]
        if recompute and flash:
            out = _softmax_block(pe, call, prep.other, i0, qb, pb, pqb, tiles)
        elif recompute:
            out = checkpoint(_block, pe, call, prep.other, i0, qb, pb, pqb, tiles, use_reentrant=False,
                             preserve_rng_state=False)
        else:
            out = _block(pe, call, prep.other, i0, qb, pb, pqb, tiles)
        outs.append(out)
    return torch.cat(outs, dim=2)


def tile_weights(pe: Any, call: AttentionCall, block: int = DEFAULT_BLOCK
                 ) -> Iterator[tuple[int, int, int, int, torch.Tensor, torch.Tensor]]:
    """Every tile's attention weights and scores, without gradients and without the whole matrix: (i0, i1, j0, j1,
    weights, scores) for queries i0..i1-1 and keys j0..j1-1 (local), weights (batch, heads, queries, keys) whose rows
    sum to 1 over all of a query block's tiles (the query's own value's share added on its own key), and scores as
    `dense_logits` gives them (-inf where the mask hides a key). A softmax kind's block is passed twice: its rows'
    log-sum-exp, then its weights."""
    mask = call.mask
    s, n = call.q.shape[-2], call.k.shape[-2]
    with torch.no_grad():
        prep = pe.prepare(call, block)
        q_edges, k_edges = block_edges(mask.q_index, s, block), block_edges(mask.k_index, n, block)
        q_blocks, q_pos = _split(call.q, q_edges, 2), _split(call.q_pos, q_edges, 1)
        keys = [_KeyTile(a, b, k, v, pos, pk) for (a, b), k, v, pos, pk in zip(
            k_edges, _split(call.k, k_edges, 2), _split(call.v, k_edges, 2), _split(call.k_pos, k_edges, 1),
            _pieces(prep.keys, k_edges), strict=True)]
        lows = mask.first_keys([a for a, _ in q_edges])
        for (i0, i1), qb, pb, pqb, low in zip(q_edges, q_blocks, q_pos, _pieces(prep.queries, q_edges), lows,
                                              strict=True):
            last = mask.q_index + i1 - 1 - mask.k_index
            tiles = [kt for kt in reversed(keys) if kt.j0 <= last and kt.j1 > low]
            lse = _block(pe, call, prep.other, i0, qb, pb, pqb, tiles, with_lse=True)[1] if pe.normalised else None
            carry, out = None, []
            for m, kt in enumerate(tiles):
                visible = mask.visible(i0, i1, kt.j0, kt.j1, qb.device)
                t = Tile(qb, kt.k, pb, kt.pos, i0, kt.j0, visible, call.layer, pqb, kt.pk, prep.other, mask, m == 0)
                scores, carry = pe.tile_scores(t, carry)
                if pe.normalised:
                    if visible is not None:
                        scores = scores.masked_fill(~visible, float("-inf"))
                    weights = _exp(scores - lse, visible)
                else:
                    weights = _exp(scores, scores > float("-inf"))
                out.append([i0, i1, kt.j0, kt.j1, weights, scores])
            own = pe.self_weight(carry)
            if own is not None:  # the query's own key is in the block's first tile
                first = out[0]
                rows = torch.arange(i1 - i0, device=qb.device)
                cols = mask.q_index + i0 + rows - (mask.k_index + first[2])
                first[4] = first[4].clone()
                first[4][..., rows, cols] += own
            yield from (tuple(x) for x in out)
