"""Registry of position encodings for the compact Llama, chosen by `PEConfig.kind`.

An encoding maps its config to an object with `tables(positions, dtype)` (computed once per
forward pass) and `rotate(q, k, tables)`. Adding a baseline means adding one registry entry.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from hdrope import HDRotary
from hdrope.errors import UserError

__all__ = ["POSITION_ENCODINGS", "PEConfig", "PositionEncoding", "build_position_encoding"]


@dataclass
class PEConfig:
    """Position-encoding settings; `kind` picks the registry entry."""

    kind: str = "hdrope"  # rope | hdrope | nope
    rotation_dim: int = 4  # N; ignored by rope (2) and nope
    theta: float = 10000.0
    basis: str = "paley"
    seed: int = 0  # seed of the random basis
    scaling: dict[str, Any] | None = None  # HF rope_scaling keys
    fused: bool = False  # torch.compile the rotary kernel


class PositionEncoding(Protocol):
    def tables(self, positions: torch.Tensor, dtype: torch.dtype) -> Any: ...

    def rotate(self, q: torch.Tensor, k: torch.Tensor, tables: Any) -> tuple[torch.Tensor, torch.Tensor]: ...


class _Rotary:
    def __init__(self, rot: HDRotary) -> None:
        self.rot = rot

    def tables(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        return self.rot.cos_sin(positions, dtype)

    def rotate(self, q, k, tables):
        cos, sin = tables
        return self.rot.apply(q, cos, sin), self.rot.apply(k, cos, sin)


class _NoPE:
    def tables(self, positions, dtype):
        return None

    def rotate(self, q, k, tables):
        return q, k


def _rope(cfg: PEConfig, head_dim: int) -> PositionEncoding:
    return _Rotary(HDRotary(head_dim, 2, cfg.theta, basis="identity", scaling=cfg.scaling, fused=cfg.fused))


def _hdrope(cfg: PEConfig, head_dim: int) -> PositionEncoding:
    rot = HDRotary(head_dim, cfg.rotation_dim, cfg.theta, cfg.basis, cfg.seed, cfg.scaling, fused=cfg.fused)
    return _Rotary(rot)


def _nope(cfg: PEConfig, head_dim: int) -> PositionEncoding:
    return _NoPE()


POSITION_ENCODINGS: dict[str, Callable[[PEConfig, int], PositionEncoding]] = {
    "rope": _rope,
    "hdrope": _hdrope,
    "nope": _nope,
}


def build_position_encoding(cfg: PEConfig, head_dim: int) -> PositionEncoding:
    """Instantiate the configured encoding; ValueError names the field and the choices."""
    if cfg.kind not in POSITION_ENCODINGS:
        raise UserError(f"pe.kind={cfg.kind!r} is unknown; choose one of {sorted(POSITION_ENCODINGS)}")
    try:
        return POSITION_ENCODINGS[cfg.kind](cfg, head_dim)
    except UserError as err:
        raise UserError(f"pe ({cfg.kind}): {err}") from None
