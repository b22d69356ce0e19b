"""What LieRE, ComRoPE and Circulant-STRING share: rotations exp(m·S) of learned skew-symmetric generators.

Each head's channels split into contiguous blocks of `block` channels; block b of layer l (and KV head h)
turns by R(m) = exp(m·s·S[l, h, b]) at position m, S skew-symmetric and s the kind's position scale. Once per
forward and layer: one matrix exponential and two tables of about √L powers of it (float64, by doubling), so
R(m) = R(B·⌊m/B⌋)·R(m mod B); q and k are turned by the low power, then the high one, gathered for a chunk of
positions at a time. No exponential and no rotation matrix per position is kept.
Because every R(m) is orthogonal and R(m)ᵀR(n) = R(n - m), q'·k' depends on m - n only.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from trainer.model.encodings.base import PositionModule, compute_dtype, positions_bound

__all__ = ["GeneratorRotary", "block_problem", "matrix_powers"]


def matrix_powers(r: torch.Tensor, length: int) -> torch.Tensor:
    """R^0 … R^(length-1) for square matrices r (..., n, n): (..., length, n, n), by doubling."""
    eye = torch.eye(r.shape[-1], dtype=r.dtype, device=r.device).expand_as(r)
    table, step = eye.unsqueeze(-3), r
    while table.shape[-3] < length:
        table = torch.cat((table, table @ step.unsqueeze(-3)), dim=-3)  # R^(k + 2^j) = R^k · R^(2^j)
        step = step @ step
    return table[..., :length, :, :]


def block_problem(block: int, head_dim: int, key: str = "block_dim", whole_ok: bool = True) -> str | None:
    """None when `block` (0: the whole head, if whole_ok) is an integer >= 2 dividing head_dim, else the problem."""
    if isinstance(block, int) and not isinstance(block, bool) and (
            (block == 0 and whole_ok) or (block >= 2 and head_dim % block == 0)):
        return None
    divisors = [b for b in range(2, head_dim + 1) if head_dim % b == 0]
    whole = "0 (the whole head) or " if whole_ok else ""
    return (f"model.pe.{key}={block!r}: the generator blocks must tile head_dim={head_dim}; use {whole}a divisor "
            f">= 2 of {head_dim}: {divisors}")


class GeneratorRotary(PositionModule):
    """Block-diagonal rotations exp(m·s·S) per layer (and KV head); subclasses say what S is (`generator`)."""

    def __init__(self, head_dim: int, block: int, n_heads: int, n_kv_heads: int, scale: float) -> None:
        super().__init__()
        self.head_dim, self.block, self.scale = head_dim, block, float(scale)
        self.n_blocks, self.group = head_dim // block, n_heads // n_kv_heads

    def extra_repr(self) -> str:
        return f"block={self.block}, n_blocks={self.n_blocks}, position_scale={self.scale:.6g}"

    def generator(self, layer: int, dtype: torch.dtype = torch.float64) -> torch.Tensor:
        """S at layer in dtype: (KV heads or 1, n_blocks, block, block), skew-symmetric, per unit position."""
        raise NotImplementedError

    def generator_index(self, layer: int) -> int:
        """Which layer's generator `layer` uses: itself, unless one generator serves every layer (then 0)."""
        return layer

    def tables(self, positions, dtype, length=None):
        pos = positions if positions.dim() == 2 else positions.unsqueeze(0)
        first = int(pos[0, 0]) if pos.shape[0] == 1 and pos.shape[1] else None
        if first is not None and not torch.equal(pos[0], torch.arange(first, first + pos.shape[1], device=pos.device)):
            first = None  # not one run of consecutive positions shared by the batch
        return pos, positions_bound(pos, length), compute_dtype(dtype), first, {}  # {}: this forward's tables

    def power_tables(self, layer: int, bound: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, int]:
        """(low, high, B): R^r for r < B and R^(B·t) for t < ⌈bound / B⌉, each (gens, n_blocks, powers, block,
        block) in dtype, B = ⌈√bound⌉, so that R(m) = high[m // B] · low[m % B]. Formed in float64 (a power R^m
        formed in float32 is off by about m·1e-7 of |x|), cast once."""
        step = torch.linalg.matrix_exp(self.generator(layer) * self.scale)
        size = math.isqrt(max(bound - 1, 0)) + 1
        low = matrix_powers(step, size).to(dtype)
        high = matrix_powers(torch.linalg.matrix_power(step, size), (bound - 1) // size + 1).to(dtype)
        return low, high, size

    def turn(self, x: torch.Tensor, pos: torch.Tensor, first: int | None, low: torch.Tensor, high: torch.Tensor,
             size: int) -> torch.Tensor:
        """R(m)·x block by block for x (batch, heads, seq, d) at positions (batch or 1, seq): the low power, then the
        high one, so no rotation per position is formed. Consecutive positions shared by the batch (from `first`)
        are laid on a grid of B columns, each power one matrix product over every vector it turns; other positions
        gather their powers a chunk at a time (recomputed in the backward, not kept). x's heads in groups of
        heads/gens share one generator, as query heads share their KV head's."""
        b, h, s, d = x.shape
        gens, rows = low.shape[0], pos.shape[0]
        xb = x.to(low.dtype).reshape(rows, b // rows, gens, h // gens, s, self.n_blocks, self.block)
        cols = xb.permute(0, 4, 2, 5, 6, 1, 3).reshape(rows, s, gens, self.n_blocks, self.block, -1)
        if first is not None:
            out = _turn_grid(cols[0], first, low, high, size)[None]
        else:
            pieces = []
            for start in range(0, s, POSITION_CHUNK):
                chunk = pos[:, start:start + POSITION_CHUNK].to(low.device)
                part = cols[:, start:start + POSITION_CHUNK]
                if torch.is_grad_enabled():
                    part = checkpoint(_turn_chunk, part, chunk, low, high, size, use_reentrant=False,
                                      preserve_rng_state=False)
                else:
                    part = _turn_chunk(part, chunk, low, high, size)
                pieces.append(part)
            out = torch.cat(pieces, dim=1)
        out = out.reshape(rows, s, gens, self.n_blocks, self.block, b // rows, h // gens)
        # contiguous (batch, heads, seq, d), as fused SDPA's kernels need (a strided view sends it to the math path)
        return out.permute(0, 5, 2, 6, 1, 3, 4).reshape(b, h, s, d).to(x.dtype).contiguous()

    def rotate(self, q, k, tables, layer=0):
        pos, bound, dtype, first, done = tables
        index = self.generator_index(layer)
        if index not in done:  # layers that share a generator share its tables within one forward
            done[index] = self.power_tables(index, bound, dtype)
        low, high, size = done[index]
        return self.turn(q, pos, first, low, high, size), self.turn(k, pos, first, low, high, size)


POSITION_CHUNK = 256  # positions whose rotations are gathered at once


def _turn_grid(cols: torch.Tensor, first: int, low: torch.Tensor, high: torch.Tensor, size: int) -> torch.Tensor:
    """high[m // B] · (low[m % B] · cols) for cols (seq, gens, n_blocks, block, columns) at positions first.., laid
    on rows of B positions: each low power turns its column of every row at once, each high power its row."""
    s, gens, nb, blk, c = cols.shape
    front = first % size
    back = -(front + s) % size
    grid = F.pad(cols, (0, 0, 0, 0, 0, 0, 0, 0, front, back)).view(-1, size, gens, nb, blk, c)
    rows, top = grid.shape[0], first // size
    by_column = grid.permute(1, 2, 3, 4, 0, 5).reshape(size, gens, nb, blk, rows * c)
    turned = (low.permute(2, 0, 1, 3, 4) @ by_column).view(size, gens, nb, blk, rows, c)
    by_row = turned.permute(4, 1, 2, 3, 0, 5).reshape(rows, gens, nb, blk, size * c)
    out = (high[:, :, top:top + rows].permute(2, 0, 1, 3, 4) @ by_row).view(rows, gens, nb, blk, size, c)
    return out.permute(0, 4, 1, 2, 3, 5).reshape(rows * size, gens, nb, blk, c)[front:front + s]


def _turn_chunk(cols: torch.Tensor, pos: torch.Tensor, low: torch.Tensor, high: torch.Tensor, size: int
                ) -> torch.Tensor:
    """high[m // B] · (low[m % B] · cols) for cols (rows, chunk, gens, n_blocks, block, columns) at positions
    (rows, chunk); tables (gens, n_blocks, powers, block, block)."""
    flat = pos.reshape(-1)
    pick = lambda table, idx: table.index_select(2, idx).unflatten(2, pos.shape).permute(2, 3, 0, 1, 4, 5)  # noqa: E731
    turned = pick(low, flat % size) @ cols
    return pick(high, torch.div(flat, size, rounding_mode="floor")) @ turned
