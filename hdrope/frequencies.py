"""Block frequencies of HD-RoPE and the channel layout they are applied in.

Layout for head_dim d and rotation dimension N (see docs/encodings.md, "Conventions"):
- B = d // N blocks; block j holds channels j, j+B, …, j+(N−1)B (the paper's Chunk(t, N)).
- All N/2 pairs of block j share one frequency θ_j = theta^(−N·j/d), j = 0 … B−1.
- When N does not divide d, the r = d − N·B leftover channels (r must be even) come last and
  get plain pairwise RoPE in rotate-half order: pair i = (N·B + i, N·B + r/2 + i), with
  frequency theta^(−(N·B + 2i)/d), continuing the exponent ladder of the blocks. This is the
  appendix's composition diag(Q_N, …, Q_N, I) in its pairwise-RoPE form.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hdrope.errors import UserError

__all__ = ["BlockLayout", "block_layout"]


@dataclass(frozen=True)
class BlockLayout:
    """How a head of `head_dim` channels splits into N-dim blocks plus pairwise leftovers."""

    head_dim: int
    rotation_dim: int
    n_blocks: int  # B
    n_leftover_pairs: int  # r / 2

    @property
    def n_frequencies(self) -> int:
        """Distinct frequencies: one per block plus one per leftover pair."""
        return self.n_blocks + self.n_leftover_pairs

    def exponents(self) -> np.ndarray:
        """e_f with θ_f = theta^(−e_f): N·j/d for blocks, then (N·B + 2i)/d for leftover pairs."""
        d, n, b = self.head_dim, self.rotation_dim, self.n_blocks
        blocks = n * np.arange(b, dtype=np.float64) / d
        pairs = (n * b + 2 * np.arange(self.n_leftover_pairs, dtype=np.float64)) / d
        return np.concatenate([blocks, pairs])

    def channel_frequency_index(self) -> np.ndarray:
        """For each channel, the index of the frequency that rotates it (length head_dim)."""
        b, r2 = self.n_blocks, self.n_leftover_pairs
        main = np.tile(np.arange(b), self.rotation_dim)
        rest = np.tile(b + np.arange(r2), 2)
        return np.concatenate([main, rest]).astype(np.int64)


def block_layout(head_dim: int, rotation_dim: int) -> BlockLayout:
    """Validate (head_dim, rotation_dim) and describe the layout; UserError names the fix."""
    for name, v in (("head_dim", head_dim), ("rotation_dim", rotation_dim)):
        if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < 2:
            raise UserError(f"{name} must be an integer ≥ 2, got {v!r}")
    if rotation_dim % 2:
        raise UserError(f"rotation_dim must be even, got {rotation_dim}")
    if head_dim % 2:
        raise UserError(f"head_dim must be even for any rotary encoding, got {head_dim}")
    if rotation_dim > head_dim:
        raise UserError(
            f"rotation_dim={rotation_dim} is larger than head_dim={head_dim}; use a rotation_dim ≤ {head_dim}"
        )
    b, r = divmod(head_dim, rotation_dim)
    return BlockLayout(head_dim, rotation_dim, b, r // 2)
