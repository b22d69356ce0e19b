"""The channel-space generator G of a whole head and its decomposition into signed permutations.

HD-RoPE applies out = x·cos + (G·x)·sin per channel, where G (head_dim × head_dim) is the
block generator K = Q·J·Qᵀ laid out in chunk order plus rotate-half pairs for leftover
channels (see `hdrope.frequencies`). G is constant: no per-position matrices exist.

`MixPlan` picks how G·x is computed:
- ``rotate_half``: G is ±(the RoPE rotate-half generator); two slices, no gather.
- ``permute``: G = Σ_t diag(coef_t)·P_t with few signed permutations P_t (Algorithm 2 is the
  N = 4 Paley case: three terms with weights 1/3, 2/3, 2/3).
- ``dense``: one GEMM with G.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hdrope.errors import UserError
from hdrope.frequencies import BlockLayout

__all__ = ["MIX_IMPLS", "MixPlan", "channel_generator", "plan_mixing"]

MIX_IMPLS = ("auto", "rotate_half", "permute", "dense")
# Above this many signed-permutation terms a GEMM with G is faster on CPU (see `hdrope bench rotary`).
_MAX_PERMUTE_TERMS = 7


def channel_generator(k: np.ndarray, layout: BlockLayout) -> np.ndarray:
    """G: K placed on every chunk-layout block, plus rotate-half pairs on leftover channels."""
    d, n, b = layout.head_dim, layout.rotation_dim, layout.n_blocks
    g = np.zeros((d, d))
    idx = np.arange(n) * b
    for j in range(b):
        g[np.ix_(idx + j, idx + j)] = k
    start, r2 = n * b, layout.n_leftover_pairs
    for i in range(r2):
        a, c = start + i, start + r2 + i
        g[a, c], g[c, a] = -1.0, 1.0
    return g


def _rotate_half_sign(g: np.ndarray) -> float | None:
    d = g.shape[0]
    h = d // 2
    ref = np.zeros_like(g)
    ref[np.arange(h), np.arange(h) + h] = -1.0
    ref[np.arange(h) + h, np.arange(h)] = 1.0
    for sign in (1.0, -1.0):
        if np.array_equal(g, sign * ref):
            return sign
    return None


def _partner(n: int, s: int) -> np.ndarray:
    """Partner index of each block coordinate in term s: XOR for powers of two, else cyclic shift."""
    coords = np.arange(n)
    return coords ^ s if n & (n - 1) == 0 else (coords + s) % n


@dataclass(frozen=True)
class MixPlan:
    """How G·x is computed, and the data each implementation needs."""

    impl: str
    generator: np.ndarray  # G, (d, d) float64
    sign: float = 1.0  # rotate_half: G = sign · rotate-half generator
    perms: np.ndarray | None = None  # permute: (T, d) int64, term t reads x[..., perms[t]]
    coefs: np.ndarray | None = None  # permute: (T, d) float64 weights
    shifts: tuple[int, ...] = ()  # permute: the XOR mask / cyclic shift s of each term
    use_xor: bool = True  # permute: partners are n XOR s (N a power of 2) or (n + s) mod N

    @property
    def n_terms(self) -> int:
        """Signed-permutation terms of the decomposition of G (0 for a dense plan)."""
        return 0 if self.perms is None else int(self.perms.shape[0])


def _permutation_terms(k: np.ndarray, layout: BlockLayout) -> tuple[np.ndarray, np.ndarray, tuple[int, ...]]:
    d, n, b = layout.head_dim, layout.rotation_dim, layout.n_blocks
    start, r2 = n * b, layout.n_leftover_pairs
    perms, coefs, shifts = [], [], []
    for s in range(1, n):
        partner = _partner(n, s)
        w = k[np.arange(n), partner]
        if not np.any(w):
            continue
        perm = np.arange(d)
        coef = np.zeros(d)
        for j in range(b):
            perm[np.arange(n) * b + j] = partner * b + j
            coef[np.arange(n) * b + j] = w
        perms.append(perm)
        coefs.append(coef)
        shifts.append(s)
    if r2:  # leftover rotate-half pairs ride on the first term
        left = np.arange(start, start + r2)
        right = left + r2
        perms[0][left], perms[0][right] = right, left
        coefs[0][left], coefs[0][right] = -1.0, 1.0
    return np.stack(perms), np.stack(coefs), tuple(shifts)


def plan_mixing(k: np.ndarray, layout: BlockLayout, impl: str = "auto", fused: bool = False) -> MixPlan:
    """Choose (or force, via impl) how to apply the generator; UserError naming `impl` if it cannot apply.

    auto: rotate_half when G is RoPE's (up to sign); otherwise, fused, signed permutations when
    there are few terms; otherwise a GEMM with G (eager gathers are slower than a GEMM on CPU).
    permute and dense apply to every generator; rotate_half only to ±RoPE's (rotation_dim = 2).
    """
    if impl not in MIX_IMPLS:
        raise UserError(f"impl={impl!r} is unknown; choose one of {list(MIX_IMPLS)} ('auto' picks the fastest)")
    g = channel_generator(k, layout)
    sign = _rotate_half_sign(g)
    perms, coefs, shifts = _permutation_terms(k, layout)
    n = layout.rotation_dim
    terms = dict(perms=perms, coefs=coefs, shifts=shifts, use_xor=n & (n - 1) == 0)
    if impl == "rotate_half" or (impl == "auto" and sign is not None):
        if sign is None:
            raise UserError(
                f"impl='rotate_half' applies only to RoPE's generator (up to sign: rotation_dim=2), and this one "
                f"mixes rotation_dim={layout.rotation_dim} channels per block; use impl='auto', 'permute' or 'dense'"
            )
        return MixPlan("rotate_half", g, sign=sign, **terms)
    if impl == "dense" or (impl == "auto" and (not fused or perms.shape[0] > _MAX_PERMUTE_TERMS)):
        return MixPlan("dense", g)
    return MixPlan("permute", g, **terms)
