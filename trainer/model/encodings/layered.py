"""A hybrid stack's position encoding (`model.pe_layers`): one module per distinct encoding, each serving its own
layers under its own layer numbers, behind the interface of one."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from trainer.model.encodings.base import PositionModule

__all__ = ["LayeredEncoding"]


class LayeredEncoding(PositionModule):
    """Parts, each built for the layers it serves (`layers[i]`, model layer indices): model layer `l` is part i's
    layer `layers[i].index(l)`. `layer_view` hands a layer its part, that part's tables and its own layer index; the
    attention of that layer is then wholly the part's."""

    def __init__(self, parts: Sequence[PositionModule], layers: Sequence[Sequence[int]]) -> None:
        super().__init__()
        self.parts = nn.ModuleList(parts)
        self.where = {layer: (i, j) for i, group in enumerate(layers) for j, layer in enumerate(group)}
        self.state_reach = max(p.state_reach for p in parts)

    def extra_repr(self) -> str:
        groups: dict[int, list[int]] = {}
        for layer, (i, _) in sorted(self.where.items()):
            groups.setdefault(i, []).append(layer)
        return ", ".join(f"parts[{i}]: layers {layers}" for i, layers in groups.items())

    def tables(self, positions: torch.Tensor, dtype: torch.dtype, length: int | None = None) -> Any:
        return tuple(p.tables(positions, dtype, length) for p in self.parts)

    def layer_view(self, tables: Any, layer: int) -> tuple[PositionModule, Any, int]:
        i, j = self.where[layer]
        return self.parts[i], None if tables is None else tables[i], j

    def rotate(self, q: torch.Tensor, k: torch.Tensor, tables: Any, layer: int = 0
               ) -> tuple[torch.Tensor, torch.Tensor]:
        part, own, j = self.layer_view(tables, layer)
        return part.rotate(q, k, own, j)

    def token_state(self, x: torch.Tensor, layer: int = 0) -> torch.Tensor | None:
        part, _, j = self.layer_view(None, layer)
        return part.token_state(x, j)

    def fold(self, layer: int) -> torch.Tensor | None:
        part, _, j = self.layer_view(None, layer)
        return part.fold(j)
