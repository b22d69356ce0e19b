"""HoPE (Chen et al. 2024, arXiv 2410.21216): RoPE keeping only the frequencies that finish a period within the
train length; the rest carry no position (their channels pass unrotated)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from hdrope.errors import UserError
from trainer.model.encodings.base import EncodingShape, rope_freqs
from trainer.model.encodings.kind import EncodingKind, LengthField, identity_row, problems_of
from trainer.model.encodings.rotary import FrequencyRoPE, check_theta


@dataclass
class HoPEConfig:
    """HoPE: RoPE with every frequency θ_i < 2π / train_len set to 0 (position-independent channels)."""

    kind: str = "hope"
    theta: float = 10000.0
    train_len: int = 0  # the length a kept frequency must finish a period within; 0: model.max_seq_len


def hope_frequencies(theta: float, head_dim: int, train_len: int) -> torch.Tensor:
    """RoPE's frequencies with those below 2π/train_len (a period longer than train_len) set to 0."""
    freqs = rope_freqs(check_theta(theta), head_dim // 2)
    freqs[freqs < 2 * math.pi / train_len] = 0.0
    return freqs


def _train_len(pe: HoPEConfig, s: EncodingShape) -> int:
    return pe.train_len or s.max_seq_len


TRAIN_LEN = LengthField(
    "train_len", "HoPE keeps only the frequencies that finish a period within it, as if it were the train length",
    _train_len, "leave model.pe.train_len at 0 (the train length, model.max_seq_len) or set it below the longest "
    "evaluated length")


def _check(pe: HoPEConfig) -> None:
    n = pe.train_len
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise UserError(f"model.pe.train_len={n!r}: must be an integer >= 0 (0: model.max_seq_len), e.g. 0")
    check_theta(pe.theta)


KIND = EncodingKind(
    "hope", HoPEConfig,
    lambda c, s: FrequencyRoPE(hope_frequencies(c.theta, s.head_dim, _train_len(c, s)), s.head_dim, s.max_seq_len,
                               f"train_len={_train_len(c, s)}"),
    lambda pe: identity_row("hope", "HoPE" + (f" L{pe.train_len}" if pe.train_len else ""), 2, "identity", None,
                            pe.theta),
    identity_keys=("train_len",), is_rope=lambda row: False,
    no_export=("its removed frequencies are 0, which HF's per-frequency factors cannot express exactly"),
    translation_invariant=True, lengths=(TRAIN_LEN,),
    problems=lambda c, s: problems_of("hope", lambda: _check(c)))
