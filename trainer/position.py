"""Registry of position encodings for the compact Llama, chosen by `PEConfig.kind`.

Each registry entry (`EncodingKind`) says how to build the encoding, what the run's encoding
identity is, and which settings provably cannot change the model. An encoding is an nn.Module
registered in the model (`print(model)` shows it) with `tables(positions, dtype)` (computed once per
forward pass), `rotate(q, k, tables)` and `bias(q_positions, k_positions, dtype)` (ALiBi's additive
attention bias; None for the others). Kinds: rope, hdrope, nope, partial_rope, p_rope, alibi.

`encoding_identity(pe)` is the one place that says which encoding a run used: every artifact
(results table, passkey table, attention dumps), the plan, the report and the notebooks write or
read its columns. `dedup_pe(pe)` is the canonical config of the model's equivalence class, from
which the sweep plan derives its dedup key. Adding a baseline means adding one registry entry.
"""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

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
    """Position-encoding settings; `kind` picks the registry entry (POSITION_ENCODINGS)."""

    kind: str = "hdrope"  # rope | hdrope | nope | partial_rope | p_rope | alibi
    rotation_dim: int = 4  # N of hdrope; rope, partial_rope and p_rope rotate pairs (2); nope and alibi none
    theta: float = 10000.0  # RoPE base of every rotary kind (alibi and nope have none)
    basis: str = "paley"  # hdrope's orthogonal basis Q
    seed: int = 0  # seed of the random basis
    scaling: dict[str, Any] | None = None  # HF rope_scaling keys (rope, hdrope)
    fused: bool = False  # torch.compile the rotary kernel
    fraction: float = 0.25  # partial_rope: share of each head's channels rotated; p_rope: share of frequencies kept


class PositionEncoding(nn.Module):
    """An encoding registered in the model: per-forward tables, a q/k transform and an optional attention bias."""

    translation_invariant = True  # q·k (plus bias) depends on positions only through m − n

    def tables(self, positions: torch.Tensor, dtype: torch.dtype) -> Any:
        """What rotate needs for these positions (computed once per forward, shared by the layers)."""
        return None

    def rotate(self, q: torch.Tensor, k: torch.Tensor, tables: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """q and k at their positions."""
        return q, k

    def bias(self, q_positions: torch.Tensor, k_positions: torch.Tensor, dtype: torch.dtype) -> torch.Tensor | None:
        """An additive attention bias (heads, q, k), or None."""
        return None


class _Rotary(PositionEncoding):
    def __init__(self, rot: HDRotary) -> None:
        super().__init__()
        self.rot = rot

    def tables(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        return self.rot.cos_sin(positions, dtype)

    def rotate(self, q, k, tables):
        cos, sin = tables
        return self.rot.apply(q, cos, sin), self.rot.apply(k, cos, sin)


class _NoPE(PositionEncoding):
    pass


class _PartialRoPE(PositionEncoding):
    """NeoX-style partial RoPE: the first `rotated` channels of a head are rotary (rotate-half over them, with
    RoPE frequencies over that width), the rest carry no position."""

    def __init__(self, head_dim: int, rotated: int, theta: float) -> None:
        super().__init__()
        self.rotated = rotated
        self.rot = HDRotary(rotated, 2, theta, basis="identity")

    def extra_repr(self) -> str:
        return f"rotated={self.rotated}"

    def tables(self, positions, dtype):
        return self.rot.cos_sin(positions, dtype)

    def rotate(self, q, k, tables):
        cos, sin = tables
        r = self.rotated
        return (torch.cat([self.rot.apply(q[..., :r], cos, sin), q[..., r:]], -1),
                torch.cat([self.rot.apply(k[..., :r], cos, sin), k[..., r:]], -1))


class _PRoPE(_Rotary):
    """p-RoPE (Barbero et al. 2025): RoPE keeping only the highest-frequency share of its frequencies; the other
    pairs turn at frequency 0 (cos 1, sin 0), so they carry no position."""

    def __init__(self, head_dim: int, kept_pairs: int, theta: float) -> None:
        super().__init__(HDRotary(head_dim, 2, theta, basis="identity"))
        self.kept = kept_pairs
        half = head_dim // 2
        keep = (torch.arange(head_dim) % half) < kept_pairs  # pair i = channels (i, i + d/2), fastest first
        self.register_buffer("keep", keep, persistent=False)

    def extra_repr(self) -> str:
        return f"kept_pairs={self.kept}"

    def tables(self, positions, dtype):
        cos, sin = self.rot.cos_sin(positions, dtype)
        keep = self.keep.to(cos.device)
        return torch.where(keep, cos, torch.ones_like(cos)), torch.where(keep, sin, torch.zeros_like(sin))


def alibi_slopes(n_heads: int) -> torch.Tensor:
    """ALiBi's head slopes: 2^(−8h/H) for H a power of two; otherwise those of the nearest lower power of two
    followed by every other slope of twice that many heads (Press et al. 2022)."""
    def powers(n: int) -> list[float]:
        return [2.0 ** (-8.0 * (h + 1) / n) for h in range(n)]

    low = 2 ** math.floor(math.log2(n_heads))
    slopes = powers(low) + powers(2 * low)[0::2][: n_heads - low]
    return torch.tensor(slopes, dtype=torch.float32)


class _ALiBi(PositionEncoding):
    """ALiBi: no q/k transform; each head adds −slope·(m − n) to the logit of query m and key n ≤ m."""

    def __init__(self, n_heads: int) -> None:
        super().__init__()
        self.register_buffer("slopes", alibi_slopes(n_heads), persistent=False)

    def extra_repr(self) -> str:
        return f"heads={self.slopes.numel()}"

    def bias(self, q_positions, k_positions, dtype):
        distance = (q_positions[:, None] - k_positions[None, :]).to(torch.float32)
        return (-self.slopes.to(distance.device)[:, None, None] * distance).to(dtype)


def _rope(cfg: PEConfig, head_dim: int, max_position: int | None, n_heads: int) -> PositionEncoding:
    return _Rotary(HDRotary(head_dim, 2, cfg.theta, basis="identity", scaling=cfg.scaling, fused=cfg.fused,
                            max_position=max_position))


def _hdrope(cfg: PEConfig, head_dim: int, max_position: int | None, n_heads: int) -> PositionEncoding:
    return _Rotary(HDRotary(head_dim, cfg.rotation_dim, cfg.theta, cfg.basis, cfg.seed, cfg.scaling,
                            fused=cfg.fused, max_position=max_position))


def _nope(cfg: PEConfig, head_dim: int, max_position: int | None, n_heads: int) -> PositionEncoding:
    return _NoPE()


def _check_fraction(cfg: PEConfig) -> None:
    f = cfg.fraction
    if isinstance(f, bool) or not isinstance(f, (int, float)) or not 0 < f <= 1:
        raise UserError(f"model.pe.fraction={f!r}: must be in (0, 1], e.g. 0.25")


def _partial_rope(cfg: PEConfig, head_dim: int, max_position: int | None, n_heads: int) -> PositionEncoding:
    _check_fraction(cfg)
    rotated = 2 * int(cfg.fraction * head_dim // 2)
    if rotated < 2:
        raise UserError(f"model.pe.fraction={cfg.fraction}: rotates no pair of a {head_dim}-channel head; raise it")
    return _PartialRoPE(head_dim, rotated, cfg.theta)


def _p_rope(cfg: PEConfig, head_dim: int, max_position: int | None, n_heads: int) -> PositionEncoding:
    _check_fraction(cfg)
    return _PRoPE(head_dim, max(1, round(cfg.fraction * head_dim / 2)), cfg.theta)


def _alibi(cfg: PEConfig, head_dim: int, max_position: int | None, n_heads: int) -> PositionEncoding:
    return _ALiBi(n_heads)


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


def _fraction_identity(kind: str, label: str):
    def identity(pe: PEConfig) -> dict[str, Any]:
        return {"pe_kind": kind, "pe_label": f"{label} {pe.fraction:g}", "rotation_dim": 2, "basis": "identity",
                "basis_seed": None, "theta": float(pe.theta), "scaling": "none"}
    return identity


def _alibi_identity(pe: PEConfig) -> dict[str, Any]:
    return {"pe_kind": "alibi", "pe_label": "ALiBi", "rotation_dim": 0, "basis": "none", "basis_seed": None,
            "theta": None, "scaling": "none"}


def _fraction_dedup(kind: str):
    def dedup(pe: PEConfig) -> PEConfig:
        if pe.fraction >= 1:  # every channel / every frequency: RoPE itself
            return _rope_dedup(pe)
        return PEConfig(kind=kind, rotation_dim=2, theta=pe.theta, basis="identity", fraction=pe.fraction)
    return dedup


def _alibi_dedup(pe: PEConfig) -> PEConfig:
    return PEConfig(kind="alibi", rotation_dim=0, theta=0.0, basis="none", seed=0, scaling=None, fraction=1.0)


def _rope_dedup(pe: PEConfig) -> PEConfig:
    # N = 2 with any basis is RoPE or its mirror image, the same model in distribution (NOTES §1)
    return PEConfig(kind="hdrope", rotation_dim=2, theta=pe.theta, basis="identity", seed=0, scaling=pe.scaling,
                    fraction=1.0)


def _hdrope_dedup(pe: PEConfig) -> PEConfig:
    if pe.rotation_dim == 2:
        return _rope_dedup(pe)
    return PEConfig(kind="hdrope", rotation_dim=pe.rotation_dim, theta=pe.theta, basis=pe.basis,
                    seed=pe.seed if pe.basis == "random" else 0, scaling=pe.scaling, fraction=1.0)


def _nope_dedup(pe: PEConfig) -> PEConfig:
    return PEConfig(kind="nope", rotation_dim=0, theta=0.0, basis="none", seed=0, scaling=None, fraction=1.0)


@dataclass(frozen=True)
class EncodingKind:
    """One registered encoding: how to build it, the run's identity row, and its dedup-canonical config."""

    build: Callable[[PEConfig, int, int | None, int], PositionEncoding]  # (config, head_dim, max length, heads)
    identity: Callable[[PEConfig], dict[str, Any]]
    dedup: Callable[[PEConfig], PEConfig]


POSITION_ENCODINGS: dict[str, EncodingKind] = {
    "rope": EncodingKind(_rope, _rope_identity, _rope_dedup),
    "hdrope": EncodingKind(_hdrope, _hdrope_identity, _hdrope_dedup),
    "nope": EncodingKind(_nope, _nope_identity, _nope_dedup),
    "partial_rope": EncodingKind(_partial_rope, _fraction_identity("partial_rope", "partial RoPE"),
                                 _fraction_dedup("partial_rope")),
    "p_rope": EncodingKind(_p_rope, _fraction_identity("p_rope", "p-RoPE"), _fraction_dedup("p_rope")),
    "alibi": EncodingKind(_alibi, _alibi_identity, _alibi_dedup),
}

# The identity row's columns and their types, as every artifact writes them (None: null).
IDENTITY_COLUMNS: dict[str, type] = {"pe_kind": str, "pe_label": str, "rotation_dim": int, "basis": str,
                                     "basis_seed": int, "theta": float, "scaling": str}
# Config keys the label is a function of: a report never needs them as extra grouping columns.
IDENTITY_KEYS = ("model.pe.kind", "model.pe.rotation_dim", "model.pe.basis", "model.pe.fraction")


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


def build_position_encoding(cfg: PEConfig, head_dim: int, max_position: int | None = None,
                            n_heads: int = 1) -> PositionEncoding:
    """Instantiate the configured encoding as a module of the model (max_position: the model's max length, which
    fills HF scaling keys taken from the model config); UserError names the field and the choices."""
    kind = _kind(cfg)
    try:
        return kind.build(cfg, head_dim, max_position, n_heads)
    except UserError as err:
        raise UserError(f"pe ({cfg.kind}): {err}") from None
