"""HD-RoPE with a learned basis: Q per layer (optionally per KV head), exactly orthogonal by construction."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from hdrope.bases import basis_generator
from hdrope.errors import UserError
from trainer.model.encodings.base import EncodingShape, PhaseTable, PositionModule
from trainer.model.encodings.kind import EncodingKind, identity_row, ladder_frequencies, problems_of
from trainer.model.encodings.rotary import check_theta

PARAMETERISATIONS = ("expm", "cayley")


@dataclass
class LearnedBasisConfig:
    """HD-RoPE whose basis Q is learned per layer (optionally per KV head), kept exactly orthogonal."""

    kind: str = "learned_basis"
    rotation_dim: int = 4
    theta: float = 10000.0
    init: str = "paley"  # identity | paley | random | hadamard | dct: the starting basis
    seed: int = 0  # seed of a random init
    per_head: bool = False
    parameterisation: str = "expm"  # expm | cayley


def orthogonal(a: torch.Tensor, how: str) -> torch.Tensor:
    """An exactly orthogonal matrix from an unconstrained square one: expm(S) or Cayley (I - S)^-1 (I + S),
    S = A - Aᵀ skew-symmetric; both are the identity at A = 0."""
    s = a - a.transpose(-1, -2)
    if how == "expm":
        return torch.linalg.matrix_exp(s)
    eye = torch.eye(a.shape[-1], dtype=a.dtype, device=a.device).expand_as(s)
    return torch.linalg.solve_ex(eye - s, eye + s).result  # I - S is invertible for skew S: no check, no sync


class LearnedBasis(PositionModule):
    """Each N-channel block (channels j, j + d/N, …) turns as cos(mθ_j)·I + sin(mθ_j)·K with K = U K₀ Uᵀ.

    K₀ = Q₀ J Q₀ᵀ is the hdrope generator of the initial basis (identity, paley, random, …) and U = orth(A)
    a learned rotation per layer (and per KV head when per_head), A a parameter initialised at zero, so the
    model starts exactly at HD-RoPE with that basis. K stays skew with K² = -I, so the transform is an exact
    rotation and q'·k' depends on m - n only."""

    def __init__(self, rotation_dim: int, theta: float, init: str, seed: int, per_head: bool, how: str,
                 shape: EncodingShape) -> None:
        super().__init__()
        n, d = rotation_dim, shape.head_dim  # checked by the kind's problems before building
        k0 = torch.from_numpy(basis_generator(init, n, seed)).float()
        self.n, self.init, self.how, self.group = n, init, how, shape.n_heads // shape.n_kv_heads
        self.register_buffer("k0", k0)  # the starting generator, saved with the checkpoint
        heads = shape.n_kv_heads if per_head else 1
        self.a = nn.Parameter(torch.zeros(shape.n_layers, heads, n, n))
        self.phases = PhaseTable(check_theta(theta) ** (-torch.arange(d // n, dtype=torch.float64) * n / d),
                                 shape.max_seq_len)

    def extra_repr(self) -> str:
        return f"rotation_dim={self.n}, init={self.init!r}, parameterisation={self.how!r}, heads={self.a.shape[1]}"

    def generator(self, layer: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """K for layer: (heads or 1, N, N) in dtype."""
        u = orthogonal(self.a[layer].to(dtype), self.how)
        return u @ self.k0.to(dtype) @ u.transpose(-1, -2)

    def tables(self, positions, dtype, length=None):
        cos, sin = self.phases.lookup(positions, dtype, length)  # (b, 1, s, d/N)
        return cos.unsqueeze(-2), sin.unsqueeze(-2)  # broadcast over the N block coordinates

    def _one(self, x: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, h, s, d = x.shape
        xb = x.to(cos.dtype).reshape(b, h, s, self.n, d // self.n)
        kx = torch.einsum("hmn,bhsnj->bhsmj", k.expand(h, -1, -1), xb)
        return (xb * cos + kx * sin).reshape(b, h, s, d).to(x.dtype)

    def rotate(self, q, k, tables, layer=0):
        cos, sin = tables
        gen = self.generator(layer, cos.dtype)  # (KV heads or 1, N, N)
        gen_q = gen.repeat_interleave(self.group, dim=0) if gen.shape[0] > 1 else gen
        return self._one(q, gen_q, cos, sin), self._one(k, gen, cos, sin)


def _problems(pe: LearnedBasisConfig, s: EncodingShape) -> list[str]:
    n, d, how, init = pe.rotation_dim, s.head_dim, pe.parameterisation, pe.init
    if isinstance(n, bool) or not isinstance(n, int) or n < 2 or n % 2 or d % n:
        return [f"model.pe.rotation_dim={n!r}: must be an even integer >= 2 dividing head_dim={d}"]
    if how not in PARAMETERISATIONS:
        return [f"model.pe.parameterisation={how!r}: choose one of {list(PARAMETERISATIONS)}"]
    try:
        basis_generator(init, n, pe.seed)
    except UserError as err:  # an init kind or order hdrope has no basis for (the seed was checked before)
        return [f"model.pe.init={init!r}: {err}"]
    return problems_of("learned_basis", lambda: check_theta(pe.theta))


def _params(pe: LearnedBasisConfig, s: EncodingShape) -> int:
    return s.n_layers * (s.n_kv_heads if pe.per_head else 1) * pe.rotation_dim**2


def _label(pe: LearnedBasisConfig) -> str:
    return f"{pe.rotation_dim}D learned ({pe.init}{', per head' if pe.per_head else ''})"


KIND = EncodingKind(
    "learned_basis", LearnedBasisConfig,
    lambda c, s: LearnedBasis(c.rotation_dim, c.theta, c.init, c.seed, c.per_head, c.parameterisation, s),
    lambda pe: identity_row("learned_basis", _label(pe), int(pe.rotation_dim), f"learned-{pe.init}",
                            int(pe.seed) if pe.init == "random" else None, pe.theta),
    identity_keys=("rotation_dim", "init", "per_head"), is_rope=lambda row: False, translation_invariant=True,
    dedup=lambda pe: pe if pe.init == "random" else LearnedBasisConfig(**{**vars(pe), "seed": 0}),
    problems=_problems, params=_params,
    # K·x on every N-block of q and k: 2·N·head_dim per head and layer forward, twice that backward
    flops=lambda c, s: 6.0 * c.rotation_dim * s.head_dim * (s.n_heads + s.n_kv_heads) * s.n_layers,
    cost_keys=("rotation_dim",), frequencies=lambda c, s: ladder_frequencies(c.theta, s.head_dim, c.rotation_dim))
