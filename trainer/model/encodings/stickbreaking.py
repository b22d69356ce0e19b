"""Stick-breaking attention (Tan et al., ICLR 2025): the softmax replaced by a stick-breaking process over the keys
from the nearest back, with no position encoding; order alone says where a key is."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from trainer.model.encodings.base import PositionModule, compute_dtype
from trainer.model.encodings.kind import EncodingKind, identity_row


@dataclass
class StickBreakingConfig:
    """Stick-breaking as the official code's model layer: β_ij = σ(q_i·k_j/√d) over the keys before the query
    (`attend_current` false), and the weight left over goes to the query's own value."""

    kind: str = "stickbreaking"


def stick_breaking_weights(logits: torch.Tensor, past: int) -> torch.Tensor:
    """Weights (batch, heads, seq, past + seq), rows summing to 1, of queries at positions past.. over keys 0..
    (float32, float64 for float64 logits): A_ij = β_ij Π_{j<t<i} (1 - β_it) for j < i, β = σ(logits), and
    A_ii = Π_{t<i} (1 - β_it), the stick left over (the official model adds it times the query's own value)."""
    s, kv = logits.shape[-2], logits.shape[-1]
    earlier = torch.ones(s, kv, dtype=torch.bool, device=logits.device).tril(diagonal=past - 1)  # key j < query i
    z = logits.to(compute_dtype(logits.dtype))
    log_beta = F.logsigmoid(z).masked_fill(~earlier, float("-inf"))
    log_rest = F.logsigmoid(-z).masked_fill(~earlier, 0.0)  # log(1 - β), 0 where no key breaks the stick
    between = log_rest.flip(-1).cumsum(-1).flip(-1) - log_rest  # Σ over the keys after j, up to the query
    weights = torch.exp(log_beta + between)
    left = torch.exp(log_rest.sum(-1, keepdim=True))  # Π over every earlier key of (1 - β)
    own = torch.arange(past, past + s, device=logits.device).view(s, 1).expand(*weights.shape[:-1], 1)
    return weights.scatter(-1, own, left)


class StickBreaking(PositionModule):
    """Attention weights by stick-breaking (`stick_breaking_weights`) over the logits q·k/√d: each query breaks off
    σ(logit) of what is left for its nearest earlier key, then the next, and keeps the rest for its own value. Its
    own attention: (batch, heads, seq, kv_len) floats several times over per layer, no fused kernel. Nothing reads
    absolute positions, so shifting every position changes nothing."""

    own_attention = True

    def weights(self, q, k, past, layer=0, state=None):
        return stick_breaking_weights(self.logits(q, k, past, layer), past)


NO_EXPORT = "it replaces the softmax by stick-breaking over the keys, which HF Llama's attention cannot express"

KIND = EncodingKind(
    "stickbreaking", StickBreakingConfig, lambda c, s: StickBreaking(),
    lambda pe: identity_row("stickbreaking", "Stick-breaking", 0, "none", None, None),
    identity_keys=(), is_rope=lambda row: False, no_export=NO_EXPORT, translation_invariant=True, tables=False)
