"""xPos (Sun et al. 2022): RoPE with a per-frequency exponential decay on q and its inverse on k."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hdrope.errors import UserError
from trainer.model.encodings.base import EncodingShape, PhaseTable, PositionModule, rope_freqs, rotate_pairs
from trainer.model.encodings.kind import EncodingKind, identity_row, problems_of
from trainer.model.encodings.rotary import check_theta


@dataclass
class XPosConfig:
    """xPos: RoPE with per-frequency exponential decay, scale ζ_i^(m/scale_base) on q and its inverse on k."""

    kind: str = "xpos"
    theta: float = 10000.0
    gamma: float = 0.4
    scale_base: float = 512.0


class XPos(PositionModule):
    """xPos (Sun et al. 2022): RoPE with q scaled by ζ_i^(m/B) and k by ζ_i^(-n/B), ζ_i = (2i/d + γ)/(1 + γ).

    q'·k' depends on m - n only (the scales multiply to ζ^((m-n)/B)); positions are not centred, so very
    long contexts (m/B in the hundreds) overflow float32."""

    def __init__(self, theta: float, gamma: float, scale_base: float, head_dim: int, min_len: int) -> None:
        super().__init__()
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


def _check(pe: XPosConfig) -> None:
    if not pe.gamma > 0 or not pe.scale_base > 0:
        raise UserError(f"model.pe.gamma={pe.gamma!r} / model.pe.scale_base={pe.scale_base!r}: both must be > 0")
    check_theta(pe.theta)


def _problems(pe: XPosConfig, s: EncodingShape) -> list[str]:
    return problems_of("xpos", lambda: _check(pe))


KIND = EncodingKind(
    "xpos", XPosConfig, lambda c, s: XPos(c.theta, c.gamma, c.scale_base, s.head_dim, s.max_seq_len),
    lambda pe: identity_row("xpos", "xPos", 2, "identity", None, pe.theta), identity_keys=(),
    is_rope=lambda row: False, translation_invariant=True, problems=_problems)
