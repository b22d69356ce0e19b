"""Paley-I conference matrices, normalised as printed in the HD-RoPE paper.

For an odd prime power q and n = q + 1, `conference_matrix(n)` is

    C = [[0, 1ᵀ],
         [1, S ]],   S[i, j] = χ(x_i − x_j)

where χ is the quadratic character of GF(q) and x_0, x_1, … are the field elements in the
order documented in `hdrope.galois`. C has a zero diagonal and C·Cᵀ = (n−1)·I.
`conference_matrix(4)` is the paper's C4. Order 2 is [[0, 1], [−1, 0]]: of the two order-2
conference matrices this is the one with det +1, so the Paley basis at N = 2 gives K = QJQᵀ = J and
HD-RoPE at N = 2 is bitwise RoPE (the paper's 2D row). The symmetric [[0, 1], [1, 0]] (det −1) would
give K = −J, RoPE's mirror image (NOTES §1); a random basis at N = 2 can still be that mirror.
"""

from __future__ import annotations

from functools import cache

import numpy as np

from hdrope.errors import UserError
from hdrope.galois import galois_field, prime_power

__all__ = ["conference_matrix", "is_paley_order", "paley_orders"]


def is_paley_order(n: int) -> bool:
    """True when a Paley conference matrix of order n exists (n = 2, or n−1 an odd prime power)."""
    if n == 2:
        return True
    pk = prime_power(n - 1)
    return pk is not None and pk[0] != 2


def paley_orders(max_n: int) -> list[int]:
    """All orders n ≤ max_n that have a Paley conference matrix, ascending."""
    return [n for n in range(2, max_n + 1) if is_paley_order(n)]


def _nearest_orders(n: int) -> tuple[int | None, int]:
    below = next((m for m in range(n - 1, 1, -1) if is_paley_order(m)), None)
    above = next(m for m in range(n + 1, 2 * n + 8) if is_paley_order(m))
    return below, above


@cache
def _conference(n: int) -> np.ndarray:
    if n == 2:
        return np.array([[0, 1], [-1, 0]], dtype=np.int8)  # det +1: N = 2 Paley is RoPE itself
    field = galois_field(n - 1)
    q = field.order
    c = np.zeros((n, n), dtype=np.int8)
    c[0, 1:] = 1
    c[1:, 0] = 1
    for i in range(q):
        for j in range(q):
            c[i + 1, j + 1] = field.chi(field.sub(i, j))
    return c


def conference_matrix(n: int) -> np.ndarray:
    """The Paley-I conference matrix of order n as int8; raises UserError for orders without one."""
    if not isinstance(n, (int, np.integer)) or isinstance(n, bool):
        raise UserError(f"conference matrix order must be an integer, got {n!r}")
    n = int(n)
    if not is_paley_order(n):
        if n < 2:
            raise UserError(f"no conference matrix of order {n}: the smallest order is 2")
        below, above = _nearest_orders(n)
        near = f"{below} or {above}" if below else str(above)
        why = "n must be 2 or q+1 for an odd prime power q"
        raise UserError(f"no Paley conference matrix of order {n} ({why}); nearest orders that exist: {near}")
    out = _conference(n).copy()
    return out
