"""RoPE++ (Liu et al. 2025, arXiv 2512.07525; OpenMOSS/rope_pp): RoPE's discarded imaginary part as further heads.

In complex form RoPE's logit is Re(q̃_t · conj(k̃_s)) = (q·k) cos(t−s) + (q×k) sin(t−s); the imaginary part,
(q·k) sin(t−s) − (q×k) cos(t−s), is the logit of the same query turned by −90° in every pair before its rotation
(the official `q * sin - rotate_half(q) * cos`). Each query head becomes two attention heads, its real one and its
imaginary one, side by side (head 2i real, 2i + 1 imaginary, as the official `stack(..., dim=2)`), against the same
rotated keys, each softmax of its own, their outputs concatenated for W_o. The two configurations its paper trains:

- `ec` (RoPE++_EC, the official `imag2`): equal cache. The model's query, key and value heads as configured; twice
  as many attention heads, so W_o reads 2·n_heads heads.
- `eh` (RoPE++_EH, `imag1`): equal heads. Half the query and KV heads are projected (half the QKV parameters and
  KV cache); their real and imaginary heads make n_heads attention heads, so W_o is RoPE's.

The pairs are RoPE's NeoX half split (channels j, j + d/2) at θ^(−2j/d), as the official Llama code's.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from trainer.model.encodings.base import EncodingShape, rope_freqs, rotate_half, rotate_pairs
from trainer.model.encodings.kind import EncodingKind, identity_row, ladder_frequencies, problems_of
from trainer.model.encodings.rotary import FrequencyRoPE, check_theta

MODES = {"ec": "equal cache: twice the attention heads", "eh": "equal heads: half the query and KV projections"}


@dataclass
class RoPEPPConfig:
    """RoPE++: each query head's real and imaginary RoPE attention as two heads (`mode`: ec or eh)."""

    kind: str = "rope_pp"
    theta: float = 10000.0
    mode: str = "ec"


class RoPEPlusPlus(FrequencyRoPE):
    """RoPE on k; each q head as its real head (RoPE) and its imaginary head (turned −90°, then RoPE), interleaved."""

    def rotate(self, q, k, tables, layer=0):
        cos, sin = tables
        real = rotate_pairs(q, cos, sin)
        imaginary = rotate_pairs(-rotate_half(q), cos, sin)  # q·sin − rotate_half(q)·cos
        b, h, s, d = q.shape
        return torch.stack((real, imaginary), dim=2).reshape(b, 2 * h, s, d), rotate_pairs(k, cos, sin)


def heads(pe: RoPEPPConfig, n_heads: int, n_kv_heads: int) -> tuple[int, int, int]:
    """(query heads projected, KV heads projected, attention heads) of a layer of this kind."""
    if pe.mode == "eh":
        return n_heads // 2, n_kv_heads // 2, n_heads
    return n_heads, n_kv_heads, 2 * n_heads


def _check(pe: RoPEPPConfig, s: EncodingShape) -> None:
    from hdrope.errors import UserError

    if pe.mode not in MODES:
        raise UserError(f"model.pe.mode={pe.mode!r}: choose one of {', '.join(MODES)} (RoPE++_EC: "
                        f"{MODES['ec']}; RoPE++_EH: {MODES['eh']})")
    if pe.mode == "eh" and (s.n_heads % 2 or s.n_kv_heads % 2):
        raise UserError(f"model.pe.mode='eh' halves the query and KV heads, but model.n_heads={s.n_heads} and "
                        f"model.n_kv_heads={s.n_kv_heads} are not both even; use even head counts or mode ec")
    if s.head_dim % 2:
        raise UserError(f"head_dim={s.head_dim}: RoPE++ rotates channel pairs; use an even head_dim")
    check_theta(pe.theta)


KIND = EncodingKind(
    "rope_pp", RoPEPPConfig,
    lambda c, s: RoPEPlusPlus(rope_freqs(check_theta(c.theta), s.head_dim // 2), s.head_dim, s.max_seq_len,
                              f"mode={c.mode}"),
    lambda pe: identity_row("rope_pp", f"RoPE++ {str(pe.mode).upper()}", 2, "identity", None, pe.theta),
    identity_keys=("mode",), is_rope=lambda row: False, translation_invariant=True,
    no_export="its imaginary heads have no place in HF Llama's attention, which takes the real part alone",
    problems=lambda c, s: problems_of("rope_pp", lambda: _check(c, s)), cost_keys=("mode",),
    frequencies=lambda c, s: ladder_frequencies(c.theta, s.head_dim, 2), heads=heads)
