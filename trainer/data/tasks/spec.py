"""What a synthetic task is: a `TaskSpec` whose `draw` turns (params, rng) into an `Instance` of symbols.

An instance is a list of inserts (symbol lists hidden, in order, at random places of the corpus's filler text),
a question that ends the prompt, and the answer that follows it. Symbols are short strings (a letter, a digit, a
marker); `trainer.data.tasks.build` tokenizes each one on its own, so a prompt's token count is exact in any
tokenizer. Keys, variables and copied strings come from the key set `KEY_SETS[data.task_params.key_set]` (lowercase
letters by default); values are digits.
"""

from __future__ import annotations

import string
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from trainer.new_setting import NEW_SETTING

__all__ = [
    "DIGITS", "KEY_SETS", "LETTERS", "Instance", "TaskParams", "TaskSpec", "digits_of", "distinct_keys", "pick_floor",
    "value",
]

LETTERS = tuple(string.ascii_lowercase)
DIGITS = tuple(string.digits)

# The alphabets keys are drawn from (`data.task_params.key_set`); the validator reads this registry.
KEY_SETS: dict[str, tuple[str, ...]] = {
    # lowercase letters: the corpus text is full of them, so a needle's key recurs in the filler
    "letters": LETTERS,
    # printable ASCII characters that never occur in the shipped Shakespeare corpus and are no task marker: a key
    # occurs only where the task puts it, so retrieving it is one induction step
    "symbols": ("$", "%", "^", "|", "~", "`", "\\"),
}


@dataclass
class TaskParams:
    """Sizes of the synthetic tasks (`data.task_params`); each task reads the fields its registry entry names."""

    keys: int = 26  # alphabet of keys, variables and copied strings: the first `keys` symbols of the key set
    value_digits: int = 1  # digits of a value (mqar, needles, vartrack)
    span: int = 4  # copy, reverse: letters in the string
    digits: int = 2  # addition: digits of each operand
    k: int = 4  # mqar: key-value pairs; niah_multikey / niah_multiquery: needles; niah_multivalue: values of the key
    q: int = 2  # mqar, niah_multiquery: keys asked
    hops: int = 2  # vartrack: assignments in the chain (and in its distractor chain)
    key_set: str = field(default="letters", metadata=NEW_SETTING)  # a name in KEY_SETS
    ops: int = field(default=6, metadata=NEW_SETTING)  # the state-tracking tasks: instructions, bits, moves or elements


@dataclass
class Instance:
    """One drawn example in symbols: inserts hidden in the filler in order, then the question; `params` are the
    drawn quantities a table keeps (k, q, the operands …)."""

    inserts: list[list[str]]
    question: list[str]
    answer: list[str]
    params: dict[str, Any] = field(default_factory=dict)
    needed: list[int] | None = None  # the inserts the answer reads (indices); None: all of them


@dataclass(frozen=True)
class TaskSpec:
    """A registered task: its name, a one-line description, the `data.task_params` fields it reads (the sizes the
    fit check may lower), its generator and its chance floor.

    An example's distance is the number of tokens from the end of the earliest insert its answer reads
    (`Instance.needed`, which the generator sets) to the start of the question: the span the answer must be carried
    across. `floor(params)` is the token accuracy of a guess that knows the answer's format but not the inserts'
    places: the level a chance-corrected token accuracy maps to 0. `answers`, for a task whose answer is one symbol,
    lists the symbols it can be: the format guess picks one of them at random (otherwise the guess is the answer's
    own symbols in a random order). `hard(params)`, for a task a shortcut can score high on, says whether an
    example defeats that shortcut: the evaluation then also reports the exact match on those examples alone
    (`hardacc_<task>_x<f>`, with their count `hardn_…`)."""

    name: str
    doc: str
    uses: tuple[str, ...]
    draw: Callable[[TaskParams, np.random.Generator], Instance]
    floor: Callable[[TaskParams], float]
    answers: tuple[str, ...] | None = None
    hard: Callable[[dict[str, Any]], bool] | None = None


def pick_floor(choices: int) -> float:
    """Token accuracy of guessing a value's digits by picking one of `choices` drawn values at random (the right
    one with probability 1/choices, another one matching a digit by chance 1 in 10)."""
    return 1 / choices + (1 - 1 / choices) / len(DIGITS)


def distinct_keys(rng: np.random.Generator, count: int, p: TaskParams) -> list[str]:
    """`count` different symbols from the first `p.keys` of the key set `p.key_set`, in random order."""
    alphabet = KEY_SETS[p.key_set]
    return [alphabet[i] for i in rng.choice(p.keys, size=count, replace=False)]


def value(rng: np.random.Generator, digits: int) -> list[str]:
    """A random value of `digits` digits (leading zeros allowed), as digit symbols."""
    return [DIGITS[i] for i in rng.integers(0, 10, size=digits)]


def digits_of(number: int, width: int) -> list[str]:
    """`number` as `width` digit symbols, least significant first (the order addition is written in)."""
    return list(str(number).zfill(width)[::-1])
