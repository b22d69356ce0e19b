"""Algorithmic tasks whose input is one contiguous insert: copy, reverse, addition and MQAR.

- copy: `< s >` … question `<`, answer s (span distinct letters): induction over the marker.
- reverse: `< s >` … question `>`, answer s reversed.
- addition: `( a + b )` … question `=`, answer a + b; operands of `digits` digits and the sum of digits + 1, all
  written least significant digit first, so each answer digit depends only on digits already seen.
- mqar: Zoology's multi-query associative recall (`multiquery_ar`): the pairs `{ k1 v1 … kk vk }` … then the
  queries `? q1 w1 q2 w2 … qq`, each query key followed by its value, and the answer is the last query's value;
  q distinct keys of the k are asked, and under the full-sequence loss every query's value is a prediction target
  (as in Zoology), while the evaluation scores the last one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from trainer.data.tasks.spec import DIGITS, Instance, TaskSpec, digits_of, distinct_keys, pick_floor, value

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
    queries = [sym for i in asked[:-1] for sym in (keys[i], *values[i])]
    return Instance([["{", *pairs, "}"]], ["?", *queries, keys[asked[-1]]], values[asked[-1]],
                    {"k": p.k, "q": p.q, "asked": asked})


SPECS = (
    # floors: the right symbols in a random order; a random digit; one of the k values at random
    TaskSpec("copy", "repeat a string of `span` distinct letters", ("span",), _copy, lambda p: 1 / p.span),
    TaskSpec("reverse", "write a string of `span` distinct letters backwards", ("span",), _reverse,
             lambda p: 1 / p.span),
    TaskSpec("addition", "add two `digits`-digit numbers (digits least significant first)", ("digits",), _addition,
             lambda p: 1 / len(DIGITS)),
    TaskSpec("mqar", "recall the values of `q` of `k` key-value pairs, each query followed by its value",
             ("k", "q", "value_digits"), _mqar, lambda p: pick_floor(p.k)),
)
