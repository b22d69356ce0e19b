"""ALiBi (Press et al. 2022): a per-head linear distance penalty on the attention logits, no q/k transform."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from trainer.model.encodings.base import PositionModule
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


class ALiBi(PositionModule):
    """Adds -slope_h · (i - j) to the logit of query position i on key position j (translation-invariant)."""

    def __init__(self, n_heads: int) -> None:
        super().__init__()
        self.register_buffer("slopes", alibi_slopes(n_heads).float(), persistent=False)

    def extra_repr(self) -> str:
        return f"heads={self.slopes.numel()}"

    def bias_key(self, layer):
        return 0  # the same slopes in every layer

    def score_bias(self, q_positions, kv_len, layer=0):
        keys = torch.arange(kv_len, device=q_positions.device, dtype=torch.float32)
        dist = q_positions.to(torch.float32).unsqueeze(-1) - keys  # (seq, kv_len)
        return -self.slopes.to(q_positions.device)[:, None, None] * dist


KIND = EncodingKind(
    "alibi", ALiBiConfig, lambda c, s: ALiBi(s.n_heads),
    lambda pe: identity_row("alibi", "ALiBi", 0, "none", None, None),
    identity_keys=(), is_rope=lambda row: False, translation_invariant=True, tables=False)
