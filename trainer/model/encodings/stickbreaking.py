"""Stick-breaking attention (Tan et al., ICLR 2025): the softmax replaced by a stick-breaking process over the keys
from the nearest back, with no position encoding; order alone says where a key is."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from trainer.model.encodings.base import PositionModule
from trainer.model.encodings.kind import EncodingKind, identity_row


@dataclass
class StickBreakingConfig:
    """Stick-breaking as the official code's model layer: β_ij = σ(q_i·k_j/√d) over the keys before the query
    (`attend_current` false), and the weight left over goes to the query's own value."""

    kind: str = "stickbreaking"


def stick_breaking_scores(logits: torch.Tensor, earlier: torch.Tensor, carry: torch.Tensor | None
                          ) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-weights of one tile of keys and the carry past it: A_ij = β_ij Π_{j<t<i} (1 - β_it) over the earlier
    keys j (`earlier`, visible and before the query; -inf elsewhere), β = σ(logits), with `carry` the sum of
    log(1 - β_it) over the later keys already passed (None: none); the new carry adds this tile's."""
    log_beta = F.logsigmoid(logits).masked_fill(~earlier, float("-inf"))
    log_rest = F.logsigmoid(-logits).masked_fill(~earlier, 0.0)  # log(1 - β), 0 where no key breaks the stick
    between = log_rest.flip(-1).cumsum(-1).flip(-1) - log_rest  # Σ over this tile's keys after j, up to the query
    total = log_rest.sum(-1)
    if carry is not None:
        between, total = between + carry[..., None], total + carry
    return log_beta + between, total


class StickBreaking(PositionModule):
    """Attention weights by stick-breaking over the logits q·k/√d: each query breaks off σ(logit) of what is left for
    its nearest earlier key, then the next, and keeps the rest, Π over its earlier keys of (1 - β), for its own
    value (`self_weight`). Tiles come from the query back, so a tile's carry is the log of the stick its later keys
    left. Nothing reads absolute positions, so shifting every position changes nothing."""

    carries = True

    normalised = False

    def tile_scores(self, t, carry=None):
        logits = t.qk() * self.softmax_scale(t.q.shape[-1])
        return stick_breaking_scores(logits, t.earlier(), carry)

    def self_weight(self, carry):
        return torch.exp(carry)


NO_EXPORT = "it replaces the softmax by stick-breaking over the keys, which HF Llama's attention cannot express"

KIND = EncodingKind(
    "stickbreaking", StickBreakingConfig, lambda c, s: StickBreaking(),
    lambda pe: identity_row("stickbreaking", "Stick-breaking", 0, "none", None, None),
    identity_keys=(), is_rope=lambda row: False, no_export=NO_EXPORT, translation_invariant=True, tables=False)
