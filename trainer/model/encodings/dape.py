"""DAPE (Zheng et al., NeurIPS 2024): a data-adaptive position encoding. An MLP over the heads mixes each query-key
pair's attention logits with a base position bias (ALiBi, KERPLE or FIRE), as the official code (`DAPE.py`,
`AliBi_DAPE` and `ParallelKerpleLog_DAPE`)."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from trainer.model.encodings import alibi, fire, kerple
from trainer.model.encodings.base import EncodingShape, PositionModule
from trainer.model.encodings.bias import generator, int_problem
from trainer.model.encodings.kind import EncodingKind, LengthField, identity_row

# the base biases DAPE is defined over: the kinds whose score bias it reads, by `model.pe.base`
BASES = {"alibi": alibi.KIND, "kerple": kerple.KIND, "fire": fire.KIND}
LABELS = {"alibi": "ALiBi", "kerple": "KERPLE", "fire": "FIRE"}


@dataclass
class DAPEConfig:
    """DAPE over a `base` bias at its kind's defaults (one per layer, as the official code builds it per layer), with
    a 2·heads → mlp_width → heads LeakyReLU MLP per layer (the official width 32), initialised as torch's
    nn.Linear from the generator of `seed` + 1 (the base takes `seed`)."""

    kind: str = "dape"
    base: str = "kerple"
    mlp_width: int = 32
    seed: int = 0


def base_config(pe: DAPEConfig) -> Any:
    """The base bias's own config: its kind's defaults, per layer where it can be shared, seeded by pe.seed, and, as
    the official code's FIRE base (`FIRE_C`, `FIRE_DAPE`), with a LeakyReLU in FIRE's MLP."""
    entry = BASES[pe.base]
    cfg = entry.config(kind=entry.name)
    fields = {f.name for f in dataclasses.fields(cfg)}
    changes = {k: v for k, v in (("shared", False), ("seed", int(pe.seed)), ("activation", "leaky_relu"))
               if k in fields}
    return dataclasses.replace(cfg, **changes)


class DAPE(PositionModule):
    """logits = x + b + MLP([x; b]) over the heads at each query-key pair, with x = q·k/√d and b the base kind's
    position bias, then the mask and the softmax (its own scores: the MLP reads the logits of every head, so a tile
    holds every head). The MLP mixes the heads pointwise, so a key the mask hides never changes a visible logit."""

    def __init__(self, pe: DAPEConfig, shape: EncodingShape) -> None:
        super().__init__()
        self.base = BASES[pe.base].build(base_config(pe), shape)
        gen, heads, width, layers = generator(int(pe.seed) + 1), shape.n_heads, int(pe.mlp_width), shape.n_layers

        def linear_init(*size: int, fan_in: int) -> nn.Parameter:  # nn.Linear's default: U(±1/√fan_in)
            return nn.Parameter((torch.rand(layers, *size, generator=gen) * 2 - 1) / math.sqrt(fan_in))

        self.w1, self.b1 = linear_init(width, 2 * heads, fan_in=2 * heads), linear_init(width, fan_in=2 * heads)
        self.w2, self.b2 = linear_init(heads, width, fan_in=width), linear_init(heads, fan_in=width)

    def extra_repr(self) -> str:
        return f"mlp_width={self.w1.shape[1]}"

    def tables(self, positions, dtype, length=None):
        return self.base.tables(positions, dtype, length)  # KERPLE projects its parameters here

    def mix(self, x: torch.Tensor, bias: torch.Tensor, layer: int) -> torch.Tensor:
        """x + b + MLP([x; b]) over the head dimension: x (batch, heads, seq, kv_len), b (batch or 1, heads, seq,
        kv_len). Both products run over the pairs in the heads-first layout, each with its bias added in the same
        kernel (no copy of the pairs into a heads-last layout, one pass over the hidden units each way)."""
        b, heads, s, n = x.shape
        dtype = x.dtype
        bias = bias.to(dtype).expand_as(x)
        feats = torch.cat([x, bias], dim=1).view(b, 2 * heads, s * n)
        w1, w2 = self.w1[layer].to(dtype), self.w2[layer].to(dtype)
        hidden = torch.baddbmm(self.b1[layer].to(dtype)[None, :, None].expand(b, -1, 1), w1[None].expand(b, -1, -1),
                               feats)
        mixed = torch.baddbmm(self.b2[layer].to(dtype)[None, :, None].expand(b, -1, 1), w2[None].expand(b, -1, -1),
                              F.leaky_relu(hidden))
        return x + bias + mixed.view(b, heads, s, n)

    def tile_scores(self, t, carry=None):
        x = t.qk() * self.softmax_scale(t.q.shape[-1])
        return self.mix(x, self.base.tile_bias(t), t.layer), carry


def _problems(pe: DAPEConfig, s: EncodingShape) -> list[str]:
    if pe.base not in BASES:
        return [f"model.pe.base={pe.base!r}: choose one of {sorted(BASES)}"]
    found = [int_problem(pe.mlp_width, "mlp_width", 1, 32)]
    return [p for p in found if p] + BASES[pe.base].problems(base_config(pe), s)


def _params(pe: DAPEConfig, s: EncodingShape) -> int:
    h, w = s.n_heads, int(pe.mlp_width)
    return BASES[pe.base].params(base_config(pe), s) + s.n_layers * (2 * h * w + w + w * h + h)


NO_EXPORT = "its MLP reads the attention logits of every head, which HF Llama's attention cannot express"


def _base_length(field: LengthField, base: str) -> LengthField:
    """A length field of base kind `base` as DAPE's own: set when DAPE's base is that kind, at the base's default."""
    default = field.value(base_config(DAPEConfig(base=base)), EncodingShape(1, 1, 1, 1, 1))
    return LengthField(f"base={base}: {field.key}", f"{LABELS[base]}, DAPE's base: {field.meaning}",
                       lambda pe, s: field.value(base_config(pe), s) if pe.base == base else None,
                       f"DAPE builds its {LABELS[base]} base at that kind's defaults ({field.key}={default:g}), so "
                       "evaluate past it (a larger eval.extrapolation), train longer, or choose another model.pe.base")


# DAPE inherits the length fields of its bases (FIRE's threshold), each in force when that base is chosen
LENGTHS = tuple(_base_length(f, name) for name, kind in BASES.items() for f in kind.lengths)

KIND = EncodingKind(
    "dape", DAPEConfig, DAPE,
    lambda pe: identity_row("dape", f"DAPE-{LABELS.get(pe.base, pe.base)}", 0, "none", None, None),
    identity_keys=("base",), is_rope=lambda row: False, no_export=NO_EXPORT,
    translation_invariant=lambda pe: BASES[pe.base].invariant(base_config(pe)),
    problems=_problems, tables=False, cost_keys=("base", "mlp_width"), params=_params, lengths=LENGTHS,
    # the MLP on each of a token's max_seq_len query-key pairs, every layer: 2·(2H·w + w·H) FLOPs forward, three
    # times that with the backward (per token of a sequence, for a batch of one sequence)
    flops=lambda c, s: 6.0 * 3 * s.n_heads * c.mlp_width * s.max_seq_len * s.n_layers)
