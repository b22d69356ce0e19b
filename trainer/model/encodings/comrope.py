"""ComRoPE (Yu et al., CVPR 2025): trainable commuting angle matrices, as the official code (Longin-Yu/ComRoPE,
`ComRoPEAPAttention` and `ComRoPELDAttention`), on one axis."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from hdrope.errors import UserError
from trainer.model.encodings.base import EncodingShape
from trainer.model.encodings.generator import GeneratorRotary, block_problem
from trainer.model.encodings.kind import EncodingKind, identity_row, problems_of
from trainer.model.encodings.liere import generator_flops

VARIANTS = ("ap", "ld")


@dataclass
class ComRoPEConfig:
    """ComRoPE: block-diagonal skew angle matrices, per layer and KV head; AP (axis-partitioned) or LD (linearly
    dependent: one learned multiplier per block)."""

    kind: str = "comrope"
    variant: str = "ap"  # ap | ld
    block_dim: int = 8  # block_size
    init_std: float = 1.0  # std of the angle-matrix init (official default 1.0)
    seed: int = 0


class ComRoPE(GeneratorRotary):
    """ComRoPE on token positions: block b turns by exp(((m + ½) / L)·A_b) with A_b = F_b - F_bᵀ (AP) or
    μ_b·(F_b - F_bᵀ) (LD), F ~ N(0, init_std²) per layer (each attention has its own) and KV head, μ ~ N(0, 1).

    With one axis the AP mask is all ones, so AP is block LieRE with a normal init, and LD its
    reparameterisation by one scalar per block (shared by the heads, as the official `multiplier`). The
    official grid puts patch i at (i + ½)/n (axis_scale); the ½ cancels in q'·k' and the step 1/L is kept."""

    def __init__(self, pe: ComRoPEConfig, s: EncodingShape) -> None:
        super().__init__(s.head_dim, pe.block_dim, s.n_heads, s.n_kv_heads, 1.0 / s.max_seq_len)
        gen = torch.Generator().manual_seed(int(pe.seed))
        shape = (s.n_layers, s.n_kv_heads, self.n_blocks, pe.block_dim, pe.block_dim)
        self.angles = nn.Parameter(torch.randn(shape, generator=gen) * float(pe.init_std))
        self.multiplier = (nn.Parameter(torch.randn(s.n_layers, 1, self.n_blocks, 1, 1, generator=gen))
                           if pe.variant == "ld" else None)

    def generator(self, layer, dtype=torch.float64):
        f = self.angles[layer].to(dtype)
        skew = f - f.transpose(-1, -2)
        return skew if self.multiplier is None else skew * self.multiplier[layer].to(dtype)


def _check(pe: ComRoPEConfig, s: EncodingShape) -> None:
    if pe.variant not in VARIANTS:
        raise UserError(f"model.pe.variant={pe.variant!r}: choose one of {list(VARIANTS)} (axis-partitioned or "
                        "linearly dependent)")
    problem = block_problem(pe.block_dim, s.head_dim, whole_ok=False)
    if problem:
        raise UserError(problem)
    std = pe.init_std
    if isinstance(std, bool) or not isinstance(std, (int, float)) or not std > 0:
        raise UserError(f"model.pe.init_std={std!r}: must be a number > 0, e.g. 1.0")


def _params(pe: ComRoPEConfig, s: EncodingShape) -> int:
    per_layer = s.n_kv_heads * s.head_dim * pe.block_dim + (s.head_dim // pe.block_dim if pe.variant == "ld" else 0)
    return s.n_layers * per_layer


KIND = EncodingKind(
    "comrope", ComRoPEConfig, ComRoPE,
    lambda pe: identity_row("comrope", f"ComRoPE-{str(pe.variant).upper()} b{pe.block_dim}", int(pe.block_dim),
                            "learned-generator", int(pe.seed), None),
    identity_keys=("variant", "block_dim"), is_rope=lambda row: False,
    no_export=("its rotations exp(m·A) have learned frequencies and bases per layer and head, while HF Llama has "
                   "one inv_freq list for every layer and head"),
    translation_invariant=True,
    problems=lambda c, s: problems_of("comrope", lambda: _check(c, s)), params=_params,
    flops=lambda c, s: generator_flops(c.block_dim, s), cost_keys=("block_dim",))
