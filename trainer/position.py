"""Registry of position encodings for the compact Llama, chosen by `PEConfig.kind`.

Each registry entry (`EncodingKind`) says how to build the encoding, what the run's encoding
identity is, and which settings provably cannot change the model. An encoding maps its config to
an object with `tables(positions, dtype)` (computed once per forward pass) and `rotate(q, k, tables)`.

`encoding_identity(pe)` is the one place that says which encoding a run used: every artifact
(results table, passkey table, attention dumps), the plan, the report and the notebooks write or
read its columns. `dedup_pe(pe)` is the canonical config of the model's equivalence class, from
which the sweep plan derives its dedup key. Adding a baseline means adding one registry entry.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from hdrope import HDRotary
from hdrope.errors import UserError

__all__ = [
    "IDENTITY_COLUMNS",
    "IDENTITY_KEYS",
    "POSITION_ENCODINGS",
    "EncodingKind",
    "PEConfig",
    "PositionEncoding",
    "build_position_encoding",
    "dedup_pe",
    "encoding_identity",
]


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


def _rope(cfg: PEConfig, head_dim: int, max_position: int | None) -> PositionEncoding:
    return _Rotary(HDRotary(head_dim, 2, cfg.theta, basis="identity", scaling=cfg.scaling, fused=cfg.fused,
                            max_position=max_position))


def _hdrope(cfg: PEConfig, head_dim: int, max_position: int | None) -> PositionEncoding:
    return _Rotary(HDRotary(head_dim, cfg.rotation_dim, cfg.theta, cfg.basis, cfg.seed, cfg.scaling,
                            fused=cfg.fused, max_position=max_position))


def _nope(cfg: PEConfig, head_dim: int, max_position: int | None) -> PositionEncoding:
    return _NoPE()


def _scaling_text(scaling: dict[str, Any] | None) -> str:
    return json.dumps(dict(scaling), sort_keys=True, default=str) if scaling else "none"


def _rope_identity(pe: PEConfig) -> dict[str, Any]:
    return {"pe_kind": "rope", "pe_label": "RoPE", "rotation_dim": 2, "basis": "identity", "basis_seed": None,
            "theta": float(pe.theta), "scaling": _scaling_text(pe.scaling)}


def _hdrope_identity(pe: PEConfig) -> dict[str, Any]:
    n, basis = int(pe.rotation_dim), str(pe.basis)
    label = "2D RoPE" if n == 2 and basis == "identity" else f"{n}D {'Paley' if basis == 'paley' else basis}"
    return {"pe_kind": "hdrope", "pe_label": label, "rotation_dim": n, "basis": basis,
            "basis_seed": int(pe.seed) if basis == "random" else None, "theta": float(pe.theta),
            "scaling": _scaling_text(pe.scaling)}


def _nope_identity(pe: PEConfig) -> dict[str, Any]:
    return {"pe_kind": "nope", "pe_label": "NoPE", "rotation_dim": 0, "basis": "none", "basis_seed": None,
            "theta": None, "scaling": "none"}


def _rope_dedup(pe: PEConfig) -> PEConfig:
    # N = 2 with any basis is RoPE or its mirror image, the same model in distribution (NOTES §1)
    return PEConfig(kind="hdrope", rotation_dim=2, theta=pe.theta, basis="identity", seed=0, scaling=pe.scaling)


def _hdrope_dedup(pe: PEConfig) -> PEConfig:
    if pe.rotation_dim == 2:
        return _rope_dedup(pe)
    return PEConfig(kind="hdrope", rotation_dim=pe.rotation_dim, theta=pe.theta, basis=pe.basis,
                    seed=pe.seed if pe.basis == "random" else 0, scaling=pe.scaling)


def _nope_dedup(pe: PEConfig) -> PEConfig:
    return PEConfig(kind="nope", rotation_dim=0, theta=0.0, basis="none", seed=0, scaling=None)


@dataclass(frozen=True)
class EncodingKind:
    """One registered encoding: how to build it, the run's identity row, and its dedup-canonical config."""

    build: Callable[[PEConfig, int, int | None], PositionEncoding]  # (config, head_dim, the model's max length)
    identity: Callable[[PEConfig], dict[str, Any]]
    dedup: Callable[[PEConfig], PEConfig]


POSITION_ENCODINGS: dict[str, EncodingKind] = {
    "rope": EncodingKind(_rope, _rope_identity, _rope_dedup),
    "hdrope": EncodingKind(_hdrope, _hdrope_identity, _hdrope_dedup),
    "nope": EncodingKind(_nope, _nope_identity, _nope_dedup),
}

# The identity row's columns and their types, as every artifact writes them (None: null).
IDENTITY_COLUMNS: dict[str, type] = {"pe_kind": str, "pe_label": str, "rotation_dim": int, "basis": str,
                                     "basis_seed": int, "theta": float, "scaling": str}
# Config keys the label is a function of: a report never needs them as extra grouping columns.
IDENTITY_KEYS = ("model.pe.kind", "model.pe.rotation_dim", "model.pe.basis")


def _kind(pe: PEConfig) -> EncodingKind:
    if pe.kind not in POSITION_ENCODINGS:
        raise UserError(f"pe.kind={pe.kind!r} is unknown; choose one of {sorted(POSITION_ENCODINGS)}")
    return POSITION_ENCODINGS[pe.kind]


def encoding_identity(pe: PEConfig) -> dict[str, Any]:
    """Which encoding a run used, as the columns of IDENTITY_COLUMNS (pe_kind, pe_label, rotation_dim, ...)."""
    return _kind(pe).identity(pe)


def dedup_pe(pe: PEConfig) -> PEConfig:
    """The canonical config of pe's equivalence class: settings that cannot change the model fixed."""
    return copy.deepcopy(_kind(pe).dedup(pe))


def build_position_encoding(cfg: PEConfig, head_dim: int, max_position: int | None = None) -> PositionEncoding:
    """Instantiate the configured encoding (max_position: the model's max length, which fills HF scaling keys
    taken from the model config); UserError names the field and the choices."""
    kind = _kind(cfg)
    try:
        return kind.build(cfg, head_dim, max_position)
    except UserError as err:
        raise UserError(f"pe ({cfg.kind}): {err}") from None
