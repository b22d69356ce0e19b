"""`HDRotary`: the HD-RoPE position encoding as an nn.Module (the paper's Algorithm 2, any N and basis)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from torch import nn

from hdrope.bases import BASIS_KINDS, basis_generator
from hdrope.errors import UserError
from hdrope.frequencies import BlockLayout, block_layout
from hdrope.kernels import Kernel, fused_by_default, make_kernel, rotate
from hdrope.mixing import MixPlan, plan_mixing
from hdrope.scaling import ScaledFrequencies, is_seq_dependent, scale_frequencies, validate_scaling

__all__ = ["HDRotary", "check_rotary"]


def check_rotary(head_dim: int, rotation_dim: int, theta: float, basis: str = "paley", seed: int = 0,
                 scaling: Mapping[str, Any] | None = None,
                 max_position: int | None = None) -> tuple[BlockLayout, np.ndarray, dict[str, Any] | None]:
    """UserError naming the bad argument unless `HDRotary` takes these (no module, no tables); else the block
    layout, the basis's block generator K and the normalised scaling."""
    if isinstance(theta, bool) or not isinstance(theta, (int, float)) or not math.isfinite(theta):
        raise UserError(f"theta must be a finite number > 1, got {theta!r}")
    if theta <= 1:
        raise UserError(f"theta must be > 1 (RoPE base, e.g. 10000), got {theta!r}")
    if basis not in BASIS_KINDS:
        raise UserError(f"unknown basis {basis!r}; choose one of {sorted(BASIS_KINDS)}")
    layout = block_layout(head_dim, rotation_dim)
    generator = basis_generator(basis, rotation_dim, seed)
    valid = validate_scaling(scaling, max_position, float(theta))
    if valid is not None:  # surface bad lengths (longrope lists) before anything is built
        exponents = layout.exponents()
        scale_frequencies(float(theta) ** (-exponents), exponents, head_dim, float(theta), valid, 1)
    return layout, generator, valid


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


class HDRotary(nn.Module):
    """Rotate queries and keys by R_N(m) = Q·R_pair(m)·Qᵀ in every N-dim block of each head.

    Args:
        head_dim: channels per head (d).
        rotation_dim: block size N (even); N = 2 is RoPE.
        theta: RoPE base (> 1); block j turns at θ_j = theta^(−N·j/d).
        basis: a kind from `hdrope.BASIS_KINDS` (identity, random, paley, hadamard, dct).
        seed: seed of the `random` basis.
        scaling: HF-style `rope_scaling` dict (linear, dynamic, yarn, longrope, llama3) or None.
        impl: how the block generator is applied (`hdrope.mixing.MIX_IMPLS`). `permute` (signed channel
            permutations) and `dense` (one GEMM) apply to every generator and agree to float rounding;
            `rotate_half` (two slices) applies only where the generator is ±RoPE's, i.e. rotation_dim = 2;
            `auto` (the default) picks rotate_half there, else the fastest of the other two. An impl that
            cannot apply is a UserError naming `impl`.
        fused: compile the kernel with torch.compile (inductor) for memory-bound speed; None (the default)
            compiles where it pays off (`hdrope.kernels.fused_by_default`: CUDA with Triton) and runs eager
            elsewhere (on CPU, compiling costs seconds per run and shape, more than a short run gains).
        max_position: the model's max (training) length; fills the scaling keys HF takes from the model config
            (e.g. yarn/longrope's original_max_position_embeddings and factor, dynamic's length).
    """

    def __init__(
        self,
        head_dim: int,
        rotation_dim: int,
        theta: float,
        basis: str = "paley",
        seed: int = 0,
        scaling: Mapping[str, Any] | None = None,
        impl: str = "auto",
        fused: bool | None = None,
        max_position: int | None = None,
    ) -> None:
        super().__init__()
        self.layout, self.block_generator, self.scaling = check_rotary(head_dim, rotation_dim, theta, basis, seed,
                                                                       scaling, max_position)
        self.head_dim, self.rotation_dim, self.theta = head_dim, rotation_dim, float(theta)
        self.basis, self.seed = basis, int(seed)
        self.fused: bool | None = None if fused is None else bool(fused)
        self._impl = impl
        self.plan: MixPlan = plan_mixing(self.block_generator, self.layout, impl, bool(fused))  # CPU: None is eager
        self._plans: dict[bool, MixPlan] = {bool(fused): self.plan}
        self._exponents = self.layout.exponents()
        self._base_freqs = self.theta ** (-self._exponents)
        self._freq_index = torch.from_numpy(self.layout.channel_frequency_index())
        self._kernels: dict[tuple[str, torch.dtype], Kernel] = {}

    def extra_repr(self) -> str:
        fused = "auto" if self.fused is None else self.fused
        return (
            f"head_dim={self.head_dim}, rotation_dim={self.rotation_dim}, theta={self.theta:g}, "
            f"basis={self.basis!r}, impl={self.plan.impl!r}, fused={fused}, scaling={self.scaling}"
        )

    # ---- frequencies -------------------------------------------------------------------------
    def scaled_frequencies(self, seq_len: int | None = None) -> ScaledFrequencies:
        """Block frequencies (rad/token) after scaling, and the attention factor on cos/sin."""
        return scale_frequencies(self._base_freqs, self._exponents, self.head_dim, self.theta, self.scaling, seq_len)

    @property
    def frequencies(self) -> np.ndarray:
        """Unscaled block frequencies θ_f, one per block and leftover pair."""
        return self._base_freqs.copy()

    # ---- tables ------------------------------------------------------------------------------
    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-channel cos and sin for integer positions ((seq,) or (batch, seq)).

        Returns tensors of shape (1 or batch, 1, seq, head_dim) in the compute dtype for `dtype`
        (float64 stays float64, anything else is float32); phases are computed in float64.
        """
        if not isinstance(positions, torch.Tensor) or positions.dtype.is_floating_point or positions.is_complex():
            raise ValueError("positions must be an integer tensor of shape (seq,) or (batch, seq)")
        if positions.dim() not in (1, 2):
            raise ValueError(f"positions must be 1-D or 2-D, got shape {tuple(positions.shape)}")
        seq_len = None
        if is_seq_dependent(self.scaling):
            seq_len = int(positions.max().item()) + 1 if positions.numel() else 1
        sf = self.scaled_frequencies(seq_len)
        freqs = torch.from_numpy(sf.freqs).to(positions.device)
        angles = positions.to(torch.float64).unsqueeze(-1) * freqs  # (..., seq, F)
        idx = self._freq_index.to(positions.device)
        cos = torch.cos(angles).index_select(-1, idx)
        sin = torch.sin(angles).index_select(-1, idx)
        if sf.attention_factor != 1.0:
            cos, sin = cos * sf.attention_factor, sin * sf.attention_factor
        ct = _compute_dtype(dtype)
        shape = (1 if positions.dim() == 1 else positions.shape[0], 1, positions.shape[-1], self.head_dim)
        return cos.to(ct).reshape(shape), sin.to(ct).reshape(shape)

    # ---- application -------------------------------------------------------------------------
    def _kernel(self, device: torch.device, dtype: torch.dtype) -> Kernel:
        key = (str(device), dtype)
        if key not in self._kernels:
            fused = fused_by_default(device) if self.fused is None else self.fused
            if fused not in self._plans:  # fused=None on a device that compiles
                self._plans[fused] = plan_mixing(self.block_generator, self.layout, self._impl, fused)
            p = self._plans[fused]
            as_t = lambda a: None if a is None else torch.as_tensor(a, device=device)  # noqa: E731
            self._kernels[key] = make_kernel(
                p.impl,
                sign=p.sign,
                perms=as_t(p.perms),
                coefs=None if p.coefs is None else as_t(p.coefs).to(dtype),
                generator=as_t(p.generator).to(dtype),
                structure=(self.rotation_dim, self.layout.n_blocks, self.layout.n_leftover_pairs, p.shifts, p.use_xor),
                fused=fused,
            )
        return self._kernels[key]

    def apply(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """Rotate x (batch, heads, seq, head_dim) with tables from `cos_sin`; output keeps x's dtype."""
        if x.shape[-1] != self.head_dim:
            raise ValueError(f"last dim of x must be head_dim={self.head_dim}, got shape {tuple(x.shape)}")
        with torch.autocast(device_type=x.device.type, enabled=False):  # the kernels compute in the tables' dtype
            return rotate(x, cos, sin, self._kernel(x.device, cos.dtype))

    def forward(self, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotate q (batch, heads, seq, d) and k (batch, kv_heads, seq, d) at integer positions."""
        if q.dim() != 4 or k.dim() != 4:
            raise ValueError(
                f"q and k must be (batch, heads, seq, head_dim); got {tuple(q.shape)} and {tuple(k.shape)}"
            )
        if positions.shape[-1] != q.shape[-2] or positions.shape[-1] != k.shape[-2]:
            raise ValueError(
                f"positions has {positions.shape[-1]} entries but q/k have seq {q.shape[-2]}/{k.shape[-2]}"
            )
        cos, sin = self.cos_sin(positions.to(q.device), q.dtype)
        return self.apply(q, cos, sin), self.apply(k, cos, sin)

    # ---- reference -----------------------------------------------------------------------------
    def rotation_matrix(self, position: int, seq_len: int | None = None) -> np.ndarray:
        """The explicit float64 (head_dim × head_dim) matrix that `forward` applies at `position`."""
        if is_seq_dependent(self.scaling) and seq_len is None:
            seq_len = int(position) + 1
        sf = self.scaled_frequencies(seq_len)
        ang = float(position) * sf.freqs[self.layout.channel_frequency_index()]
        return sf.attention_factor * (np.diag(np.cos(ang)) + np.diag(np.sin(ang)) @ self.plan.generator)
