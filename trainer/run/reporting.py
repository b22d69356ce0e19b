"""Reporters: the hook through which a training run talks to the outside (progress bar, MLflow, Ray).

`trainer.train` calls a `Reporter`; the sweep layer subclasses it to forward metrics and checkpoints to Ray Tune,
and `trainer.run.tracking.MLflowReporter` logs a run to MLflow. The trainer itself never imports Ray.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["ProgressReporter", "Reporter", "Reporters"]

class Reporter:
    """Does nothing; override what you need."""

    def restore_path(self) -> Path | None:
        """A checkpoint directory to resume from (e.g. the one Ray restored), or None."""
        return None

    def start(self, run_dir: Path, params: dict[str, Any], total_steps: int, start_step: int) -> None:
        """Called once before the first step, after any resume."""

    def log(self, step: int, metrics: dict[str, float]) -> None:
        """Metrics of optimizer step `step` (1-based count of completed steps)."""

    def checkpoint(self, step: int, path: Path, metrics: dict[str, float]) -> None:
        """A checkpoint was written at `path` after `step` steps."""

    def artifact(self, path: Path, kind: str) -> None:
        """A result file was written (kind: config, passkey, tasks, attention, result)."""

    def finish(self, status: str, error: str | None = None) -> None:
        """The run ended: FINISHED, or FAILED with the error."""


class Reporters(Reporter):
    """Fans every call out to several reporters; the first restore path wins."""

    def __init__(self, *reporters: Reporter) -> None:
        self.reporters = [r for r in reporters if r is not None]

    def restore_path(self) -> Path | None:
        return next((p for r in self.reporters if (p := r.restore_path()) is not None), None)

    def start(self, run_dir, params, total_steps, start_step):
        for r in self.reporters:
            r.start(run_dir, params, total_steps, start_step)

    def log(self, step, metrics):
        for r in self.reporters:
            r.log(step, metrics)

    def checkpoint(self, step, path, metrics):
        for r in self.reporters:
            r.checkpoint(step, path, metrics)

    def artifact(self, path, kind):
        for r in self.reporters:
            r.artifact(path, kind)

    def finish(self, status, error=None):
        for r in self.reporters:
            r.finish(status, error)


class ProgressReporter(Reporter):
    """A tqdm progress bar with ETA and the latest loss."""

    def __init__(self) -> None:
        self.bar = None

    def start(self, run_dir, params, total_steps, start_step):
        from tqdm import tqdm

        self.bar = tqdm(total=total_steps, initial=start_step, unit="step", dynamic_ncols=True)

    def log(self, step, metrics):
        if self.bar is None:
            return
        self.bar.update(step - self.bar.n)
        shown = {k: f"{v:.4g}" for k, v in metrics.items() if k in ("train_loss", "val_loss", "tokens_per_s")}
        self.bar.set_postfix(shown, refresh=False)

    def finish(self, status, error=None):
        if self.bar is not None:
            self.bar.close()
