"""FIRE (Li et al., ICLR 2024): a learned MLP of the progressively interpolated log distance as attention bias."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from trainer.model.encodings.base import EncodingShape
from trainer.model.encodings.bias import (
    NO_BIAS_EXPORT,
    LayerBias,
    bias_identity,
    distance,
    generator,
    int_problem,
    positive_problem,
    table_count,
)
from trainer.model.encodings.kind import EncodingKind, LengthField
from trainer.new_setting import NEW_SETTING

EPS = 1e-6  # added to the normaliser (the paper's code)
ACTIVATIONS = {"relu": F.relu, "leaky_relu": F.leaky_relu}  # leaky_relu: torch's default negative slope, 0.01


@dataclass
class FireConfig:
    """FIRE with the paper's defaults: a 1 → mlp_width → heads ReLU MLP, ψ(x) = log(|c|x + 1) with c learned
    from init_c, and a learned threshold L = |multiplier · init_threshold| (multiplier starts at 1); one FIRE per
    layer unless `shared`."""

    kind: str = "fire"
    mlp_width: int = 32
    init_c: float = 0.1
    init_threshold: float = 512.0
    shared: bool = False
    seed: int = 0  # seed of the MLP's init (torch's nn.Linear default: U(±1/√fan_in))
    # the MLP's activation, a key of ACTIVATIONS: FIRE's paper and code use a ReLU, DAPE's official FIRE base a
    # LeakyReLU (`FIRE_C`, `FIRE_DAPE`), which `dape` sets for its base
    activation: str = field(default="relu", metadata=NEW_SETTING)


class Fire(LayerBias):
    """b_h(i, j) = MLP_h(ψ(i - j) / (ψ(max(i, L)) + ε)), ψ(x) = log(|c|·x + 1), L = |m · L₀|.

    Per table: the MLP's two layers, c and the multiplier m (L₀ a fixed buffer). The normaliser depends on the
    query's absolute position, so FIRE is not translation-invariant."""

    def __init__(self, width: int, init_c: float, init_threshold: float, shared: bool, seed: int,
                 shape: EncodingShape, activation: str = "relu") -> None:
        super().__init__(shape.n_layers, shape.n_heads, shared)
        self.activation = activation
        t, h, gen = self.tables_count, shape.n_heads, generator(seed)

        def uniform(*size: int, fan_in: int) -> nn.Parameter:
            return nn.Parameter((torch.rand(t, *size, generator=gen) * 2 - 1) / math.sqrt(fan_in))

        self.w1, self.b1 = uniform(width, 1, fan_in=1), uniform(width, fan_in=1)
        self.w2, self.b2 = uniform(h, width, fan_in=width), uniform(h, fan_in=width)
        self.c = nn.Parameter(torch.full((t,), float(init_c)))
        self.multiplier = nn.Parameter(torch.ones(t))
        self.register_buffer("init_threshold", torch.tensor(float(init_threshold)))

    def extra_repr(self) -> str:
        return f"mlp_width={self.w1.shape[1]}, shared={self.shared}, activation={self.activation}"

    def normalised(self, query: torch.Tensor, key: torch.Tensor, table: int) -> torch.Tensor:
        """ψ(i - j) / (ψ(max(i, L)) + ε) of broadcastable query and key positions, float32, in [0, 1] up to ε for
        i <= L."""
        c = self.c[table].float().abs()
        threshold = (self.multiplier[table].float() * self.init_threshold).abs()
        norm = torch.log1p(c * torch.maximum(query.to(torch.float32), threshold)) + EPS
        return torch.log1p(c * distance(query, key)) / norm

    def bias(self, query, key, layer):  # the MLP as two matmuls over a tile's pairs, every head at once
        t = self.table(layer)
        x = self.normalised(query[:, 0], key[:, 0], t).unsqueeze(-1)  # (batch or 1, q, k, 1)
        hidden = ACTIVATIONS[self.activation](F.linear(x, self.w1[t].float(), self.b1[t].float()))
        return F.linear(hidden, self.w2[t].float(), self.b2[t].float()).permute(0, 3, 1, 2)

    def head_bias(self, head, query, key, layer):  # one head at a time: the MLP's hidden units one by one
        t = self.table(layer)
        x = self.normalised(query, key, t)
        w1, b1, w2 = self.w1[t, :, 0].float(), self.b1[t].float(), self.w2[t][head].float()
        out = self.b2[t][head].float()
        for unit in range(w1.shape[0]):
            out = out + w2[..., unit] * ACTIVATIONS[self.activation](w1[unit] * x + b1[unit])
        return out


def _problems(pe: FireConfig, s: EncodingShape) -> list[str]:
    found = [int_problem(pe.mlp_width, "mlp_width", 1, 32), positive_problem(pe.init_c, "init_c", 0.1),
             positive_problem(pe.init_threshold, "init_threshold", 512.0)]
    if pe.activation not in ACTIVATIONS:
        found.append(f"model.pe.activation={pe.activation!r}: choose one of {', '.join(ACTIVATIONS)}")
    return [p for p in found if p]


# the threshold L as a length: FIRE normalises by ψ(max(i, L)), so below L the bias is a fixed function of the log
# distance and the progressive interpolation (normalising by the query's own position) acts only past it
THRESHOLD = LengthField(
    "init_threshold", "FIRE's progressive interpolation acts only on query positions past this (initial, learned) "
    "threshold; below it FIRE is a learned log-distance bias", lambda pe, s: float(pe.init_threshold),
    "set model.pe.init_threshold to at most the train length (model.max_seq_len), so the evaluated lengths go past it")


def _mlp_params(width: int, heads: int) -> int:
    return 2 * width + heads * width + heads


KIND = EncodingKind(
    "fire", FireConfig, lambda c, s: Fire(c.mlp_width, c.init_c, c.init_threshold, c.shared, c.seed, s, c.activation),
    lambda pe: bias_identity("fire", "FIRE", pe, default_shared=False),
    identity_keys=("shared",), is_rope=lambda row: False, no_export=NO_BIAS_EXPORT, translation_invariant=False,
    problems=_problems, tables=False, cost_keys=("mlp_width",), lengths=(THRESHOLD,),
    params=lambda c, s: table_count(c, s.n_layers) * (_mlp_params(c.mlp_width, s.n_heads) + 2),
    # the MLP on each of a token's max_seq_len query-key pairs, every layer: 2·width·(1 + heads) FLOPs forward,
    # three times that forward plus backward (per token of a sequence, for a batch of one sequence)
    flops=lambda c, s: 6.0 * c.mlp_width * (1 + s.n_heads) * s.max_seq_len * s.n_layers)
