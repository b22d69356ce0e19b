"""STRING (Schenck et al. 2025, arXiv 2502.02562), from the paper's equations (no official code): Cayley-STRING,
RoPE in a learned orthogonal basis R(m) = P·RoPE(m)·Pᵀ with P = Cayley(S), and Circulant-STRING, exp(m·(C - Cᵀ))
with C a learned circulant matrix."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from hdrope import HDRotary
from hdrope.errors import UserError
from hdrope.rotary import check_rotary
from trainer.model.encodings.base import EncodingShape, PositionModule, kv_group, rope_freqs
from trainer.model.encodings.generator import GeneratorRotary
from trainer.model.encodings.kind import EncodingKind, identity_row, ladder_frequencies, problems_of
from trainer.model.encodings.learned_basis import orthogonal
from trainer.model.encodings.liere import generator_flops
from trainer.model.encodings.rotary import RotaryTable

VARIANTS = ("cayley", "circulant")


@dataclass
class STRINGConfig:
    """STRING. Cayley: P·R(m)·Pᵀ, P = (I - S)⁻¹(I + S) learned per layer (and KV head), S = A - Aᵀ, A from 0; R is
    RoPE (rotation_dim 2), or HD-RoPE's identity-basis rotation at rotation_dim N (each frequency on N/2 pairs),
    so HD-RoPE with any fixed basis is STRING with P = its fold matrix. Circulant: exp(m·(C - Cᵀ)), C circulant."""

    kind: str = "string"
    variant: str = "cayley"  # cayley | circulant
    theta: float = 10000.0
    rotation_dim: int = 2  # Cayley's inner rotation block size: 2 is RoPE (circulant: 2 only)
    per_head: bool = False  # one P (or C) per KV head (default: one per layer)


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
        self.group = kv_group(s.n_heads, s.n_kv_heads)
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


def circulant_init(head_dim: int, theta: float) -> torch.Tensor:
    """First row c whose C - Cᵀ turns Fourier mode k (1 <= k < d/2) at RoPE's frequency θ^(-2(k-1)/d)."""
    omega = rope_freqs(theta, head_dim // 2)[: head_dim // 2 - 1]
    k = torch.arange(1, head_dim // 2, dtype=torch.float64)
    lag = torch.arange(head_dim, dtype=torch.float64)
    return (omega / head_dim * torch.sin(2 * math.pi * lag[:, None] * k / head_dim)).sum(-1)


class CirculantSTRING(GeneratorRotary):
    """Circulant-STRING on token positions: R(m) = exp(m·(C - Cᵀ)), C[i, j] = c[(j - i) mod d], c learned per layer
    (and KV head). Circulant matrices commute and share the Fourier eigenbasis, so this is RoPE in a fixed real
    Fourier basis with learned frequencies 2·Im(ĉ_k): d/2 - 1 of them, plus two unrotated modes (k = 0, d/2).
    c starts at RoPE's d/2 - 1 fastest frequencies (the paper's init is not stated in the equations we follow)."""

    def __init__(self, pe: STRINGConfig, s: EncodingShape) -> None:
        super().__init__(s.head_dim, s.head_dim, s.n_heads, s.n_kv_heads, 1.0)
        heads = s.n_kv_heads if pe.per_head else 1
        self.c = nn.Parameter(circulant_init(s.head_dim, pe.theta).float().expand(s.n_layers, heads, -1).clone())
        lag = torch.arange(s.head_dim)
        self.register_buffer("lags", (lag[None, :] - lag[:, None]) % s.head_dim, persistent=False)

    def generator(self, layer, dtype=torch.float64):
        circ = self.c[layer].to(dtype)[:, self.lags]  # (heads, d, d)
        return (circ - circ.transpose(-1, -2)).unsqueeze(1)


def _build(pe: STRINGConfig, s: EncodingShape) -> PositionModule:
    return CirculantSTRING(pe, s) if pe.variant == "circulant" else CayleySTRING(pe, s)


def _hf_rotary(pe: STRINGConfig, s: EncodingShape) -> HDRotary:
    if pe.variant == "circulant":
        raise UserError("model.pe.variant='circulant' is not exportable to HF Llama: its frequencies are learned per "
                        "layer, while HF Llama has one inv_freq list for every layer and head; Cayley-STRING is")
    return inner_rotary(pe, s, None)


def _problems(pe: STRINGConfig, s: EncodingShape) -> list[str]:
    if pe.variant not in VARIANTS:
        return [f"model.pe.variant={pe.variant!r}: choose one of {list(VARIANTS)}"]
    if pe.variant == "circulant" and (pe.rotation_dim != 2 or s.head_dim < 4 or s.head_dim % 2):
        return [f"model.pe.variant='circulant' takes rotation_dim 2 (got {pe.rotation_dim!r}) and an even head_dim "
                f">= 4 (got {s.head_dim}); use variant=cayley for an HD-RoPE rotation"]
    n = pe.rotation_dim
    if isinstance(n, bool) or not isinstance(n, int) or n < 2 or n % 2 or s.head_dim % n:
        return [f"model.pe.rotation_dim={n!r}: must be an even integer >= 2 dividing head_dim={s.head_dim} "
                "(2: RoPE inside the learned basis)"]
    return problems_of("string", lambda: check_rotary(s.head_dim, n, pe.theta, "identity", 0, None, s.max_seq_len))


def _label(pe: STRINGConfig) -> str:
    return str(pe.variant).capitalize() + "-STRING" + (f" {pe.rotation_dim}D" if pe.rotation_dim != 2 else "") + (
        " (per head)" if pe.per_head else "")


def _params(pe: STRINGConfig, s: EncodingShape) -> int:
    per = s.head_dim if pe.variant == "circulant" else s.head_dim**2
    return s.n_layers * (s.n_kv_heads if pe.per_head else 1) * per


def _flops(pe: STRINGConfig, s: EncodingShape) -> float:
    if pe.variant == "circulant":
        return generator_flops(s.head_dim, s)
    # Pᵀx and P·(R·Pᵀx) on every head of q and k: 2·2·d² forward, twice that backward
    return 12.0 * s.head_dim**2 * (s.n_heads + s.n_kv_heads) * s.n_layers


KIND = EncodingKind(
    "string", STRINGConfig, _build,
    lambda pe: identity_row("string", _label(pe), int(pe.rotation_dim), f"learned-{pe.variant}", None, pe.theta),
    identity_keys=("variant", "rotation_dim", "per_head"), is_rope=lambda row: False, translation_invariant=True,
    problems=_problems, hf_rotary=_hf_rotary, params=_params, flops=_flops, cost_keys=("variant", "rotation_dim"),
    frequencies=lambda c, s: ladder_frequencies(c.theta, s.head_dim, c.rotation_dim))  # circulant: at init
