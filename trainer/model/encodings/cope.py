"""CoPE (Golovneva et al. 2024): contextual positions counted by sigmoid gates, with interpolated embeddings."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from trainer.model.encodings.base import EncodingShape, PositionModule
from trainer.model.encodings.bias import bias_identity, int_problem, table_count
from trainer.model.encodings.kind import EncodingKind


@dataclass
class CoPEConfig:
    """CoPE as the official code's defaults: gates from q·k, npos position embeddings of head_dim channels shared
    by a layer's heads, one set per layer unless `shared`; npos 0 means max_seq_len + 1 (the official default)."""

    kind: str = "cope"
    npos: int = 0
    shared: bool = False


def interpolated(table: torch.Tensor, pos: torch.Tensor, box: list) -> torch.Tensor:
    """table (..., npos), made by `shared_table` with `box`, read at fractional positions pos (..., kv_len): linear
    between ⌊p⌋ and ⌈p⌉. Every read's gradient of the table is added into the box's one buffer, so the backward
    zeroes one table, not one per read."""
    return _Read.apply(table, pos, box)


def shared_table(table: torch.Tensor) -> tuple[torch.Tensor, list]:
    """`table` as the source of reads whose gradients meet in one buffer (`interpolated(..., box)`), and the box."""
    box: list = [None]
    return _Shared.apply(table, box), box


class _Shared(torch.autograd.Function):
    """The identity on a table; its backward hands on the gradients its reads added into the box."""

    @staticmethod
    def forward(ctx, table, box):
        ctx.box = box
        return table.view_as(table)

    @staticmethod
    def backward(ctx, grad):
        added, ctx.box[0] = ctx.box[0], None  # emptied, so a second backward starts from nothing
        return (grad if added is None else grad + added), None


class _Read(torch.autograd.Function):
    """`interpolated` of a shared table: the table's gradient is scattered into the box's buffer (made by the first
    backward to need it), and none is returned, so autograd allocates no table-sized gradient per read."""

    @staticmethod
    def forward(ctx, table, pos, box):
        low, high = pos.floor().long(), pos.ceil().long()
        weight = pos - low.to(pos.dtype)
        below, above = table.gather(-1, low), table.gather(-1, high)
        ctx.box, ctx.table = box, (table.shape, table.dtype, table.device)
        ctx.save_for_backward(low, high, weight, above - below)
        return above * weight + below * (1 - weight)

    @staticmethod
    def backward(ctx, grad):
        low, high, weight, rise = ctx.saved_tensors
        if ctx.needs_input_grad[0]:
            shape, dtype, device = ctx.table
            if ctx.box[0] is None:
                ctx.box[0] = torch.zeros(shape, dtype=dtype, device=device)
            ctx.box[0].scatter_add_(-1, high, (grad * weight).to(dtype))
            ctx.box[0].scatter_add_(-1, low, (grad * (1 - weight)).to(dtype))
        return None, (grad * rise if ctx.needs_input_grad[1] else None), None


class CoPE(PositionModule):
    """logits_ij = (q_i·k_j + q_i·e[p_ij]) / √d with p_ij = Σ_{t=j..i} σ(q_i·k_t/√d) over the visible keys, capped at
    npos - 1 (the contextual position), and q·e[p] interpolated between the integer positions' q·e; no q/k rotation.
    Tiles come from the query back, so a tile's carry is the gate sum of its later keys (and the query block's q·e).
    Nothing reads absolute positions, so shifting every position changes nothing."""

    carries = True

    def __init__(self, npos: int, shared: bool, shape: EncodingShape) -> None:
        super().__init__()
        self.npos = int(npos) or shape.max_seq_len + 1
        self.shared = bool(shared)
        self.emb = nn.Parameter(torch.zeros(1 if shared else shape.n_layers, shape.head_dim, self.npos))

    def extra_repr(self) -> str:
        return f"npos={self.npos}, shared={self.shared}"

    def tile_scores(self, t, carry=None):
        scale = 1 / math.sqrt(t.q.shape[-1])
        qk = t.qk()
        gates = torch.sigmoid(qk * scale)
        if t.visible is not None:
            gates = gates * t.visible
        later, at_integers, box = carry if carry is not None else (None, None, None)
        if at_integers is None:  # q·e at each position the block can count to, once per query block, for its tiles
            # a count is at most the keys held up to the block's last query, so no position past them is read
            reach = min(self.npos, t.mask.q_index + t.i1 - t.mask.k_index + 1)
            emb = self.emb[0 if self.shared else t.layer][:, :reach]
            at_integers, box = shared_table(t.q.to(t.dtype) @ emb.to(t.dtype))
        counted = gates.flip(-1).cumsum(-1).flip(-1)
        total = gates.sum(-1, keepdim=True)
        if later is not None:
            counted, total = counted + later, total + later
        pos = counted.clamp(max=at_integers.shape[-1] - 1)  # npos - 1, or the count's own bound when lower
        return (qk + interpolated(at_integers, pos, box)) * scale, (total, at_integers, box)


def _npos(pe: CoPEConfig, s: EncodingShape) -> int:
    return int(pe.npos) or s.max_seq_len + 1


NO_EXPORT = "its positions are counted by q·k gates inside the attention, which HF Llama's attention cannot express"

KIND = EncodingKind(
    "cope", CoPEConfig, lambda c, s: CoPE(c.npos, c.shared, s),
    lambda pe: bias_identity("cope", "CoPE", pe, default_shared=False),
    identity_keys=("shared",), is_rope=lambda row: False, no_export=NO_EXPORT, translation_invariant=True,
    problems=lambda pe, s: [p for p in [int_problem(pe.npos, "npos", 0, 64)] if p], tables=False,
    cost_keys=("npos",),
    params=lambda c, s: table_count(c, s.n_layers) * s.head_dim * _npos(c, s),
    # q·e for every integer position, per head and layer: 2·head_dim·npos FLOPs forward, three times that with
    # the backward (the gates' q·k is the attention's own product); the dense path's count, an upper bound for the
    # tiled path, whose query blocks read only the positions they can count to
    flops=lambda c, s: 6.0 * s.head_dim * _npos(c, s) * s.n_heads * s.n_layers)
