"""`hdrope bench tasks`: what the task mixture and the task evaluation cost, measured side by side in one run.

1. A training step (taking the batch, forward, cross-entropy, backward, AdamW) with `data.task_ratio` 0.5 against
   a pure language-model step of the same model, timed round-robin (`median_round_robin`), each with its batches
   made the way `train.batch_producer=auto` makes them in a run (task batches in a producer process on Linux,
   language-model batches inline): generating task examples must not make a step slower (target <= 1.05x). The task
   step with its batches made inline, in the timed step, is timed beside them.
2. The task evaluation at the preset's largest length factor (and at all of them), in seconds and as a share of
   the preset's training time (its steps x the measured language-model step).
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from hdrope.bench import median_round_robin
from hdrope.bench_args import non_negative_int, positive_int, probability
from trainer.config import RunConfig, TaskEvalConfig
from trainer.data.batch_stream import BatchStream
from trainer.data.batches import TrainBatches
from trainer.data.tasks.build import TaskMixture
from trainer.evals.tasks import evaluate_tasks
from trainer.model.llama import Llama
from trainer.presets import load_config
from trainer.run.loop import DataBundle, prepare_data

__all__ = ["main", "run_tasks_bench"]


def _steps_fn(model: Llama, opt: torch.optim.Optimizer, stream: BatchStream, block: int) -> Callable[[], None]:
    """`block` optimizer steps in a row, each on the next batch of `stream` (taken inside the timed call)."""
    steps = itertools.count()

    def steps_in_a_row() -> None:
        for _ in range(block):
            batch = torch.from_numpy(stream.get(next(steps)))
            F.cross_entropy(model(batch[:, :-1]).flatten(0, 1), batch[:, 1:].flatten()).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

    return steps_in_a_row


def _batches(cfg: RunConfig, data: DataBundle, ratio: float) -> TrainBatches:
    mixture = [(ratio, TaskMixture(data.task_builder(cfg, "train"), cfg.data.tasks))] if ratio > 0 else []
    return TrainBatches(data.tokens.train, cfg.model.max_seq_len, cfg.train.batch_size, cfg.train.seed, mixture)


def _eval_seconds(model: Llama, cfg: RunConfig, data: DataBundle, factors: list[float]) -> float:
    te = TaskEvalConfig(length_factors=factors, samples=cfg.eval.tasks.samples, batch_size=cfg.eval.tasks.batch_size)
    t0 = time.perf_counter()
    evaluate_tasks(model, data.task_builder(cfg, "val"), list(cfg.data.tasks), cfg.model.max_seq_len, te,
                   cfg.train.seed, contextlib.nullcontext)
    return time.perf_counter() - t0


def run_tasks_bench(preset: str = "tasks_compact", ratio: float = 0.5, rounds: int = 10,
                    overrides: list[str] | None = None, block: int = 10) -> dict:
    """Step times (ms; the median over rounds of `block` steps in a row, per step) with and without the task
    mixture, and the task evaluation's seconds and shares."""
    cfg = load_config(preset, list(overrides or []))
    if not cfg.data.tasks:
        cfg = load_config(preset, [*(overrides or []), "data.tasks=[mqar, copy]"])
    data = prepare_data(cfg)
    torch.manual_seed(0)
    model = Llama(cfg.model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
    steps = (rounds + 2) * block  # median_round_robin's two warm-up calls, then the rounds
    with contextlib.ExitStack() as streams:
        def stream(r: float, producer: str) -> BatchStream:
            return streams.enter_context(BatchStream(_batches(cfg, data, r), 0, steps, 1, producer))

        lm, tasks, inline = stream(0.0, "auto"), stream(ratio, "auto"), stream(ratio, "inline")
        fns = {"lm": lm, "tasks": tasks, "tasks_inline": inline}
        ms = median_round_robin({k: _steps_fn(model, opt, v, block) for k, v in fns.items()}, rounds)
        ms = {k: v / block for k, v in ms.items()}
        tasks_producer = "process" if tasks.in_process else "inline"
    model.eval()
    factors = list(cfg.eval.tasks.length_factors)
    longest = _eval_seconds(model, cfg, data, [max(factors)])
    every = _eval_seconds(model, cfg, data, factors)
    train_s = cfg.train.steps * ms["lm"] / 1e3
    return {"preset": preset, "tasks": list(cfg.data.tasks), "ratio": ratio, "batch": cfg.train.batch_size,
            "seq_len": cfg.model.max_seq_len, "block": block, "threads": torch.get_num_threads(),
            "lm_step_ms": ms["lm"],
            "task_step_ms": ms["tasks"], "step_ratio": ms["tasks"] / ms["lm"], "task_producer": tasks_producer,
            "inline_step_ms": ms["tasks_inline"], "inline_ratio": ms["tasks_inline"] / ms["lm"],
            "longest_factor": max(factors),
            "eval_longest_s": longest, "eval_all_s": every, "train_s": train_s,
            "eval_longest_share": longest / (train_s + every), "eval_all_share": every / (train_s + every),
            "samples": cfg.eval.tasks.samples}


def main(argv: list[str]) -> int:
    """CLI entry of `hdrope bench tasks`."""
    p = argparse.ArgumentParser(prog="hdrope bench tasks", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="tasks_compact")
    p.add_argument("--ratio", type=probability, default=0.5, help="data.task_ratio of the task step")
    p.add_argument("--rounds", type=positive_int, default=10)
    p.add_argument("--block", type=positive_int, default=10,
                   help="steps in a row per timed call (a producer process gets no more head start than in a run)")
    p.add_argument("--threads", type=non_negative_int, default=0, help="torch threads (0: default)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("overrides", nargs="*", help="key=value overrides of the preset")
    a = p.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    r = run_tasks_bench(a.preset, a.ratio, a.rounds, a.overrides, a.block)
    if a.json:
        print(json.dumps(r, indent=1))
        return 0
    print(f"# {r['preset']} batch={r['batch']} seq={r['seq_len']} threads={r['threads']} tasks={','.join(r['tasks'])}")
    rows = [("training step, language model only", f"{r['lm_step_ms']:.1f} ms"),
            (f"training step, task_ratio {r['ratio']:g} ({r['task_producer']})",
             f"{r['task_step_ms']:.1f} ms ({r['step_ratio']:.3f}x; target <= 1.05x)"),
            (f"training step, task_ratio {r['ratio']:g} (inline)",
             f"{r['inline_step_ms']:.1f} ms ({r['inline_ratio']:.3f}x)"),
            (f"task evaluation at x{r['longest_factor']:g} ({r['samples']} per task)",
             f"{r['eval_longest_s']:.1f} s ({100 * r['eval_longest_share']:.1f}% of the run)"),
            ("task evaluation at every factor", f"{r['eval_all_s']:.1f} s ({100 * r['eval_all_share']:.1f}% of the "
             f"run: {r['train_s']:.0f} s of training + the evaluation)")]
    for label, value in rows:
        print(f"{label:<42} {value}")
    return 0
