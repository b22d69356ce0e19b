"""What LieRE, ComRoPE and Circulant-STRING share: rotations exp(m·S) of learned skew-symmetric generators.

Each head's channels split into contiguous blocks of `block` channels; block b of layer l (and KV head h)
turns by R(m) = exp(m·s·S[l, h, b]) at position m, S skew-symmetric and s the kind's position scale. Once per
forward and layer: one matrix exponential, two tables of about √L powers of it (float64, by doubling) and one batched
product R(m) = R(B·⌊m/B⌋)·R(m mod B) for the positions in use; no exponential per position. q and k are then mixed
block by block, one matmul per position and block over every vector at that position.
Because every R(m) is orthogonal and R(m)ᵀR(n) = R(n - m), q'·k' depends on m - n only.
"""

from __future__ import annotations

import math

import torch

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
        return pos, positions_bound(pos, length), compute_dtype(dtype), {}  # {}: this forward's rotations

    def rotations(self, layer: int, pos: torch.Tensor, bound: int, dtype: torch.dtype) -> torch.Tensor:
        """R(m) at the positions (batch, seq): (batch, KV heads or 1, seq, n_blocks, block, block) in dtype.

        R(m) = R(B·⌊m/B⌋)·R(m mod B), B = ⌈√bound⌉, from two tables of about √bound powers formed in float64 (a
        power R^m formed in float32 is off by about m·1e-7 of |x|), multiplied once in dtype."""
        step = torch.linalg.matrix_exp(self.generator(layer) * self.scale)
        size = math.isqrt(max(bound - 1, 0)) + 1
        low = matrix_powers(step, size).to(dtype).transpose(0, 2)  # (size, n_blocks, heads, block, block)
        high = matrix_powers(torch.linalg.matrix_power(step, size), (bound - 1) // size + 1).to(dtype).transpose(0, 2)
        flat = pos.reshape(-1).to(low.device)
        rot = high.index_select(0, torch.div(flat, size, rounding_mode="floor")) @ low.index_select(0, flat % size)
        return rot.reshape(*pos.shape, *rot.shape[1:]).permute(0, 3, 1, 2, 4, 5)

    def mix(self, x: torch.Tensor, rot: torch.Tensor) -> torch.Tensor:
        """R·x block by block: x (batch, heads, seq, d); rot from `rotations`, its heads 1 or a divisor of x's
        (x's heads in groups of heads/rot-heads share one generator, as query heads share their KV head's)."""
        b, h, s, d = x.shape
        gens = rot.shape[1]
        if rot.shape[0] != 1:  # positions per batch row: one small product per vector
            rot = rot.repeat_interleave(h // gens, dim=1)
            xb = x.to(rot.dtype).reshape(b, h, s, self.n_blocks, self.block)
            return torch.einsum("bhsnij,bhsnj->bhsni", rot, xb).reshape(b, h, s, d).to(x.dtype)
        # positions shared by the batch: each R(m) turns every vector at m in one matmul (batched over m, blocks)
        xb = x.to(rot.dtype).reshape(b, gens, h // gens, s, self.n_blocks, self.block)
        cols = xb.permute(1, 3, 4, 5, 0, 2).reshape(gens, s, self.n_blocks, self.block, -1)
        out = (rot[0] @ cols).reshape(gens, s, self.n_blocks, self.block, b, h // gens)
        return out.permute(4, 0, 5, 1, 2, 3).reshape(b, h, s, d).to(x.dtype)

    def rotate(self, q, k, tables, layer=0):
        pos, bound, dtype, done = tables
        index = self.generator_index(layer)
        if index not in done:  # layers that share a generator share its rotations within one forward
            done[index] = self.rotations(index, pos, bound, dtype)
        rot = done[index]
        return self.mix(q, rot), self.mix(k, rot)
