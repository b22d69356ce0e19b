"""`hdrope bench tasks`: what the task mixture and the task evaluation cost, measured side by side in one run.

1. A training step (batch production, forward, cross-entropy, backward, AdamW) with `data.task_ratio` 0.5 against
   a pure language-model step of the same model, timed round-robin (`median_round_robin`): generating task examples
   in the batch producer must not make a step slower (target <= 1.05x).
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
from trainer.config import RunConfig, TaskEvalConfig
from trainer.data.batches import TrainBatches
from trainer.data.tasks.build import TaskMixture
from trainer.evals.tasks import evaluate_tasks
from trainer.model.llama import Llama
from trainer.presets import load_config
from trainer.run.loop import DataBundle, prepare_data

__all__ = ["main", "run_tasks_bench"]


def _step_fn(model: Llama, opt: torch.optim.Optimizer, batches: TrainBatches) -> Callable[[], None]:
    """One optimizer step on the next batch of `batches` (the batch is produced inside the timed step)."""
    steps = itertools.count()

    def step() -> None:
        batch = batches.get(next(steps))
        F.cross_entropy(model(batch[:, :-1]).flatten(0, 1), batch[:, 1:].flatten()).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


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
                    overrides: list[str] | None = None) -> dict:
    """Median step times (ms) with and without the task mixture, and the task evaluation's seconds and shares."""
    cfg = load_config(preset, list(overrides or []))
    if not cfg.data.tasks:
        cfg = load_config(preset, [*(overrides or []), "data.tasks=[mqar, copy]"])
    data = prepare_data(cfg)
    torch.manual_seed(0)
    model = Llama(cfg.model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
    ms = median_round_robin({"lm": _step_fn(model, opt, _batches(cfg, data, 0.0)),
                             "tasks": _step_fn(model, opt, _batches(cfg, data, ratio))}, rounds)
    model.eval()
    factors = list(cfg.eval.tasks.length_factors)
    longest = _eval_seconds(model, cfg, data, [max(factors)])
    every = _eval_seconds(model, cfg, data, factors)
    train_s = cfg.train.steps * ms["lm"] / 1e3
    return {"preset": preset, "tasks": list(cfg.data.tasks), "ratio": ratio, "batch": cfg.train.batch_size,
            "seq_len": cfg.model.max_seq_len, "threads": torch.get_num_threads(), "lm_step_ms": ms["lm"],
            "task_step_ms": ms["tasks"], "step_ratio": ms["tasks"] / ms["lm"], "longest_factor": max(factors),
            "eval_longest_s": longest, "eval_all_s": every, "train_s": train_s,
            "eval_longest_share": longest / (train_s + every), "eval_all_share": every / (train_s + every),
            "samples": cfg.eval.tasks.samples}


def main(argv: list[str]) -> int:
    """CLI entry of `hdrope bench tasks`."""
    p = argparse.ArgumentParser(prog="hdrope bench tasks", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="tasks_compact")
    p.add_argument("--ratio", type=float, default=0.5, help="data.task_ratio of the task step")
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: default)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("overrides", nargs="*", help="key=value overrides of the preset")
    a = p.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    r = run_tasks_bench(a.preset, a.ratio, a.rounds, a.overrides)
    if a.json:
        print(json.dumps(r, indent=1))
        return 0
    print(f"# {r['preset']} batch={r['batch']} seq={r['seq_len']} threads={r['threads']} tasks={','.join(r['tasks'])}")
    rows = [("training step, language model only", f"{r['lm_step_ms']:.1f} ms"),
            (f"training step, task_ratio {r['ratio']:g}",
             f"{r['task_step_ms']:.1f} ms ({r['step_ratio']:.3f}x; target <= 1.05x)"),
            (f"task evaluation at x{r['longest_factor']:g} ({r['samples']} per task)",
             f"{r['eval_longest_s']:.1f} s ({100 * r['eval_longest_share']:.1f}% of the run)"),
            ("task evaluation at every factor", f"{r['eval_all_s']:.1f} s ({100 * r['eval_all_share']:.1f}% of the "
             f"run: {r['train_s']:.0f} s of training + the evaluation)")]
    for label, value in rows:
        print(f"{label:<42} {value}")
    return 0
