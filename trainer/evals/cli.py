"""`hdrope eval lm-eval CHECKPOINT --tasks ...`: downstream benchmarks of a checkpoint through lm-eval."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from hdrope.errors import UserError

__all__ = ["eval_main"]


def _lm_eval(a: argparse.Namespace) -> int:
    try:
        from trainer.evals.lm_harness import run_lm_eval
    except ImportError as err:
        raise UserError(f"lm-evaluation-harness is not installed ({err}); `pip install -e '.[eval]'`") from None
    from trainer.run.tracking import check_tracking_uri, log_eval_metrics
    from trainer.run.trained import run_config

    if a.tracking_uri:
        check_tracking_uri(a.tracking_uri)
    tasks = [t for t in a.tasks.split(",") if t]
    metrics = run_lm_eval(Path(a.checkpoint), tasks, a.include_path or None, a.limit or None, a.max_length or None)
    print(json.dumps(metrics, indent=1))
    if a.tracking_uri:
        cfg = run_config(Path(a.checkpoint))
        runs = log_eval_metrics(a.tracking_uri, cfg, metrics, int(cfg.train.steps), "hdrope-lm-eval")
        print(f"logged to MLflow run(s) {', '.join(runs)}")
    return 0


def eval_main(argv: list[str]) -> int:
    """Dispatch `hdrope eval <kind>`."""
    p = argparse.ArgumentParser(prog="hdrope eval", description="evaluations of trained checkpoints")
    sub = p.add_subparsers(dest="kind", required=True)
    q = sub.add_parser("lm-eval", help="lm-evaluation-harness tasks (the paper's HellaSwag, ARC, WinoGrande, BoolQ)")
    q.add_argument("checkpoint", help="a checkpoint directory inside a run (…/checkpoints/step_N)")
    q.add_argument("--tasks", required=True, help="comma-separated lm_eval task names")
    q.add_argument("--include-path", default="", help="a directory of local task YAMLs (offline tasks)")
    q.add_argument("--limit", type=int, default=0, help="first N documents per task (0: all)")
    q.add_argument("--max-length", type=int, default=0, help="context tokens (default: the run's train length)")
    q.add_argument("--tracking-uri", default=os.environ.get("MLFLOW_TRACKING_URI", ""),
                   help="log the metrics to the run's MLflow run(s), found by config hash")
    q.set_defaults(fn=_lm_eval)
    a = p.parse_args(argv)
    return a.fn(a)
