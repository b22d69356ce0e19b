"""FoPE: Fourier Position Embedding (Hua et al. 2024), as the official code's defaults."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from hdrope.errors import UserError
from trainer.model.encodings.base import EncodingShape, PhaseTable, PositionModule, rope_freqs, rotate_pairs
from trainer.model.encodings.kind import EncodingKind, identity_row
from trainer.model.encodings.rotary import check_theta


@dataclass
class FoPEConfig:
    """FoPE (Hua et al. 2024) as its official code's defaults."""

    kind: str = "fope"
    theta: float = 10000.0
    sigma: float = 0.3  # Xavier-normal gain of the coefficient noise (official: 0.3 / 0.4 / 0.6 by size)
    learnable: bool = False  # official default: fixed (saved in the checkpoint, not trained)
    seed: int = 0  # seed of the coefficient noise


def fope_frequencies(theta: float, head_dim: int, train_len: int) -> torch.Tensor:
    """RoPE's inverse frequencies with those below 2π/train_len dropped (they cannot finish a period)."""
    freqs = rope_freqs(check_theta(theta), head_dim // 2)
    return freqs[freqs >= 2 * math.pi / train_len]


def step_eye(rows: int, cols: int) -> torch.Tensor:
    """Identity when rows == cols, else E[i·s, i] = 1 with s = ceil(rows/cols) wherever i·s < rows."""
    eye = torch.zeros(rows, cols)
    step = math.ceil(rows / cols)
    for i in range(cols):
        if i * step < rows:
            eye[i * step, i] = 1.0
    return eye


def fope_coefficients(
    n_layers: int, heads: int, d_in: int, d_out: int, sigma: float, gen: torch.Generator
) -> torch.Tensor:
    """(layers, heads, d_in, d_out): step eye + Xavier-normal noise with gain sigma per layer.

    torch's fans for a 3-D (heads, d_in, d_out) tensor give a per-entry std of σ·√(2 / (d_out·(d_in + heads)))."""
    std = sigma * math.sqrt(2.0 / (d_out * d_in + d_out * heads))
    noise = torch.randn(n_layers, heads, d_in, d_out, generator=gen) * std
    return noise + step_eye(d_in, d_out)


class FoPE(PositionModule):
    """FoPE: each pair's phase becomes a learned-at-init Fourier series of the kept frequencies.

    Per layer and KV head, S = sin(tθ)·W_sin and C = cos(tθ)·W_cos over the D kept frequencies (θ_i ≥ 2π/L_train),
    W of shape (D, min(D, head_dim/4)); both padded with 1 up to head_dim/2, duplicated to full width, and
    x' = x·C + rotate_half(x)·S, phases in float32. Because W_sin ≠ W_cos this is neither norm-preserving nor
    translation-invariant (q'·k' has absolute-position terms), and the padded pairs are a fixed √2 × 45° map.
    The coefficients are persistent buffers (fixed, saved in checkpoints, as the official default) or parameters
    when `learnable`. Under grouped-query attention, each query head uses its KV head's coefficients (the
    official code, without GQA, has one set per head)."""

    def __init__(self, theta: float, sigma: float, learnable: bool, seed: int, shape: EncodingShape) -> None:
        super().__init__()
        freqs = fope_frequencies(theta, shape.head_dim, shape.max_seq_len)
        self.d_in, self.d_out, self.half = freqs.numel(), min(freqs.numel(), shape.head_dim // 4), shape.head_dim // 2
        self.group = shape.n_heads // shape.n_kv_heads
        self.phases = PhaseTable(freqs, shape.max_seq_len)
        gen = torch.Generator().manual_seed(int(seed))
        w_sin, w_cos = (fope_coefficients(shape.n_layers, shape.n_kv_heads, self.d_in, self.d_out, sigma, gen)
                        for _ in range(2))
        if learnable:
            self.w_sin, self.w_cos = nn.Parameter(w_sin), nn.Parameter(w_cos)
        else:
            self.register_buffer("w_sin", w_sin)
            self.register_buffer("w_cos", w_cos)

    def extra_repr(self) -> str:
        return f"kept_freqs={self.d_in}, d_out={self.d_out}, learnable={isinstance(self.w_sin, nn.Parameter)}"

    def tables(self, positions, dtype, length=None):
        return self.phases.lookup(positions, dtype, length)

    def _series(self, trig: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        out = torch.einsum("bxsf,hfo->bhso", trig, w.to(trig.dtype))
        pad = out.new_ones(*out.shape[:-1], self.half - self.d_out)
        return torch.cat((out, pad), dim=-1)

    def rotate(self, q, k, tables, layer=0):
        cos, sin = tables
        c, s = self._series(cos, self.w_cos[layer]), self._series(sin, self.w_sin[layer])
        cq, sq = c.repeat_interleave(self.group, dim=1), s.repeat_interleave(self.group, dim=1)
        return rotate_pairs(q, cq, sq), rotate_pairs(k, c, s)


def _problems(pe: FoPEConfig, s: EncodingShape) -> list[str]:
    # the Fourier series has min(kept frequencies, head_dim/4) outputs; it needs at least one of each
    problems = []
    if s.head_dim < 4:
        problems.append(f"head_dim={s.head_dim}: model.pe.kind='fope' needs head_dim >= 4 (its series has head_dim/4 "
                        "terms); raise model.dim (or model.head_dim) or lower model.n_heads")
    try:
        kept = fope_frequencies(pe.theta, s.head_dim, s.max_seq_len).numel()
    except UserError as err:  # a bad theta, named by check_theta
        return [*problems, str(err)]
    if s.head_dim >= 2 and not kept:  # the fastest frequency (1 rad/token) needs 2π positions to finish a period
        problems.append(f"model.max_seq_len={s.max_seq_len}: FoPE keeps only frequencies that finish a period within "
                        f"the train length (θ_i >= 2π/{s.max_seq_len}) and none does; use model.max_seq_len >= "
                        f"{math.ceil(2 * math.pi)}")
    return problems


def _coefficients(pe: FoPEConfig, s: EncodingShape) -> int:
    """Entries of one of W_sin / W_cos over all layers and KV heads."""
    d_in = fope_frequencies(pe.theta, s.head_dim, s.max_seq_len).numel()
    return s.n_layers * s.n_kv_heads * d_in * min(d_in, s.head_dim // 4)


KIND = EncodingKind(
    "fope", FoPEConfig, lambda c, s: FoPE(c.theta, c.sigma, c.learnable, c.seed, s),
    lambda pe: identity_row("fope", "FoPE" + (" learned" if pe.learnable else ""), 2, "fourier", int(pe.seed),
                            pe.theta),
    identity_keys=("learnable",), is_rope=lambda row: False, translation_invariant=False, problems=_problems,
    params=lambda c, s: 2 * _coefficients(c, s) if c.learnable else 0,
    # the two series per token: 2·(d_in·d_out) multiply-adds per KV head and layer each; backward only if learned
    flops=lambda c, s: 4.0 * _coefficients(c, s) * (3 if c.learnable else 1))
