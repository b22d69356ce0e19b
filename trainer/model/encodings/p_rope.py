"""p-RoPE: RoPE's frequencies with all but the highest `fraction` set to zero."""

from __future__ import annotations

from dataclasses import dataclass

from trainer.model.encodings.base import rope_freqs
from trainer.model.encodings.kind import EncodingKind, identity_row, pct, problems_of
from trainer.model.encodings.rotary import FrequencyRoPE, check_fraction, check_theta, fraction_dedup


@dataclass
class PRoPEConfig:
    """p-RoPE: keep the highest-frequency `fraction` of RoPE's frequencies, zero the rest."""

    kind: str = "p_rope"
    theta: float = 10000.0
    fraction: float = 0.75


def p_rope(theta: float, fraction: float, head_dim: int, min_len: int) -> FrequencyRoPE:
    """p-RoPE: RoPE's frequencies with all but the int(fraction·head_dim/2) highest set to zero."""
    freqs = rope_freqs(check_theta(theta), head_dim // 2)
    freqs[int(check_fraction(fraction, "fraction", True) * head_dim // 2):] = 0.0
    return FrequencyRoPE(freqs, head_dim, min_len, f"p={fraction:g}")


def _label(fraction: float) -> str:
    return f"p-RoPE {pct(fraction)}"


KIND = EncodingKind(
    "p_rope", PRoPEConfig, lambda c, s: p_rope(c.theta, c.fraction, s.head_dim, s.max_seq_len),
    lambda pe: identity_row("p_rope", _label(pe.fraction), 2, "identity", None, pe.theta),
    identity_keys=("fraction",), is_rope=lambda row: row["pe_label"] == _label(1.0),  # as fraction_dedup says
    translation_invariant=True, dedup=fraction_dedup,
    problems=lambda c, s: problems_of("p_rope", lambda: (check_theta(c.theta),
                                                         check_fraction(c.fraction, "fraction", True))))
