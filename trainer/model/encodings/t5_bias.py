"""T5 relative position bias (Raffel et al. 2020), causal: a learned scalar per head and distance bucket."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from trainer.model.encodings.base import EncodingShape
from trainer.model.encodings.bias import (
    NO_BIAS_EXPORT,
    LayerBias,
    bias_identity,
    distance,
    generator,
    int_problem,
    table_count,
)
from trainer.model.encodings.kind import EncodingKind


@dataclass
class T5BiasConfig:
    """T5's bucketed relative bias, unidirectional (a decoder's): exact buckets for short distances, log-spaced
    buckets up to max_distance, one bucket beyond; shared by every layer as in T5 unless `shared` is false."""

    kind: str = "t5_bias"
    num_buckets: int = 32
    max_distance: int = 128
    shared: bool = True
    seed: int = 0  # seed of the N(0, (heads·head_dim)^-1/2) init


def t5_bucket(dist: torch.Tensor, num_buckets: int, max_distance: int) -> torch.Tensor:
    """T5's causal bucket of each distance n = i - j >= 0 (int64): n itself below num_buckets // 2 (`exact`),
    else exact + ⌊log(n/exact) / log(max_distance/exact) · (num_buckets - exact)⌋ capped at num_buckets - 1.

    The log is taken in float32 and divided by a float64 constant, as transformers does, so that the bucket ids
    agree exactly at the boundaries."""
    exact = num_buckets // 2
    n = dist.to(torch.int64)
    scaled = torch.log(n.clamp(min=exact).float() / exact) / math.log(max_distance / exact) * (num_buckets - exact)
    far = (exact + scaled.to(torch.int64)).clamp(max=num_buckets - 1)
    return torch.where(n < exact, n, far)


class T5Bias(LayerBias):
    """bias_h(i, j) = W[bucket(i - j), h], W (tables, num_buckets, heads) initialised N(0, (heads·head_dim)^-1/2)
    like transformers' T5; translation-invariant. Added to the scaled logits (T5 itself does not scale q·k)."""

    def __init__(self, num_buckets: int, max_distance: int, shared: bool, seed: int, shape: EncodingShape) -> None:
        super().__init__(shape.n_layers, shape.n_heads, shared)
        self.num_buckets, self.max_distance = int(num_buckets), int(max_distance)
        std = (shape.n_heads * shape.head_dim) ** -0.5
        init = torch.randn(self.tables_count, self.num_buckets, shape.n_heads, generator=generator(seed)) * std
        self.weight = nn.Parameter(init)

    def extra_repr(self) -> str:
        return f"buckets={self.num_buckets}, max_distance={self.max_distance}, shared={self.shared}"

    def head_bias(self, head, query, key, layer):
        buckets = t5_bucket(distance(query, key), self.num_buckets, self.max_distance)
        return self.weight[self.table(layer)][buckets, head].float()

    def bias(self, query, key, layer):  # one gather of every head's row, not one per head
        buckets = t5_bucket(distance(query, key), self.num_buckets, self.max_distance)  # (batch or 1, 1, q, k)
        return self.weight[self.table(layer)][buckets[:, 0]].permute(0, 3, 1, 2).float()


def _problems(pe: T5BiasConfig, s: EncodingShape) -> list[str]:
    problem = int_problem(pe.num_buckets, "num_buckets", 2, 32)
    if problem:
        return [problem]
    if isinstance(pe.max_distance, bool) or not isinstance(pe.max_distance, int) or pe.max_distance < pe.num_buckets:
        return [f"model.pe.max_distance={pe.max_distance!r}: must be an integer >= model.pe.num_buckets="
                f"{pe.num_buckets} (half the buckets are exact distances, the rest log-spaced up to max_distance), "
                f"e.g. {4 * pe.num_buckets}"]
    return []


def _label(pe: T5BiasConfig) -> str:
    default = T5BiasConfig()
    if (pe.num_buckets, pe.max_distance) == (default.num_buckets, default.max_distance):
        return "T5 bias"
    return f"T5 bias ({pe.num_buckets} buckets, max {pe.max_distance})"


KIND = EncodingKind(
    "t5_bias", T5BiasConfig, lambda c, s: T5Bias(c.num_buckets, c.max_distance, c.shared, c.seed, s),
    lambda pe: bias_identity("t5_bias", _label(pe), pe, default_shared=True),
    identity_keys=("num_buckets", "max_distance", "shared"), is_rope=lambda row: False, no_export=NO_BIAS_EXPORT,
    translation_invariant=True, problems=_problems, tables=False,
    params=lambda c, s: table_count(c, s.n_layers) * c.num_buckets * s.n_heads)
