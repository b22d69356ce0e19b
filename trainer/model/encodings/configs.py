"""One typed config dataclass per position-encoding kind, chosen by `model.pe.kind` when a run config is merged.

`PEConfig` is shared by the original kinds (rope, hdrope, nope) so that their config hashes and the
sweep axes `model.pe.rotation_dim` / `model.pe.basis` keep working; every newer kind has its own
class holding only the fields it reads, so a key it ignores is a merge error naming that key.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class PEConfig:
    """rope | hdrope | nope settings (rope ignores rotation_dim/basis/seed, nope ignores all)."""

    kind: str = "hdrope"
    rotation_dim: int = 4  # N; ignored by rope (2) and nope
    theta: float = 10000.0
    basis: str = "paley"
    seed: int = 0  # seed of the random basis
    scaling: dict[str, Any] | None = None  # HF rope_scaling keys
    fused: bool | None = None  # torch.compile the rotary kernel; None: on CUDA with Triton, eager elsewhere


@dataclass
class PartialRoPEConfig:
    """NeoX partial rotary: RoPE on the first `fraction`·head_dim channels, the rest untouched."""

    kind: str = "partial_rope"
    theta: float = 10000.0
    fraction: float = 0.25


@dataclass
class PRoPEConfig:
    """p-RoPE: keep the highest-frequency `fraction` of RoPE's frequencies, zero the rest."""

    kind: str = "p_rope"
    theta: float = 10000.0
    fraction: float = 0.75


@dataclass
class XPosConfig:
    """xPos: RoPE with per-frequency exponential decay, scale ζ_i^(m/scale_base) on q and its inverse on k."""

    kind: str = "xpos"
    theta: float = 10000.0
    gamma: float = 0.4
    scale_base: float = 512.0


@dataclass
class ALiBiConfig:
    """ALiBi: no q/k transform; a per-head linear distance penalty added to the attention logits."""

    kind: str = "alibi"


@dataclass
class FoPEConfig:
    """FoPE (Hua et al. 2024) as its official code's defaults."""

    kind: str = "fope"
    theta: float = 10000.0
    sigma: float = 0.3  # Xavier-normal gain of the coefficient noise (official: 0.3 / 0.4 / 0.6 by size)
    learnable: bool = False  # official default: fixed (saved in the checkpoint, not trained)
    seed: int = 0  # seed of the coefficient noise


@dataclass
class RPE3DConfig:
    """3D-RPE (Ma et al. 2025), paper form as a q/k transform."""

    kind: str = "rpe3d"
    theta: float = 10000.0
    chunk_size: int = 128  # c: in-chunk index p mod c is rotated as RoPE
    phi_base: float = 10000.0  # φ_j = phi_base^(-j) for chunk j = p // c


@dataclass
class LearnedBasisConfig:
    """HD-RoPE whose basis Q is learned per layer (optionally per KV head), kept exactly orthogonal."""

    kind: str = "learned_basis"
    rotation_dim: int = 4
    theta: float = 10000.0
    init: str = "paley"  # identity | paley | random | hadamard | dct: the starting basis
    seed: int = 0  # seed of a random init
    per_head: bool = False
    parameterisation: str = "expm"  # expm | cayley


AnyPEConfig = (PEConfig | PartialRoPEConfig | PRoPEConfig | XPosConfig | ALiBiConfig | FoPEConfig | RPE3DConfig
               | LearnedBasisConfig)
