"""Arithmetic in small finite fields GF(p^k), enough to build Paley conference matrices.

Element encoding (the *element order* used everywhere in this package):
an element a_0 + a_1·α + … + a_{k-1}·α^{k-1} (coefficients a_i in 0..p-1, α a root of
the field's modulus) has the integer index Σ a_i·p^i. So GF(p) is 0, 1, …, p-1 in the
usual order and, for k > 1, index 1 is the field's one and index p is α.

Modulus: the lexicographically first monic irreducible polynomial of degree k over GF(p),
comparing coefficient vectors (a_0, a_1, …, a_{k-1}) of x^k + a_{k-1}x^{k-1} + … + a_0 as
base-p numbers Σ a_i·p^i. For example GF(9) uses x² + 1, GF(25) uses x² + 2 and GF(27) uses
x³ + 2x + 1. `GaloisField.modulus` reports the coefficients actually used.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache, cached_property

from hdrope.errors import UserError

__all__ = ["GaloisField", "galois_field", "prime_power"]


def _is_prime(n: int) -> bool:
    if n < 2:
        return False
    f = 2
    while f * f <= n:
        if n % f == 0:
            return False
        f += 1
    return True


def prime_power(q: int) -> tuple[int, int] | None:
    """Return (p, k) with q = p**k for a prime p, or None when q is not a prime power."""
    if q < 2:
        return None
    p = 2
    while p * p <= q and q % p:
        p += 1
    if q % p:
        p = q  # q itself is prime
    k, rest = 0, q
    while rest % p == 0:
        rest //= p
        k += 1
    return (p, k) if rest == 1 and _is_prime(p) else None


def _poly_mulmod(a: list[int], b: list[int], modulus: list[int], p: int) -> list[int]:
    """Multiply coefficient lists a·b modulo the monic polynomial x^k + Σ modulus[i] x^i."""
    k = len(modulus)
    prod = [0] * (2 * k - 1)
    for i, ai in enumerate(a):
        if ai:
            for j, bj in enumerate(b):
                prod[i + j] = (prod[i + j] + ai * bj) % p
    # reduce: x^k ≡ -Σ modulus[i] x^i
    for deg in range(len(prod) - 1, k - 1, -1):
        c = prod[deg]
        if c:
            prod[deg] = 0
            for i, mi in enumerate(modulus):
                prod[deg - k + i] = (prod[deg - k + i] - c * mi) % p
    return prod[:k]


def _has_root_free_factorisation(modulus: list[int], p: int) -> bool:
    """True when x^k + Σ modulus[i] x^i is irreducible over GF(p) (checked by brute force)."""
    k = len(modulus)
    full = [*modulus, 1]  # coefficients low→high, monic
    # A reducible degree-k polynomial has a monic factor of degree 1..k//2.
    for deg in range(1, k // 2 + 1):
        for code in range(p**deg):
            factor = [(code // p**i) % p for i in range(deg)] + [1]
            if _poly_divides(factor, full, p):
                return False
    return True


def _poly_divides(divisor: list[int], poly: list[int], p: int) -> bool:
    rem = list(poly)
    dd = len(divisor) - 1
    for deg in range(len(rem) - 1, dd - 1, -1):
        c = rem[deg]
        if c:
            for i, di in enumerate(divisor):
                rem[deg - dd + i] = (rem[deg - dd + i] - c * di) % p
    return not any(rem[:dd])


@cache
def _first_irreducible(p: int, k: int) -> tuple[int, ...]:
    for code in range(p**k):
        modulus = [(code // p**i) % p for i in range(k)]
        if modulus[0] == 0 and k > 1:
            continue  # divisible by x
        if _has_root_free_factorisation(modulus, p):
            return tuple(modulus)
    raise AssertionError(f"no irreducible polynomial of degree {k} over GF({p})")  # cannot happen


@dataclass(frozen=True)
class GaloisField:
    """The finite field GF(p^k) with the element order documented in the module docstring."""

    p: int
    k: int

    @property
    def order(self) -> int:
        """Number of elements q = p^k."""
        return self.p**self.k

    @cached_property
    def modulus(self) -> tuple[int, ...]:
        """Low-to-high coefficients (a_0 … a_{k-1}) of the monic modulus x^k + Σ a_i x^i."""
        return (0,) if self.k == 1 else _first_irreducible(self.p, self.k)

    def digits(self, a: int) -> list[int]:
        """Coefficient vector of element index a."""
        return [(a // self.p**i) % self.p for i in range(self.k)]

    def index(self, digits: list[int]) -> int:
        """Element index of a coefficient vector."""
        return sum(d * self.p**i for i, d in enumerate(digits))

    def add(self, a: int, b: int) -> int:
        """a + b."""
        return self.index([(x + y) % self.p for x, y in zip(self.digits(a), self.digits(b), strict=False)])

    def sub(self, a: int, b: int) -> int:
        """a − b."""
        return self.index([(x - y) % self.p for x, y in zip(self.digits(a), self.digits(b), strict=False)])

    def mul(self, a: int, b: int) -> int:
        """a · b."""
        if self.k == 1:
            return (a * b) % self.p
        return self.index(_poly_mulmod(self.digits(a), self.digits(b), list(self.modulus), self.p))

    @cached_property
    def squares(self) -> frozenset[int]:
        """The nonzero squares (quadratic residues)."""
        return frozenset(self.mul(a, a) for a in range(1, self.order))

    def chi(self, a: int) -> int:
        """Quadratic character: 0 for 0, +1 for a nonzero square, −1 otherwise."""
        if a == 0:
            return 0
        return 1 if a in self.squares else -1


def galois_field(q: int) -> GaloisField:
    """The field with q elements; raises UserError when q is not a prime power."""
    pk = prime_power(q)
    if pk is None:
        raise UserError(f"GF({q}) does not exist: {q} is not a prime power")
    return GaloisField(*pk)
