"""GRAPE-M (Zhang et al., ICLR 2026): multiplicative GRAPE with commuting rank-2 generators on the canonical planes,
as the official non-contextual model (`model/llama-mha-grape-m-nonctx.py`, `MSGRAPECommuting`): RoPE's planes with
one learned log-frequency per plane and layer, shared by the heads."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from trainer.model.encodings.base import EncodingShape, PositionModule, compute_dtype, rope_freqs, rotate_pairs
from trainer.model.encodings.bias import positive_problem
from trainer.model.encodings.kind import EncodingKind, identity_row, problems_of
from trainer.model.encodings.rotary import check_theta


@dataclass
class GrapeMConfig:
    """GRAPE-M with the official defaults: frequencies start at RoPE's spectrum for base `theta`, are learned
    (`learnable`), shared by every head of a layer, and stored as log-frequency × `log_freq_scale` (16: the official
    learning-rate scaling of the log-frequencies)."""

    kind: str = "grape_m"
    theta: float = 10000.0
    learnable: bool = True
    log_freq_scale: float = 16.0


class GrapeM(PositionModule):
    """Pair i (channels i, i + d/2) of every head in layer l turns by -m·exp(s[l, i] / scale), s learned from
    scale·log θ^(-2i/d). The official rotation is (x1 cos + x2 sin, -x1 sin + x2 cos), the transpose of RoPE's: at
    its initial spectrum GRAPE-M is RoPE on q and k with their second half negated (the same model, the sign
    absorbed in W_q and W_k). Phases in float32 as the official code (float64 for float64 inputs)."""

    def __init__(self, pe: GrapeMConfig, s: EncodingShape) -> None:
        super().__init__()
        self.scale = float(pe.log_freq_scale)
        start = rope_freqs(check_theta(pe.theta), s.head_dim // 2).log() * self.scale
        self.log_freq = nn.Parameter(start.float().expand(s.n_layers, -1).clone(), requires_grad=bool(pe.learnable))

    def extra_repr(self) -> str:
        return f"log_freq_scale={self.scale:g}, learnable={self.log_freq.requires_grad}"

    def tables(self, positions, dtype, length=None):
        pos = positions if positions.dim() == 2 else positions.unsqueeze(0)
        return pos.to(compute_dtype(dtype))

    def rotate(self, q, k, tables, layer=0):
        freq = torch.exp(self.log_freq[layer].to(tables.dtype) / self.scale)  # (d/2,)
        angles = tables.to(freq.device)[:, None, :, None] * freq  # (batch, 1, seq, d/2)
        cos, sin = torch.cos(angles), torch.sin(angles)
        return rotate_pairs(q, cos, -sin), rotate_pairs(k, cos, -sin)


SPECTRUM_TOLERANCE = 1e-5  # relative: the initial frequencies, read back from their float32 parameter, are RoPE's


def spectrum_error(theta: float, head_dim: int, scale: float) -> float:
    """The largest relative error of the initial frequencies as the module reads them back from their stored
    float32 parameter (scale · log f): 0 up to float32 rounding, 1 where a frequency overflows to 0."""
    want = rope_freqs(theta, head_dim // 2)
    stored = (want.log() * scale).float()
    got = torch.exp(stored.double() / scale)
    return float(((got - want).abs() / want).max())


def _problems(pe: GrapeMConfig, s: EncodingShape) -> list[str]:
    found = problems_of("grape_m", lambda: check_theta(pe.theta))
    found += [p for p in [positive_problem(pe.log_freq_scale, "log_freq_scale", 16.0)] if p]
    if not found:
        err = spectrum_error(pe.theta, s.head_dim, pe.log_freq_scale)
        if not err <= SPECTRUM_TOLERANCE:
            found.append(f"model.pe.log_freq_scale={pe.log_freq_scale!r}: its float32 log-frequencies give back RoPE's "
                         f"initial spectrum only to {err:.2g} relative (over {SPECTRUM_TOLERANCE:g}: overflow or lost "
                         "precision), so the kind is not RoPE at init; use a scale such as the official 16")
    return found


KIND = EncodingKind(
    "grape_m", GrapeMConfig, GrapeM,
    lambda pe: identity_row("grape_m", "GRAPE-M" if pe.learnable else "GRAPE-M frozen", 2, "learned-freqs", None,
                            pe.theta),
    identity_keys=("learnable",), is_rope=lambda row: False,
    no_export=("its frequencies are learned per layer, while HF Llama has one inv_freq list for every layer"),
    translation_invariant=True, problems=_problems, tables=False,
    params=lambda c, s: s.n_layers * (s.head_dim // 2))
