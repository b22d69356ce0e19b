"""3D-RPE (Ma et al., AAAI 2025) in the paper's form, as a pure q/k transform."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from trainer.model.encodings.base import EncodingShape, PhaseTable, rope_freqs
from trainer.model.encodings.kind import EncodingKind, identity_row, problems_of
from trainer.model.encodings.rotary import FrequencyRoPE, check_theta

_MAX_INDEX = 2**31 - 1


@dataclass
class RPE3DConfig:
    """3D-RPE (Ma et al. 2025), paper form as a q/k transform."""

    kind: str = "rpe3d"
    theta: float = 10000.0
    chunk_size: int = 128  # c: in-chunk index p mod c is rotated as RoPE
    phi_base: float = 10000.0  # φ_j = phi_base^(-j) for chunk j = p // c


class ChunkPhaseTable(PhaseTable):
    """3D-RPE phases: (p mod c)·θ_i + π/2 - φ_j with φ_j = base^(-j), j = p // c, on every pair i."""

    def __init__(self, freqs: torch.Tensor, min_len: int, chunk: int, phi_base: float) -> None:
        super().__init__(freqs, min_len, prefill=False)
        self.chunk, self.phi_base = int(chunk), float(phi_base)
        self._extend(self.min_len)

    def angles(self, pos: torch.Tensor) -> torch.Tensor:
        chunk_index = torch.div(pos, self.chunk, rounding_mode="floor")
        phi = self.phi_base ** (-chunk_index)
        inner = pos - chunk_index * self.chunk
        return inner.unsqueeze(-1) * self.freqs.to(pos.device) + (math.pi / 2 - phi).unsqueeze(-1)


class RPE3D(FrequencyRoPE):
    """3D-RPE (Ma et al., AAAI 2025) in the paper's form, as a pure q/k transform.

    Position p splits into chunk j = p // c and in-chunk m = p mod c; h' = e^{i m θ}(cos φ_j · h⊥ + sin φ_j · h)
    with h⊥ = (-h², h¹) on every half-split pair and φ_j = base^(-j), i.e. a rotation by m·θ_i + π/2 - φ_j.
    Within one chunk it is RoPE (the π/2 cancels in q·k); across chunks it is not translation-invariant.
    The official code instead runs dual-chunk attention (intra/successive/inter-chunk flash-attention calls
    merged by log-sum-exp) around this rotation; the lab implements the paper's formula only."""

    def __init__(self, theta: float, chunk_size: int, phi_base: float, head_dim: int, min_len: int) -> None:
        # chunk_size and phi_base are checked by the kind's problems before building
        super().__init__(rope_freqs(check_theta(theta), head_dim // 2), head_dim, min_len,
                         f"chunk_size={chunk_size}, phi_base={phi_base:g}")
        self.phases = ChunkPhaseTable(self.phases.freqs, min_len, chunk_size, phi_base)


def _problems(pe: RPE3DConfig, s: EncodingShape) -> list[str]:
    problems = []
    c = pe.chunk_size
    if isinstance(c, bool) or not isinstance(c, int) or not 1 <= c <= _MAX_INDEX:
        problems.append(f"model.pe.chunk_size={c!r}: must be a positive integer <= {_MAX_INDEX} "
                        "(a chunk longer than every position is plain RoPE), e.g. 128")
    b = pe.phi_base
    if isinstance(b, bool) or not isinstance(b, (int, float)) or not b > 1:
        problems.append(f"model.pe.phi_base={b!r}: must be > 1 (φ_j = phi_base^-j), e.g. 10000")
    return problems or problems_of("rpe3d", lambda: check_theta(pe.theta))


KIND = EncodingKind(
    "rpe3d", RPE3DConfig, lambda c, s: RPE3D(c.theta, c.chunk_size, c.phi_base, s.head_dim, s.max_seq_len),
    lambda pe: identity_row("rpe3d", f"3D-RPE c{pe.chunk_size}", 2, "identity", None, pe.theta),
    identity_keys=("chunk_size",), is_rope=lambda row: False, translation_invariant=False, problems=_problems)
