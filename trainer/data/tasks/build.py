"""Task examples in a run's tokens: `TaskBuilder` hides an instance's inserts in corpus filler at exact lengths.

An example of `length` tokens is filler (a window of the split's own token stream) with the instance's inserts
placed, in order, at sorted random token offsets, then the question, then the answer: prompt + answer is exactly
`length` tokens in any tokenizer, because every symbol is tokenized on its own and the filler fills the rest.
Everything drawn comes from the generator passed in, so an example is a function of that generator's seed.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from hdrope.errors import UserError
from trainer.data.tasks.registry import TASKS
from trainer.data.tasks.spec import DIGITS, KEY_SETS
from trainer.data.tokenizer import Tokenizer

if TYPE_CHECKING:
    from trainer.data.tasks.spec import TaskParams

__all__ = ["TaskBuilder", "TaskExample", "TaskMixture", "check_fit"]

MARKERS = ("<", ">", "(", "+", ")", "=", "{", "}", "?", ":", "#", ".", "*", "@", "&", ";", "-", "[", "_")


@dataclass
class TaskExample:
    """Token ids of one example's prompt and answer, with the drawn parameters (depths of the inserts included) and
    its distance (tokens from the end of the earliest insert the answer reads to the question; `TaskSpec`)."""

    task: str
    prompt: list[int]
    answer: list[int]
    params: dict[str, Any]
    distance: int = 0

    @property
    def params_json(self) -> str:
        return json.dumps(self.params, sort_keys=True)


class TaskBuilder:
    """Builds examples of the registered tasks for one tokenizer, task_params and filler token stream."""

    def __init__(self, tok: Tokenizer, params: TaskParams, filler: np.ndarray) -> None:
        # a plain ndarray view of the split (no copy): a memmap runs Python code on every slice of every draw
        self.tok, self.params, self.filler = tok, params, np.asarray(filler)
        symbols = dict.fromkeys((*MARKERS, *DIGITS, *(k for keys in KEY_SETS.values() for k in keys)))
        self._ids = {s: tok.encode(s) for s in symbols}
        self._widest = max(len(ids) for ids in self._ids.values())
        self._narrowest = min(len(ids) for ids in self._ids.values())

    def ids(self, symbols: list[str]) -> list[int]:
        """The symbols' tokens, each symbol tokenized on its own."""
        return [t for s in symbols for t in self._ids[s]]

    def unwritable(self, task: str) -> str | None:
        """What keeps the tokenizer from writing `task`'s symbols apart (under the builder's params), in words: the
        symbols it encodes as no token, or two symbols it encodes alike (an unknown-token fallback); None when every
        symbol the task can draw has tokens of its own. Exact match would score such an answer as right."""
        inst = TASKS[task].draw(self.params, np.random.default_rng(0))
        drawn = {s for part in (*inst.inserts, inst.question, inst.answer) for s in part}
        keys = KEY_SETS[self.params.key_set][: self.params.keys]
        used = sorted(drawn & set(MARKERS)) + [s for group in (DIGITS, keys) if drawn & set(group) for s in group]
        empty = [s for s in used if not self._ids[s]]
        if empty:
            return f"writes the symbols {' '.join(map(repr, empty))} of task {task} as no token at all"
        seen: dict[tuple[int, ...], str] = {}
        for s in used:
            if (other := seen.setdefault(tuple(self._ids[s]), s)) != s:
                return f"writes the symbols {other!r} and {s!r} of task {task} as the same tokens {self._ids[s]}"
        return None

    def smallest(self, task: str, params: TaskParams | None = None) -> int:
        """Most tokens an example of `task` takes without filler (inserts, question and answer), under `params`
        (default the builder's): the shortest length any example fits in."""
        inst = TASKS[task].draw(params or self.params, np.random.default_rng(0))
        count = sum(map(len, inst.inserts)) + len(inst.question) + len(inst.answer)  # a fixed count per params
        return count * self._widest

    def max_distance(self, task: str, length: int) -> int:
        """The longest distance an example of `task` of `length` tokens can hold (its earliest needed insert first,
        every other token filler or a later insert), under the builder's params."""
        inst = TASKS[task].draw(self.params, np.random.default_rng(0))
        count = len(inst.inserts[0]) + len(inst.question) + len(inst.answer)  # a fixed count per params
        return max(0, length - count * self._narrowest)

    def floor(self, task: str) -> float:
        """The chance token accuracy of `task` under the builder's params (`TaskSpec.floor`)."""
        return float(TASKS[task].floor(self.params))

    def build(self, task: str, length: int, rng: np.random.Generator) -> TaskExample:
        """An example of `task` whose prompt + answer is exactly `length` tokens, filler from a random place."""
        out = np.empty(length, dtype=np.int64)
        lay = self.place(task, out, rng)
        depths = [round(o / lay.room, 4) if lay.room else 0.0 for o in lay.offsets]
        cut = length - lay.answer_len
        return TaskExample(task, out[:cut].tolist(), out[cut:].tolist(), {**lay.params, "depth": depths},
                           lay.distance)

    def place(self, task: str, out: np.ndarray, rng: np.random.Generator) -> _Layout:
        """Write an example of `task` filling all of `out` (its prompt, then its answer) in place, drawing what
        `build` draws; what was drawn. The training mixture writes its rows with it."""
        length = len(out)
        inst = TASKS[task].draw(self.params, rng)
        inserts = [self.ids(part) for part in inst.inserts]
        question, answer = self.ids(inst.question), self.ids(inst.answer)
        if not answer:  # exact match would count an empty answer as right whatever the model writes
            raise UserError(f"data.tasks: a {task} example's answer {' '.join(inst.answer)!r} is no token in "
                            f"data.tokenizer ({_tokenizer_name(self.tok)}); {_TOKENIZER_FIX}")
        room = length - sum(map(len, inserts)) - len(question) - len(answer)
        if room < 0:
            raise UserError(f"data.tasks: a {task} example needs {length - room} tokens, more than {length}; "
                            "lower its data.task_params or use a longer model.max_seq_len")
        if room > len(self.filler):
            raise UserError(f"data.tasks: a {task} example of {length} tokens needs {room} filler tokens but the "
                            f"split holds {len(self.filler)}; lower eval.tasks.length_factors or use a larger corpus")
        start = int(rng.integers(0, len(self.filler) - room + 1))
        # one insert: the scalar draw equals the size-1 array draw (value and generator state), at a third the cost
        offsets = ([int(rng.integers(0, room + 1))] if len(inserts) == 1 else
                   np.sort(rng.integers(0, room + 1, size=len(inserts))).tolist())
        filler, at, last = self.filler[start : start + room], 0, 0
        for offset, ids in zip(offsets, inserts, strict=True):  # filler up to the insert's offset, then the insert
            out[at : at + offset - last] = filler[last:offset]
            at += offset - last
            out[at : at + len(ids)] = ids
            at += len(ids)
            last = offset
        out[at : at + room - last] = filler[last:]
        out[at + room - last :] = question + answer
        first = min(inst.needed) if inst.needed else 0  # tokens after its end: filler and the later inserts
        distance = room - offsets[first] + sum(map(len, inserts[first + 1 :]))
        return _Layout(inst.params, room, offsets, len(answer), distance)


@dataclass
class _Layout:
    """What placing an example drew beyond its instance: the instance's params, the number of filler tokens, the
    inserts' offsets into the filler, the answer's token count and the example's distance."""

    params: dict[str, Any]
    room: int
    offsets: list[int]
    answer_len: int
    distance: int


class TaskMixture:
    """The training source of task windows: a row is filled with examples back to back, each of a task drawn
    uniformly from `tasks` and of a length drawn uniformly between that task's smallest example and the room left;
    the corpus text of the window stays where no example fits."""

    def __init__(self, builder: TaskBuilder, tasks: list[str]) -> None:
        self.builder, self.tasks = builder, list(tasks)
        self.smallest = [builder.smallest(t) for t in self.tasks]

    def fill(self, row: np.ndarray, rng: np.random.Generator) -> None:
        """Overwrite `row` (a window of seq_len + 1 tokens) from its start with task examples, in place."""
        start = 0
        while True:
            i = int(rng.integers(len(self.tasks)))
            room = len(row) - start
            if start and self.smallest[i] > room:
                return
            length = int(rng.integers(min(self.smallest[i], room), room + 1))
            self.builder.place(self.tasks[i], row[start : start + length], rng)
            start += length


def check_fit(builder: TaskBuilder, task: str, length: int, where: str) -> None:
    """UserError when the smallest example of `task` does not fit in `length` tokens: it names the sizes of
    data.task_params the task reads and the largest value of each that fits (the others kept); UserError first when
    the tokenizer cannot write the task's symbols apart (`TaskBuilder.unwritable`)."""
    if (problem := builder.unwritable(task)) is not None:
        raise UserError(f"data.tokenizer={_tokenizer_name(builder.tok)}: it {problem}; {_TOKENIZER_FIX}")
    need = builder.smallest(task)
    if need <= length:
        return
    params, fits = builder.params, []
    for name in TASKS[task].uses:
        if (v := _largest_fitting(builder, task, name, length)) is not None:
            fits.append(f"data.task_params.{name}={v}")
    sizes = ", ".join(f"{n}={getattr(params, n)}" for n in TASKS[task].uses)
    fix = (f"the largest size that fits, the others kept: {' or '.join(fits)}" if fits else
           "no single size of it fits when lowered alone: lower several")
    raise UserError(f"data.tasks: the smallest {task} example ({sizes}) takes {need} tokens but {where} holds "
                    f"{length}; {fix}, or raise the length")


def _largest_fitting(builder: TaskBuilder, task: str, name: str, length: int) -> int | None:
    """The largest value of size `name` below the builder's whose smallest `task` example fits in `length` tokens,
    the other sizes kept (None when none does): a bisection, since an example only grows with a size."""
    def small_enough(v: int) -> bool:  # sizes that do not fit together (q > k) lie below the valid ones: skip them
        trial = dataclasses.replace(builder.params, **{name: v})
        return not _sizes_valid(trial) or builder.smallest(task, trial) <= length

    lo, hi = 0, getattr(builder.params, name) - 1  # lo is small enough (0: none yet), everything above hi is not
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if small_enough(mid) else (lo, mid - 1)
    return lo if lo and _sizes_valid(dataclasses.replace(builder.params, **{name: lo})) else None


_TOKENIZER_FIX = ("use a tokenizer that writes every character on its own (data.tokenizer=bytes or bpe, byte-level "
                  "BPE), or drop the task from data.tasks")


def _tokenizer_name(tok: Tokenizer) -> str:
    return str(getattr(tok, "path", None) or tok.identity)


def _sizes_valid(p: TaskParams) -> bool:
    return p.q <= p.k
