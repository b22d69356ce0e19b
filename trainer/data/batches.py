"""Deterministic batches: the windows of step s depend only on (seed, s, micro-batch), never on history.

A batch may mix in synthetic windows: each `MixtureSource` (passkey prompts, task examples) takes its share of
the rows, drawn per row from the step's generator, and overwrites part of a corpus window in place.

So the data position of a run is its step count, and a resumed run sees exactly the batches an
uninterrupted one would. A batch is the step's global batch; with W data-parallel workers (the rank axis)
worker r takes its contiguous 1/W of the rows, so W workers together see exactly the rows one process
would. Validation windows are fixed, evenly spaced and shared by every run.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np
import torch

from hdrope.errors import UserError

__all__ = ["MixtureSource", "TrainBatches", "check_factors", "check_length", "to_device", "val_windows"]


class MixtureSource(Protocol):
    """A source of synthetic training windows (passkey prompts, task examples)."""

    def fill(self, row: np.ndarray, rng: np.random.Generator) -> None:
        """Overwrite part of `row`, a corpus window of seq_len + 1 tokens, in place, drawing only from rng."""


def check_length(tokens: np.ndarray, length: int, what: str) -> None:
    """UserError naming the knob when a token stream is too short for windows of `length` tokens."""
    if len(tokens) < length + 1:
        raise UserError(
            f"{what} needs windows of {length + 1} tokens but the split holds only {len(tokens)}; "
            "lower model.max_seq_len (or eval.extrapolation factors) or use a larger corpus"
        )


def check_factors(tokens: np.ndarray, seq_len: int, factors: list[float], what: str) -> None:
    """UserError naming the field `what`, its value and the largest factor that fits when the split is too short
    for windows of f times the train length seq_len (plus the next token) for some factor f of `factors`."""
    too_long = [f for f in factors if round(seq_len * f) + 1 > len(tokens)]
    if not too_long:
        return
    largest = (len(tokens) - 1) // seq_len
    fitting = [f for f in factors if f not in too_long]
    use = f"use {what}={fitting}" if fitting else f"use factors of at most {largest}"
    raise UserError(
        f"{what}={list(factors)}: {max(too_long):g}x the train length {seq_len} needs validation windows of "
        f"{round(seq_len * max(too_long)) + 1} tokens but the validation split holds only {len(tokens)}; the largest "
        f"factor that fits is {largest}: {use}, or give a larger corpus or data.val_fraction"
    )


class TrainBatches:
    """(batch / world_size, seq_len + 1) int64 windows from the train stream, with optional mixture sources:
    rank `rank`'s rows of the global batch of `batch_size` rows.

    `mixture` lists (share, source): one uniform draw per row picks the source whose cumulative share covers it
    (the rest stay corpus text), and the chosen rows are filled in row order from the step's generator."""

    def __init__(
        self,
        tokens: np.ndarray,
        seq_len: int,
        batch_size: int,
        seed: int,
        mixture: list[tuple[float, MixtureSource]] | None = None,
        rank: int = 0,
        world_size: int = 1,
    ) -> None:
        check_length(tokens, seq_len, "model.max_seq_len (training)")
        if batch_size % world_size:
            raise UserError(f"train.batch_size={batch_size} does not split evenly over {world_size} workers; "
                            f"use a multiple of {world_size} or another number of workers")
        # a plain ndarray view of the stream (no copy): a memmap runs Python code on every row's slice
        self.tokens, self.seq_len, self.batch_size, self.seed = np.asarray(tokens), seq_len, batch_size, seed
        self.mixture = [(share, source) for share, source in mixture or [] if share > 0]
        self.edges = np.cumsum([share for share, _ in self.mixture])
        self.rows_per_rank = batch_size // world_size
        self.rank_rows = slice(rank * self.rows_per_rank, (rank + 1) * self.rows_per_rank)

    def get(self, step: int, micro: int = 0) -> torch.Tensor:
        """This rank's rows of micro-batch `micro` of optimizer step `step`, as a tensor."""
        return torch.from_numpy(self.rows(step, micro))

    def rows(self, step: int, micro: int = 0) -> np.ndarray:
        """This rank's rows of micro-batch `micro` of optimizer step `step`."""
        rng = np.random.default_rng([self.seed, step, micro])
        n = self.seq_len + 1
        starts = rng.integers(0, len(self.tokens) - n + 1, size=self.batch_size)
        out = np.stack([np.asarray(self.tokens[s : s + n], dtype=np.int64) for s in starts])
        if self.mixture:
            which = np.searchsorted(self.edges, rng.random(self.batch_size), side="right")
            for i in np.flatnonzero(which < len(self.mixture)):
                self.mixture[which[i]][1].fill(out[i], rng)
        return out[self.rank_rows]


def val_windows(tokens: np.ndarray, seq_len: int, count: int) -> torch.Tensor:
    """`count` evenly spaced windows of seq_len + 1 tokens (may overlap when the split is short)."""
    n = seq_len + 1
    check_length(tokens, seq_len, f"validation at length {seq_len}")
    starts = np.linspace(0, len(tokens) - n, count).astype(np.int64)
    return torch.from_numpy(np.stack([np.asarray(tokens[s : s + n], dtype=np.int64) for s in starts]))


def to_device(batch: torch.Tensor, device: torch.device) -> torch.Tensor:
    """The batch on `device`; to a GPU through pinned memory with a non-blocking copy (the host runs ahead)."""
    if device.type != "cuda":
        return batch.to(device)
    return batch.pin_memory().to(device, non_blocking=True)
