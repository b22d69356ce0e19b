"""Algorithmic tasks whose input is one contiguous insert: copy, reverse, addition and MQAR.

- copy: `< s >` … question `<`, answer s (span distinct letters): induction over the marker.
- reverse: `< s >` … question `>`, answer s reversed.
- addition: `( a + b )` … question `=`, answer a + b; operands of `digits` digits and the sum of digits + 1, all
  written least significant digit first, so each answer digit depends only on digits already seen.
- mqar: `{ k1 v1 … kk vk }` … question `? q1 … qq :`, answer the values of the q queried keys in query order
  (Zoology's multi-query associative recall with k pairs and q queries).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from trainer.data.tasks.spec import Instance, TaskSpec, digits_of, distinct_keys, value

if TYPE_CHECKING:
    from trainer.data.tasks.spec import TaskParams

__all__ = ["SPECS"]


def _copy(p: TaskParams, rng: np.random.Generator) -> Instance:
    s = distinct_keys(rng, p.span, p)
    return Instance([["<", *s, ">"]], ["<"], s, {"span": p.span})


def _reverse(p: TaskParams, rng: np.random.Generator) -> Instance:
    s = distinct_keys(rng, p.span, p)
    return Instance([["<", *s, ">"]], [">"], s[::-1], {"span": p.span})


def _addition(p: TaskParams, rng: np.random.Generator) -> Instance:
    a, b = (int(x) for x in rng.integers(0, 10**p.digits, size=2))
    insert = ["(", *digits_of(a, p.digits), "+", *digits_of(b, p.digits), ")"]
    return Instance([insert], ["="], digits_of(a + b, p.digits + 1), {"digits": p.digits, "a": a, "b": b})


def _mqar(p: TaskParams, rng: np.random.Generator) -> Instance:
    keys = distinct_keys(rng, p.k, p)
    values = [value(rng, p.value_digits) for _ in keys]
    asked = [int(i) for i in rng.choice(p.k, size=p.q, replace=False)]
    pairs = [sym for key, val in zip(keys, values, strict=True) for sym in (key, *val)]
    answer = [sym for i in asked for sym in values[i]]
    return Instance([["{", *pairs, "}"]], ["?", *(keys[i] for i in asked), ":"], answer,
                    {"k": p.k, "q": p.q, "asked": asked})


SPECS = (
    TaskSpec("copy", "repeat a string of `span` distinct letters", ("span",), _copy),
    TaskSpec("reverse", "write a string of `span` distinct letters backwards", ("span",), _reverse),
    TaskSpec("addition", "add two `digits`-digit numbers (digits least significant first)", ("digits",), _addition),
    TaskSpec("mqar", "recall the values of `q` of `k` key-value pairs", ("k", "q", "value_digits"), _mqar),
)
