"""LongRoPE-style passkey prompts assembled in token space.

A prompt is header ‖ filler^x ‖ key(p) ‖ filler^y ‖ question, answered by " p". The filler is
cycled sentence by sentence, so x and y count filler sentences and lengths can be hit closely.
Parts are tokenized separately and concatenated, so the token count is exact by construction.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from hdrope.errors import UserError
from trainer.config import PasskeyFormat
from trainer.data.tokenizer import Tokenizer

__all__ = ["PasskeyPrompt", "PasskeyPrompter", "first_integer"]

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


@dataclass
class PasskeyPrompt:
    """Token ids of one prompt and its answer, with the key's place."""

    prompt: list[int]
    answer: list[int]
    passkey: int
    x: int  # filler sentences before the key
    y: int  # filler sentences after the key

    @property
    def depth(self) -> float:
        """Relative depth of the key, x / (x + y) (0 when there is no filler)."""
        return self.x / (self.x + self.y) if self.x + self.y else 0.0


class PasskeyPrompter:
    """Builds passkey prompts of a given token length and key depth for one tokenizer."""

    def __init__(self, tok: Tokenizer, fmt: PasskeyFormat) -> None:
        self.tok, self.fmt = tok, fmt
        sentences = [s for s in re.split(r"(?<=[.!?])(?=\s)", fmt.filler) if s.strip()]
        self.units = [tok.encode(s) for s in sentences] or [tok.encode(fmt.filler)]
        self.header = tok.encode(fmt.header) if fmt.header else []
        self.question = tok.encode(fmt.question)
        self.end = tok.encode(".")  # what follows the answer in training prompts
        longest = tok.encode(fmt.key.replace("{k}", str(fmt.max_key)))
        self.fixed = len(self.header) + len(longest) + len(self.question) + len(self.answer_ids(fmt.max_key))

    def answer_ids(self, passkey: int) -> list[int]:
        return self.tok.encode(f" {passkey}")

    def _filler(self, start: int, count: int) -> list[int]:
        out: list[int] = []
        for i in range(start, start + count):
            out += self.units[i % len(self.units)]
        return out

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
        key = self.tok.encode(self.fmt.key.replace("{k}", str(passkey)))
        prompt = self.header + self._filler(0, x) + key + self._filler(x, y) + self.question
        return PasskeyPrompt(prompt, self.answer_ids(passkey), passkey, x, y)

    def sample_training(self, length: int, rng: np.random.Generator) -> list[int]:
        """Prompt, answer and a closing "." of a random key at a random depth, at most `length` tokens.

        The full stop teaches where the answer ends: a model that never saw what follows the key keeps
        writing digits (" 1733") and fails the exact match although it retrieved the key."""
        passkey = int(rng.integers(self.fmt.min_key, self.fmt.max_key + 1))
        p = self.build(length - len(self.end), float(rng.random()), passkey)
        return p.prompt + p.answer + self.end
