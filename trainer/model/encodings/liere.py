"""LieRE (Ostmeier et al. 2024, arXiv 2406.10322): rotations exp(m·S) of learned skew-symmetric generators,
as the official code (StanfordMIMI/LieRE, `LierePositionEncoder` with phase_type 'learned'), on one axis."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from trainer.model.encodings.base import EncodingShape
from trainer.model.encodings.generator import GeneratorRotary, block_problem
from trainer.model.encodings.kind import EncodingKind, identity_row


@dataclass
class LieREConfig:
    """LieRE: per block of `block_dim` channels (0: the whole head, the official default) a learned generator."""

    kind: str = "liere"
    block_dim: int = 0  # generator_dim; 0 is head_dim (the official default, 64 = its head size)
    per_layer: bool = False  # rotary_embedding_per_layer (official default False)
    per_head: bool = False  # rotary_embedding_per_head, per KV head here (official default False)
    seed: int = 0  # seed of the U[0, 2π) init


def liere_block(pe: LieREConfig, s: EncodingShape) -> int:
    """The generator size: block_dim, or head_dim when 0."""
    return pe.block_dim or s.head_dim


def liere_skew(raw: torch.Tensor) -> torch.Tensor:
    """The official map from raw parameters to generators: U - Uᵀ with U = triu(raw, 1) (its −0.5 cancels)."""
    upper = torch.triu(raw, diagonal=1)
    return upper - upper.transpose(-1, -2)


class LieRE(GeneratorRotary):
    """LieRE on token positions: block b turns by exp((m / (L - 1))·S_b), S_b = triu(W_b, 1) - triu(W_b, 1)ᵀ.

    W ~ U[0, 2π) (the official init, from RoPE-Mixed's angle range), per layer and per KV head when asked.
    The official code places its grid's n points at linspace(0, 1, n) at the train resolution; on a sequence
    that is position m / (L - 1) for train length L, kept for longer inputs (a fixed step, so relative)."""

    def __init__(self, pe: LieREConfig, s: EncodingShape) -> None:
        block = liere_block(pe, s)
        super().__init__(s.head_dim, block, s.n_heads, s.n_kv_heads, 1.0 / max(s.max_seq_len - 1, 1))
        gen = torch.Generator().manual_seed(int(pe.seed))
        shape = (s.n_layers if pe.per_layer else 1, s.n_kv_heads if pe.per_head else 1, self.n_blocks, block, block)
        self.raw = nn.Parameter(torch.rand(shape, generator=gen) * (2 * math.pi))

    def generator_index(self, layer):
        return layer if self.raw.shape[0] > 1 else 0

    def generator(self, layer, dtype=torch.float64):
        return liere_skew(self.raw[self.generator_index(layer)].to(dtype))


def _problems(pe: LieREConfig, s: EncodingShape) -> list[str]:
    problem = block_problem(pe.block_dim, s.head_dim)
    return [problem] if problem else []


def _params(pe: LieREConfig, s: EncodingShape) -> int:
    block = liere_block(pe, s)
    return (s.n_layers if pe.per_layer else 1) * (s.n_kv_heads if pe.per_head else 1) * s.head_dim * block


def generator_flops(block: int, s: EncodingShape) -> float:
    """R(m)·x on every block of q and k as two products, the low power's then the high power's: 2·2·block·head_dim
    per head and layer forward, twice that backward (the power tables, formed per forward and layer and not per
    token, are left out)."""
    return 12.0 * block * s.head_dim * (s.n_heads + s.n_kv_heads) * s.n_layers


def _label(pe: LieREConfig) -> str:
    flags = [f for f, on in (("per layer", pe.per_layer), ("per head", pe.per_head)) if on]
    return "LieRE" + (f" b{pe.block_dim}" if pe.block_dim else "") + (f" ({', '.join(flags)})" if flags else "")


KIND = EncodingKind(
    "liere", LieREConfig, LieRE,
    lambda pe: identity_row("liere", _label(pe), int(pe.block_dim), "learned-generator", int(pe.seed), None),
    identity_keys=("block_dim", "per_layer", "per_head"), is_rope=lambda row: False,
    no_export=("its rotations exp(m·S) have learned frequencies and bases per generator, while HF Llama has one "
                   "inv_freq list for every layer and head"),
    translation_invariant=True,
    problems=_problems, params=_params,
    flops=lambda c, s: generator_flops(liere_block(c, s), s), cost_keys=("block_dim",))
