"""RoPE (Su et al.): HD-RoPE at N = 2 with the identity basis, through the hdrope library."""

from __future__ import annotations

from hdrope import HDRotary
from hdrope.rotary import check_rotary
from trainer.model.encodings.base import EncodingShape, PositionModule
from trainer.model.encodings.kind import EncodingKind, identity_row, ladder_frequencies, problems_of, scaling_text
from trainer.model.encodings.rotary import (
    SCALING_LENGTH,
    HDRotaryEncoding,
    PEConfig,
    canonical_rope,
    ignored_field_problems,
)


def _rotary(cfg: PEConfig, s: EncodingShape, fused: bool | None = None) -> HDRotary:
    # max_position fills the scaling keys HF takes from the model config
    return HDRotary(s.head_dim, 2, cfg.theta, basis="identity", scaling=cfg.scaling, fused=fused,
                    max_position=s.max_seq_len)


def _build(cfg: PEConfig, s: EncodingShape) -> PositionModule:
    return HDRotaryEncoding(_rotary(cfg, s, cfg.fused), s.max_seq_len)


def _problems(cfg: PEConfig, s: EncodingShape) -> list[str]:
    return ignored_field_problems(cfg, "rope", ("basis", "rotation_dim")) + problems_of(
        "rope", lambda: check_rotary(s.head_dim, 2, cfg.theta, "identity", 0, cfg.scaling, s.max_seq_len))


KIND = EncodingKind(
    "rope", PEConfig, _build,
    identity=lambda pe: identity_row("rope", "RoPE", 2, "identity", None, pe.theta, scaling_text(pe.scaling)),
    identity_keys=(), is_rope=lambda row: True, translation_invariant=True, dedup=canonical_rope,
    problems=_problems, hf_rotary=_rotary, cost_keys=("rotation_dim", "fused"),
    frequencies=lambda c, s: ladder_frequencies(c.theta, s.head_dim, 2), lengths=(SCALING_LENGTH,))
