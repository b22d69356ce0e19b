"""The driver-side Ray Tune callback that writes MLflow: the driver is the only writer of the store."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ray import tune

from sweeps.plan import Plan
from sweeps.plan_file import load_plan
from sweeps.trainable import reported_metrics
from trainer.config import flatten_config
from trainer.files.run_files import RESULT_FILE
from trainer.labels import value_label
from trainer.model.pe_schedule import run_identity
from trainer.run.tracking import ServerWatch, SweepTracker, cell_run_name, identity_tags, is_outage

__all__ = ["TrackingCallback", "cell_end_ms", "trial_name"]


def trial_name(trial: Any, plan: Plan | None = None, payload: dict[str, Any] | None = None) -> str:
    """Tune's name for a trial: its cell's readable run name (e.g. 4D-Paley-θ10000-s42), as in MLflow.

    (`payload`: the plan as Tune state pickled before the plan was typed holds it; its sweep's plan is loaded.)"""
    return _run_name(plan or load_plan(payload["root"]), trial.config)


def cell_end_ms(run_dir: Path) -> int | None:
    """When a cell's training ended (ms since the epoch): when its trainer wrote result.json, or error.txt for a
    failed trial; None when it has neither (it never ended)."""
    for name in (RESULT_FILE, "error.txt"):
        try:
            return int((Path(run_dir) / name).stat().st_mtime * 1000)
        except OSError:
            continue
    return None


def _run_name(plan: Plan, trial_config: dict[str, Any]) -> str:
    cell = plan.trial_cell(trial_config)
    return cell_run_name(run_identity(cell.config), cell.config.train.seed, cell.values, plan.seed_axes)


def _outage_tolerant(hook: Callable[..., None]) -> Callable[..., None]:
    """A tracking hook that neither ends nor stalls the sweep while the tracking server is down: it is skipped
    then, and the end of the sweep (runner._reconcile) logs what MLflow lacks from each cell's files."""

    @functools.wraps(hook)
    def guarded(self: TrackingCallback, *args: Any, **kwargs: Any) -> None:
        if self.watch.skip():
            return
        from mlflow.exceptions import MlflowException

        try:
            hook(self, *args, **kwargs)
        except MlflowException as err:
            if not is_outage(err):
                raise
            self.watch.went_down(err)

    return guarded


class TrackingCallback(tune.Callback):
    """Maps each trial to its cell's one MLflow run and logs metrics, status and artifacts there."""

    def __init__(self, uri: str, plan: Plan, tracker: SweepTracker | None = None) -> None:
        self.uri, self.plan = uri, plan
        self._tracker = tracker  # the driver's own, shared with the end of the sweep (runner._reconcile)
        self._resolved: dict[str, tuple[str, str, Path]] = {}
        self._watch: ServerWatch | None = None

    def __getstate__(self) -> dict[str, Any]:  # Tune pickles callbacks with the experiment state
        return {"uri": self.uri, "plan": self.plan, "_tracker": None, "_resolved": {}, "_watch": None}

    def __setstate__(self, state: dict[str, Any]) -> None:
        if "payload" in state:  # pickled before the plan was typed: the sweep's plan, as load_plan reads it
            state = {**state, "plan": load_plan(state.pop("payload")["root"])}
        self.__dict__.update(state)

    @property
    def watch(self) -> ServerWatch:
        """Whether the tracking server is down (a callback restored from an older pickle has none yet)."""
        if getattr(self, "_watch", None) is None:
            self._watch = ServerWatch(self.uri)
        return self._watch

    @property
    def tracker(self) -> SweepTracker:
        if self._tracker is None:
            self._tracker = SweepTracker(self.uri, self.plan.spec.name, self.plan.root / "artifacts")
        return self._tracker

    def run_for(self, trial_config: dict[str, Any]) -> tuple[str, str, Path]:
        """(cell_id, run_id, cell dir) of a trial; creates the run the first time a cell is seen."""
        key = json.dumps(trial_config, sort_keys=True, default=str)
        if key not in self._resolved:  # on_trial_result is a hot path: resolve each trial's config once
            self._resolved[key] = self._resolve(trial_config)
        return self._resolved[key]

    def _resolve(self, trial_config: dict[str, Any]) -> tuple[str, str, Path]:
        cell = self.plan.trial_cell(trial_config)
        cfg = cell.config
        axes = ", ".join(f"{k}={value_label(v)}" for k, v in cell.values.items())
        tags = {"dedup_group": cell.group if cell.cell_id in self._planned else "", "axes": axes,
                **identity_tags(cfg, cell.config_hash)}
        run_id = self.tracker.cell_run(cell.cell_id, cell.config_hash, flatten_config(cfg), tags,
                                       _run_name(self.plan, trial_config))
        return cell.cell_id, run_id, Path(cfg.train.out_dir)

    @property
    def _planned(self) -> set[str]:
        """The ids of the plan's stored cells (an Optuna trial's cell is not one of them)."""
        return {c.cell_id for c in self.plan.cells}

    @_outage_tolerant
    def on_trial_start(self, iteration, trials, trial, **info):
        _, run_id, _ = self.run_for(trial.config)
        self.tracker.set_status(run_id, "RUNNING")

    @_outage_tolerant
    def on_trial_result(self, iteration, trials, trial, result, **info):
        _, run_id, _ = self.run_for(trial.config)
        if "step" in result:
            self.tracker.log_metrics(run_id, int(result["step"]), reported_metrics(result))

    @_outage_tolerant
    def on_trial_complete(self, iteration, trials, trial, **info):
        _, run_id, cell_dir = self.run_for(trial.config)
        self.tracker.log_artifacts(run_id, cell_dir)
        self.tracker.set_status(run_id, "FINISHED", end_ms=cell_end_ms(cell_dir))  # the cell's end, not the sweep's

    @_outage_tolerant
    def on_trial_error(self, iteration, trials, trial, **info):  # out of retries: the cell's run ends here
        _, run_id, cell_dir = self.run_for(trial.config)
        self.tracker.client.set_tag(run_id, "last_error", str(getattr(trial, "error_file", "") or "error")[:500])
        error = cell_dir / "error.txt"
        self.tracker.set_status(run_id, "FAILED", error.read_text(errors="replace") if error.is_file() else None,
                                end_ms=cell_end_ms(cell_dir))
