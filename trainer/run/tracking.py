"""The lab's one gateway to MLflow: the default store, experiments, a run's identity tags, run lookup by tags, metric,
param and artifact logging, run status and links, and riding out a tracking server that does not answer.

A run's identity is the same whoever creates it (`identity_tags`: config hash, encoding identity, seed): a sweep
cell, `hdrope train --tracking-uri`, and the evaluations that attach to a trained model's runs by its config hash
(`log_eval_metrics`: `hdrope passkey eval`, `hdrope eval lm-eval`).

A sweep is written by one process (its driver), exactly one run per cell: a parent run tagged (sweep, role=parent)
and one child per cell tagged (sweep, cell_id) and its identity. `cell_run` finds before it creates (one search
for all of a sweep's cell runs), so a restarted driver or a retried trial reuses the same run. Because the driver is
the only writer, a `SweepTracker` knows what it wrote to the runs it created (metric steps, artifacts, status) and
never reads it back; what it finds in the store it reads once. Every numeric metric the trainer reports is logged
at the step it was computed; one already logged at a step is not logged again when a trial replays
steps after restoring a checkpoint, or when the end of a sweep copies a cell's metrics.jsonl.

A tracking server that goes down neither ends nor stalls a sweep: a request is retried for about 10 s
(`bound_http_retries`), then the driver carries on without logging (`ServerWatch`) until the server
answers again, and the end of the sweep logs every step, status and artifact that MLflow lacks.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hdrope.errors import UserError
from trainer.config import RunConfig, config_hash
from trainer.labels import value_label
from trainer.model.pe_schedule import run_identity
from trainer.model.position import identity_keys
from trainer.run.reporting import Reporter
from trainer.run.store_home import rehome_store
from trainer.run.store_seed import seed_store

__all__ = [
    "CELLS_FILTER",
    "EXPERIMENT_KIND_TAG",
    "MODEL_TRAINING",
    "TRAINING_VIEW",
    "MLflowReporter",
    "ServerWatch",
    "SweepTracker",
    "bound_http_retries",
    "cell_run_name",
    "check_tracking_uri",
    "default_tracking_uri",
    "experiment",
    "git_commit",
    "identity_tags",
    "is_outage",
    "log_eval_metrics",
    "log_params",
    "outage_reason",
    "quiet_mlflow_links",
    "run_link",
    "runs_page",
    "runs_view",
    "runs_with",
    "server_answers",
    "share_runs_view",
    "tracking_client",
    "update_runs_view",
]

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


def tracking_client(uri: str) -> Any:
    """An MLflow client of `uri`; a new local store starts from the cached migrated template
    (`trainer.run.store_seed`)."""
    import mlflow

    seed_store(uri)
    return mlflow.MlflowClient(uri)


def default_tracking_uri(directory: Path) -> str:
    """The MLflow store of a sweep (or any directory that keeps its own): directory/mlflow.db."""
    return f"sqlite:///{Path(directory) / 'mlflow.db'}"


def experiment(client: Any, name: str, artifact_dir: Path | None = None) -> str:
    """The id of experiment `name`, created on first use, marked as model training. A local store keeps artifacts
    in `artifact_dir`, or beside its database (mlartifacts/), never in ./mlruns of whoever ran the command."""
    found = client.get_experiment_by_name(name)
    if found is not None:
        return found.experiment_id
    uri = str(client.tracking_uri)
    location = None
    if uri.startswith("sqlite:///"):
        where = artifact_dir or Path(uri.removeprefix("sqlite:///")).resolve().parent / "mlartifacts"
        location = Path(where).resolve().as_uri()
    return client.create_experiment(name, artifact_location=location, tags={EXPERIMENT_KIND_TAG: MODEL_TRAINING})


def identity_tags(cfg: RunConfig, chash: str | None = None) -> dict[str, str]:
    """The tags that say which model a run trained: its config hash, encoding identity and seed (the same for a
    sweep cell, a `hdrope train` run and the evaluations that attach to them)."""
    identity = {k: str(v) for k, v in run_identity(cfg).items()}
    return {"config_hash": chash or config_hash(cfg), **identity, "seed": str(cfg.train.seed)}


SEARCH_MAX_RESULTS = 50000  # the most runs MLflow returns from one search (its stores' and server's limit)


def runs_with(client: Any, tags: dict[str, str], experiment_ids: list[str] | None = None) -> list[Any]:
    """The runs carrying every tag in `tags` (in these experiments, or in any), up to MLflow's limit for one search
    (not its default page of 1000)."""
    ids = experiment_ids if experiment_ids is not None else [e.experiment_id for e in client.search_experiments()]
    query = " and ".join(f"tags.{k} = '{v}'" for k, v in tags.items())
    return client.search_runs(ids, filter_string=query, max_results=SEARCH_MAX_RESULTS) if ids else []

SHARED_VIEW_TAG = "mlflow.sharedViewState."  # MLflow UI: a stored runs-table view, opened by ?viewStateShareKey=
RUNS_VIEW_KEY = "hdrope-runs"  # the sweep's runs-table view, stored as MLflow's shared view state of that key
# The view's run filter: the cells, one row each. The sweep's parent run (its plan and report, no metrics) stays in
# the experiment, outside this list: clearing the filter, or its own link (`hdrope ui` prints it), shows it.
CELLS_FILTER = "tags.role = 'cell'"
TABLE_METRICS = ("val_loss", "val_loss_x2", "passkey_acc")  # the runs table's columns, left to right


def cell_run_name(identity: dict[str, Any], seed: int, values: dict[str, Any], seed_axes: list[str]) -> str:
    """A readable child-run name from the cell's encoding identity and its other axes, e.g. 4D-Paley-θ1e+04-s42."""
    parts = [str(identity["pe_label"]).replace(" ", "-")]
    if identity.get("theta") is not None:
        parts.append(f"θ{identity['theta']:g}")
    parts.append(f"s{seed}")
    skip = {*identity_keys(), "model.pe.theta", *seed_axes}  # what the label already says
    parts += [f"{k.rsplit('.', 1)[-1]}{value_label(v)}" for k, v in values.items()
              if k not in skip and not _said_by_label(k, v, skip)]
    return "-".join(parts)[:250]


def _said_by_label(key: str, value: Any, said: set[str]) -> bool:
    """Whether an axis over a whole config node (`model` with mappings that set pe, pe_layers and window per arm)
    sets only keys the label says (or under model.pe)."""
    if not isinstance(value, dict) or not value:
        return False
    keys = [f"{key}.{k}" for k in value]
    return all(k in said or k.startswith("model.pe.") or k == "model.pe" for k in keys)


def runs_view(metric: str = "val_loss", ascending: bool = True) -> dict[str, Any]:
    """The runs table as a researcher wants it, in MLflow's shared-view-state format (what the UI's Share button
    stores under the experiment tag `mlflow.sharedViewState.<key>`): the cells only (CELLS_FILTER, not the sweep's
    parent run), the TABLE_METRICS and Duration as columns, ordered by `metric` (which lists child runs flat, not
    folded under the parent)."""
    return {"searchFilter": CELLS_FILTER, "orderByKey": f"metrics.`{metric}`", "orderByAsc": ascending,
            "selectedColumns": [*(f"metrics.`{m}`" for m in TABLE_METRICS), "attributes.`Duration`"],
            "runsHiddenMode": "SHOW_ALL"}


def share_runs_view(client: Any, experiment_id: str, metric: str = "val_loss", ascending: bool = True) -> str:
    """Store `runs_view` on the experiment (a tag MLflow's UI reads by its key); returns the key."""
    client.set_experiment_tag(experiment_id, SHARED_VIEW_TAG + RUNS_VIEW_KEY,
                              json.dumps(runs_view(metric, ascending)))
    return RUNS_VIEW_KEY


def update_runs_view(client: Any, experiment: Any) -> None:
    """Store `runs_view` on a sweep's experiment that lacks it, or bring a stored one (of a sweep that ran before
    the view listed cells only) up to date, keeping its order."""
    stored = experiment.tags.get(SHARED_VIEW_TAG + RUNS_VIEW_KEY)
    try:
        view = json.loads(stored) if stored else None
    except json.JSONDecodeError:  # a hand-edited tag: store the lab's view again
        view = None
    if not isinstance(view, dict):
        share_runs_view(client, experiment.experiment_id)
    elif view.get("searchFilter") != CELLS_FILTER:
        client.set_experiment_tag(experiment.experiment_id, SHARED_VIEW_TAG + RUNS_VIEW_KEY,
                                  json.dumps({**view, "searchFilter": CELLS_FILTER}))


def runs_page(base_url: str, experiment_id: str, view_key: str = RUNS_VIEW_KEY) -> str:
    """The MLflow UI page of a sweep's runs: the model-training view (not the GenAI traces overview) in the stored
    view `view_key` (see `share_runs_view`: metric columns, ordered by the sweep's metric, runs listed flat).

    The page takes the order from the stored view only when the URL holds no order of its own."""
    return (f"{base_url.rstrip('/')}/#/experiments/{experiment_id}/runs?{TRAINING_VIEW}"
            f"&viewStateShareKey={view_key}")


def git_commit() -> str:
    """HEAD of the working tree, or 'unknown'."""
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5,
                             cwd=Path(__file__).resolve().parent)
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


# MLflow's HTTP client retries a failed request for about 4 minutes by default, which would stall the whole sweep
# (Tune's loop runs the tracking callback) at each request while a server restarts: 3 retries, 0 + 2 + 4 s apart.
HTTP_RETRIES = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "3", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1"}


def bound_http_retries() -> None:
    """Bound how long this process's MLflow client retries a request to a server that does not answer (about 10 s),
    unless the user set MLflow's own variables."""
    for key, value in HTTP_RETRIES.items():
        os.environ.setdefault(key, value)


def is_outage(err: BaseException) -> bool:
    """Whether an MLflow error is the tracking server not answering (refused, timed out, or still failing with a
    5xx after the client's retries), rather than a request that the server answered and refused."""
    import requests
    from mlflow.exceptions import MlflowException

    cause = err.__cause__ or err.__context__
    return isinstance(err, MlflowException) and isinstance(cause, requests.exceptions.RequestException)


def outage_reason(err: BaseException) -> str:
    """What an outage error comes down to, short: e.g. "[Errno 111] Connection refused" or "ReadTimeout"."""
    found = re.search(r"\[Errno -?\d+\] [^'\")(]+", str(err))
    return found.group(0).strip() if found else type(err.__cause__ or err.__context__ or err).__name__


def server_answers(uri: str, timeout: float = 2.0) -> bool:
    """Whether the tracking server at an http(s) URI answers its health check (any other store: True)."""
    if not uri.startswith(("http://", "https://")):
        return True
    try:
        with urllib.request.urlopen(f"{uri.rstrip('/')}/health", timeout=timeout) as r:
            return r.status == 200
    except OSError:
        return False


class ServerWatch:
    """Whether the tracking server is down, for a writer that must neither stop nor stall while it is: after an
    outage, `skip()` is true (at most one health check every `probe_every_s`) until the server answers again."""

    def __init__(self, uri: str, probe_every_s: float = 5.0) -> None:
        self.uri, self.probe_every_s = uri, probe_every_s
        self.down_since: float | None = None
        self._probed = 0.0

    def went_down(self, err: BaseException, then: str = "the sweep goes on, and what it could not log is logged "
                  "once the server answers, at the latest when the sweep ends") -> None:
        """Record an outage (one line on stderr when it starts, saying what happens `then`)."""
        if self.down_since is None:
            self.down_since = self._probed = time.monotonic()
            print(f"MLflow at {self.uri} does not answer ({outage_reason(err)}); {then}", file=sys.stderr, flush=True)

    def skip(self) -> bool:
        """True while the server is known to be down."""
        if self.down_since is None:
            return False
        now = time.monotonic()
        if now - self._probed < self.probe_every_s:
            return True
        self._probed = now
        if not server_answers(self.uri):
            return True
        print(f"MLflow at {self.uri} answers again after {now - self.down_since:.0f} s", file=sys.stderr, flush=True)
        self.down_since = None
        return False

    def wait(self, timeout_s: float) -> bool:
        """Block until the server answers (True) or timeout_s passes (False)."""
        deadline = time.monotonic() + timeout_s
        while not server_answers(self.uri):
            if time.monotonic() >= deadline:
                return False
            time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))  # nothing else to do: check every second
        self.down_since = None
        return True


class SweepTracker:
    """Find-or-create parent and cell runs of one sweep and log into them."""

    def __init__(self, uri: str, sweep: str, artifact_root: Path | None = None) -> None:
        self.uri, self.sweep = uri, sweep
        if uri.startswith(("http://", "https://")):
            bound_http_retries()
        if artifact_root is not None:  # a copied or moved sweep's own store logs into the sweep where it is now
            rehome_store(uri, Path(artifact_root).parent)
        self.client = tracking_client(uri)
        self.experiment_id = experiment(self.client, sweep, artifact_root)
        self._runs: dict[str, str] = {}
        self._found: dict[str, Any] | None = None  # the sweep's cell runs in the store when first asked, by cell id
        # The runs this tracker created: the driver is the store's only writer, so what it logged there is known
        # without asking the store (metric steps, artifacts, status); any other run's is read from the store once.
        self._mine: dict[str, _Written] = {}
        self._steps: dict[tuple[str, str], set[int]] = {}
        self._commit: str | None = None

    @property
    def commit(self) -> str:
        """The working tree's HEAD, read once per tracker (its runs are tagged with it)."""
        if self._commit is None:
            self._commit = git_commit()
        return self._commit

    def describe(self, description: str, tags: dict[str, str]) -> None:
        """Mark the sweep's experiment as model training (so the MLflow UI opens on its runs), with the spec's
        description as its note and the sweep's tags."""
        kind = {EXPERIMENT_KIND_TAG: MODEL_TRAINING}
        note = {"mlflow.note.content": description} if description else {}
        for key, value in {**kind, **note, **tags}.items():
            self.client.set_experiment_tag(self.experiment_id, key, str(value)[:5000])

    def _find(self, params: dict[str, Any], **tags: str) -> str | None:
        """The run with these tags; params it lacks (its creator was cut off before logging them) are logged."""
        found = runs_with(self.client, tags, [self.experiment_id])
        return self._complete(found[0], params) if found else None

    def _complete(self, run: Any, params: dict[str, Any]) -> str:
        """A found run's id, after logging the params it lacks."""
        log_params(self.client, run.info.run_id, {k: v for k, v in params.items() if k not in run.data.params})
        return run.info.run_id

    def _cell_runs(self) -> dict[str, Any]:
        """The sweep's cell runs in the store, by cell id, read in one search the first time a cell is looked up."""
        if self._found is None:
            runs = runs_with(self.client, {"sweep": self.sweep, "role": "cell"}, [self.experiment_id])
            self._found = {r.data.tags["cell_id"]: r for r in runs if "cell_id" in r.data.tags}
        return self._found

    def _create(self, run_name: str, tags: dict[str, str], params: dict[str, Any]) -> str:
        """A new run, with its tags and params; remembered as this tracker's own, and as found (so a call cut off
        before its params reuses the run and logs them)."""
        run = self.client.create_run(self.experiment_id, run_name=run_name, tags=tags)
        self._mine[run.info.run_id] = _Written(run.info.artifact_uri)
        if "cell_id" in tags:
            self._cell_runs()[tags["cell_id"]] = run
        log_params(self.client, run.info.run_id, params)
        return run.info.run_id

    def parent_run(self, params: dict[str, Any] | None = None) -> str:
        """The sweep's parent run, created on first use."""
        if "__parent__" not in self._runs:
            run_id = self._find(params or {}, sweep=self.sweep, role="parent")
            if run_id is None:
                tags = {"sweep": self.sweep, "role": "parent", "git_commit": self.commit}
                run_id = self._create(self.sweep, tags, params or {})
            self._runs["__parent__"] = run_id
        return self._runs["__parent__"]

    def cell_run(self, cell_id: str, config_hash: str, params: dict[str, Any], tags: dict[str, str],
                 run_name: str | None = None) -> str:
        """The one run of a cell: found by its tags, or created (with all params) under the parent."""
        if cell_id in self._runs:
            return self._runs[cell_id]
        found = self._cell_runs().get(cell_id)
        if found is not None:
            run_id = self._complete(found, params)
        else:
            all_tags = {"sweep": self.sweep, "role": "cell", "cell_id": cell_id, "config_hash": config_hash,
                        "git_commit": self.commit, "mlflow.parentRunId": self.parent_run(), **tags}
            run_id = self._create(run_name or cell_id, all_tags, params)
        self._runs[cell_id] = run_id
        return run_id

    def set_status(self, run_id: str, status: str, error: str | None = None, end_ms: int | None = None) -> None:
        """RUNNING, FINISHED or FAILED (with the error as a tag), ended at end_ms (ms since the epoch; now if None).
        A status this tracker already set on its own run, at the same end, is not written again."""
        mine = self._mine.get(run_id)
        # "ended now" (FINISHED or FAILED without end_ms) is a new time at every call, so it is never known
        known = (status, end_ms) if status == "RUNNING" or end_ms is not None else None
        if mine is not None and not error and known is not None and mine.status == known:
            return
        if error:
            self.client.set_tag(run_id, "error", error[:5000])
        if status == "RUNNING":
            self.client.update_run(run_id, status="RUNNING")
        else:
            self.client.set_terminated(run_id, status, end_time=end_ms)
        if mine is not None:
            mine.status = known

    def log_metrics(self, run_id: str, step: int, metrics: dict[str, Any]) -> None:
        """Log every finite numeric metric of `step`, skipping any already logged at that step or later."""
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = [Metric(k, v, now, step) for k, v in _finite(metrics).items()
                 if step > max(self._logged_steps(run_id, k), default=-1)]
        self._log_batch(run_id, batch)

    def _logged_steps(self, run_id: str, key: str) -> set[int]:
        """The steps at which metric `key` of the run is in the store (read from it once, unless the run is ours)."""
        if (run_id, key) not in self._steps:
            known = run_id in self._mine
            self._steps[(run_id, key)] = set() if known else {m.step for m in self.client.get_metric_history(run_id,
                                                                                                             key)}
        return self._steps[(run_id, key)]

    def log_history(self, run_id: str, records: list[dict[str, Any]]) -> None:
        """Log a run's metrics.jsonl records (each at its own step), every (metric, step) that MLflow lacks: also
        the steps before the last logged one that the live logging missed (its server was down)."""
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch, queued = [], set()
        for rec in records:
            step = int(rec["step"])
            for k, v in _finite({k: v for k, v in rec.items() if k != "step"}).items():
                if step not in self._logged_steps(run_id, k) and (k, step) not in queued:
                    queued.add((k, step))
                    batch.append(Metric(k, v, now, step))
        self._log_batch(run_id, batch)

    def _log_batch(self, run_id: str, batch: list[Any]) -> None:
        """Log metrics in MLflow's batches of 1000; a metric's step counts as logged once its batch is stored."""
        for i in range(0, len(batch), 1000):
            chunk = batch[i : i + 1000]
            self.client.log_batch(run_id, metrics=chunk)
            for m in chunk:
                self._logged_steps(run_id, m.key).add(m.step)

    def log_artifacts(self, run_id: str, cell_dir: Path) -> None:
        """Config, eval tables, attention dumps and a reference to the final checkpoint (files already logged are
        kept, so a second call logs only what the first could not)."""
        files = {"config.yaml": "config", "result.json": "result", "dedup.json": "result", "passkey.parquet": "eval",
                 "tasks.parquet": "eval", "metrics.jsonl": "result", "attention/attention.parquet": "attention",
                 "attention/logit_profile.parquet": "attention"}
        from mlflow.store.artifact.artifact_repository_registry import get_artifact_repository

        mine = self._mine.get(run_id)
        present: dict[str, set[str]] = {}
        for rel, kind in files.items():
            if not (cell_dir / rel).is_file():
                continue
            if kind not in present:
                present[kind] = mine.artifacts if mine is not None else \
                    {a.path for a in self.client.list_artifacts(run_id, kind)}
            name = f"{kind}/{Path(rel).name}"
            if name in present[kind]:
                continue
            if mine is not None:  # its artifact location is known: no lookup of the run per file
                get_artifact_repository(mine.artifact_uri, self.uri).log_artifact(str(cell_dir / rel), kind)
                mine.artifacts.add(name)
            else:
                self.client.log_artifact(run_id, str(cell_dir / rel), artifact_path=kind)
        ckpts = sorted((cell_dir / "checkpoints").glob("step_*"))
        if ckpts and (mine is None or mine.checkpoint != str(ckpts[-1])):
            self.client.set_tag(run_id, "final_checkpoint", str(ckpts[-1]))
            if mine is not None:
                mine.checkpoint = str(ckpts[-1])


@dataclass
class _Written:
    """What a tracker wrote to a run it created: where its artifacts go, which it logged, its status (and end)
    and final checkpoint tag."""

    artifact_uri: str
    artifacts: set[str] = field(default_factory=set)
    status: tuple[str, int | None] | None = ("RUNNING", None)  # create_run starts a run RUNNING
    checkpoint: str | None = None


def _finite(metrics: dict[str, Any]) -> dict[str, float]:
    """The finite numeric values of a record (booleans, strings and NaN/inf left out)."""
    return {k: float(v) for k, v in metrics.items()
            if not isinstance(v, bool) and isinstance(v, (int, float)) and math.isfinite(v)}


class MLflowReporter(Reporter):
    """Logs params, metrics with steps and artifacts to one MLflow run."""

    def __init__(self, tracking_uri: str, experiment_name: str, run_name: str,
                 tags: dict[str, str] | None = None) -> None:
        quiet_mlflow_links()
        self.uri = tracking_uri
        self.client = tracking_client(tracking_uri)
        self.experiment_id = experiment(self.client, experiment_name)
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


def log_eval_metrics(tracking_uri: str, cfg: RunConfig, metrics: dict[str, float], step: int,
                     experiment_name: str) -> list[str]:
    """Log an evaluation's metrics at `step` to every MLflow run of this model (found by its config_hash tag, in any
    experiment: a sweep cell's run, a `hdrope train` run), or to a new run with the model's identity tags in
    `experiment_name` when none exists; returns the run ids."""
    import time

    from mlflow.entities import Metric

    client = tracking_client(tracking_uri)
    tags = identity_tags(cfg)
    runs = [r.info.run_id for r in runs_with(client, {"config_hash": tags["config_hash"]})]
    if not runs:
        print(f"MLflow at {tracking_uri} has no run of config {tags['config_hash']}; logging to a new run in "
              f"experiment {experiment_name!r}", file=sys.stderr)
        run = client.create_run(experiment(client, experiment_name), run_name=cfg.name, tags=tags)
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

