"""State-tracking and counting tasks (issue 36), each a run of `ops` short inserts hidden in the filler, in order,
then a question. The answer depends on inserts spread over the whole window, so the model must carry a state
across the filler rather than retrieve one span.

- flipflop / flipflop_dense: flip-flop language modelling (Liu et al. 2023). Each insert is an instruction,
  write `@ b` or ignore `& b` (b a bit); the first is a write. The question `@ =` reads back the last bit written,
  at any distance. An instruction is an ignore with probability 0.8 (flipflop, the sparse variant) or 0.1
  (flipflop_dense). Only the last write is needed, so the distance is from it to the question.
- parity: `ops` bits `* b`; the question `* =` asks the parity of their sum (Delétang et al. 2023).
- cycle: cycle navigation (Delétang et al.): moves `; +`, `; -` or `; 0` on a cycle of 5 places from place 0;
  the question `; =` asks the place reached.
- s3, s5: word problems on the symmetric groups S3 and S5 (Merrill et al. 2024). Each insert `[ g` is a
  permutation g in one-line notation (the images of 0..n-1, n digits); the question `[ =` asks the product of all
  of them, the first applied first, in the same notation.
- selective_copy: selective copying (Gu and Dao 2023; the CoPE paper's selective copy): `span` distinct keys, each
  its own insert `_ x` scattered in the filler; the question `_ =` asks for them in order.
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, Any

import numpy as np

from trainer.data.tasks.spec import DIGITS, Instance, TaskSpec, distinct_keys

if TYPE_CHECKING:
    from trainer.data.tasks.spec import TaskParams

__all__ = ["CYCLE", "SPECS", "compose"]

BITS = ("0", "1")
CYCLE = 5  # places on the cycle of `cycle`
MOVES = {"+": 1, "-": -1, "0": 0}


def _flipflop(ignore: float):
    """The flip-flop generator whose instructions are ignores with probability `ignore` (the first is a write)."""

    def draw(p: TaskParams, rng: np.random.Generator) -> Instance:
        writes = rng.random(p.ops) >= ignore
        writes[0] = True
        bits = [BITS[int(b)] for b in rng.integers(0, 2, size=p.ops)]
        inserts = [["@" if w else "&", b] for w, b in zip(writes, bits, strict=True)]
        last = int(np.flatnonzero(writes)[-1])
        # trailing: the ignores after the last write; where there are some, reading the last instruction's bit is a
        # coin flip, so accuracy on those examples separates flip-flop from that shortcut (docs/tasks.md)
        return Instance(inserts, ["@", "="], [bits[last]], {"ops": p.ops, "writes": int(writes.sum()),
                                                            "trailing": p.ops - 1 - last}, needed=[last])

    return draw


def _parity(p: TaskParams, rng: np.random.Generator) -> Instance:
    bits = rng.integers(0, 2, size=p.ops)
    return Instance([["*", BITS[int(b)]] for b in bits], ["*", "="], [BITS[int(bits.sum()) % 2]],
                    {"ops": p.ops, "ones": int(bits.sum())})


def _cycle(p: TaskParams, rng: np.random.Generator) -> Instance:
    moves = [list(MOVES)[i] for i in rng.integers(0, len(MOVES), size=p.ops)]
    place = sum(MOVES[m] for m in moves) % CYCLE
    return Instance([[";", m] for m in moves], [";", "="], [DIGITS[place]], {"ops": p.ops})


def compose(perms: list[tuple[int, ...]]) -> tuple[int, ...]:
    """The product of permutations in one-line notation, the first applied first: x ↦ p_last(…p_first(x))."""
    out = tuple(range(len(perms[0])))
    for p in perms:
        out = tuple(p[x] for x in out)
    return out


def _group(n: int):
    """The word-problem generator on the symmetric group S_n."""
    elements = list(itertools.permutations(range(n)))

    def draw(p: TaskParams, rng: np.random.Generator) -> Instance:
        word = [elements[i] for i in rng.integers(0, len(elements), size=p.ops)]
        return Instance([["[", *(DIGITS[x] for x in g)] for g in word], ["[", "="],
                        [DIGITS[x] for x in compose(word)], {"ops": p.ops})

    return draw


def _selective_copy(p: TaskParams, rng: np.random.Generator) -> Instance:
    s = distinct_keys(rng, p.span, p)
    return Instance([["_", x] for x in s], ["_", "="], s, {"span": p.span})


def _ignores_trail(params: dict[str, Any]) -> bool:
    """Whether ignores follow the last write: there the last instruction's bit is a coin flip (docs/tasks.md)."""
    return params["trailing"] > 0


SPECS = (
    # floors: a random bit; a random place; a random element's label digit by digit (S_n: 1/n per digit); the
    # right keys in a random order
    TaskSpec("flipflop", "read back the last of `ops` sparse write/ignore instructions' written bit", ("ops",),
             _flipflop(0.8), lambda p: 1 / len(BITS), BITS, _ignores_trail),
    TaskSpec("flipflop_dense", "flip-flop with dense writes (ignore probability 0.1)", ("ops",), _flipflop(0.1),
             lambda p: 1 / len(BITS), BITS, _ignores_trail),
    TaskSpec("parity", "the parity of `ops` scattered bits", ("ops",), _parity, lambda p: 1 / len(BITS), BITS),
    TaskSpec("cycle", "the place reached by `ops` moves on a cycle of 5", ("ops",), _cycle, lambda p: 1 / CYCLE,
             DIGITS[:CYCLE]),
    TaskSpec("s3", "the product of `ops` permutations of 3 (a word problem on S3)", ("ops",), _group(3),
             lambda p: 1 / 3),
    TaskSpec("s5", "the product of `ops` permutations of 5 (a word problem on S5)", ("ops",), _group(5),
             lambda p: 1 / 5),
    TaskSpec("selective_copy", "repeat `span` distinct keys scattered in the filler, in order", ("span",),
             _selective_copy, lambda p: 1 / p.span),
)
