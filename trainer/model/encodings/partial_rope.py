"""Partial RoPE (NeoX partial rotary): RoPE on the first `fraction`·head_dim channels, the rest untouched."""

from __future__ import annotations

from dataclasses import dataclass

from hdrope.errors import UserError
from trainer.model.encodings.base import rope_freqs
from trainer.model.encodings.kind import EncodingKind, identity_row, pct, problems_of
from trainer.model.encodings.rotary import FrequencyRoPE, check_fraction, check_theta, fraction_dedup


@dataclass
class PartialRoPEConfig:
    """NeoX partial rotary: RoPE on the first `fraction`·head_dim channels, the rest untouched."""

    kind: str = "partial_rope"
    theta: float = 10000.0
    fraction: float = 0.25


def _rotated(fraction: float, head_dim: int) -> int:
    rot = int(head_dim * check_fraction(fraction, "fraction", False)) // 2 * 2
    if rot < 2:
        raise UserError(f"model.pe.fraction={fraction!r}: rotates {rot} of {head_dim} channels; need at least 2")
    return rot


def partial_rope(theta: float, fraction: float, head_dim: int, min_len: int) -> FrequencyRoPE:
    """NeoX partial rotary: frequencies θ^(-2i/r) on the first r = fraction·head_dim channels (r even)."""
    rot = _rotated(fraction, head_dim)
    return FrequencyRoPE(rope_freqs(check_theta(theta), rot // 2), head_dim, min_len, f"fraction={fraction:g}")


def _label(fraction: float) -> str:
    return f"Partial RoPE {pct(fraction)}"


KIND = EncodingKind(
    "partial_rope", PartialRoPEConfig, lambda c, s: partial_rope(c.theta, c.fraction, s.head_dim, s.max_seq_len),
    lambda pe: identity_row("partial_rope", _label(pe.fraction), 2, "identity", None, pe.theta),
    identity_keys=("fraction",), is_rope=lambda row: row["pe_label"] == _label(1.0),  # as fraction_dedup says
    translation_invariant=True, dedup=fraction_dedup,
    problems=lambda c, s: problems_of("partial_rope", lambda: (_rotated(c.fraction, s.head_dim),
                                                               check_theta(c.theta))))

