"""The paper's downstream benchmarks through lm-evaluation-harness, on the lab's own model.

`LabLM` is an `lm_eval` model backed by a trained checkpoint of any position encoding (HD-RoPE of any
rotation dim and basis, NoPE, …): log-likelihoods come from one forward pass over context +
continuation (left-truncated to the train length), generation is the trainer's greedy KV-cache
decoding. `run_lm_eval` runs tasks by name (HellaSwag, ARC-E/C, WinoGrande, BoolQ on a connected
machine) or from local task YAMLs (`include_path`), and writes `<run dir>/lm_eval.json`, whose
metrics `hdrope sweep results` puts into results.parquet as `lm_<task>_<metric>` columns.
"""

from __future__ import annotations

import functools
import math
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from lm_eval.api.model import LM

from hdrope.errors import UserError
from trainer.files.run_files import LM_EVAL_FILE, write_json_atomic
from trainer.model.generate import greedy_generate
from trainer.run.trained import Trained, load_trained

__all__ = ["LabLM", "flat_metrics", "run_lm_eval"]


def _args(requests: list[Any]) -> list[tuple]:
    """The arguments of lm_eval Instances (or plain tuples) as tuples."""
    return [r.args if hasattr(r, "args") else tuple(r) for r in requests]


class LabLM(LM):
    """An lm_eval LM over a lab checkpoint (CPU or the run's device, fp32)."""

    def __init__(self, trained: Trained, max_length: int | None = None) -> None:
        super().__init__()
        self.trained, self.model, self.tok = trained, trained.model, trained.tok
        self.max_length = int(max_length or trained.cfg.model.max_seq_len)

    def _logprobs(self, context: list[int], continuation: list[int]) -> tuple[float, bool]:
        ids = (context + continuation)[-(self.max_length + 1):]
        n = min(len(continuation), len(ids) - 1)
        with torch.no_grad():
            logits = self.model(torch.tensor([ids[:-1]]))[0, -n:].float()
        target = torch.tensor(ids[-n:])
        logp = F.log_softmax(logits, dim=-1)
        total = float(logp.gather(1, target[:, None]).sum())
        return total, bool((logits.argmax(-1) == target).all())

    def _start_id(self) -> int:
        """What an empty context is: the tokenizer's <bos> (or <eos>, or id 0)."""
        for name in ("bos_id", "eos_id"):
            if isinstance(getattr(self.tok, name, None), int):
                return getattr(self.tok, name)
        return 0

    def loglikelihood(self, requests: list[Any]) -> list[tuple[float, bool]]:
        out = []
        for context, continuation in _args(requests):
            ctx = self.tok.encode(context) if context else [self._start_id()]
            out.append(self._logprobs(ctx, self.tok.encode(continuation)))
        return out

    def loglikelihood_rolling(self, requests: list[Any]) -> list[float]:
        out = []
        for (text,) in _args(requests):
            ids, total = self.tok.encode(text), 0.0
            stride = max(1, self.max_length // 2)  # each token scored once, with at least half a window of context
            for start in range(0, len(ids), stride):
                ctx = ids[:start] if start else [self._start_id()]  # _logprobs keeps the last max_length tokens
                total += self._logprobs(ctx, ids[start:start + stride])[0]
            out.append(total)
        return out

    def generate_until(self, requests: list[Any]) -> list[str]:
        out = []
        for context, kwargs in _args(requests):
            until = kwargs.get("until") or []
            until = [until] if isinstance(until, str) else list(until)
            budget = int(kwargs.get("max_gen_toks", 32))
            prompt = self.tok.encode(context)[-(self.max_length - 1):] or [0]

            def stop(ids: list[int], until: list[str] = until) -> bool:
                return any(u in self.tok.decode(ids) for u in until)

            text = self.tok.decode(greedy_generate(self.model, prompt, budget, stop))
            for u in until:
                text = text.split(u)[0]
            out.append(text)
        return out


def flat_metrics(results: dict[str, Any], n_samples: dict[str, Any] | None = None) -> dict[str, float]:
    """lm_eval's per-task results as lm_<task>_<metric> floats (filters such as ',none' dropped, stderr kept), plus
    lm_<task>_n, the number of documents scored, from lm_eval's n-samples (accuracies are k of n)."""
    flat: dict[str, float] = {}
    for task, counts in (n_samples or {}).items():
        if isinstance(counts, dict) and isinstance(counts.get("effective"), int):
            flat[f"lm_{task}_n".replace("-", "_")] = float(counts["effective"])
    for task, metrics in results.items():
        for key, value in metrics.items():
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                continue
            metric = key.split(",")[0]
            flat[f"lm_{task}_{metric}".replace("-", "_")] = float(value)
    return flat


def _yaml_stamps(include_path: str | None) -> tuple[tuple[str, int], ...]:
    """Each task YAML under include_path with its modification time: what a cached task index depends on."""
    if not include_path:
        return ()
    return tuple(sorted((str(p), p.stat().st_mtime_ns) for p in Path(include_path).rglob("*.y*ml")))


@functools.lru_cache(maxsize=4)
def _indexed_tasks(include_path: str | None, stamps: tuple[tuple[str, int], ...]) -> Any:
    """lm_eval's task index (every installed task plus include_path's), built once per process and YAML state: it
    reads lm_eval's thousands of task YAMLs (docs/lm-eval.md)."""
    from lm_eval.tasks import TaskManager

    return TaskManager(include_path=include_path) if include_path else TaskManager()


def run_lm_eval(checkpoint: Path, tasks: list[str], include_path: str | None = None, limit: int | None = None,
                max_length: int | None = None) -> dict[str, float]:
    """Evaluate a checkpoint on lm_eval tasks; write <run dir>/lm_eval.json and return the flat metrics."""
    from lm_eval import simple_evaluate

    if not tasks:
        raise UserError("--tasks is empty: name lm_eval tasks, e.g. hellaswag,arc_easy,arc_challenge,winogrande,boolq")
    for flag, value, least, default in (("--limit", limit, 1, "0 for every document"),
                                        ("--max-length", max_length, 2, "0 for the run's train length")):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < least):
            raise UserError(f"{flag} {value}: must be an integer >= {least} (or {default})")
    if include_path and not Path(include_path).is_dir():
        raise UserError(f"--include-path {include_path}: not a directory of task YAMLs")
    manager = _indexed_tasks(include_path, _yaml_stamps(include_path))
    unknown = [t for t in tasks if t not in manager.all_tasks]
    if unknown:
        raise UserError(f"--tasks: unknown lm_eval task(s) {unknown}; see `lm_eval ls tasks`, or give local task "
                        "YAMLs with --include-path")
    trained = load_trained(checkpoint)
    lm = LabLM(trained, max_length)
    out = simple_evaluate(model=lm, tasks=tasks, task_manager=manager, limit=limit, log_samples=False,
                          bootstrap_iters=0, random_seed=42, numpy_random_seed=42, torch_random_seed=42)
    metrics = flat_metrics(out["results"], out.get("n-samples"))
    write_json_atomic(trained.run_dir / LM_EVAL_FILE, {"checkpoint": str(checkpoint), "tasks": tasks,
                                                      "limit": limit, "config_hash": trained.config_hash,
                                                      "results": out["results"], "metrics": metrics})
    return metrics
