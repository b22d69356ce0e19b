"""Needle-in-a-haystack variants (after RULER) and variable tracking, hidden in the corpus's own text.

A needle is `# key value .` (a letter, `value_digits` digits); the question repeats its start, `# key`, and the
value follows (plain induction).
- niah_single: one needle.
- niah_multikey: k needles of distinct keys (k - 1 distractors); one is asked.
- niah_multivalue: k needles of one key, each with its own value; question `# key *`, answered by all k values in
  the order they appear.
- niah_multiquery: k needles of distinct keys; question `# q1 … qq ?`, answered by the q values in query order.
- vartrack: a chain `# x1 = v .`, `# x2 = x1 .` … of `hops` assignments, interleaved (order kept) with a distractor
  chain of as many; question `= x_hops ?`, answered by v.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from trainer.data.tasks.spec import DIGITS, Instance, TaskSpec, distinct_keys, pick_floor, value

if TYPE_CHECKING:
    from trainer.data.tasks.spec import TaskParams

__all__ = ["SPECS"]


def _needle(key: str, val: list[str]) -> list[str]:
    return ["#", key, *val, "."]


def _single(p: TaskParams, rng: np.random.Generator) -> Instance:
    key, val = distinct_keys(rng, 1, p)[0], value(rng, p.value_digits)
    return Instance([_needle(key, val)], ["#", key], val, {"k": 1})


def _multikey(p: TaskParams, rng: np.random.Generator) -> Instance:
    keys = distinct_keys(rng, p.k, p)
    values = [value(rng, p.value_digits) for _ in keys]
    asked = int(rng.integers(p.k))
    return Instance([_needle(k, v) for k, v in zip(keys, values, strict=True)], ["#", keys[asked]],
                    values[asked], {"k": p.k, "asked": asked}, needed=[asked])


def _multivalue(p: TaskParams, rng: np.random.Generator) -> Instance:
    key = distinct_keys(rng, 1, p)[0]
    values = [value(rng, p.value_digits) for _ in range(p.k)]
    return Instance([_needle(key, v) for v in values], ["#", key, "*"], [s for v in values for s in v], {"k": p.k})


def _multiquery(p: TaskParams, rng: np.random.Generator) -> Instance:
    keys = distinct_keys(rng, p.k, p)
    values = [value(rng, p.value_digits) for _ in keys]
    asked = [int(i) for i in rng.choice(p.k, size=p.q, replace=False)]
    return Instance([_needle(k, v) for k, v in zip(keys, values, strict=True)],
                    ["#", *(keys[i] for i in asked), "?"], [s for i in asked for s in values[i]],
                    {"k": p.k, "q": p.q, "asked": asked}, needed=asked)


def _vartrack(p: TaskParams, rng: np.random.Generator) -> Instance:
    names = distinct_keys(rng, 2 * p.hops, p)
    chains = []
    for names_of in (names[: p.hops], names[p.hops :]):
        val = value(rng, p.value_digits)
        chain = [["#", names_of[0], "=", *val, "."]]
        chain += [["#", names_of[i], "=", names_of[i - 1], "."] for i in range(1, p.hops)]
        chains.append((chain, val))
    order = rng.permutation([0] * p.hops + [1] * p.hops)  # which chain each insert comes from, order kept within
    taken = [0, 0]
    inserts = []
    for c in order:
        inserts.append(chains[c][0][taken[c]])
        taken[c] += 1
    needed = [i for i, c in enumerate(order) if c == 0]  # the asked chain's assignments
    return Instance(inserts, ["=", names[p.hops - 1], "?"], chains[0][1], {"hops": p.hops}, needed=needed)


SPECS = (
    # floors: a random digit (one needle); one of the k values (or the k values in a random order) at random;
    # one of the two chains' values
    TaskSpec("niah_single", "retrieve the value of the one needle", ("value_digits",), _single,
             lambda p: 1 / len(DIGITS)),
    TaskSpec("niah_multikey", "retrieve one of `k` needles of distinct keys", ("k", "value_digits"), _multikey,
             lambda p: pick_floor(p.k)),
    TaskSpec("niah_multivalue", "retrieve all `k` values of one key", ("k", "value_digits"), _multivalue,
             lambda p: pick_floor(p.k)),
    TaskSpec("niah_multiquery", "retrieve `q` of `k` needles", ("k", "q", "value_digits"), _multiquery,
             lambda p: pick_floor(p.k)),
    TaskSpec("vartrack", "follow a chain of `hops` assignments past a distractor chain", ("hops", "value_digits"),
             _vartrack, lambda p: pick_floor(2)),
)
