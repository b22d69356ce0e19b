"""The Ray Tune function trainable: one trial trains one cell through `trainer.train`.

The plan travels to workers through `tune.with_parameters`, so a worker never re-resolves a grid
cell: it trains exactly the config that was validated before the sweep started. Metrics and
checkpoints reach Tune through `TuneReporter`; a retried trial resumes from Tune's checkpoint.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from sweeps.plan import cell_config, metric_driven
from sweeps.spec import SweepSpec
from trainer.config import RunConfig
from trainer.presets import merge_config
from trainer.reporting import Reporter

__all__ = ["TuneReporter", "plan_payload", "resolve_cell", "run_trial"]


def plan_payload(plan) -> dict[str, Any]:
    """What workers and the driver callback need of a plan (plain data, picklable)."""
    return {
        "name": plan.spec.name,
        "root": str(plan.root),
        "spec": OmegaConf.to_yaml(OmegaConf.structured(plan.spec)),
        "space": list(plan.spec.search.space),
        "required_metric": plan.spec.search.metric if metric_driven(plan.spec) else None,
        "cells": {c.cell_id: {"config": OmegaConf.to_yaml(OmegaConf.structured(c.config)), "values": c.values,
                              "config_hash": c.config_hash, "group": c.group, "dedup_of": c.dedup_of}
                  for c in plan.cells if plan.spec.search.kind == "grid"},  # optuna trials are named as sampled
    }


def resolve_cell(payload: dict[str, Any], trial_config: dict[str, Any]) -> tuple[str, RunConfig, dict[str, Any]]:
    """(cell_id, RunConfig, values) of a trial: a planned grid cell, or an Optuna sample named by its hash."""
    if "cell" in trial_config:
        cell = payload["cells"][trial_config["cell"]]
        cfg = merge_config([OmegaConf.create(cell["config"])], where=f"cell {trial_config['cell']}")
        return trial_config["cell"], cfg, cell["values"]
    values = {k: trial_config[k] for k in payload["space"]}
    digest = hashlib.sha256(json.dumps(values, sort_keys=True, default=str).encode()).hexdigest()[:12]
    cell_id = f"t-{digest}"
    spec_cfg = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(SweepSpec), OmegaConf.create(payload["spec"])))
    return cell_id, cell_config(spec_cfg, values, cell_id, Path(payload["root"]) / "cells" / cell_id), values


class TuneReporter(Reporter):
    """Forwards metrics and checkpoints to Ray Tune; carries the last known value of every metric."""

    def __init__(self, cell_id: str, required_metric: str | None = None) -> None:
        self.cell_id, self.required = cell_id, required_metric
        self.carry: dict[str, Any] = {}

    def restore_path(self) -> Path | None:
        from ray import tune

        ckpt = tune.get_checkpoint()
        return Path(ckpt.to_directory()) if ckpt is not None else None

    def _payload(self, step: int, metrics: dict[str, float]) -> dict[str, Any]:
        self.carry.update(metrics)
        return {**self.carry, "step": step, "cell_id": self.cell_id}

    def log(self, step: int, metrics: dict[str, float]) -> None:
        from ray import tune

        payload = self._payload(step, metrics)
        if self.required is None or self.required in payload:  # a searcher needs its metric in every result
            tune.report(payload)

    def checkpoint(self, step: int, path: Path, metrics: dict[str, float]) -> None:
        from ray import tune

        payload = self._payload(step, metrics)
        if self.required is not None and self.required not in payload:
            payload[self.required] = float("nan")  # a checkpoint is never dropped; its metric is not known yet
        tune.report(payload, checkpoint=tune.Checkpoint.from_directory(str(path)))


def finished_result(cfg: RunConfig) -> dict[str, Any] | None:
    """The stored result of a cell that already trained to the end, else None."""
    path = Path(cfg.train.out_dir) / "result.json"
    if not path.is_file():
        return None
    result = json.loads(path.read_text())
    return result if result.get("step", 0) >= cfg.train.steps else None


def run_trial(config: dict[str, Any], payload: dict[str, Any]) -> None:
    """Tune entry point: train the trial's cell (never twice: a finished cell only re-reports its result)."""
    from ray import tune

    from trainer.loop import train

    cell_id, cfg, _ = resolve_cell(payload, config)
    done = finished_result(cfg)
    if done is not None:
        metrics = {k: v for k, v in done["metrics"].items() if v is not None}
        tune.report({**metrics, "step": done["step"], "cell_id": cell_id, "reused": 1})
        return
    error_file = Path(cfg.train.out_dir) / "error.txt"
    try:
        train(cfg, TuneReporter(cell_id, payload.get("required_metric")))
    except Exception as err:
        error_file.parent.mkdir(parents=True, exist_ok=True)
        error_file.write_text(f"{type(err).__name__}: {err}\n")
        raise
    error_file.unlink(missing_ok=True)
