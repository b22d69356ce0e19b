"""What the position-bias kinds share (ALiBi, FIRE, KERPLE, T5 bias): the bias as a function of head, query and key
position for the tiles and for FlexAttention, one learned table per layer or one for all layers, query-key
distances, a private initialisation generator, and their identity row and checks."""

from __future__ import annotations

from typing import Any

import torch

from trainer.model.encodings.base import PositionModule
from trainer.model.encodings.kind import identity_row

# why `hdrope export` refuses a bias kind
NO_BIAS_EXPORT = "HF Llama's attention takes no additive position bias, so the learned bias has no counterpart there"


class PositionBias(PositionModule):
    """A bias of the query and key positions alone (ALiBi, FIRE, KERPLE, T5): `head_bias` says it for broadcast
    head indices and positions, which serves the tiles (every head at once) and FlexAttention (one score at a
    time) alike; a kind may compute whole tiles faster in `bias`."""

    def head_bias(self, head: torch.Tensor, query: torch.Tensor, key: torch.Tensor, layer: int) -> torch.Tensor:
        """The bias at broadcastable int64 head indices, query positions and key positions, float32."""
        raise NotImplementedError

    def bias(self, query: torch.Tensor, key: torch.Tensor, layer: int) -> torch.Tensor:
        """(batch or 1, heads, queries, keys) float32 bias of query positions (batch or 1, 1, queries, 1) over key
        positions (batch or 1, 1, 1, keys)."""
        heads = torch.arange(self.heads, device=query.device).view(1, -1, 1, 1)
        return self.head_bias(heads, query, key, layer)

    def tile_bias(self, t):
        return self.bias(t.q_pos[:, None, :, None], t.k_pos[:, None, None, :], t.layer)

    def score_bias(self, q_positions: torch.Tensor, kv_len: int, layer: int = 0) -> torch.Tensor:
        """(heads, seq, kv_len) bias of queries at q_positions (seq,) over keys at positions 0..kv_len-1."""
        keys = torch.arange(kv_len, device=q_positions.device)
        return self.bias(q_positions.view(1, 1, -1, 1), keys.view(1, 1, 1, -1), layer)[0]

    def score_mod(self, call, prep):
        b = call.q.shape[0]
        query, key, layer = call.q_pos.expand(b, -1), call.k_pos.expand(b, -1), call.layer

        def mod(score, batch, head, q_idx, kv_idx):
            return score + self.head_bias(head, query[batch, q_idx], key[batch, kv_idx], layer).to(score.dtype)

        return mod


class LayerBias(PositionBias):
    """A learned bias of query and key positions, with parameters per layer or `shared` by every layer.

    Subclasses hold their parameters with a leading dimension of `tables_count` (1 when shared, else n_layers) and
    read table `table(layer)`."""

    def __init__(self, n_layers: int, n_heads: int, shared: bool) -> None:
        super().__init__()
        self.shared, self.heads = bool(shared), int(n_heads)
        self.tables_count = 1 if shared else int(n_layers)

    def table(self, layer: int) -> int:
        """Which parameter table `layer` reads."""
        return 0 if self.shared else layer


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
