"""Reporters: the hook through which a training run talks to the outside (progress bar, MLflow, Ray).

`trainer.train` calls a `Reporter`; the sweep layer subclasses it to forward metrics and
checkpoints to Ray Tune and MLflow. The trainer itself never imports Ray.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from hdrope.errors import UserError

__all__ = ["EXPERIMENT_KIND_TAG", "MODEL_TRAINING", "TRAINING_VIEW", "MLflowReporter", "ProgressReporter", "Reporter",
           "Reporters", "log_eval_metrics", "log_params", "quiet_mlflow_links", "run_link"]

# MLflow 3's UI opens an experiment tagged as model training on its runs (not the GenAI overview); a page whose URL
# lacks TRAINING_VIEW falls back to the browser's stored view, GenAI by default ("Evaluation runs").
EXPERIMENT_KIND_TAG, MODEL_TRAINING = "mlflow.experimentKind", "custom_model_development"
TRAINING_VIEW = "workflowType=machine_learning"


def run_link(base_url: str, experiment_id: str, run_id: str) -> str:
    """The MLflow UI page of one run, in the model-training view."""
    return f"{base_url.rstrip('/')}/#/experiments/{experiment_id}/runs/{run_id}?{TRAINING_VIEW}"


def quiet_mlflow_links() -> None:
    """Stop MLflow's own 'View run at' lines (their links open the GenAI view); the lab prints `run_link`s."""
    os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")


def log_params(client, run_id: str, params: dict[str, Any]) -> None:
    """Log params to an MLflow run in batches of 100 (values cut to MLflow's 6000-character limit)."""
    from mlflow.entities import Param

    items = [Param(k, str(v)[:6000]) for k, v in params.items()]
    for i in range(0, len(items), 100):
        client.log_batch(run_id, params=items[i : i + 100])


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
        """A result file was written (kind: config, passkey, attention, result)."""

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


class MLflowReporter(Reporter):
    """Logs params, metrics with steps and artifacts to one MLflow run."""

    def __init__(self, tracking_uri: str, experiment: str, run_name: str, tags: dict[str, str] | None = None) -> None:
        import mlflow

        quiet_mlflow_links()
        self.uri = tracking_uri
        self.client = mlflow.MlflowClient(tracking_uri)
        exp = self.client.get_experiment_by_name(experiment)
        location = None
        if tracking_uri.startswith("sqlite:///"):  # keep artifacts beside the database, not in ./mlruns
            location = (Path(tracking_uri.removeprefix("sqlite:///")).resolve().parent / "mlartifacts").as_uri()
        if exp is None:
            self.experiment_id = self.client.create_experiment(experiment, artifact_location=location,
                                                               tags={EXPERIMENT_KIND_TAG: MODEL_TRAINING})
        else:
            self.experiment_id = exp.experiment_id
        self.run_id = self.client.create_run(self.experiment_id, run_name=run_name, tags=tags or {}).info.run_id

    def start(self, run_dir, params, total_steps, start_step):
        log_params(self.client, self.run_id, params)

    def log(self, step, metrics):
        import time

        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = [Metric(k, float(v), now, step) for k, v in metrics.items()]
        self.client.log_batch(self.run_id, metrics=batch)

    def artifact(self, path, kind):
        self.client.log_artifact(self.run_id, str(path), artifact_path=kind)

    def finish(self, status, error=None):
        if error:
            self.client.set_tag(self.run_id, "error", error[:5000])
        self.client.set_terminated(self.run_id, status)
        if self.uri.startswith(("http://", "https://")):
            print(f"MLflow run: {run_link(self.uri, self.experiment_id, self.run_id)}", file=sys.stderr)


def log_eval_metrics(tracking_uri: str, config_hash: str, metrics: dict[str, float], step: int,
                     experiment: str, run_name: str) -> list[str]:
    """Log an evaluation's metrics at `step` to every MLflow run of this configuration (found by its config_hash
    tag: a sweep cell's run, a `hdrope train` run), or to a new run in `experiment`; returns the run ids."""
    import time

    import mlflow
    from mlflow.entities import Metric

    client = mlflow.MlflowClient(tracking_uri)
    exps = [e.experiment_id for e in client.search_experiments()]
    runs = [r.info.run_id for r in client.search_runs(exps, f"tags.config_hash = '{config_hash}'")] if exps else []
    if not runs:
        exp = client.get_experiment_by_name(experiment)
        exp_id = exp.experiment_id if exp else client.create_experiment(experiment)
        run = client.create_run(exp_id, run_name=run_name, tags={"config_hash": config_hash})
        client.set_terminated(run.info.run_id)
        runs = [run.info.run_id]
    now = int(time.time() * 1000)
    for run_id in runs:
        client.log_batch(run_id, metrics=[Metric(k, float(v), now, step) for k, v in metrics.items()])
    return runs


def check_tracking_uri(uri: str, flag: str = "--tracking-uri") -> None:
    """UserError naming the flag when a local MLflow store (sqlite:/// or file:/ path) cannot be created where asked."""
    from urllib.parse import urlparse

    if not uri or uri.startswith(("http://", "https://", "databricks")):
        return
    parsed = urlparse(uri)
    path = Path(uri.removeprefix("sqlite:///")) if uri.startswith("sqlite:///") else Path(parsed.path or uri)
    if uri.startswith("sqlite:") and not uri.startswith("sqlite:///"):
        raise UserError(f"{flag} {uri}: a SQLite store is sqlite:///ABSOLUTE/PATH/mlflow.db (three slashes)")
    for parent in [path, *path.parents]:
        if parent.exists():
            if parent != path and not parent.is_dir():
                raise UserError(f"{flag} {uri}: {parent} is a file, so the store cannot be created under it; "
                                "point the URI at a directory path")
            break

