"""PoPE (arXiv 2509.10534): polar coordinates, magnitude from content and phase from position; q and k become
2·head_dim real channels (v keeps head_dim), from the paper's equations and the PoPE-pytorch package."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from trainer.model.encodings.base import EncodingShape, PhaseTable, PositionModule
from trainer.model.encodings.kind import EncodingKind, identity_row, problems_of
from trainer.model.encodings.rotary import check_theta


@dataclass
class PoPEConfig:
    """PoPE: channel c of q and k is the complex number softplus(x_c)·e^{i·m·θ_c}, θ_c = theta^(-c/d), c < d;
    a learned phase bias δ ∈ [-2π, 0] per layer, head and channel (zero at start) shifts the keys' phases."""

    kind: str = "pope"
    theta: float = 10000.0


class PoPE(PositionModule):
    """q'·k' = Σ_c softplus(q_c)·softplus(k_c)·cos((m - n)·θ_c - δ_c), scaled by 1/√head_dim.

    Real form: q' = [μ·cos φ, μ·sin φ] (2d channels). The package puts δ on the keys (phase n·θ + δ); here it
    sits on the queries with the opposite sign (phase m·θ - δ), the same logits, so δ can be per query head while
    the keys stay shared by their GQA group. δ is clamped to [-2π, 0] when used, as the package does."""

    widens = True

    def __init__(self, pe: PoPEConfig, s: EncodingShape) -> None:
        super().__init__()
        d = s.head_dim
        self.phases = PhaseTable(check_theta(pe.theta) ** (-torch.arange(d, dtype=torch.float64) / d),
                                 s.max_seq_len)
        self.bias = nn.Parameter(torch.zeros(s.n_layers, s.n_heads, d))

    def softmax_scale(self, width):
        return (width // 2) ** -0.5

    def tables(self, positions, dtype, length=None):
        return self.phases.lookup(positions, dtype, length)

    @staticmethod
    def _polar(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        mag = F.softplus(x.to(cos.dtype))
        return torch.cat((mag * cos, mag * sin), dim=-1).to(x.dtype)

    def rotate(self, q, k, tables, layer=0):
        cos, sin = tables  # (batch or 1, 1, seq, d)
        delta = self.bias[layer].to(cos.dtype).clamp(-2 * torch.pi, 0.0)[None, :, None, :]  # (1, heads, 1, d)
        # cos(φ - δ), sin(φ - δ) on the queries
        dc, ds = torch.cos(delta), torch.sin(delta)
        return self._polar(q, cos * dc + sin * ds, sin * dc - cos * ds), self._polar(k, cos, sin)


KIND = EncodingKind(
    "pope", PoPEConfig, PoPE, lambda pe: identity_row("pope", "PoPE", 2, "polar", None, pe.theta), identity_keys=(),
    is_rope=lambda row: False,
    no_export=("its q and k are 2·head_dim polar vectors with softplus magnitudes, not rotations of q and k"),
    translation_invariant=True,
    problems=lambda c, s: problems_of("pope", lambda: check_theta(c.theta)),
    params=lambda c, s: s.n_layers * s.n_heads * s.head_dim)
