"""`hdrope bench sweep`: an 8-cell tiny grid under Ray Tune vs the same cells back to back in one process.

Reports the fixed start-up cost (ray.init until the Tuner starts), the Tune wall time, the
sequential wall time and the overhead per trial beyond Ray's start, with per-trial training
throttled to one thread in both arms so the comparison is like for like.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from hdrope.bench_args import positive_int

__all__ = ["main", "run_sweep_bench"]

_SPEC = """
name: bench
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
  model.pe.rotation_dim: [4, 8]
  model.pe.basis: [identity, paley]
  seed: [1, 2]
resources: {{cpus: 1}}
max_concurrent: {concurrent}
"""


def run_sweep_bench(steps: int = 30, concurrent: int = 1) -> dict:
    """Time both arms; returns the figures as a dict."""
    import ray

    from sweeps.plan_file import save_plan
    from sweeps.runner import _execute, _init_ray, prepare
    from trainer.run.loop import train
    from trainer.run.tracking import default_tracking_uri

    with tempfile.TemporaryDirectory() as tmp:
        spec_file = Path(tmp) / "bench.yaml"
        spec_file.write_text(_SPEC.format(storage=Path(tmp) / "seq", steps=steps, concurrent=concurrent))
        plan = prepare(str(spec_file))
        t0 = time.perf_counter()
        for cell in plan.to_run:
            train(cell.config)
        sequential = time.perf_counter() - t0

        spec_file.write_text(_SPEC.format(storage=Path(tmp) / "tune", steps=steps, concurrent=concurrent))
        plan = prepare(str(spec_file))
        plan = save_plan(plan)
        t0 = time.perf_counter()
        _init_ray(None, plan.spec)
        startup = time.perf_counter() - t0
        t1 = time.perf_counter()
        _execute(plan, None, default_tracking_uri(plan.root), restore=False)
        tuned = time.perf_counter() - t1
        ray.shutdown()
    n = len(plan.to_run)
    return {"trials": n, "steps_per_trial": steps, "max_concurrent": concurrent, "sequential_s": sequential,
            "ray_startup_s": startup, "tune_s": tuned, "overhead_per_trial_s": (tuned - sequential / concurrent) / n}


def main(argv: list[str]) -> int:
    """CLI entry of `hdrope bench sweep`."""
    p = argparse.ArgumentParser(prog="hdrope bench sweep", description=__doc__)
    p.add_argument("--steps", type=positive_int, default=30)
    p.add_argument("--concurrent", type=positive_int, default=1,
                   help="trials at once under Tune (1 compares like for like)")
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    r = run_sweep_bench(a.steps, a.concurrent)
    if a.json:
        print(json.dumps(r, indent=1))
    else:
        print(f"{r['trials']} trials x {r['steps_per_trial']} steps, max_concurrent={r['max_concurrent']}\n"
              f"  back to back in one process : {r['sequential_s']:7.2f} s\n"
              f"  Ray start-up (ray.init)     : {r['ray_startup_s']:7.2f} s\n"
              f"  under Ray Tune (+ MLflow)   : {r['tune_s']:7.2f} s\n"
              f"  overhead per trial          : {r['overhead_per_trial_s']:7.2f} s  (target <= 2 s)")
    return 0
