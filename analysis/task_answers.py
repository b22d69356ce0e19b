"""Known answers for the task instruments: stand-in decoders whose skill is set by distance, scored by the lab's own
task evaluation, and the table docs/length-generalisation.md shows.

`AnswerModel` takes the place of the Llama in `trainer.evals.tasks.evaluate_tasks` (greedy decoding with a KV cache
and the lab's scoring): for each prompt it emits the example's own answer where `knows(distance, prompt tokens)`
holds, and a
guess that knows the format elsewhere (the answer's own tokens in a random order: for copy and reverse, exactly the
guess the chance floor describes). So an oracle (knows everything), a model that fails past distance 2D in every
window, one that fails in windows past 2x at every distance, and one that never learned have known effective
lengths on distance and on position, "learned" marks and chance-corrected token accuracies.

Regenerate the docs table: `python -m analysis.task_answers` (about a minute on one core).
"""

from __future__ import annotations

import contextlib
import math
import zlib
from collections.abc import Callable, Sequence
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import torch

from analysis.distance import stability
from analysis.lengthgen import effective_length, learned_table, with_effective_lengths
from trainer.config import TaskEvalConfig, task_metric
from trainer.data.tasks.build import TaskBuilder, TaskExample
from trainer.data.tasks.registry import TASKS
from trainer.evals.tasks import TaskResult, evaluate_tasks, task_examples
from trainer.evals.tasks_table import TASKS_FILE

__all__ = ["FACTORS", "AnswerModel", "known_answer_cells", "known_answer_table", "score", "stability_table"]

FACTORS = (1.0, 1.5, 2.0, 4.0, 8.0)  # the shipped studies' eval.tasks.length_factors
Knows = Callable[[int, int], bool]  # (distance, prompt tokens) -> whether a stand-in answers that example


class AnswerModel(torch.nn.Module):
    """A stand-in decoder: the examples' own answers where `knows(distance, prompt tokens)`, else a format guess
    (seeded by the prompt), one token per decoding step; the interface `greedy_generate_batch` uses. The guess is
    one of the task's possible answers at random where `guesses` lists them (token ids per task: a one-symbol
    answer), else the answer's own tokens shuffled."""

    def __init__(self, examples: Sequence[TaskExample], vocab_size: int, knows: Knows,
                 seed: int = 0, guesses: dict[str, list[list[int]]] | None = None) -> None:
        super().__init__()
        self.args = SimpleNamespace(n_layers=1)
        self.anchor = torch.nn.Parameter(torch.zeros(1))  # where decoding puts its tensors
        self.vocab_size = vocab_size
        self.replies: dict[tuple[int, ...], list[int]] = {}
        for ex in examples:
            reply = list(ex.answer)
            if not knows(ex.distance, len(ex.prompt)):
                rng = np.random.default_rng([seed, zlib.crc32(np.asarray(ex.prompt, dtype=np.int64).tobytes())])
                options = (guesses or {}).get(ex.task)
                reply = list(options[rng.integers(len(options))]) if options else \
                    [reply[i] for i in rng.permutation(len(reply))]
            self.replies[tuple(ex.prompt)] = reply
        self._pending: list[list[int]] = []
        self._step = 0

    def forward(self, tokens: torch.Tensor, cache: object = None) -> torch.Tensor:
        """Logits (batch, 1, vocab) one-hot at the next reply token: a prompt starts a reply, one token steps it."""
        if tokens.shape[1] > 1 or not self._pending:
            self._pending, self._step = [self.replies[tuple(r)] for r in tokens.tolist()], 0
        else:
            self._step += 1
        logits = torch.zeros(len(tokens), 1, self.vocab_size)
        for i, reply in enumerate(self._pending):
            if self._step < len(reply):
                logits[i, 0, reply[self._step]] = 1.0
        return logits


def score(builder: TaskBuilder, tasks: Sequence[str], train_length: int, samples: int, seed: int,
          knows: Knows, factors: Sequence[float] = FACTORS) -> TaskResult:
    """The lab's task evaluation of an `AnswerModel` on the examples of (tasks, factors, samples, seed)."""
    examples = [ex for task in tasks for f in factors
                for ex in task_examples(builder, task, round(train_length * f), samples, seed)]
    guesses = {task: [builder.ids([a]) for a in TASKS[task].answers] for task in tasks if TASKS[task].answers}
    model = AnswerModel(examples, builder.tok.vocab_size, knows, seed, guesses)
    cfg = TaskEvalConfig(length_factors=list(factors), samples=samples, batch_size=samples)
    return evaluate_tasks(model, builder, list(tasks), train_length, cfg, seed, contextlib.nullcontext)  # type: ignore[arg-type]


def known_answer_cells(builder: TaskBuilder, tasks: Sequence[str], train_length: int, samples: int,
                       seeds: Sequence[int], models: dict[str, Knows], out: Path) -> pd.DataFrame:
    """Cells as the report reads them (variant, theta, seed, run_dir, the task metrics), one per (model, seed), each
    run directory holding the tasks.parquet of its scored rows; efflen_<task> added by `with_effective_lengths`."""
    cells = []
    for rank, (name, knows) in enumerate(models.items()):
        for seed in seeds:
            result = score(builder, tasks, train_length, samples, seed, knows)
            run_dir = out / f"{name}-{samples}-{seed}".replace(" ", "_")
            run_dir.mkdir(parents=True, exist_ok=True)
            pd.DataFrame(result.rows).to_parquet(run_dir / TASKS_FILE)
            cells.append({"variant": name, "variant_rank": rank, "theta": math.nan, "seed": seed,
                          "run_dir": str(run_dir), **result.metrics})
    return with_effective_lengths(pd.DataFrame(cells))


def known_answer_table(builder: TaskBuilder, train_length: int, out: Path, task: str = "copy",
                       sample_counts: Sequence[int] = (32, 64), sets: int = 8) -> pd.DataFrame:
    """model, prompts, the right effective length, what the instruments returned on each of `sets` prompt sets
    (the distance rule, and the length-factor rule it replaced), learned, and 1x token accuracy raw and
    chance-corrected (mean over the sets)."""
    trained = builder.max_distance(task, train_length + 1)
    reach = builder.max_distance(task, round(train_length * max(FACTORS)))
    window = 2 * train_length  # the position stand-in answers in windows up to 2x the train length
    models: dict[str, Knows] = {"oracle": lambda d, n: True, "right to 2D, guesses past": lambda d, n: d <= 2 * trained,
                                "right in windows to 2x, guesses in longer": lambda d, n: n <= window,
                                "never learned (guesses)": lambda d, n: False}
    top = f"{max(FACTORS):g}"
    truth = {"oracle": f"{reach / trained:.3g} (the longest evaluated); position {top}",
             "right to 2D, guesses past": f"2; position {top} (it fails by distance)",
             "right in windows to 2x, guesses in longer": f"{builder.max_distance(task, window) / trained:.3g} (the "
             "2x windows' longest, never crossed); position 2 (it fails by position)",
             "never learned (guesses)": "not learned"}
    rows = []
    for samples in sample_counts:
        cells = known_answer_cells(builder, [task], train_length, samples, range(sets), models, out)
        learned = learned_table(cells).set_index("variant")
        for name in models:
            mine = cells[cells["variant"] == name]
            by_factor = [[row[task_metric("acc", task, f)] for f in FACTORS] for _, row in mine.iterrows()]
            rows.append({
                "model": name, "prompts per length": samples, "right answer": truth[name],
                "effective length on distance (× trained distance)": _values(mine[f"efflen_{task}"]),
                "on position (× train length)": _values(mine[f"poslen_{task}"]),
                "by length factor, the old rule (× train length)": _values(
                    [effective_length(FACTORS, accs) for accs in by_factor]),
                "learned": bool(learned.loc[name, "learned"]),
                "1x token accuracy": f"{mine[task_metric('tokacc', task, 1.0)].mean():.3f}",
                "1x chance-corrected": f"{mine[task_metric('tokskill', task, 1.0)].mean():.3f}"})
    return pd.DataFrame(rows)


def stability_table(trained: int, reaches: dict[float, int], sample_counts: Sequence[int] = (8, 16, 32, 64, 128),
                    sets: int = 500, seed: int = 0) -> pd.DataFrame:
    """Per accuracy curve over distance: the share of `sets` simulated prompt sets that give the most common
    effective length, at each prompt count per evaluated length (`analysis.distance.stability`)."""
    curves = {"oracle (1.0)": lambda d: np.ones(len(d)),
              "1.0 to 2D, format guess (1/24) past": lambda d: np.where(d <= 2 * trained, 1.0, 1 / 24),
              "0.95 at every distance": lambda d: np.full(len(d), 0.95),
              "0.90 at every distance": lambda d: np.full(len(d), 0.90),
              "0.97 to D, 0.24 past (issue 33's RoPE at 2x)": lambda d: np.where(d <= trained, 0.97, 0.24)}
    out = []
    for name, curve in curves.items():
        row: dict[str, object] = {"accuracy by distance": name}
        for n in sample_counts:
            row[f"{n} prompts"] = f"{stability(curve, trained, reaches, n, sets, np.random.default_rng(seed)):.2f}"
        out.append(row)
    return pd.DataFrame(out)


def _values(values: object) -> str:
    """Per-set values, compact: 'nan' for none."""
    return ", ".join("nan" if not np.isfinite(v) else f"{v:.3g}" for v in np.asarray(values, dtype=float))


def main() -> None:
    """Print the docs' known-answer and stability tables for the tasks_compact design (copy, train length 32)."""
    import tempfile

    from trainer.config import DataConfig
    from trainer.data.corpus import load_corpus
    from trainer.data.tasks.spec import TaskParams
    from trainer.data.tokenizer import ByteTokenizer

    tok = ByteTokenizer()
    filler = np.asarray(tok.encode("".join(load_corpus(DataConfig()).val)), dtype=np.int64)
    builder = TaskBuilder(tok, TaskParams(keys=7, key_set="symbols", span=4), filler)
    with tempfile.TemporaryDirectory() as tmp:
        table = known_answer_table(builder, 32, Path(tmp))
    print(table.to_markdown(index=False))
    reaches = {f: builder.max_distance("copy", round(32 * f)) for f in FACTORS}
    print()
    print(stability_table(builder.max_distance("copy", 33), reaches).to_markdown(index=False))


if __name__ == "__main__":
    main()
