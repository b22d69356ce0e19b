"""LongRoPE-style passkey prompts: the one assembler, and the one definition of the key's depth.

A prompt is header ‖ filler^x ‖ key(p) ‖ filler^y ‖ question, answered by " p" (`prompt_parts`). The filler
is cycled unit by unit: a unit is one filler sentence for training prompts and the training-time evaluation
(so lengths can be hit closely), the whole filler for the paper's dataset builder (its x and y count whole
fillers, as the appendix writes F^x). Whatever the unit, the key's depth is the fraction of filler tokens
before it (`key_depth`). Training prompts tokenize the parts separately and concatenate them, so their token
count is exact by construction; the builder writes the joined text.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from hdrope.errors import UserError
from trainer.config import PasskeyFormat
from trainer.data.tokenizer import Tokenizer

__all__ = ["PasskeyPrompt", "PasskeyPrompter", "filler_sentences", "first_integer", "key_depth", "prompt_parts"]

_INT = re.compile(r"\d+")


def first_integer(text: str) -> str | None:
    """The first run of digits in text, or None."""
    m = _INT.search(text)
    return m.group(0) if m else None


def stop_after_number(tok: Tokenizer):
    """A decoding stop rule: true once the generated text holds a number followed by something else
    (or starts with a non-digit)."""

    def stop(ids: list[int]) -> bool:
        text = tok.decode(ids)
        stripped = text.lstrip()
        return bool(stripped) and (not stripped[0].isdigit() or not text.rstrip()[-1:].isdigit())

    return stop


def filler_sentences(fmt: PasskeyFormat) -> list[str]:
    """The filler's sentences (each with its leading space): the unit training prompts cycle."""
    return [s for s in re.split(r"(?<=[.!?])(?=\s)", fmt.filler) if s.strip()] or [fmt.filler]


def prompt_parts(fmt: PasskeyFormat, units: list[str], x: int, y: int, passkey: int | str) -> list[str]:
    """The texts of a prompt in order: header, x filler units, the key sentence, the next y filler units (the cycle
    goes on past the key), the question."""
    before = [units[i % len(units)] for i in range(x)]
    after = [units[i % len(units)] for i in range(x, x + y)]
    return [fmt.header, *before, fmt.key.replace("{k}", str(passkey)), *after, fmt.question]


def key_depth(filler_before: int, filler_after: int) -> float:
    """Where the key sits: the fraction of the prompt's filler tokens that come before it (0 with no filler)."""
    total = filler_before + filler_after
    return filler_before / total if total else 0.0


@dataclass
class PasskeyPrompt:
    """Token ids of one prompt and its answer, with the key's place."""

    prompt: list[int]
    answer: list[int]
    passkey: int
    x: int  # filler sentences before the key
    y: int  # filler sentences after the key
    depth: float  # key_depth: the fraction of filler tokens before the key


class PasskeyPrompter:
    """Builds passkey prompts of a given token length and key depth for one tokenizer."""

    def __init__(self, tok: Tokenizer, fmt: PasskeyFormat) -> None:
        self.tok, self.fmt = tok, fmt
        self.sentences = filler_sentences(fmt)
        self.units = [tok.encode(s) for s in self.sentences]
        self.header = tok.encode(fmt.header) if fmt.header else []
        self.question = tok.encode(fmt.question)
        self._known = {**dict(zip(self.sentences, self.units, strict=True)), fmt.header: self.header,
                       fmt.question: self.question}
        self.end = tok.encode(".")  # what follows the answer in training prompts
        longest = tok.encode(fmt.key.replace("{k}", str(fmt.max_key)))
        self.fixed = len(self.header) + len(longest) + len(self.question) + len(self.answer_ids(fmt.max_key))

    def answer_ids(self, passkey: int) -> list[int]:
        return self.tok.encode(f" {passkey}")

    def _filler_len(self, start: int, count: int) -> int:
        return sum(len(self.units[i % len(self.units)]) for i in range(start, start + count))

    def max_sentences(self, length: int) -> int:
        """Most filler sentences that fit with the longest passkey in `length` tokens (prompt + answer)."""
        s = 0
        while self.fixed + self._filler_len(0, s + 1) <= length:
            s += 1
        return s

    def build(self, length: int, depth: float, passkey: int) -> PasskeyPrompt:
        """A prompt whose prompt+answer fits in `length` tokens, with the key at relative depth `depth`."""
        s = self.max_sentences(length)
        if s < 1:
            raise UserError(
                f"data.passkey: header+key+question+answer take {self.fixed} tokens, which leaves no room for "
                f"filler within {length} tokens; shorten data.passkey.header or evaluate at longer lengths"
            )
        x = round(min(max(depth, 0.0), 1.0) * s)
        y = s - x
        parts = prompt_parts(self.fmt, self.sentences, x, y, passkey)
        prompt = [t for part in parts for t in self._ids(part)]
        depth = key_depth(self._filler_len(0, x), self._filler_len(x, y))
        return PasskeyPrompt(prompt, self.answer_ids(passkey), passkey, x, y, depth)

    def _ids(self, part: str) -> list[int]:
        """A part's tokens (the fixed parts from the cache; an empty header is no tokens)."""
        if part not in self._known:
            return self.tok.encode(part) if part else []
        return self._known[part]

    def sample_training(self, length: int, rng: np.random.Generator) -> list[int]:
        """Prompt, answer and a closing "." of a random key at a random depth, at most `length` tokens.

        The full stop teaches where the answer ends: a model that never saw what follows the key keeps
        writing digits (" 1733") and fails the exact match although it retrieved the key."""
        passkey = int(rng.integers(self.fmt.min_key, self.fmt.max_key + 1))
        p = self.build(length - len(self.end), float(rng.random()), passkey)
        return p.prompt + p.answer + self.end

    def fill(self, row: np.ndarray, rng: np.random.Generator) -> None:
        """A training prompt (`sample_training`) at the end of `row`, the corpus text before it (a MixtureSource)."""
        ids = self.sample_training(len(row), rng)
        row[len(row) - len(ids) :] = ids
