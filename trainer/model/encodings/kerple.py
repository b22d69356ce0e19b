"""KERPLE (Chi et al., NeurIPS 2022): conditionally positive definite kernels of |i - j| as attention biases."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from trainer.model.encodings.base import EncodingShape
from trainer.model.encodings.bias import NO_BIAS_EXPORT, LayerBias, bias_identity, distance, generator, table_count
from trainer.model.encodings.kind import EncodingKind

VARIANTS = ("log", "power")
EPS = 1e-2  # the official code's lower bound on a and p


@dataclass
class KerpleConfig:
    """KERPLE with per-head learned a and p: log (-p·log(1 + a·|i-j|)) or power (-a·|i-j|^p, p <= 2); one
    kernel shared by every layer, as the official code, unless `shared` is false."""

    kind: str = "kerple"
    variant: str = "log"  # log | power
    shared: bool = True
    seed: int = 0  # seed of the uniform init: a ~ U(0, 1), p ~ U(0, 2)


class Kerple(LayerBias):
    """The official code's parameterisation: per head a ~ U(0, 1) and p ~ U(0, 2) at init, projected in place once
    per forward (`tables`) onto a >= 0.01 and 0.01 <= p (<= 2 for power): a projection, not a clamp in the graph,
    so the gradient is that of the projected values. Translation-invariant."""

    def __init__(self, variant: str, shared: bool, seed: int, shape: EncodingShape) -> None:
        super().__init__(shape.n_layers, shape.n_heads, shared)
        self.variant = variant
        gen = generator(seed)
        self.p = nn.Parameter(torch.rand(self.tables_count, shape.n_heads, generator=gen) * 2)
        self.a = nn.Parameter(torch.rand(self.tables_count, shape.n_heads, generator=gen))

    def extra_repr(self) -> str:
        return f"variant={self.variant!r}, shared={self.shared}"

    def tables(self, positions, dtype, length=None):
        self.project()  # once per forward, before any layer reads a and p
        return None

    @torch.no_grad()
    def project(self) -> None:
        """The official projection onto the constraints, applied to the stored values."""
        self.a.clamp_(min=EPS)
        self.p.clamp_(min=EPS, max=2.0 if self.variant == "power" else None)

    def head_bias(self, head, query, key, layer):
        dist = distance(query, key)
        t = self.table(layer)
        a, p = self.a[t][head].float(), self.p[t][head].float()
        if self.variant == "log":
            return -p * torch.log1p(a * dist)
        return -a * dist.pow(p)


def _problems(pe: KerpleConfig, s: EncodingShape) -> list[str]:
    if pe.variant not in VARIANTS:
        return [f"model.pe.variant={pe.variant!r}: choose one of {list(VARIANTS)}"]
    return []


KIND = EncodingKind(
    "kerple", KerpleConfig, lambda c, s: Kerple(c.variant, c.shared, c.seed, s),
    lambda pe: bias_identity("kerple", f"KERPLE {pe.variant}", pe, default_shared=True),
    identity_keys=("variant", "shared"), is_rope=lambda row: False, no_export=NO_BIAS_EXPORT,
    translation_invariant=True, problems=_problems, tables=False,
    params=lambda c, s: 2 * table_count(c, s.n_layers) * s.n_heads)
