"""Run, resume and reconcile a sweep on Ray Tune (embedded local Ray by default, or `--address`).

Layout of a sweep directory (storage/name):
    spec.yaml, plan.json    the validated spec and every cell's resolved config
    cells/<cell_id>/        each cell's trainer run dir (checkpoints, metrics, dumps, result.json)
    ray/tune/               Ray Tune's experiment state (what `Tuner.restore` reads)
    mlflow.db               the default MLflow store (the driver is its only writer)
    results.parquet         one row per cell, written at the end
"""

from __future__ import annotations

import functools
import ipaddress
import os
import sys
import time
from pathlib import Path
from typing import Any

from hdrope.errors import UserError
from sweeps.plan import Plan, local_gpus, make_plan
from sweeps.plan_file import find_plan, save_plan
from sweeps.procs import exit_on_signals, loopback_ray, signal_exit_codes, signals_held, start_watchdog
from sweeps.results import cell_rows, sampled_values, write_results
from sweeps.spec import SweepSpec, load_spec
from sweeps.trainable import run_trial
from trainer.files.dir_lock import hold_dir_lock
from trainer.files.run_files import METRICS_FILE, read_metrics, write_json_atomic
from trainer.presets import config_yaml
from trainer.run.tracking import (
    ServerWatch,
    SweepTracker,
    check_tracking_uri,
    default_tracking_uri,
    git_commit,
    is_outage,
    outage_reason,
    quiet_mlflow_links,
    runs_page,
    share_runs_view,
)

__all__ = ["prepare", "resume_sweep", "run_sweep"]

RECONCILE_WAIT_S = 600.0  # how long the end of a sweep waits for a tracking server that does not answer


def prepare(spec_path: str, overrides: list[str] | None = None) -> Plan:
    """Load and validate a spec into a plan (raises SpecError, exit code 2, before any Ray)."""
    spec = load_spec(spec_path, overrides)
    return make_plan(spec, source=str(spec_path))


def _init_ray(address: str | None, spec: SweepSpec) -> bool:
    """Join the cluster at `address`, or start an embedded single-node Ray on loopback; True if started here.

    The embedded Ray binds 127.0.0.1 only, keeps token auth on (Ray's default), lives under $HDROPE_RAY_TMPDIR
    when set (else Ray's /tmp/ray), and is watched: if this driver is killed, its processes are stopped. A stop
    signal while Ray starts ends the driver once it has started (128 + signal, Ray shut down again), never
    inside Ray's start-up."""
    import ray

    os.environ.setdefault("TUNE_DISABLE_STRICT_METRIC_CHECKING", "1")
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")  # with verbose=0 Tune prints nothing (no configuration box)
    os.environ.setdefault("TUNE_DISABLE_SIGINT_HANDLER", "1")  # Ctrl-C ends the driver (exit 130); resume finishes
    os.environ.setdefault("TUNE_WARN_EXCESSIVE_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S", "0")  # frequent ckpts are fine
    os.environ.setdefault("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")  # only the JSON log added below: no TensorBoard
    if ray.is_initialized():
        return False
    kwargs: dict[str, Any] = {"dashboard_host": "127.0.0.1", "log_to_driver": True, "configure_logging": True,
                              "logging_level": "warning"}
    if address:
        if _on_loopback(address):  # a cluster bound to 127.0.0.1 (as an embedded one is): Ray would dial the LAN IP
            with loopback_ray() as loopback, signals_held():
                ray.init(address=address, **kwargs, **loopback)
        else:
            with signals_held():
                ray.init(address=address, **kwargs)
        return False
    if os.environ.get("HDROPE_RAY_TMPDIR"):
        kwargs["_temp_dir"] = os.environ["HDROPE_RAY_TMPDIR"]
    kwargs["include_dashboard"] = False  # half of an embedded start (docs/sweeps.md); a cluster keeps its own
    # without a dashboard there is no State API, which Ray Train's cleaner polls and says so once a second
    kwargs["runtime_env"] = {"worker_process_setup_hook": "sweeps.ray_quiet.quiet_train_cleaner"}
    start_watchdog()
    try:
        with loopback_ray() as loopback, signals_held():
            ray.init(**kwargs, **loopback)
    except SystemExit:  # stopped while Ray started: what the lab starts, it stops
        if ray.is_initialized():
            ray.shutdown()
        raise
    return True


def _on_loopback(address: str) -> bool:
    """Whether a Ray address (HOST:PORT) names this machine's loopback interface."""
    if "://" in address:  # a Ray Client (ray://) address: the client starts no node of its own here
        return False
    host = address.rsplit(":", 1)[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback  # 127.0.0.0/8 and ::1
    except ValueError:  # a host name or `auto`
        return False


def _tuner(plan: Plan, uri: str, restore: bool, tracker: SweepTracker | None = None):
    from ray import tune
    from ray.tune.logger import JsonLoggerCallback

    from sweeps.callback import TrackingCallback, trial_name
    from sweeps.progress import ProgressCallback

    root, spec = plan.root, plan.spec
    # A trial of W > 1 workers only drives its Ray Train run, whose workers hold the CPUs and GPUs: the trial asks
    # for one byte of memory, the least Tune accepts (a request may not be empty), so W workers fit W CPUs.
    r = spec.resources
    request = {"cpu": r.cpus, "gpu": r.gpus} if r.workers == 1 else {"cpu": 0, "gpu": 0, "memory": 1}
    trainable = tune.with_resources(tune.with_parameters(run_trial, plan=plan), request)
    exp_dir = root / "ray" / "tune"
    if restore and tune.Tuner.can_restore(str(exp_dir)):
        return tune.Tuner.restore(str(exp_dir), trainable, resume_errored=True)
    s = spec.search
    scheduler = None
    if spec.scheduler == "asha":
        from ray.tune.schedulers import ASHAScheduler

        steps = max(c.config.train.steps for c in plan.cells)
        scheduler = ASHAScheduler(time_attr="step", metric=s.metric, mode=s.mode, max_t=steps,
                                  grace_period=max(1, steps // 8))
    search_alg, num_samples = None, 1
    if s.kind == "optuna":
        param_space, search_alg = _optuna(spec, root)
        num_samples = s.n_trials
    else:
        param_space = {"cell": tune.grid_search([c.cell_id for c in plan.to_run])}
    return tune.Tuner(
        trainable,
        param_space=param_space,
        tune_config=tune.TuneConfig(num_samples=num_samples, max_concurrent_trials=_concurrent(spec),
                                    scheduler=scheduler, search_alg=search_alg,
                                    # a warm worker (torch imported, data cached) per slot; a Train run's trial is
                                    # never reused: a stopped trial's actor dies, and its Train run with it
                                    reuse_actors=r.workers == 1,
                                    trial_name_creator=functools.partial(trial_name, plan=plan)),
        run_config=tune.RunConfig(
            name="tune",
            storage_path=str(root / "ray"),
            failure_config=tune.FailureConfig(max_failures=spec.max_failures),
            checkpoint_config=tune.CheckpointConfig(num_to_keep=2),
            callbacks=[TrackingCallback(uri, plan, tracker), ProgressCallback(), JsonLoggerCallback()],
            verbose=0,  # ProgressCallback prints one line per trial event instead of Tune's tables
        ),
    )


def _concurrent(spec: SweepSpec) -> int | None:
    """Tune's max_concurrent_trials: the spec's, or for Ray Train trials (which hold no resources themselves) the
    number of Train runs the cluster fits at once, so no trial waits on workers it cannot get."""
    import ray

    r = spec.resources
    if r.workers == 1 or spec.max_concurrent:
        return spec.max_concurrent or None
    have = ray.cluster_resources()
    fit = int(have.get("CPU", 0) // (r.cpus * r.workers) + 1e-9)
    if r.gpus_per_worker > 0:
        fit = min(fit, int(have.get("GPU", 0) // (r.gpus_per_worker * r.workers) + 1e-9))
    return max(1, fit)


def _optuna(spec: SweepSpec, root: Path) -> tuple[dict[str, Any], Any]:
    """Tune's search space for spec.search.space and an OptunaSearch whose study lives in a journal file."""
    import optuna
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend
    from ray import tune
    from ray.tune.search.optuna import OptunaSearch

    space: dict[str, Any] = {}
    for key, dim in spec.search.space.items():
        if dim.type == "categorical":
            space[key] = tune.choice(list(dim.choices))
        elif dim.type == "int":
            space[key] = (tune.lograndint if dim.log else tune.randint)(int(dim.low), int(dim.high) + 1)
        else:
            space[key] = (tune.loguniform if dim.log else tune.uniform)(dim.low, dim.high)
    sampler_cls = optuna.samplers.TPESampler if spec.search.sampler == "tpe" else optuna.samplers.RandomSampler
    storage = JournalStorage(JournalFileBackend(str(root / "optuna.journal")))
    searcher = OptunaSearch(metric=spec.search.metric, mode=spec.search.mode, sampler=sampler_cls(seed=42),
                            study_name=spec.name, storage=storage)
    return space, searcher


def _dedup_cell_dir(plan: Plan, row: dict[str, Any]) -> Path:
    """A deduplicated cell's own directory: its config.yaml and dedup.json naming the cell that trained for it."""
    cell = plan.cell(row["cell_id"])
    cell_dir = plan.root / "cells" / cell.cell_id
    cell_dir.mkdir(parents=True, exist_ok=True)
    (cell_dir / "config.yaml").write_text(config_yaml(cell.config))
    write_json_atomic(cell_dir / "dedup.json", {"dedup_of": row["dedup_of"], "trained_dir": row["run_dir"],
                                                "config_hash": cell.config_hash, "group": cell.group})
    return cell_dir


def _reconcile(plan: Plan, uri: str, tracker: SweepTracker | None = None) -> tuple[int, list[str]]:
    """Final MLflow state: every finished cell's metrics as in its metrics.jsonl, failed cells FAILED with their
    error, dedup cells the history of the cell that trained for them (with their own config).

    `tracker`: the driver's, which knows what it already logged (then nothing is logged twice or read back).
    Returns (cells finished, failed cell ids)."""
    from sweeps.callback import TrackingCallback, cell_end_ms

    cb = TrackingCallback(uri, plan, tracker)
    tracker = cb.tracker
    failed, finished = [], 0
    for row in cell_rows(plan):
        if row["cell_id"].startswith("t-") and row["status"] == "PENDING":
            continue
        run_id = cb.run_for({"cell": row["cell_id"]} if not row["cell_id"].startswith("t-") else
                            sampled_values(plan, Path(row["run_dir"])))[1]
        if row["status"] == "FINISHED":
            # MLflow ends up holding exactly the trained run's metrics.jsonl, final evaluation included
            tracker.log_history(run_id, read_metrics(Path(row["run_dir"]) / METRICS_FILE))
            if row["dedup_of"]:
                tracker.client.set_tag(run_id, "dedup_of", row["dedup_of"])
            # a trained cell's artifacts too: the live callback skipped them if its server was down then
            tracker.log_artifacts(run_id, _dedup_cell_dir(plan, row) if row["dedup_of"] else Path(row["run_dir"]))
            # a run ends when its cell ended (a dedup copy, made here, when it is made), not when the sweep does
            end = None if row["dedup_of"] else cell_end_ms(Path(row["run_dir"]))
            tracker.set_status(run_id, "FINISHED", end_ms=end)
            finished += 1
        else:
            failed.append(row["cell_id"])
            tracker.set_status(run_id, "FAILED", row["error"] or "the trial did not finish",
                               end_ms=cell_end_ms(Path(row["run_dir"])))
    parent = tracker.parent_run()
    tracker.client.set_tag(parent, "failed_cells", ",".join(failed) or "none")
    tracker.set_status(parent, "FINISHED" if not failed else "FAILED")
    return finished, failed


def _reconcile_when_up(plan: Plan, uri: str, tracker: SweepTracker | None = None) -> tuple[int, list[str]]:
    """`_reconcile`, waiting up to RECONCILE_WAIT_S in all for a tracking server that does not answer."""
    from mlflow.exceptions import MlflowException

    watch, deadline = ServerWatch(uri), time.monotonic() + RECONCILE_WAIT_S
    while True:
        try:
            return _reconcile(plan, uri, tracker)
        except MlflowException as err:
            if not is_outage(err):
                raise
            # (a server whose database is down answers /health: the deadline still holds)
            watch.went_down(err, f"waiting up to {RECONCILE_WAIT_S:.0f} s to log what MLflow lacks")
            if time.monotonic() >= deadline or not watch.wait(deadline - time.monotonic()):
                raise UserError(f"tracking_uri {uri}: the MLflow server did not answer for {RECONCILE_WAIT_S:.0f} s "
                                f"at the end of sweep {plan.spec.name!r}, so MLflow lacks some of its metrics; every "
                                f"cell's results are in {plan.root / 'results.parquet'}; once the server "
                                f"answers, `hdrope sweep resume {plan.root}` logs what MLflow lacks") from None


def _execute(plan: Plan, address: str | None, uri: str, restore: bool) -> int:
    from mlflow.exceptions import MlflowException

    from sweeps.progress import quiet_logs

    spec = plan.spec
    quiet_logs()
    quiet_mlflow_links()  # MLflow's per-run links open the GenAI view; the summary links the runs page instead
    try:
        tracker = SweepTracker(uri, spec.name, plan.root / "artifacts")
        tracker.describe(spec.description, {"sweep": spec.name, "git_commit": git_commit(), "base": spec.base,
                                            "axes": ", ".join(plan.axes)})
        share_runs_view(tracker.client, tracker.experiment_id, spec.search.metric, spec.search.mode == "min")
        tracker.parent_run({"spec": (plan.root / "spec.yaml").read_text()[:6000], "cells": len(plan.cells)})
    except MlflowException as err:
        if not is_outage(err):
            raise
        raise UserError(f"tracking_uri {uri}: the MLflow server does not answer ({outage_reason(err)}); start it, or "
                        "point the spec's tracking_uri (or --tracking-uri) at one that runs") from None
    with signal_exit_codes():  # a stop signal ends the driver with 128 + signal wherever it lands
        started = _init_ray(address, spec)
        try:
            return _fit_and_reconcile(plan, uri, restore, tracker)
        finally:
            if started:  # what the lab starts, it stops
                import ray

                ray.shutdown()


def _fit_and_reconcile(plan: Plan, uri: str, restore: bool, tracker: SweepTracker | None = None) -> int:
    tuner = _tuner(plan, uri, restore, tracker)
    # Every path is absolute; work from the sweep dir so a job's shipped working dir may be cleaned up under us.
    try:
        old_cwd: str | None = os.getcwd()
    except FileNotFoundError:
        old_cwd = None
    os.chdir(plan.root)
    started = time.monotonic()
    try:
        tuner.fit()
    finally:
        if old_cwd and os.path.isdir(old_cwd):
            os.chdir(old_cwd)
    path = write_results(plan)  # first: a tracking server that is down does not hold the results back
    finished, failed = _reconcile_when_up(plan, uri, tracker)
    if uri.startswith(("http://", "https://")):
        where = runs_page(uri, (tracker or SweepTracker(uri, plan.spec.name)).experiment_id)
    else:
        where = f"hdrope ui {plan.root}"
    took = time.monotonic() - started
    print(f"sweep {plan.spec.name}: {finished} cells finished, {len(failed)} failed in {took:.0f} s; "
          f"results {path}; MLflow: {where}", file=sys.stderr)
    return 1 if failed else 0


def _uri(spec: SweepSpec, root: Path, tracking_uri: str | None) -> str:
    uri = tracking_uri or spec.tracking_uri or default_tracking_uri(root)
    check_tracking_uri(uri, "--tracking-uri" if tracking_uri else "tracking_uri")  # before Ray starts
    return uri


def run_sweep(spec_path: str, overrides: list[str] | None = None, address: str | None = None,
              tracking_uri: str | None = None) -> int:
    """Validate, plan and run a sweep; returns 0 when every cell finished."""
    exit_on_signals()
    plan = prepare(spec_path, overrides)
    if address is None and plan.summary()["concurrent_here"] == 0:
        per_trial, cpus = plan.summary()["per_trial"], os.cpu_count() or 1
        raise UserError(f"a trial needs {per_trial['cpus']:g} CPUs and {per_trial['gpus']:g} GPUs (resources: "
                        f"workers={plan.spec.resources.workers}), but this machine has {cpus} CPUs and "
                        f"{local_gpus()} GPUs for the embedded Ray: every trial would wait forever; run with --address "
                        "on a cluster that fits a trial, or lower resources.workers, cpus, gpus or gpus_per_worker")
    uri = _uri(plan.spec, plan.root, tracking_uri)
    with hold_dir_lock(plan.root, "hdrope sweep run"):  # one driver per sweep directory
        plan = save_plan(plan)
        restore = (plan.root / "ray" / "tune").is_dir()
        if not restore:
            from sweeps.estimate import estimate_text

            print(estimate_text(plan), file=sys.stderr, flush=True)
        return _execute(plan, address, uri, restore)


def resume_sweep(name: str, storage: str = "runs/sweeps", address: str | None = None,
                 tracking_uri: str | None = None) -> int:
    """Finish a sweep whose driver died: restore Tune's state, resume errored and unfinished trials."""
    exit_on_signals()
    plan = find_plan(name, storage)
    uri = _uri(plan.spec, plan.root, tracking_uri)
    with hold_dir_lock(plan.root, "hdrope sweep resume"):  # never beside the sweep's running driver
        return _execute(plan, address, uri, restore=True)
