"""`hdrope bench sweep`: what Ray Tune + MLflow add to a sweep, measured side by side in one run.

- **Empty trials** (the per-trial overhead): cells that already trained to the end go through the real Tune path
  (`sweeps.runner`: the trainable, which only re-reports the stored result, the MLflow tracking callback, the
  progress lines and the end-of-sweep reconciliation) at two sizes on one embedded Ray. The overhead per trial is
  the slope between them, (T_large - T_small) / (n_large - n_small); what is left of T_small is the fixed cost of a
  sweep (actor start-up, experiment set-up, results file).
- **Training trials**: a tiny grid (4 seeds x rotation dims 4 and 8: 8 cells) under Tune vs the same cells back to
  back in one process, one thread per trial in both arms, so the difference is what Tune adds to trials that train.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from hdrope.bench_args import positive_int
from hdrope.errors import UserError

__all__ = ["main", "run_sweep_bench"]

OVERHEAD_TARGET_S = 0.5  # the per-trial overhead of an empty trial the lab holds itself to

_SPEC = """
name: {name}
base: tiny
storage: {storage}
overrides:
  train.steps: {steps}
  train.threads: 1
  train.log_every: 10
  train.ckpt_every: {steps}
  eval.passkey.enabled: false
  eval.extrapolation_batches: 0
axes:
  seed: {seeds}
  model.pe.rotation_dim: {dims}
resources: {{cpus: 1}}
max_concurrent: {concurrent}
"""


def _plan(folder: Path, name: str, seeds: int, steps: int, concurrent: int, dims: tuple[int, ...] = (4,)):
    """The plan of a tiny sweep of `seeds` seeds × `dims` rotation dimensions under `folder`."""
    from sweeps.plan_file import save_plan
    from sweeps.runner import prepare

    spec_file = folder / f"{name}.yaml"
    spec_file.write_text(_SPEC.format(name=name, storage=folder / "store", steps=steps,
                                      seeds=list(range(1, seeds + 1)), dims=list(dims), concurrent=concurrent))
    return save_plan(prepare(str(spec_file)))


def _train_back_to_back(plan) -> float:
    """Seconds to train the plan's cells one after another in this process."""
    from trainer.run.loop import train

    t0 = time.perf_counter()
    for cell in plan.to_run:
        train(cell.config)
    return time.perf_counter() - t0


def _tune(plan) -> float:
    """Seconds the sweep takes through the real Tune path on the Ray already started."""
    from sweeps.runner import _execute
    from trainer.run.tracking import default_tracking_uri

    t0 = time.perf_counter()
    failed = _execute(plan, None, default_tracking_uri(plan.root), restore=False)
    took = time.perf_counter() - t0
    if failed:
        raise RuntimeError(f"bench sweep {plan.spec.name}: a trial failed; its error is under {plan.root}")
    return took


def run_sweep_bench(steps: int = 30, concurrent: int = 1, small: int = 8, large: int = 32, seeds: int = 4) -> dict:
    """Time both parts on one embedded Ray; returns the figures as a dict."""
    import ray

    from sweeps.runner import _init_ray

    if large <= small:
        raise UserError(f"--large {large}: must be more than --small {small} (the overhead per trial is the slope "
                        "between the two sizes); e.g. --small 8 --large 32")
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        train_plan = _plan(folder, "train", seeds, steps, concurrent, dims=(4, 8))
        sequential = _train_back_to_back(train_plan)
        warmup = _plan(folder, "warmup", 2, 2, concurrent)
        empty = {n: _plan(folder, f"empty{n}", n, 2, concurrent) for n in (small, large)}
        for plan in (warmup, *empty.values()):
            _train_back_to_back(plan)  # trained to the end: under Tune each trial only re-reports its result
        t0 = time.perf_counter()
        started = _init_ray(None, train_plan.spec)  # joins a Ray this process already runs
        startup = time.perf_counter() - t0
        try:
            _tune(warmup)  # warm-up: the first sweep in a process also pays Tune's and MLflow's imports
            empty_s = {n: _tune(empty[n]) for n in (small, large)}
            tuned = _tune(_plan(folder, "tuned", seeds, steps, concurrent, dims=(4, 8)))
        finally:
            if started:
                ray.shutdown()
    per_trial = (empty_s[large] - empty_s[small]) / (large - small)
    return {"trials": len(train_plan.to_run), "steps_per_trial": steps, "max_concurrent": concurrent,
            "ray_startup_s": startup,
            "empty_trials": [small, large], "empty_s": [empty_s[small], empty_s[large]],
            "overhead_per_trial_s": per_trial, "fixed_per_sweep_s": empty_s[small] - small * per_trial,
            "mean_per_trial_s": empty_s[large] / large,
            "sequential_s": sequential, "tune_s": tuned, "tune_over_sequential": tuned / sequential,
            "target_s": OVERHEAD_TARGET_S}


def main(argv: list[str]) -> int:
    """CLI entry of `hdrope bench sweep`."""
    p = argparse.ArgumentParser(prog="hdrope bench sweep", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=positive_int, default=30, help="optimizer steps per training trial")
    p.add_argument("--concurrent", type=positive_int, default=1,
                   help="trials at once under Tune (1 compares like for like)")
    p.add_argument("--small", type=positive_int, default=8, help="empty trials in the smaller sweep")
    p.add_argument("--large", type=positive_int, default=32, help="empty trials in the larger sweep")
    p.add_argument("--seeds", type=positive_int, default=4,
                   help="seeds of the training grid (x rotation dims 4 and 8: 8 cells by default)")
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    r = run_sweep_bench(a.steps, a.concurrent, a.small, a.large, a.seeds)
    if a.json:
        print(json.dumps(r, indent=1))
        return 0
    small, large = r["empty_trials"]
    verdict = "within" if r["overhead_per_trial_s"] <= r["target_s"] else "over"
    print(f"Ray start-up (ray.init)                  : {r['ray_startup_s']:7.2f} s\n"
          f"empty trials, max_concurrent={r['max_concurrent']}\n"
          f"  {small:3d} trials under Ray Tune (+ MLflow)  : {r['empty_s'][0]:7.2f} s\n"
          f"  {large:3d} trials under Ray Tune (+ MLflow)  : {r['empty_s'][1]:7.2f} s\n"
          f"  overhead per trial (the slope)         : {r['overhead_per_trial_s']:7.3f} s  "
          f"({verdict} the target of {r['target_s']} s)\n"
          f"  fixed cost of a sweep                  : {r['fixed_per_sweep_s']:7.2f} s\n"
          f"  {large} trials' mean, the fixed cost shared : {r['mean_per_trial_s']:7.3f} s\n"
          f"{r['trials']} training trials x {r['steps_per_trial']} steps\n"
          f"  back to back in one process            : {r['sequential_s']:7.2f} s\n"
          f"  under Ray Tune (+ MLflow)              : {r['tune_s']:7.2f} s  "
          f"({r['tune_over_sequential']:.2f}x back to back)")
    return 0
