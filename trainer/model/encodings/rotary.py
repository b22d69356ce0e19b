"""What the rotary kinds share: the `PEConfig` of rope / hdrope / nope, the HD-RoPE module (the hdrope library),
RoPE's canonical config, the frequency-vector RoPE module of partial RoPE, p-RoPE and 3D-RPE, and their checks."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from hdrope import HDRotary
from hdrope.errors import UserError
from hdrope.scaling import is_seq_dependent, validate_scaling
from trainer.model.encodings.base import CosSinCache, EncodingShape, PhaseTable, PositionModule, rotate_pairs
from trainer.model.encodings.kind import LengthField


@dataclass
class PEConfig:
    """rope | hdrope | nope settings (rope ignores rotation_dim/basis/seed, nope ignores all).

    Shared by the original kinds so that their config hashes and the sweep axes `model.pe.rotation_dim` /
    `model.pe.basis` keep working; every newer kind has its own class holding only the fields it reads, so a
    key it ignores is a merge error naming that key."""

    kind: str = "hdrope"
    rotation_dim: int = 4  # N; ignored by rope (2) and nope
    theta: float = 10000.0
    basis: str = "paley"
    seed: int = 0  # seed of the random basis
    scaling: dict[str, Any] | None = None  # HF rope_scaling keys
    fused: bool | None = None  # torch.compile the rotary kernel; None: on CUDA with Triton, eager elsewhere


def _original_length(pe: PEConfig, s: EncodingShape) -> int | None:
    scaling = validate_scaling(pe.scaling, s.max_seq_len, pe.theta)  # fills what HF fills from the model
    return None if scaling is None else scaling.get("original_max_position_embeddings")


# rope_scaling's original length (rope and hdrope): the length the scaling takes as trained
SCALING_LENGTH = LengthField(
    "scaling.original_max_position_embeddings",
    "the context rope_scaling takes as trained; it is built to stretch the rotation to positions past it",
    _original_length,
    "set it to the train length (model.max_seq_len) or leave it out, so the evaluated lengths go past it")


def canonical_rope(pe: Any) -> PEConfig:
    """RoPE's dedup-canonical config at pe's θ (and scaling): N = 2 with any basis is RoPE or its mirror image,
    the same model in distribution (NOTES §1)."""
    return PEConfig(kind="hdrope", rotation_dim=2, theta=pe.theta, basis="identity", seed=0,
                    scaling=getattr(pe, "scaling", None))


class RotaryTable(CosSinCache):
    """`HDRotary`'s per-channel cos/sin (computed afresh for length-dependent scaling such as `dynamic`)."""

    def __init__(self, rot: HDRotary, min_len: int) -> None:
        super().__init__(rot.head_dim, min_len, prefill=False)
        self.rot, self.seq_dependent = rot, is_seq_dependent(rot.scaling)
        if not self.seq_dependent:
            self._extend(self.min_len)

    def fresh(self, dtype):
        return super().fresh(dtype) or self.seq_dependent

    def compute(self, pos, dtype):
        cos, sin = self.rot.cos_sin(pos, dtype)
        return cos[:, 0], sin[:, 0]


class HDRotaryEncoding(PositionModule):
    """RoPE or HD-RoPE through `hdrope.HDRotary`; cos/sin cached up to the longest position seen."""

    def __init__(self, rot: HDRotary, min_len: int) -> None:
        super().__init__()
        self.phases = RotaryTable(rot, min_len)

    @property
    def rot(self) -> HDRotary:
        """The hdrope rotary (owned by the table)."""
        return self.phases.rot

    def tables(self, positions, dtype, length=None):
        return self.phases.lookup(positions, dtype, length)

    def rotate(self, q, k, tables, layer=0):
        cos, sin = tables
        return self.rot.apply(q, cos, sin), self.rot.apply(k, cos, sin)


class FrequencyRoPE(PositionModule):
    """NeoX-layout RoPE with an explicit frequency vector over the first `rot_dims` channels.

    Partial RoPE and p-RoPE are this module with different frequency vectors; both are
    translation-invariant (q'·k' depends on m - n only)."""

    def __init__(self, freqs: torch.Tensor, head_dim: int, min_len: int, label: str) -> None:
        super().__init__()
        self.rot_dims, self.head_dim, self.label = 2 * freqs.numel(), head_dim, label
        self.phases = PhaseTable(freqs, min_len)

    def extra_repr(self) -> str:
        return f"{self.label}, rotated_channels={self.rot_dims}/{self.head_dim}"

    def tables(self, positions, dtype, length=None):
        return self.phases.lookup(positions, dtype, length)

    def _one(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        if self.rot_dims == self.head_dim:
            return rotate_pairs(x, cos, sin)
        return torch.cat((rotate_pairs(x[..., : self.rot_dims], cos, sin), x[..., self.rot_dims:]), dim=-1)

    def rotate(self, q, k, tables, layer=0):
        cos, sin = tables
        return self._one(q, cos, sin), self._one(k, cos, sin)


def check_fraction(value: float, key: str, allow_zero: bool) -> float:
    """value as a float; UserError naming model.pe.<key> unless it is a number in (0, 1] (or [0, 1])."""
    low_ok = value >= 0 if allow_zero else value > 0
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (low_ok and value <= 1):
        span = "[0, 1]" if allow_zero else "(0, 1]"
        raise UserError(f"model.pe.{key}={value!r}: must be a number in {span}, e.g. 0.25")
    return float(value)


def fraction_dedup(pe: Any) -> Any:
    """Fraction 1 rotates every channel at RoPE's frequencies: exactly RoPE."""
    return canonical_rope(pe) if float(pe.fraction) == 1.0 else pe


def ignored_field_problems(pe: PEConfig, kind: str, ignored: tuple[str, ...]) -> list[str]:
    """A problem for each field of PEConfig that `kind` ignores (`ignored`) but whose value no kind could take: a
    typo there (model.pe.basis=paleyy on a RoPE cell) is refused, while a value a sweep shares with its HD-RoPE
    cells (basis=paley) is not."""
    from hdrope.bases import BASIS_KINDS

    found = []
    note = f"model.pe.kind={kind} ignores it, but a value no kind takes is a typo"
    if "basis" in ignored and pe.basis not in (*BASIS_KINDS, "none"):
        found.append(f"model.pe.basis={pe.basis!r}: not a basis ({note}); choose one of {', '.join(BASIS_KINDS)}")
    n = pe.rotation_dim
    if "rotation_dim" in ignored and (isinstance(n, bool) or not isinstance(n, int) or n < 0 or n % 2):
        found.append(f"model.pe.rotation_dim={n!r}: not an even integer >= 0 ({note}); e.g. 4")
    return found


def check_theta(theta: float) -> float:
    """theta as a float; UserError naming model.pe.theta unless it is a finite number > 1."""
    if isinstance(theta, bool) or not isinstance(theta, (int, float)) or not math.isfinite(theta) or theta <= 1:
        raise UserError(f"model.pe.theta={theta!r}: must be a finite number > 1 (RoPE base, e.g. 10000)")
    return float(theta)
