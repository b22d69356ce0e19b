"""Language models whose length generalisation is known, for checking the length instruments (issue 33).

A byte n-gram model (interpolated Witten-Bell, counted on a slice of the train split) sees only its last n − 1
tokens, so its loss past position n − 2 does not depend on how long the window is: a perfect length generaliser.
`NGramLM` wraps it as a torch module with the interface the lab's evaluation calls (tokens (batch, seq) → logits
(batch, seq, vocab)), in three known behaviours: `perfect`, `forgets` (uniform logits from position D on: fails
exactly past D) and `never_learned` (unigram logits everywhere: gains nothing from context).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

__all__ = ["NGramCounts", "NGramLM", "count_ngrams"]


@dataclass
class NGramCounts:
    """Log-probabilities of an interpolated Witten-Bell n-gram model: `keys[k]` are the sorted codes of the seen
    contexts of k tokens (k = 1 … n − 1), `rows[k]` their rows in `log_probs` (row 0: the unigram)."""

    n: int
    vocab: int
    keys: dict[int, np.ndarray]
    rows: dict[int, np.ndarray]
    log_probs: np.ndarray


def _codes(tokens: np.ndarray, k: int, vocab: int) -> np.ndarray:
    """The code of the k tokens ending at each position (axis -1), for positions k − 1 onwards."""
    length = tokens.shape[-1]
    code = np.zeros((*tokens.shape[:-1], length - k + 1), dtype=np.int64)
    for i in range(k):
        code = code * vocab + tokens[..., i : length - k + 1 + i]
    return code


def count_ngrams(tokens: np.ndarray, n: int, vocab: int) -> NGramCounts:
    """Count an n-gram model on a token array (each order interpolated with the one below, the unigram with the
    uniform distribution, by Witten-Bell)."""
    tokens = np.asarray(tokens, dtype=np.int64)
    counts = np.bincount(tokens, minlength=vocab).astype(np.float64)
    seen = float((counts > 0).sum())
    probs = [((counts + seen / vocab) / (counts.sum() + seen))[None, :]]
    keys, rows, parent_keys, start = {}, {}, np.zeros(1, dtype=np.int64), 1
    for k in range(1, n):
        ctx = _codes(tokens[:-1], k, vocab)
        nxt = tokens[k:]
        uniq, inverse = np.unique(ctx, return_inverse=True)
        table = np.zeros((len(uniq), vocab), dtype=np.float64)
        np.add.at(table, (inverse, nxt), 1.0)
        total, types = table.sum(axis=1, keepdims=True), (table > 0).sum(axis=1, keepdims=True)
        parent = np.zeros(len(uniq), dtype=np.int64) if k == 1 else \
            np.searchsorted(parent_keys, uniq % vocab ** (k - 1)) + rows[k - 1][0]
        lower = np.concatenate(probs)[parent]
        probs.append((table + types * lower) / (total + types))
        keys[k], rows[k] = uniq, np.arange(start, start + len(uniq))
        parent_keys, start = uniq, start + len(uniq)
    return NGramCounts(n, vocab, keys, rows, np.log(np.concatenate(probs)).astype(np.float32))


class NGramLM(nn.Module):
    """The n-gram model as a language model the lab's evaluation can score; behaviour `perfect`, `forgets` (uniform
    logits at input positions ≥ forget_from) or `never_learned` (unigram logits everywhere)."""

    BEHAVIOURS = ("perfect", "forgets", "never_learned")

    def __init__(self, counts: NGramCounts, behaviour: str = "perfect", forget_from: int = 0) -> None:
        super().__init__()
        if behaviour not in self.BEHAVIOURS or (behaviour == "forgets") != (forget_from > 0):
            raise ValueError(f"NGramLM({behaviour!r}, forget_from={forget_from}): choose one of {self.BEHAVIOURS}; "
                             "forget_from > 0 exactly with 'forgets'")
        self.counts, self.behaviour, self.forget_from = counts, behaviour, forget_from
        self.table = nn.Parameter(torch.from_numpy(counts.log_probs), requires_grad=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = tokens.cpu().numpy().astype(np.int64)
        row = np.zeros(x.shape, dtype=np.int64)  # the unigram
        if self.behaviour != "never_learned":
            c = self.counts
            for k in range(1, c.n):  # longer contexts overwrite shorter ones where seen
                if x.shape[1] < k:
                    break
                code = _codes(x, k, c.vocab)
                at = np.clip(np.searchsorted(c.keys[k], code), 0, len(c.keys[k]) - 1)
                found = c.keys[k][at] == code
                row[:, k - 1 :] = np.where(found, c.rows[k][at], row[:, k - 1 :])
        logits = self.table[torch.from_numpy(row)]
        if self.behaviour == "forgets":
            logits[:, self.forget_from :] = 0.0
        return logits.to(tokens.device)
