"""FoX, the Forgetting Transformer (Lin et al., ICLR 2025): a data-dependent forget gate as the only position
signal. Each layer projects the attention input to one gate per head and token, f_t = σ(w·x_t + b), and the logit
of query i on key j gets the log of the gates between them, Σ_{j<t≤i} log f_t. No q/k rotation."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from trainer.model.attention.call import Prepared
from trainer.model.encodings.base import EncodingShape, PositionModule, compute_dtype
from trainer.model.encodings.bias import generator, positive_problem
from trainer.model.encodings.kind import EncodingKind, identity_row


@dataclass
class FoXConfig:
    """FoX as the official code's default ("full" gate, no RoPE): one gate projection Linear(dim, heads) with a
    bias per layer, weights N(0, init_std) (the official initializer_range 0.02) and biases 0, from `seed`'s own
    generator."""

    kind: str = "fox"
    init_std: float = 0.02
    seed: int = 0


class FoX(PositionModule):
    """logits_ij = q_i·k_j/√d + Σ_{j<t≤i} log σ(w_h·x_t + b_h): forgetting attention. The gates read the attention
    input (`token_state`), one per query head: the official code has no grouped-query attention, and here a KV
    group's query heads each keep their own gate. The decay is a difference of one cumulative sum of the log gates
    over the held keys (`prepare`), so a tile reads it at its queries and keys. Nothing reads absolute positions, so
    shifting every position changes nothing."""

    def __init__(self, init_std: float, seed: int, shape: EncodingShape) -> None:
        super().__init__()
        gen = generator(seed)
        size = (shape.n_layers, shape.n_heads, shape.input_dim)
        self.gate_weight = nn.Parameter(torch.randn(size, generator=gen) * float(init_std))
        self.gate_bias = nn.Parameter(torch.zeros(shape.n_layers, shape.n_heads))

    def extra_repr(self) -> str:
        return f"layers={self.gate_weight.shape[0]}, heads={self.gate_weight.shape[1]}"

    def token_state(self, x, layer=0):
        logit = F.linear(x, self.gate_weight[layer], self.gate_bias[layer])  # (batch, seq, heads)
        return F.logsigmoid(logit.to(compute_dtype(logit.dtype))).transpose(1, 2)  # float32 before the log, as FoX's

    def prepare(self, call, block):
        cum = torch.cumsum(call.state.to(call.dtype), dim=-1)  # (batch, heads, keys)
        return Prepared(queries={"cum": cum[..., -call.q.shape[-2]:]}, keys={"cum": cum})

    def tile_bias(self, t):
        return t.pq["cum"][..., :, None] - t.pk["cum"][..., None, :]

    def score_mod(self, call, prep):
        q_cum, k_cum = prep.queries["cum"], prep.keys["cum"]

        def mod(score, batch, head, q_idx, kv_idx):
            return score + (q_cum[batch, head, q_idx] - k_cum[batch, head, kv_idx]).to(score.dtype)

        return mod


NO_EXPORT = "its forget gates read each token's hidden state inside the attention, which HF Llama cannot express"


def _problems(pe: FoXConfig, s: EncodingShape) -> list[str]:
    found = positive_problem(pe.init_std, "init_std", 0.02)
    return [found] if found else []


KIND = EncodingKind(
    "fox", FoXConfig, lambda c, s: FoX(c.init_std, c.seed, s),
    lambda pe: identity_row("fox", "FoX", 0, "none", None, None),
    identity_keys=(), is_rope=lambda row: False, no_export=NO_EXPORT, translation_invariant=True,
    problems=_problems, tables=False, cost_keys=(),
    params=lambda c, s: s.n_layers * s.n_heads * (s.input_dim + 1),
    # the gate projection per token and layer: 2·dim·heads FLOPs forward, three times that with the backward
    flops=lambda c, s: 6.0 * s.input_dim * s.n_heads * s.n_layers)
