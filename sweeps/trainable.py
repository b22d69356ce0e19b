"""The Ray Tune function trainable: one trial trains one cell through `trainer.train`.

The typed plan travels to workers through `tune.with_parameters`, so a worker never re-resolves a grid
cell: it trains exactly the `Cell` (and its `RunConfig`) that was validated before the sweep started. Metrics and
checkpoints reach Tune through `TuneReporter`, each result holding only the metrics computed at its
step (listed under `reported`). Tune's checkpoint of a trial is a pointer to the trainer's own checkpoint
(one copy on disk); a retried trial resumes from it.

With `resources.workers` W > 1 the trial only drives a Ray Train run (Train V2: a `TorchTrainer` built and
fitted inside the Tune function): W data-parallel workers train the cell (`trainer.run.distributed`), and rank 0's
reporter sends each result and checkpoint pointer through a queue to the trial, which reports them to Tune
as a one-process trial would.
"""

from __future__ import annotations

import dataclasses
import json
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from sweeps.plan import Cell, Plan
from trainer.config import RunConfig
from trainer.files.run_files import ERROR_FILE, read_result
from trainer.run.reporting import Reporter

__all__ = ["REPORTED", "TuneReporter", "WorkerReporter", "reported_metrics", "run_trial", "train_worker",
           "trial_config", "tune_result"]


POINTER = "hdrope_checkpoint.json"  # Tune's checkpoint of a trial: the path of the trainer's own checkpoint
REPORTED = "reported"  # the result key listing the trainer metrics computed at that step (comma-separated)


def tune_result(cell_id: str, step: int, metrics: dict[str, float], **extra: Any) -> dict[str, Any]:
    """A Tune result of the trainer metrics computed at `step`, with the list of their names under REPORTED.

    Progress keys (`extra`, e.g. steps and eta_s) come first: Tune's status table shows the first few."""
    return {"step": step, **extra, **metrics, "cell_id": cell_id, REPORTED: ",".join(sorted(metrics))}


def reported_metrics(result: dict[str, Any]) -> dict[str, float]:
    """The trainer metrics a Tune result carries (those listed under REPORTED), by name."""
    names = [n for n in str(result.get(REPORTED, "")).split(",") if n]
    return {n: result[n] for n in names if n in result}


class TuneReporter(Reporter):
    """Forwards metrics and checkpoints to Ray Tune; each result holds only what was computed at its step."""

    def __init__(self, cell_id: str, required_metric: str | None = None) -> None:
        self.cell_id, self.required = cell_id, required_metric
        self.total, self.first, self.t0 = 0, 0, time.monotonic()

    def start(self, run_dir: Path, params: dict[str, Any], total_steps: int, start_step: int) -> None:
        self.total, self.first, self.t0 = total_steps, start_step, time.monotonic()

    def _progress(self, step: int) -> dict[str, Any]:
        """steps (the trial's total) and eta_s (seconds left at this trial's pace since it started or resumed)."""
        done = step - self.first
        eta = (self.total - step) * (time.monotonic() - self.t0) / done if done > 0 else float("nan")
        return {"steps": self.total, "eta_s": round(eta, 1)}

    def restore_path(self) -> Path | None:
        """The trainer checkpoint Tune restored this trial to (Tune's checkpoint is a pointer to it)."""
        from ray import tune

        ckpt = tune.get_checkpoint()
        if ckpt is None:
            return None
        with ckpt.as_directory() as where:
            pointer = Path(where) / POINTER
            if not pointer.is_file():  # a full copy (sweeps started before checkpoints were pointers)
                return Path(ckpt.to_directory())
            target = Path(json.loads(pointer.read_text())["path"])
        return target if target.is_dir() else None

    def log(self, step: int, metrics: dict[str, float]) -> None:
        if self.required is None or self.required in metrics:  # a searcher needs its metric in every result
            self.send(tune_result(self.cell_id, step, metrics, **self._progress(step)))

    def checkpoint(self, step: int, path: Path, metrics: dict[str, float]) -> None:
        result = tune_result(self.cell_id, step, metrics, **self._progress(step))
        if self.required is not None and self.required not in result:
            result[self.required] = float("nan")  # a checkpoint is never dropped; not listed under REPORTED
        self.send(result, {"path": str(Path(path).resolve()), "step": step})

    def send(self, result: dict[str, Any], pointer: dict[str, Any] | None = None) -> None:
        """Report a result to Tune, with a checkpoint that points at the trainer's (`pointer`: path and step)."""
        from ray import tune

        if pointer is None:
            tune.report(result)
            return
        with tempfile.TemporaryDirectory(prefix="hdrope-ckpt-pointer-") as tmp:  # one copy on disk: the trainer's
            (Path(tmp) / POINTER).write_text(json.dumps(pointer))
            tune.report(result, checkpoint=tune.Checkpoint.from_directory(tmp))


class WorkerReporter(TuneReporter):
    """Rank 0's reporter in a Ray Train worker: sends each Tune result (and checkpoint pointer) through a queue
    to the Tune trial that drives the Train run, and resumes from the checkpoint that trial was restored to."""

    def __init__(self, cell_id: str, required_metric: str | None, queue: Any, restore: str | None) -> None:
        super().__init__(cell_id, required_metric)
        self.queue, self.restore = queue, restore

    def restore_path(self) -> Path | None:
        return Path(self.restore) if self.restore and Path(self.restore).is_dir() else None

    def send(self, result: dict[str, Any], pointer: dict[str, Any] | None = None) -> None:
        self.queue.put((result, pointer))


def train_worker(loop_config: dict[str, Any]) -> None:
    """Ray Train's function per worker: train the cell's config in the process group Ray Train set up."""
    import ray.train

    from sweeps.progress import quiet_logs
    from trainer.run.loop import train

    quiet_logs()
    cfg = loop_config["config"]
    reporter = None
    if ray.train.get_context().get_world_rank() == 0:
        reporter = WorkerReporter(loop_config["cell_id"], loop_config["required_metric"], loop_config["queue"],
                                  loop_config["restore"])
    train(cfg, reporter, strategy=loop_config["strategy"])


def _train_workers(cell: Cell, plan: Plan) -> None:
    """Train the cell as a Ray Train run of `resources.workers` data-parallel workers driven from this Tune trial;
    rank 0's results and checkpoint pointers reach Tune through a queue."""
    import ray.train
    from ray import tune
    from ray.train.torch import TorchConfig, TorchTrainer
    from ray.util.queue import Empty, Queue

    cell_id, resources = cell.cell_id, plan.spec.resources
    tuned = TuneReporter(cell_id, plan.required_metric)
    restore = tuned.restore_path()
    queue = Queue(actor_options={"num_cpus": 0})
    use_gpu = resources.gpus_per_worker > 0
    trainer = TorchTrainer(
        train_worker,
        train_loop_config={"config": cell.config, "cell_id": cell_id, "required_metric": plan.required_metric,
                           "queue": queue,
                           "restore": str(restore) if restore else None, "strategy": resources.strategy},
        torch_config=TorchConfig(backend="nccl" if use_gpu else "gloo"),
        scaling_config=ray.train.ScalingConfig(
            num_workers=resources.workers, use_gpu=use_gpu,
            resources_per_worker={"CPU": resources.cpus, **({"GPU": resources.gpus_per_worker} if use_gpu else {})}),
        run_config=ray.train.RunConfig(  # a fresh Train run per attempt: resuming is the trainer's own checkpoint's
            name=f"{cell_id}-{tune.get_context().get_trial_id()}-{time.time_ns()}",
            storage_path=str(plan.root / "ray" / "train"),
            failure_config=ray.train.FailureConfig(max_failures=0),  # Tune's max_failures retries the trial
            logging_config=ray.train.LoggingConfig(log_level="WARNING")),  # progress lines come from Tune
    )
    failure: list[BaseException] = []

    def fit() -> None:
        try:
            trainer.fit()
        except BaseException as err:  # re-raised in the trial below
            failure.append(err)

    runner = threading.Thread(target=fit, name=f"train-{cell_id}", daemon=True)
    runner.start()
    try:
        while runner.is_alive() or not queue.empty():
            try:
                tuned.send(*queue.get(timeout=0.5))
            except Empty:
                pass
        runner.join()
    finally:
        queue.shutdown()
    if failure:
        raise failure[0]


def trial_config(cfg: RunConfig, cpus: float) -> RunConfig:
    """The cell's config as a trial allotted `cpus` cores trains it: with `train.batch_producer=auto`, batches are
    made inline when torch's threads take every allotted core. Trials then share the machine's cores with other
    trials, and a producer process only takes CPU time from a sibling: two one-thread quickstart cells trained at
    once on 2 cores gave about 2% fewer tokens/s with it (docs/training.md)."""
    if cfg.train.batch_producer != "auto" or cpus > (cfg.train.threads or cpus):
        return cfg
    return dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, batch_producer="inline"))


def finished_result(cfg: RunConfig) -> dict[str, Any] | None:
    """The stored result of a cell that already trained to the end, else None."""
    result = read_result(Path(cfg.train.out_dir))
    return result if result is not None and result.get("step", 0) >= cfg.train.steps else None


def run_trial(config: dict[str, Any], plan: Plan) -> None:
    """Tune entry point: train the trial's cell (never twice: a finished cell only re-reports its result)."""
    from ray import tune

    from sweeps.progress import quiet_logs
    from trainer.run.loop import train

    quiet_logs()
    cell = plan.trial_cell(config)
    cell = dataclasses.replace(cell, config=trial_config(cell.config, plan.spec.resources.cpus))
    cell_id, cfg = cell.cell_id, cell.config
    done = finished_result(cfg)
    if done is not None:
        metrics = {k: v for k, v in done["metrics"].items() if v is not None}
        tune.report(tune_result(cell_id, done["step"], metrics, steps=done["step"], reused=1))
        return
    error_file = Path(cfg.train.out_dir) / ERROR_FILE
    try:
        if plan.spec.resources.workers > 1:
            _train_workers(cell, plan)
        else:
            train(cfg, TuneReporter(cell_id, plan.required_metric))
    except Exception as err:  # records whatever ended the trial in error.txt, then re-raises it unchanged
        error_file.parent.mkdir(parents=True, exist_ok=True)
        error_file.write_text(f"{type(err).__name__}: {err}\n")
        raise
    error_file.unlink(missing_ok=True)
