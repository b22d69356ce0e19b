"""Deterministic batches: the windows of step s depend only on (seed, s, micro-batch), never on history.

So the data position of a run is its step count, and a resumed run sees exactly the batches an
uninterrupted one would. Validation windows are fixed, evenly spaced and shared by every run.
"""

from __future__ import annotations

import numpy as np
import torch

from hdrope.errors import UserError
from trainer.passkey.prompt import PasskeyPrompter

__all__ = ["TrainBatches", "check_length", "val_windows"]


def check_length(tokens: np.ndarray, length: int, what: str) -> None:
    """ValueError naming the knob when a token stream is too short for windows of `length` tokens."""
    if len(tokens) < length + 1:
        raise UserError(
            f"{what} needs windows of {length + 1} tokens but the split holds only {len(tokens)}; "
            "lower model.max_seq_len (or eval.extrapolation factors) or use a larger corpus"
        )


class TrainBatches:
    """(batch, seq_len + 1) int64 windows from the train stream, with an optional passkey mixture."""

    def __init__(
        self,
        tokens: np.ndarray,
        seq_len: int,
        batch_size: int,
        seed: int,
        passkey: PasskeyPrompter | None = None,
        passkey_ratio: float = 0.0,
    ) -> None:
        check_length(tokens, seq_len, "model.max_seq_len (training)")
        self.tokens, self.seq_len, self.batch_size, self.seed = tokens, seq_len, batch_size, seed
        self.passkey, self.passkey_ratio = passkey, passkey_ratio

    def get(self, step: int, micro: int = 0) -> torch.Tensor:
        """The micro-batch `micro` of optimizer step `step`."""
        rng = np.random.default_rng([self.seed, step, micro])
        n = self.seq_len + 1
        starts = rng.integers(0, len(self.tokens) - n + 1, size=self.batch_size)
        out = np.stack([np.asarray(self.tokens[s : s + n], dtype=np.int64) for s in starts])
        if self.passkey is not None and self.passkey_ratio > 0:
            for i in np.flatnonzero(rng.random(self.batch_size) < self.passkey_ratio):
                ids = self.passkey.sample_training(n, rng)
                out[i, n - len(ids) :] = ids  # real text before, the passkey prompt at the end
        return torch.from_numpy(out)


def val_windows(tokens: np.ndarray, seq_len: int, count: int) -> torch.Tensor:
    """`count` evenly spaced windows of seq_len + 1 tokens (may overlap when the split is short)."""
    n = seq_len + 1
    check_length(tokens, seq_len, f"validation at length {seq_len}")
    starts = np.linspace(0, len(tokens) - n, count).astype(np.int64)
    return torch.from_numpy(np.stack([np.asarray(tokens[s : s + n], dtype=np.int64) for s in starts]))
