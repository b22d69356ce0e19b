"""Task accuracy at many lengths: greedy decoding of each task's examples at round(train length x factor) tokens.

The examples of (task, factor) are a function of (seed, task, factor, example) only, so every run of a seed sees
the same prompts whatever its encoding, and comparisons pair. Each prompt + answer is exactly the target length
(filler from the validation split); prompts of one length are decoded together with the KV cache for as many
tokens as the longest answer. An example is correct when the first len(answer) generated tokens equal the answer
(exact match); its token accuracy is the share of those positions that match, and its chance-corrected token
accuracy (`chance_corrected`) maps the task's chance floor (`TaskSpec.floor`) to 0 and a right answer to 1. Each
example also records its distance (`TaskSpec`), the longest distance a training example can hold
(`trained_distance`: an example as long as a training row, train length + 1 tokens) and the longest its own length
can hold (`reach`).
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass

import numpy as np
import torch

from trainer.config import TaskEvalConfig, task_metric
from trainer.data.tasks.build import TaskBuilder, TaskExample
from trainer.data.tasks.registry import TASKS
from trainer.evals.evaluate import Autocast
from trainer.model.generate import greedy_generate_batch
from trainer.model.llama import Llama

__all__ = ["TaskResult", "chance_corrected", "evaluate_tasks", "task_examples"]

_EVAL_STREAM = 15485863  # keeps evaluation draws apart from the training batches' generators


@dataclass
class TaskResult:
    """The acc_/n_/tokacc_/tokskill_ metrics per (task, factor) and one row per example (the tasks.parquet
    columns)."""

    metrics: dict[str, float]
    rows: list[dict]


def chance_corrected(token_acc: float, floor: float) -> float:
    """Token accuracy above its chance floor, as a share of the room above it: 0 at chance, 1 when right, negative
    below chance."""
    return (token_acc - floor) / (1 - floor)


def task_examples(builder: TaskBuilder, task: str, length: int, samples: int, seed: int) -> list[TaskExample]:
    """The `samples` evaluation examples of `task` at `length` tokens for `seed`: example i is drawn from its own
    generator, seeded by (seed, task, length, i)."""
    key = zlib.crc32(task.encode())
    return [builder.build(task, length, np.random.default_rng([seed, _EVAL_STREAM, key, length, i]))
            for i in range(samples)]


@torch.no_grad()
def evaluate_tasks(model: Llama, builder: TaskBuilder, tasks: list[str], seq_len: int, cfg: TaskEvalConfig,
                   seed: int, autocast: Autocast) -> TaskResult:
    """Exact-match, per-token and chance-corrected per-token accuracy of greedy answers for every task and length
    factor; for a task with a `hard` subset, exact match on that subset too."""
    was_training = model.training
    model.eval()
    rows: list[dict] = []
    metrics: dict[str, float] = {}
    try:
        for task in tasks:
            floor, trained = builder.floor(task), builder.max_distance(task, seq_len + 1)
            for factor in cfg.length_factors:
                target = round(seq_len * factor)
                examples = task_examples(builder, task, target, cfg.samples, seed)
                here = _decode(model, builder, examples, cfg.batch_size, autocast)
                for i, (ex, row) in enumerate(zip(examples, here, strict=True)):
                    row.update(task=task, length_factor=float(factor), length=len(ex.prompt), target_length=target,
                               example=i, params=ex.params_json, distance=ex.distance, trained_distance=trained,
                               reach=builder.max_distance(task, target), floor=floor,
                               token_skill=chance_corrected(row["token_acc"], floor))
                rows += here
                correct = [r["correct"] for r in here]
                metrics[task_metric("acc", task, factor)] = float(np.mean(correct))
                metrics[task_metric("n", task, factor)] = float(len(correct))
                metrics[task_metric("tokacc", task, factor)] = float(np.mean([r["token_acc"] for r in here]))
                metrics[task_metric("tokskill", task, factor)] = float(np.mean([r["token_skill"] for r in here]))
                if hard := TASKS[task].hard:  # the examples its shortcut cannot answer
                    on = [r["correct"] for ex, r in zip(examples, here, strict=True) if hard(ex.params)]
                    metrics[task_metric("hardacc", task, factor)] = float(np.mean(on)) if on else math.nan
                    metrics[task_metric("hardn", task, factor)] = float(len(on))
    finally:
        model.train(was_training)
    return TaskResult(metrics, rows)


def _decode(model: Llama, builder: TaskBuilder, examples: list[TaskExample], batch_size: int,
            autocast: Autocast) -> list[dict]:
    """target, generated, correct and token_acc of each example, prompts of one length decoded in batches."""
    out: list[dict] = [{} for _ in examples]
    by_length: dict[int, list[int]] = {}
    for i, ex in enumerate(examples):
        by_length.setdefault(len(ex.prompt), []).append(i)
    for group in by_length.values():
        for start in range(0, len(group), batch_size):
            idx = group[start : start + batch_size]
            width = max(len(examples[i].answer) for i in idx)
            prompts = torch.tensor([examples[i].prompt for i in idx], dtype=torch.long)
            with autocast():
                generated = greedy_generate_batch(model, prompts, width).tolist()
            for i, gen in zip(idx, generated, strict=True):
                answer = examples[i].answer
                if not answer:  # the builder refuses one: an empty answer would match anything
                    raise ValueError(f"a {examples[i].task} example has an empty answer")
                hits = [g == a for g, a in zip(gen, answer, strict=False)]
                out[i] = {"target": builder.tok.decode(answer), "generated": builder.tok.decode(gen[: len(answer)]),
                          "correct": all(hits), "token_acc": float(np.mean(hits))}
    return out
