"""What the learned attention-bias kinds share (FIRE, KERPLE, T5 bias): one bias table per layer or one for all
layers, query-key distances, a private initialisation generator, and their identity row and checks."""

from __future__ import annotations

from typing import Any

import torch

from trainer.model.encodings.base import PositionModule
from trainer.model.encodings.kind import identity_row

# why `hdrope export` refuses a bias kind
NO_BIAS_EXPORT = "HF Llama's attention takes no additive position bias, so the learned bias has no counterpart there"


class LayerBias(PositionModule):
    """A learned bias of query and key positions, with parameters per layer or `shared` by every layer.

    Subclasses hold their parameters with a leading dimension of `tables` (1 when shared, else n_layers) and say
    what the bias of one table is (`bias`). The bias is (heads, seq, kv_len) floats per layer: SDPA reads it as
    its additive mask, broadcast over the batch."""

    def __init__(self, n_layers: int, shared: bool) -> None:
        super().__init__()
        self.shared = bool(shared)
        self.tables_count = 1 if shared else int(n_layers)

    def bias(self, query: torch.Tensor, key: torch.Tensor, table: int) -> torch.Tensor:
        """(heads, seq, kv_len) float32 bias of integer query positions (seq, 1) over key positions (1, kv_len)."""
        raise NotImplementedError

    def bias_key(self, layer):
        return 0 if self.shared else layer

    def score_bias(self, q_positions, kv_len, layer=0):
        key = torch.arange(kv_len, device=q_positions.device)[None, :]
        return self.bias(q_positions[:, None].to(key.device), key, self.bias_key(layer))


def distance(query: torch.Tensor, key: torch.Tensor) -> torch.Tensor:
    """max(i - j, 0) as float32: how far back key j lies from query i (0 for the keys the causal mask hides)."""
    return (query - key).clamp(min=0).to(torch.float32)


def generator(seed: int) -> torch.Generator:
    """A private CPU generator: a kind's initial values come from its own seed, so building it leaves the global
    RNG (and with it the model's other weights at a given train seed) exactly as for RoPE."""
    return torch.Generator().manual_seed(int(seed))


def table_count(pe: Any, n_layers: int) -> int:
    """How many bias tables a config builds: 1 when shared by every layer, else one per layer."""
    return 1 if pe.shared else n_layers


def bias_identity(kind: str, label: str, pe: Any, default_shared: bool) -> dict[str, Any]:
    """The identity row of a bias kind: no rotation, no θ; the label says when sharing departs from the default."""
    if bool(pe.shared) != default_shared:
        label += ", shared" if pe.shared else ", per layer"
    return identity_row(kind, label, 0, "none", None, None)


def int_problem(value: Any, key: str, low: int, example: int) -> str | None:
    """A problem naming model.pe.<key> unless value is an integer >= low."""
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        return f"model.pe.{key}={value!r}: must be an integer >= {low}, e.g. {example}"
    return None


def positive_problem(value: Any, key: str, example: float) -> str | None:
    """A problem naming model.pe.<key> unless value is a finite number > 0."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value < float("inf")
    return None if ok else f"model.pe.{key}={value!r}: must be a finite number > 0, e.g. {example:g}"
