"""Rotary kinds: RoPE / HD-RoPE (the hdrope library), NoPE, partial RoPE, p-RoPE, xPos and 3D-RPE."""

from __future__ import annotations

import math

import torch

from hdrope import HDRotary
from hdrope.errors import UserError
from hdrope.scaling import is_seq_dependent
from trainer.model.encodings.base import (
    PhaseTable,
    PositionModule,
    compute_dtype,
    positions_bound,
    rope_freqs,
    rotate_pairs,
)


class HDRotaryEncoding(PositionModule):
    """RoPE or HD-RoPE through `hdrope.HDRotary`; cos/sin cached up to the longest position seen
    (recomputed per forward only for length-dependent scaling such as `dynamic`)."""

    def __init__(self, rot: HDRotary, min_len: int) -> None:
        super().__init__()
        self.rot, self.min_len = rot, int(min_len)
        self.register_buffer("cos", torch.empty(0, rot.head_dim), persistent=False)
        self.register_buffer("sin", torch.empty(0, rot.head_dim), persistent=False)
        if not is_seq_dependent(rot.scaling):
            self._extend(self.min_len, self.cos.device)

    def extra_repr(self) -> str:
        return f"cached_len={self.cos.shape[0]}"

    def _extend(self, needed: int, device: torch.device) -> None:
        length = max(self.min_len, 1 << max(needed - 1, 0).bit_length())
        cos, sin = self.rot.cos_sin(torch.arange(length, device=device), torch.float32)
        self.cos, self.sin = cos[0, 0], sin[0, 0]

    def tables(self, positions, dtype, length=None):
        if compute_dtype(dtype) == torch.float64 or is_seq_dependent(self.rot.scaling):
            return self.rot.cos_sin(positions, dtype)
        pos = positions if positions.dim() == 2 else positions.unsqueeze(0)
        needed = positions_bound(pos, length)
        if needed > self.cos.shape[0]:
            self._extend(needed, self.cos.device)
        pos = pos.to(self.cos.device)
        return self.cos[pos].unsqueeze(1), self.sin[pos].unsqueeze(1)

    def rotate(self, q, k, tables, layer=0):
        cos, sin = tables
        return self.rot.apply(q, cos, sin), self.rot.apply(k, cos, sin)


class NoPE(PositionModule):
    """No position encoding: causal attention alone."""


class FrequencyRoPE(PositionModule):
    """NeoX-layout RoPE with an explicit frequency vector over the first `rot_dims` channels.

    Partial RoPE and p-RoPE are this module with different frequency vectors; both are
    translation-invariant (q'·k' depends on m - n only)."""

    def __init__(self, freqs: torch.Tensor, head_dim: int, min_len: int, label: str) -> None:
        super().__init__()
        self.rot_dims, self.head_dim, self.label = 2 * freqs.numel(), head_dim, label
        self.phases = PhaseTable(freqs, min_len)

    def extra_repr(self) -> str:
        return f"{self.label}, rotated_channels={self.rot_dims}/{self.head_dim}"

    def tables(self, positions, dtype, length=None):
        return self.phases.lookup(positions, dtype, length)

    def _one(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        if self.rot_dims == self.head_dim:
            return rotate_pairs(x, cos, sin)
        return torch.cat((rotate_pairs(x[..., : self.rot_dims], cos, sin), x[..., self.rot_dims:]), dim=-1)

    def rotate(self, q, k, tables, layer=0):
        cos, sin = tables
        return self._one(q, cos, sin), self._one(k, cos, sin)


def _fraction(value: float, key: str, allow_zero: bool) -> float:
    low_ok = value >= 0 if allow_zero else value > 0
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (low_ok and value <= 1):
        span = "[0, 1]" if allow_zero else "(0, 1]"
        raise UserError(f"model.pe.{key}={value!r}: must be a number in {span}, e.g. 0.25")
    return float(value)


def check_theta(theta: float) -> float:
    """theta as a float; UserError naming model.pe.theta unless it is a finite number > 1."""
    if isinstance(theta, bool) or not isinstance(theta, (int, float)) or not math.isfinite(theta) or theta <= 1:
        raise UserError(f"model.pe.theta={theta!r}: must be a finite number > 1 (RoPE base, e.g. 10000)")
    return float(theta)


def partial_rope(theta: float, fraction: float, head_dim: int, min_len: int) -> FrequencyRoPE:
    """NeoX partial rotary: frequencies θ^(-2i/r) on the first r = fraction·head_dim channels (r even)."""
    rot = int(head_dim * _fraction(fraction, "fraction", False)) // 2 * 2
    if rot < 2:
        raise UserError(f"model.pe.fraction={fraction!r}: rotates {rot} of {head_dim} channels; need at least 2")
    return FrequencyRoPE(rope_freqs(check_theta(theta), rot // 2), head_dim, min_len, f"fraction={fraction:g}")


def p_rope(theta: float, fraction: float, head_dim: int, min_len: int) -> FrequencyRoPE:
    """p-RoPE: RoPE's frequencies with all but the int(fraction·head_dim/2) highest set to zero."""
    freqs = rope_freqs(check_theta(theta), head_dim // 2)
    freqs[int(_fraction(fraction, "fraction", True) * head_dim // 2):] = 0.0
    return FrequencyRoPE(freqs, head_dim, min_len, f"p={fraction:g}")


class XPos(PositionModule):
    """xPos (Sun et al. 2022): RoPE with q scaled by ζ_i^(m/B) and k by ζ_i^(-n/B), ζ_i = (2i/d + γ)/(1 + γ).

    q'·k' depends on m - n only (the scales multiply to ζ^((m-n)/B)); positions are not centred, so very
    long contexts (m/B in the hundreds) overflow float32."""

    def __init__(self, theta: float, gamma: float, scale_base: float, head_dim: int, min_len: int) -> None:
        super().__init__()
        if not gamma > 0 or not scale_base > 0:
            raise UserError(f"model.pe.gamma={gamma!r} / model.pe.scale_base={scale_base!r}: both must be > 0")
        half = head_dim // 2
        self.phases = PhaseTable(rope_freqs(check_theta(theta), half), min_len)
        zeta = (torch.arange(half, dtype=torch.float64) * 2 / head_dim + gamma) / (1 + gamma)
        self.register_buffer("log_zeta", torch.log(zeta), persistent=False)
        self.scale_base = float(scale_base)

    def extra_repr(self) -> str:
        return f"scale_base={self.scale_base:g}"

    def tables(self, positions, dtype, length=None):
        cos, sin = self.phases.lookup(positions, dtype, length)
        pos = (positions if positions.dim() == 2 else positions.unsqueeze(0)).to(cos.device, torch.float64)
        scale = torch.exp(pos.unsqueeze(-1) / self.scale_base * self.log_zeta.to(cos.device)).unsqueeze(1)
        return cos, sin, scale.to(cos.dtype)

    def rotate(self, q, k, tables, layer=0):
        cos, sin, scale = tables
        return rotate_pairs(q, cos * scale, sin * scale), rotate_pairs(k, cos / scale, sin / scale)


class ChunkPhaseTable(PhaseTable):
    """3D-RPE phases: (p mod c)·θ_i + π/2 - φ_j with φ_j = base^(-j), j = p // c, on every pair i."""

    def __init__(self, freqs: torch.Tensor, min_len: int, chunk: int, phi_base: float) -> None:
        super().__init__(freqs, min_len, prefill=False)
        self.chunk, self.phi_base = int(chunk), float(phi_base)
        self._extend(self.min_len)

    def angles(self, pos: torch.Tensor) -> torch.Tensor:
        chunk_index = torch.div(pos, self.chunk, rounding_mode="floor")
        phi = self.phi_base ** (-chunk_index)
        inner = pos - chunk_index * self.chunk
        return inner.unsqueeze(-1) * self.freqs.to(pos.device) + (math.pi / 2 - phi).unsqueeze(-1)


class RPE3D(FrequencyRoPE):
    """3D-RPE (Ma et al., AAAI 2025) in the paper's form, as a pure q/k transform.

    Position p splits into chunk j = p // c and in-chunk m = p mod c; h' = e^{i m θ}(cos φ_j · h⊥ + sin φ_j · h)
    with h⊥ = (-h², h¹) on every half-split pair and φ_j = base^(-j), i.e. a rotation by m·θ_i + π/2 - φ_j.
    Within one chunk it is RoPE (the π/2 cancels in q·k); across chunks it is not translation-invariant.
    The official code instead runs dual-chunk attention (intra/successive/inter-chunk flash-attention calls
    merged by log-sum-exp) around this rotation; the lab implements the paper's formula only."""

    def __init__(self, theta: float, chunk_size: int, phi_base: float, head_dim: int, min_len: int) -> None:
        # chunk_size and phi_base are checked by the kind registry (trainer.model.position) before building
        super().__init__(rope_freqs(check_theta(theta), head_dim // 2), head_dim, min_len,
                         f"chunk_size={chunk_size}, phi_base={phi_base:g}")
        self.phases = ChunkPhaseTable(self.phases.freqs, min_len, chunk_size, phi_base)
