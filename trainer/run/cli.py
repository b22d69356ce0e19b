"""`hdrope train CONFIG [key=value ...]`: one local training run with a progress bar, optionally logged to MLflow.

Under `torchrun --nproc-per-node W -m sweeps.console train …` (WORLD_SIZE > 1 in the environment) the W
processes train one run data-parallel (`--strategy`, DDP by default): gloo on CPU, NCCL on CUDA; rank 0
alone shows progress, logs to MLflow and prints the result. The workers wait at most
$HDROPE_RENDEZVOUS_TIMEOUT_S seconds (default 300) for each other to join.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

__all__ = ["train_main"]


def train_main(argv: list[str]) -> int:
    """Run one training from a preset name or YAML path plus dotted overrides."""
    p = argparse.ArgumentParser(prog="hdrope train", description=__doc__)
    p.add_argument("config", help="preset name in experiments/ (tiny, compact, ...) or a YAML path")
    p.add_argument("overrides", nargs="*", help="dotted key=value overrides, e.g. model.pe.rotation_dim=8")
    p.add_argument("--tracking-uri", default=os.environ.get("MLFLOW_TRACKING_URI", ""),
                   help="MLflow tracking URI (default $MLFLOW_TRACKING_URI; unset: no MLflow)")
    p.add_argument("--experiment", default="hdrope-train", help="MLflow experiment name")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--strategy", default="ddp", help="data-parallel strategy under torchrun: ddp or fsdp")
    args = p.parse_intermixed_args(argv)  # flags may come before, between or after the overrides

    from hdrope.errors import UserError
    from trainer.presets import load_config
    from trainer.run.distributed import STRATEGIES, join_torchrun_group
    from trainer.run.loop import TrainingDiverged, train
    from trainer.run.reporting import ProgressReporter, Reporters
    from trainer.run.tracking import MLflowReporter, check_tracking_uri, identity_tags

    if args.strategy not in STRATEGIES:
        raise UserError(f"--strategy {args.strategy!r}: choose one of {', '.join(sorted(STRATEGIES))}")
    if args.tracking_uri:
        check_tracking_uri(args.tracking_uri)
    cfg = load_config(args.config, args.overrides)
    with join_torchrun_group(cfg.train.device) as rank:
        reporters = [] if args.no_progress or rank else [ProgressReporter()]
        if args.tracking_uri and not rank:
            tags = {**identity_tags(cfg), "preset": args.config}
            reporters.append(MLflowReporter(args.tracking_uri, args.experiment, cfg.name, tags))
        try:
            result = train(cfg, Reporters(*reporters), strategy=args.strategy)
        except TrainingDiverged as err:  # a user error: the message names the settings behind it
            print(f"hdrope train: {err}", file=sys.stderr)
            return 2
    if rank:
        return 0
    shown = {k: round(v, 4) for k, v in result.metrics.items()}
    print(json.dumps({"run_dir": str(result.run_dir), "step": result.step, "stop_reason": result.stop_reason,
                      "metrics": shown}, indent=1))
    return 0
