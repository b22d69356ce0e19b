"""ALiBi (Press et al. 2022): a per-head linear distance penalty on the attention logits, no q/k transform."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from trainer.model.encodings.bias import PositionBias
from trainer.model.encodings.kind import EncodingKind, identity_row


@dataclass
class ALiBiConfig:
    """ALiBi: no q/k transform; a per-head linear distance penalty added to the attention logits."""

    kind: str = "alibi"


def alibi_slopes(n_heads: int) -> torch.Tensor:
    """2^(-8h/H) for h = 1..H when H is a power of two; otherwise the slopes of the nearest lower power
    of two n followed by every other slope of 2n (the reference implementation's interpolation)."""

    def power_of_two(n: int) -> list[float]:
        return [2.0 ** (-8.0 * h / n) for h in range(1, n + 1)]

    n = 2 ** math.floor(math.log2(n_heads))
    slopes = power_of_two(n) if n == n_heads else power_of_two(n) + power_of_two(2 * n)[0::2][: n_heads - n]
    return torch.tensor(slopes, dtype=torch.float64)


class ALiBi(PositionBias):
    """Adds -slope_h · (m - n) to the logit of a query at position m on a key at position n (translation-invariant)."""

    def __init__(self, n_heads: int) -> None:
        super().__init__()
        self.heads = int(n_heads)
        self.register_buffer("slopes", alibi_slopes(n_heads).float(), persistent=False)

    def extra_repr(self) -> str:
        return f"heads={self.slopes.numel()}"

    def head_bias(self, head, query, key, layer):
        return -self.slopes[head] * (query - key).to(torch.float32)


KIND = EncodingKind(
    "alibi", ALiBiConfig, lambda c, s: ALiBi(s.n_heads),
    lambda pe: identity_row("alibi", "ALiBi", 0, "none", None, None),
    identity_keys=(), is_rope=lambda row: False, translation_invariant=True, tables=False)
