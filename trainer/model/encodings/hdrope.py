"""HD-RoPE: N-dimensional rotations in a fixed basis (the hdrope library); N = 2 with any basis is RoPE."""

from __future__ import annotations

from hdrope import HDRotary
from hdrope.rotary import check_rotary
from trainer.model.encodings.base import EncodingShape, PositionModule
from trainer.model.encodings.kind import EncodingKind, identity_row, ladder_frequencies, problems_of, scaling_text
from trainer.model.encodings.rotary import SCALING_LENGTH, HDRotaryEncoding, PEConfig, canonical_rope


def _rotary(cfg: PEConfig, s: EncodingShape, fused: bool | None = None) -> HDRotary:
    return HDRotary(s.head_dim, cfg.rotation_dim, cfg.theta, cfg.basis, cfg.seed, cfg.scaling, fused=fused,
                    max_position=s.max_seq_len)


def _build(cfg: PEConfig, s: EncodingShape) -> PositionModule:
    return HDRotaryEncoding(_rotary(cfg, s, cfg.fused), s.max_seq_len)


def _identity(pe: PEConfig) -> dict:
    n, basis = int(pe.rotation_dim), str(pe.basis)
    label = "2D RoPE" if n == 2 and basis == "identity" else f"{n}D {'Paley' if basis == 'paley' else basis}"
    return identity_row("hdrope", label, n, basis, int(pe.seed) if basis == "random" else None, pe.theta,
                        scaling_text(pe.scaling))


def _dedup(pe: PEConfig) -> PEConfig:
    if pe.rotation_dim == 2:
        return canonical_rope(pe)
    return PEConfig(kind="hdrope", rotation_dim=pe.rotation_dim, theta=pe.theta, basis=pe.basis,
                    seed=pe.seed if pe.basis == "random" else 0, scaling=pe.scaling)


def _problems(pe: PEConfig, s: EncodingShape) -> list[str]:
    n = pe.rotation_dim
    if not isinstance(n, int) or isinstance(n, bool) or n < 2 or n % 2:
        return [f"model.pe.rotation_dim={n!r}: must be an even integer >= 2 (the paper uses 2, 4, 8, 32)"]
    if s.head_dim % n:
        return [f"model.pe.rotation_dim={n} does not divide head_dim={s.head_dim}; choose a rotation_dim that "
                f"divides {s.head_dim} (leftover channels are only for direct HDRotary use)"]
    return problems_of("hdrope", lambda: check_rotary(s.head_dim, n, pe.theta, pe.basis, pe.seed, pe.scaling,
                                                      s.max_seq_len))


KIND = EncodingKind(
    "hdrope", PEConfig, _build, _identity, identity_keys=("rotation_dim", "basis"),
    is_rope=lambda row: row["rotation_dim"] == 2,  # any basis (see _dedup)
    translation_invariant=True, dedup=_dedup, problems=_problems, hf_rotary=_rotary,
    cost_keys=("rotation_dim", "fused"),
    frequencies=lambda c, s: ladder_frequencies(c.theta, s.head_dim, c.rotation_dim), lengths=(SCALING_LENGTH,))
