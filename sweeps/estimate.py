"""How long a planned sweep will take on this machine, printed before Ray starts.

The training-step time of every distinct model shape in the plan is measured here (a few real
optimizer steps on the trial's thread count); evaluations are counted in forward-pass equivalents
of that step, and trials are packed onto the concurrent slots the plan reports. It is an estimate:
`hdrope sweep run` prints the measured wall time at the end for comparison.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any

from sweeps.plan import Plan
from trainer.config import RunConfig, validation_windows
from trainer.model.pe_layers import stack_groups
from trainer.model.position import step_cost_key
from trainer.model.throughput import param_count

__all__ = ["estimate_line", "estimate_sweep", "estimate_text"]

FORWARD_SHARE = 1 / 3  # a forward pass costs about a third of a training step (forward + backward + update)
TRIAL_OVERHEAD_S = 6.0  # data, model and checkpoint set-up, dumps and reporting per trial (hdrope bench sweep)
TRAIN_RUN_OVERHEAD_S = 10.0  # a Ray Train run per trial of workers > 1: controller, worker group, process group
STARTUP_S = 15.0  # embedded Ray and MLflow start-up, reconciliation and results
MAX_TIMED_PARAMS = 60e6  # larger models are not timed on the driver (it would take minutes of the sweep's time)


def _eval_steps(cfg: RunConfig) -> float:
    """Evaluation cost of one run in training-step equivalents."""
    e, t = cfg.eval, cfg.train
    scale = e.batch_size / t.batch_size * FORWARD_SHARE
    evals = (t.steps // t.eval_every if t.eval_every else 0) + 1
    per_eval = validation_windows(e, 1) / e.batch_size  # in batches of eval.batch_size windows at 1x
    if e.extrapolation_batches > 0:  # the final evaluation alone runs every length
        per_eval += sum(validation_windows(e, f) * f for f in e.extrapolation) / e.batch_size / evals
    passkey = 0.0
    if e.passkey.enabled:  # one prefill of the prompt plus a token-by-token decode, per prompt, at the end
        prompts = e.passkey.depths * e.passkey.samples
        decode = e.passkey.max_new_tokens / cfg.model.max_seq_len
        passkey = sum(prompts * (f + decode) for f in e.passkey.length_factors)
        passkey *= FORWARD_SHARE / t.batch_size
    tasks = 0.0
    if cfg.data.tasks and e.tasks.enabled:  # one batched prefill per prompt (the short answers' decode is small)
        tasks = len(cfg.data.tasks) * e.tasks.samples * sum(e.tasks.length_factors) * FORWARD_SHARE / t.batch_size
    return evals * per_eval * scale + passkey + tasks


def _shape_key(cfg: RunConfig) -> str:
    model = asdict(cfg.model)
    model["pe"] = step_cost_key(cfg.model.pe)  # θ, basis: same cost
    if cfg.model.pe_layers:  # a hybrid stack: each encoding's cost keys at its layers
        model["pe_layers"] = [[step_cost_key(g.pe), list(g.layers)] for g in stack_groups(cfg.model)]
    return json.dumps([model, cfg.train.batch_size, cfg.train.threads], sort_keys=True, default=str)


def estimate_sweep(plan: Plan) -> dict[str, Any]:
    """Estimated seconds for the plan's trials here: {total_s, per_trial_s, step_s, concurrent}, or {reason}."""
    from trainer.run.bench import step_seconds

    s = plan.summary()
    if plan.spec.search.kind != "grid":
        return {"reason": "Optuna trials are sampled as they run"}
    if plan.spec.resources.gpus or plan.spec.resources.gpus_per_worker:
        return {"reason": "GPU trials are not timed on the driver"}
    overhead = TRIAL_OVERHEAD_S + (TRAIN_RUN_OVERHEAD_S if plan.spec.resources.workers > 1 else 0.0)
    step_s: dict[str, float] = {}
    per_trial: list[float] = []
    for cell in plan.to_run:
        cfg = cell.config
        key = _shape_key(cfg)
        if key not in step_s:
            if param_count(cfg.model) > MAX_TIMED_PARAMS:
                return {"reason": f"models of {param_count(cfg.model) / 1e6:.0f}M parameters are not timed on the "
                        "driver"}
            threads = cfg.train.threads or max(1, int(plan.spec.resources.cpus))
            step_s[key] = step_seconds(cfg.model, cfg.train.batch_size * cfg.train.grad_accum, threads)
        per_trial.append((cfg.train.steps + _eval_steps(cfg)) * step_s[key] + overhead)  # W workers: no faster
    if not per_trial:
        return {"reason": "nothing to train (every cell is a dedup copy)"}
    slots = max(1, s["concurrent_here"])
    total = max(sum(per_trial) / slots, max(per_trial)) + STARTUP_S
    return {"total_s": total, "per_trial_s": per_trial, "step_s": sorted(step_s.values()), "concurrent": slots}


def estimate_text(plan: Plan) -> str:
    """The plan summary and the estimated time, as `hdrope sweep run` prints them before Ray starts."""
    s = plan.summary()
    lines = [f"sweep {s['name']}: {s['cells']} cells, {s['trials_run']} trials to train "
             f"({s['trials_saved']} saved by dedup), {s['concurrent_here']} at once here "
             f"({s['per_trial']['cpus']} CPU / {s['per_trial']['gpus']} GPU each), {s['total_steps']} steps in all; "
             f"writes to {s['dir']}"]
    return "\n".join([*lines, estimate_line(plan)])


def estimate_line(plan: Plan) -> str:
    """One line: the plan's estimated time here (with the step times it measured), or why it is not estimated."""
    est = estimate_sweep(plan)
    if "reason" in est:
        return f"estimated time: not estimated ({est['reason']})"
    steps = ", ".join(f"{v * 1e3:.0f}" for v in est["step_s"])
    return (f"estimated time: about {_duration(est['total_s'])} (measured {steps} ms per training step; "
            f"each trial about {_duration(max(est['per_trial_s']))})")


def _duration(seconds: float) -> str:
    if seconds >= 3 * 3600:
        return f"{seconds / 3600:.0f} h"
    return f"{seconds / 60:.1f} min" if seconds >= 90 else f"{seconds:.0f} s"
