"""STRING (Schenck et al. 2025, arXiv 2502.02562) in its Cayley form: RoPE in a learned orthogonal basis,
R(m) = P·RoPE(m)·Pᵀ with P = Cayley(S), from the paper's equations (no official code)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from hdrope import HDRotary
from hdrope.rotary import check_rotary
from trainer.model.encodings.base import EncodingShape, PositionModule
from trainer.model.encodings.kind import EncodingKind, identity_row, problems_of
from trainer.model.encodings.learned_basis import orthogonal
from trainer.model.encodings.rotary import RotaryTable


@dataclass
class STRINGConfig:
    """Cayley-STRING: P·R(m)·Pᵀ, P = (I - S)⁻¹(I + S) learned per layer (and KV head), S = A - Aᵀ, A from 0.

    R is RoPE (rotation_dim 2), or HD-RoPE's identity-basis rotation at rotation_dim N (each frequency on N/2
    pairs): then HD-RoPE with any fixed basis is STRING with P = its fold matrix."""

    kind: str = "string"
    theta: float = 10000.0
    rotation_dim: int = 2  # the inner rotation's block size: 2 is RoPE
    per_head: bool = False  # one P per KV head (default: one per layer)


def inner_rotary(pe: STRINGConfig, s: EncodingShape, fused: bool | None = False) -> HDRotary:
    """R: the identity-basis rotation at pe's rotation dim and θ (RoPE at 2); STRING's exact HF rotary."""
    return HDRotary(s.head_dim, pe.rotation_dim, pe.theta, basis="identity", fused=fused, max_position=s.max_seq_len)


class CayleySTRING(PositionModule):
    """x ↦ P·R(m)·Pᵀ·x per layer; P starts at I (exactly R), stays orthogonal, so q'·k' depends on m - n only.

    The transform is R in the basis P: the model equals the R model with W_q, W_k premultiplied by Pᵀ per
    head, which is how it exports to plain HF Llama RoPE (`fold`)."""

    def __init__(self, pe: STRINGConfig, s: EncodingShape) -> None:
        super().__init__()
        self.phases = RotaryTable(inner_rotary(pe, s), s.max_seq_len)
        self.group = s.n_heads // s.n_kv_heads
        self.a = nn.Parameter(torch.zeros(s.n_layers, s.n_kv_heads if pe.per_head else 1, s.head_dim, s.head_dim))

    def extra_repr(self) -> str:
        return f"rotation_dim={self.phases.rot.rotation_dim}, bases={tuple(self.a.shape[:2])}"

    def fold(self, layer):
        return orthogonal(self.a[layer].double(), "cayley")  # formed in float64, cast by the caller

    def tables(self, positions, dtype, length=None):
        return self.phases.lookup(positions, dtype, length)

    def _one(self, x: torch.Tensor, p: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        xc = x.to(cos.dtype)
        inner = torch.einsum("hji,bhsj->bhsi", p, xc)  # Pᵀx
        return torch.einsum("hij,bhsj->bhsi", p, self.phases.rot.apply(inner, cos, sin)).to(x.dtype)

    def rotate(self, q, k, tables, layer=0):
        cos, sin = tables
        p = self.fold(layer).to(cos.dtype)  # (KV heads or 1, d, d)
        p_q = p.repeat_interleave(self.group, dim=0) if p.shape[0] > 1 else p
        return self._one(q, p_q, cos, sin), self._one(k, p, cos, sin)


def _problems(pe: STRINGConfig, s: EncodingShape) -> list[str]:
    n = pe.rotation_dim
    if isinstance(n, bool) or not isinstance(n, int) or n < 2 or n % 2 or s.head_dim % n:
        return [f"model.pe.rotation_dim={n!r}: must be an even integer >= 2 dividing head_dim={s.head_dim} "
                "(2: RoPE inside the learned basis)"]
    return problems_of("string", lambda: check_rotary(s.head_dim, n, pe.theta, "identity", 0, None, s.max_seq_len))


def _label(pe: STRINGConfig) -> str:
    return "Cayley-STRING" + (f" {pe.rotation_dim}D" if pe.rotation_dim != 2 else "") + (
        " (per head)" if pe.per_head else "")


KIND = EncodingKind(
    "string", STRINGConfig, CayleySTRING,
    lambda pe: identity_row("string", _label(pe), int(pe.rotation_dim), "learned-cayley", None, pe.theta),
    identity_keys=("rotation_dim", "per_head"), is_rope=lambda row: False, translation_invariant=True,
    problems=_problems, hf_rotary=lambda c, s: inner_rotary(c, s, None),
    params=lambda c, s: s.n_layers * (s.n_kv_heads if c.per_head else 1) * s.head_dim**2,
    # Pᵀx and P·(R·Pᵀx) on every head of q and k: 2·2·d² forward, twice that backward
    flops=lambda c, s: 12.0 * s.head_dim**2 * (s.n_heads + s.n_kv_heads) * s.n_layers, cost_keys=("rotation_dim",))
