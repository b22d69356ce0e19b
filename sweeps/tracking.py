"""MLflow tracking for sweeps, written by one process (the driver), exactly one run per cell.

Run identity lives in MLflow itself: a parent run tagged (sweep, role=parent) and one child per
cell tagged (sweep, cell_id, config_hash). `cell_run` finds before it creates, so a restarted
driver or a retried trial reuses the same run. Every numeric metric the trainer reports is logged
at the step it was computed; one already logged at a step is not logged again when a trial replays
steps after restoring a checkpoint, or when the end of a sweep copies a cell's metrics.jsonl.
"""

from __future__ import annotations

import json
import math
import subprocess
import time
from pathlib import Path
from typing import Any

from trainer.labels import value_label
from trainer.reporting import EXPERIMENT_KIND_TAG, MODEL_TRAINING, TRAINING_VIEW, log_params

__all__ = [
    "EXPERIMENT_KIND_TAG",
    "MODEL_TRAINING",
    "SweepTracker",
    "cell_run_name",
    "default_tracking_uri",
    "git_commit",
    "runs_page",
    "runs_view",
    "share_runs_view",
]

SHARED_VIEW_TAG = "mlflow.sharedViewState."  # MLflow UI: a stored runs-table view, opened by ?viewStateShareKey=
RUNS_VIEW_KEY = "hdrope-runs"  # the sweep's runs-table view, stored as MLflow's shared view state of that key
TABLE_METRICS = ("val_loss", "val_loss_x2", "passkey_acc")  # the runs table's columns, left to right


def cell_run_name(identity: dict[str, Any], seed: int, values: dict[str, Any], seed_axes: list[str]) -> str:
    """A readable child-run name from the cell's encoding identity and its other axes, e.g. 4D-Paley-θ1e+04-s42."""
    parts = [str(identity["pe_label"]).replace(" ", "-")]
    if identity.get("theta") is not None:
        parts.append(f"θ{identity['theta']:g}")
    parts.append(f"s{seed}")
    skip = {"model.pe.kind", "model.pe.rotation_dim", "model.pe.basis", "model.pe.theta", *seed_axes}
    parts += [f"{k.rsplit('.', 1)[-1]}{value_label(v)}" for k, v in values.items() if k not in skip]
    return "-".join(parts)[:250]


def runs_view(metric: str = "val_loss", ascending: bool = True) -> dict[str, Any]:
    """The runs table as a researcher wants it, in MLflow's shared-view-state format (what the UI's Share button
    stores under the experiment tag `mlflow.sharedViewState.<key>`): the TABLE_METRICS and Duration as columns,
    every run ordered by `metric` (which lists child runs flat, not folded under the parent)."""
    return {"orderByKey": f"metrics.`{metric}`", "orderByAsc": ascending,
            "selectedColumns": [*(f"metrics.`{m}`" for m in TABLE_METRICS), "attributes.`Duration`"],
            "runsHiddenMode": "SHOW_ALL"}


def share_runs_view(client: Any, experiment_id: str, metric: str = "val_loss", ascending: bool = True) -> str:
    """Store `runs_view` on the experiment (a tag MLflow's UI reads by its key); returns the key."""
    client.set_experiment_tag(experiment_id, SHARED_VIEW_TAG + RUNS_VIEW_KEY,
                              json.dumps(runs_view(metric, ascending)))
    return RUNS_VIEW_KEY


def runs_page(base_url: str, experiment_id: str, view_key: str = RUNS_VIEW_KEY) -> str:
    """The MLflow UI page of a sweep's runs: the model-training view (not the GenAI traces overview) in the stored
    view `view_key` (see `share_runs_view`: metric columns, ordered by the sweep's metric, runs listed flat).

    The page takes the order from the stored view only when the URL holds no order of its own."""
    return (f"{base_url.rstrip('/')}/#/experiments/{experiment_id}/runs?{TRAINING_VIEW}"
            f"&viewStateShareKey={view_key}")


def default_tracking_uri(root: Path) -> str:
    """The sweep's own SQLite store (the driver is its only writer)."""
    return f"sqlite:///{root / 'mlflow.db'}"


def git_commit() -> str:
    """HEAD of the working tree, or 'unknown'."""
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5,
                             cwd=Path(__file__).resolve().parent)
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


class SweepTracker:
    """Find-or-create parent and cell runs of one sweep and log into them."""

    def __init__(self, uri: str, sweep: str, artifact_root: Path | None = None) -> None:
        import mlflow

        self.uri, self.sweep = uri, sweep
        self.client = mlflow.MlflowClient(uri)
        exp = self.client.get_experiment_by_name(sweep)
        if exp is None:  # a local store keeps artifacts in the sweep dir, not in ./mlruns of whoever ran it
            location = artifact_root.resolve().as_uri() if artifact_root and uri.startswith("sqlite") else None
            self.experiment_id = self.client.create_experiment(sweep, artifact_location=location)
        else:
            self.experiment_id = exp.experiment_id
        self._runs: dict[str, str] = {}
        self._last_step: dict[tuple[str, str], int] = {}

    def describe(self, description: str, tags: dict[str, str]) -> None:
        """Mark the sweep's experiment as model training (so the MLflow UI opens on its runs), with the spec's
        description as its note and the sweep's tags."""
        kind = {EXPERIMENT_KIND_TAG: MODEL_TRAINING}
        note = {"mlflow.note.content": description} if description else {}
        for key, value in {**kind, **note, **tags}.items():
            self.client.set_experiment_tag(self.experiment_id, key, str(value)[:5000])

    def _find(self, **tags: str) -> str | None:
        query = " and ".join(f"tags.{k} = '{v}'" for k, v in tags.items())
        found = self.client.search_runs([self.experiment_id], filter_string=query, max_results=2)
        return found[0].info.run_id if found else None

    def parent_run(self, params: dict[str, Any] | None = None) -> str:
        """The sweep's parent run, created on first use."""
        if "__parent__" not in self._runs:
            run_id = self._find(sweep=self.sweep, role="parent")
            if run_id is None:
                tags = {"sweep": self.sweep, "role": "parent", "git_commit": git_commit()}
                run_id = self.client.create_run(self.experiment_id, run_name=self.sweep, tags=tags).info.run_id
                log_params(self.client, run_id, params or {})
            self._runs["__parent__"] = run_id
        return self._runs["__parent__"]

    def cell_run(self, cell_id: str, config_hash: str, params: dict[str, Any], tags: dict[str, str],
                 run_name: str | None = None) -> str:
        """The one run of a cell: found by its tags, or created (with all params) under the parent."""
        if cell_id in self._runs:
            return self._runs[cell_id]
        run_id = self._find(sweep=self.sweep, cell_id=cell_id)
        if run_id is None:
            all_tags = {"sweep": self.sweep, "role": "cell", "cell_id": cell_id, "config_hash": config_hash,
                        "git_commit": git_commit(), "mlflow.parentRunId": self.parent_run(), **tags}
            run = self.client.create_run(self.experiment_id, run_name=run_name or cell_id, tags=all_tags)
            run_id = run.info.run_id
            log_params(self.client, run_id, params)
        self._runs[cell_id] = run_id
        return run_id

    def set_status(self, run_id: str, status: str, error: str | None = None, end_ms: int | None = None) -> None:
        """RUNNING, FINISHED or FAILED (with the error as a tag), ended at end_ms (ms since the epoch; now if None)."""
        if error:
            self.client.set_tag(run_id, "error", error[:5000])
        if status == "RUNNING":
            self.client.update_run(run_id, status="RUNNING")
        else:
            self.client.set_terminated(run_id, status, end_time=end_ms)

    def log_metrics(self, run_id: str, step: int, metrics: dict[str, Any]) -> None:
        """Log every finite numeric metric of `step`, skipping any already logged at that step or later."""
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = []
        for k, v in metrics.items():
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                continue
            key = (run_id, k)
            if key not in self._last_step:
                hist = self.client.get_metric_history(run_id, k)
                self._last_step[key] = max((m.step for m in hist), default=-1)
            if step <= self._last_step[key]:
                continue
            self._last_step[key] = step
            batch.append(Metric(k, float(v), now, step))
        for i in range(0, len(batch), 1000):
            self.client.log_batch(run_id, metrics=batch[i : i + 1000])

    def log_history(self, run_id: str, records: list[dict[str, Any]]) -> None:
        """Log a run's metrics.jsonl records (each at its own step), skipping what is already logged."""
        for rec in records:
            self.log_metrics(run_id, int(rec["step"]), {k: v for k, v in rec.items() if k != "step"})

    def log_artifacts(self, run_id: str, cell_dir: Path) -> None:
        """Config, eval tables, attention dumps and a reference to the final checkpoint."""
        files = {"config.yaml": "config", "result.json": "result", "dedup.json": "result", "passkey.parquet": "eval",
                 "metrics.jsonl": "result", "attention/attention.parquet": "attention",
                 "attention/logit_profile.parquet": "attention"}
        for rel, kind in files.items():
            if (cell_dir / rel).is_file():
                self.client.log_artifact(run_id, str(cell_dir / rel), artifact_path=kind)
        ckpts = sorted((cell_dir / "checkpoints").glob("step_*"))
        if ckpts:
            self.client.set_tag(run_id, "final_checkpoint", str(ckpts[-1]))
