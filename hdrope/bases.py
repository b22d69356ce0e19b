"""Orthogonal mixing bases Q and the block generator K = Q·J·Qᵀ they induce.

Registry of basis kinds (`BASIS_KINDS`), each a function ``(n, seed) -> Q`` returning an
orthogonal float64 n×n matrix. A block of HD-RoPE rotates by R_N(m) = Q·R_pair(m)·Qᵀ
(the paper's Algorithm 2), i.e. R_N(m) = cos(mθ)·I + sin(mθ)·K with K = Q·J·Qᵀ, where
J[2i, 2i+1] = −1 and J[2i+1, 2i] = +1 pairs block coordinates (0,1), (2,3), ….
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from hdrope.conference import conference_matrix, paley_orders
from hdrope.errors import UserError

__all__ = [
    "BASIS_KINDS",
    "BasisReport",
    "basis_generator",
    "block_generator",
    "describe_basis",
    "mixing_basis",
    "pair_generator",
]


def _identity(n: int, seed: int) -> np.ndarray:
    return np.eye(n)


def _random(n: int, seed: int) -> np.ndarray:
    """Haar-distributed orthogonal matrix: Gram–Schmidt (QR with positive diag R) of a PCG64 Gaussian.

    The Gaussian comes from numpy's PCG64; the orthogonalisation runs in Python floats with
    correctly rounded sums (math.fsum), so the bits do not depend on the BLAS or platform.
    """
    g = np.random.Generator(np.random.PCG64(seed)).standard_normal((n, n))
    cols: list[list[float]] = []
    for j in range(n):
        v = [float(g[i, j]) for i in range(n)]
        for _ in range(2):  # two passes of modified Gram–Schmidt keep orthogonality at 1e-16
            for u in cols:
                dot = math.fsum(a * b for a, b in zip(u, v, strict=False))
                v = [a - dot * b for a, b in zip(v, u, strict=False)]
        norm = math.sqrt(math.fsum(a * a for a in v))
        cols.append([a / norm for a in v])
    return np.array(cols, dtype=np.float64).T


def _paley(n: int, seed: int) -> np.ndarray:
    return conference_matrix(n).astype(np.float64) / math.sqrt(n - 1)


def _hadamard(n: int, seed: int) -> np.ndarray:
    if n < 1 or n & (n - 1):
        raise UserError(f"basis 'hadamard' (Sylvester) needs n a power of 2, got n={n}")
    h = np.ones((1, 1))
    while h.shape[0] < n:
        h = np.block([[h, h], [h, -h]])
    return h / math.sqrt(n)


def _dct(n: int, seed: int) -> np.ndarray:
    k = np.arange(n)[:, None]
    i = np.arange(n)[None, :]
    q = np.sqrt(2.0 / n) * np.cos(np.pi * (2 * i + 1) * k / (2 * n))
    q[0] /= math.sqrt(2.0)
    return q


BASIS_KINDS: dict[str, Callable[[int, int], np.ndarray]] = {
    "identity": _identity,
    "random": _random,
    "paley": _paley,
    "hadamard": _hadamard,
    "dct": _dct,
}


def mixing_basis(kind: str, n: int, seed: int = 0) -> np.ndarray:
    """The orthogonal n×n float64 basis of the given kind; UserError for unknown kinds or orders."""
    if kind not in BASIS_KINDS:
        raise UserError(f"unknown basis {kind!r}; choose one of {sorted(BASIS_KINDS)}")
    if not isinstance(n, (int, np.integer)) or isinstance(n, bool) or n < 1:
        raise UserError(f"basis order must be a positive integer, got {n!r}")
    if kind == "paley":
        try:
            return _paley(int(n), seed)
        except UserError as err:
            raise UserError(f"basis 'paley': {err}; orders ≤ 64: {paley_orders(64)}") from None
    return BASIS_KINDS[kind](int(n), int(seed))


def pair_generator(n: int) -> np.ndarray:
    """J: the generator of pairwise rotations over pairs (0,1), (2,3), … of an even n."""
    if n % 2:
        raise UserError(f"rotation dimension must be even, got {n}")
    j = np.zeros((n, n))
    for i in range(0, n, 2):
        j[i, i + 1] = -1.0
        j[i + 1, i] = 1.0
    return j


def block_generator(q: np.ndarray) -> np.ndarray:
    """K = Q·J·Qᵀ, made exactly skew-symmetric with round-off zeros cleared; R_N(m) = cos·I + sin·K."""
    k = q @ pair_generator(q.shape[0]) @ q.T
    k = 0.5 * (k - k.T)
    k[np.abs(k) < 1e-14] = 0.0
    return k


def basis_generator(kind: str, n: int, seed: int = 0) -> np.ndarray:
    """K for a named basis; Paley's is computed in integers, C·J·Cᵀ/(n−1), so it is exact."""
    if kind == "paley":
        mixing_basis(kind, n, seed)  # validates the order
        c = conference_matrix(n).astype(np.float64)
        return (c @ pair_generator(n) @ c.T) / (n - 1)
    return block_generator(mixing_basis(kind, n, seed))


@dataclass(frozen=True)
class BasisReport:
    """Numerical facts about a basis Q and its generator K."""

    kind: str
    n: int
    orthogonality_error: float  # max |QᵀQ − I|
    det: float
    mu_q: float  # √n · max|Q_ij|, the paper's incoherence
    k_nonzero: int  # entries of K with |K_ij| > 1e-12
    k_nonzero_fraction: float  # k_nonzero / n²
    mu_k: float  # √n · max|K_ij|


def describe_basis(kind: str, n: int, seed: int = 0) -> BasisReport:
    """Orthogonality error, determinant, incoherence μ(Q), and density and μ of K = QJQᵀ."""
    q = mixing_basis(kind, n, seed)
    k = basis_generator(kind, n, seed)
    nz = int((np.abs(k) > 1e-12).sum())
    return BasisReport(
        kind=kind,
        n=n,
        orthogonality_error=float(np.abs(q.T @ q - np.eye(n)).max()),
        det=float(np.linalg.det(q)),
        mu_q=float(math.sqrt(n) * np.abs(q).max()),
        k_nonzero=nz,
        k_nonzero_fraction=nz / n**2,
        mu_k=float(math.sqrt(n) * np.abs(k).max()),
    )
