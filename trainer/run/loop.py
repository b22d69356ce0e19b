"""The training loop: `train(cfg, reporter) -> TrainResult`.

Seeded (train.seed, 42 by default) for random, numpy and torch; batches depend only on the step,
so resuming from a checkpoint reproduces an uninterrupted run's per-step losses exactly (CPU,
fp32). Writes under train.out_dir (default runs/<name>-<config hash>): run.json, config.yaml,
tokenizer.json, checkpoints/, metrics.jsonl, position_loss.parquet, passkey.parquet, tasks.parquet, attention/
and result.json (see trainer.files.run_files). A run directory belongs to one configuration and one process at a
time (a lock refuses a second writer); another configuration is refused, and so is a directory whose checkpoints
are all damaged (training from step 0 would replace its metrics). Each metric is reported once, at
the step it was computed; the final evaluation is reported at the last step.

Data-parallel (`trainer.run.distributed`): when torch.distributed is initialised with W processes, each
trains on its rows of the global batch under `strategy` (gradients averaged), the logged loss is the
mean over the workers, and only rank 0 writes the run directory, evaluates and talks to the reporter
(a sharding strategy's state is gathered to rank 0's model first); the per-step losses equal a
one-process run's to fp32 rounding, and checkpoints are the same files.
"""

from __future__ import annotations

import contextlib
import math
import random
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from hdrope.errors import UserError
from trainer.config import RunConfig, config_hash, flatten_config, validate_config
from trainer.data.batch_stream import BatchStream
from trainer.data.batches import TrainBatches, check_factors, check_length, to_device, val_windows
from trainer.data.corpus import load_corpus
from trainer.data.documents import document_policy, document_stats
from trainer.data.passkey_prompt import PasskeyPrompter
from trainer.data.shard_tokens import load_shards
from trainer.data.tasks.build import TaskBuilder, TaskMixture
from trainer.data.tasks.fit import check_task_fits
from trainer.data.token_cache import TokenData, cached_tokens
from trainer.data.tokenizer import Tokenizer, load_tokenizer
from trainer.evals.attention_dump import DumpIds, check_budget, dump_attention, run_columns
from trainer.evals.evaluate import Autocast, Validation, evaluate_passkey, evaluate_validation
from trainer.evals.passkey.table import write_passkey_table
from trainer.evals.position_loss import POSITION_LOSS_FILE, write_position_loss
from trainer.evals.tasks import evaluate_tasks
from trainer.evals.tasks_table import TASKS_FILE, write_tasks_table
from trainer.files.dir_lock import hold_dir_lock
from trainer.files.machine import machine_info
from trainer.files.run_files import (
    METRICS_FILE,
    RESULT_FILE,
    append_metrics,
    claim_run_dir,
    default_out_dir,
    metrics_at,
    read_metrics,
    read_result,
    refuse_foreign_run_dir,
    store_tokenizer,
    truncate_metrics,
    write_json_atomic,
)
from trainer.model.llama import Llama
from trainer.model.pe_schedule import lr_override, pe_at, run_identity, switch_encoding
from trainer.model.pe_schedule import schedule as pe_schedule
from trainer.model.position import encoding_identity
from trainer.model.throughput import flops_per_token, peak_flops
from trainer.presets import config_yaml
from trainer.run.checkpoint import damaged_checkpoints, latest_checkpoint, load_checkpoint, read_state, save_checkpoint
from trainer.run.distributed import (
    STRATEGIES,
    World,
    broadcast_from_main,
    current_world,
    gather_to_main,
    load_from_main,
    main_first,
    mean_across,
    no_sync,
    wrap_model,
)
from trainer.run.divergence import (
    first_step_message,
    later_step_message,
    leaving_no_stillborn_run,
    remove_stillborn_dir,
    suspect_parameters,
)
from trainer.run.optim import build_optimizer, lr_at
from trainer.run.reporting import Reporter

__all__ = ["DataBundle", "TrainResult", "TrainingDiverged", "prepare_data", "seed_everything", "train"]


class TrainingDiverged(RuntimeError):
    """The loss became NaN or infinite."""


@dataclass
class TrainResult:
    """What a finished (or time-limited) run produced."""

    run_dir: Path
    config_hash: str
    step: int
    losses: list[float]
    metrics: dict[str, float]
    checkpoint: Path | None
    artifacts: dict[str, Path] = field(default_factory=dict)
    resumed_from: int | None = None
    stop_reason: str = "completed"  # completed | max_time


@dataclass
class DataBundle:
    """Tokenizer, cached token streams and what the evals need of them."""

    tokenizer: Tokenizer
    tokens: TokenData
    bytes_per_token: float
    prompter: PasskeyPrompter

    def task_builder(self, cfg: RunConfig, split: str) -> TaskBuilder:
        """Task examples of cfg's data.task_params hidden in the text of `split` (train or val)."""
        return TaskBuilder(self.tokenizer, cfg.data.task_params, getattr(self.tokens, split))


def seed_everything(seed: int) -> None:
    """Seed python, numpy and torch."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def _device(name: str, world: World | None = None) -> torch.device:
    """The configured device; a CUDA device is the worker's local one (its local rank among this machine's GPUs)."""
    if name == "cuda" and not torch.cuda.is_available():
        raise UserError("train.device=cuda but no CUDA device is visible; use train.device=cpu or auto")
    kind = ("cuda" if torch.cuda.is_available() else "cpu") if name == "auto" else name
    if kind == "cuda" and world is not None and world.size > 1:
        return torch.device("cuda", world.local_rank)  # one GPU per worker: join_torchrun_group checked it
    return torch.device(kind)


def _autocast(device: torch.device, dtype: str) -> tuple[Autocast, torch.dtype]:
    use_bf16 = dtype == "bf16" or (dtype == "auto" and device.type == "cuda")
    if not use_bf16:
        return contextlib.nullcontext, torch.float32
    return (lambda: torch.autocast(device.type, dtype=torch.bfloat16)), torch.bfloat16


def prepare_data(cfg: RunConfig) -> DataBundle:
    """Load the corpus, tokenizer and cached tokens; UserError when the model or lengths do not fit."""
    d = cfg.data
    corpus = None if d.corpus == "shards" else load_corpus(d)
    tok = load_tokenizer(d.tokenizer, corpus.train if corpus else None, d.bpe_vocab_size, d.cache_dir)
    if tok.vocab_size > cfg.model.vocab_size:
        raise UserError(
            f"model.vocab_size={cfg.model.vocab_size} is smaller than the tokenizer's {tok.vocab_size} ids "
            f"(data.tokenizer={d.tokenizer!r}); set model.vocab_size={tok.vocab_size}"
        )
    if corpus is None:
        shards = load_shards(d.shards_dir, tok, d.cache_dir)
        tokens = TokenData(shards.train, shards.val, shards.path, shards.key)  # type: ignore[arg-type]
        return DataBundle(tok, tokens, shards.val_bytes_per_token, PasskeyPrompter(tok, d.passkey))
    tokens = cached_tokens(corpus, tok, d.cache_dir)
    val_bytes = sum(len(t.encode("utf-8")) for t in corpus.val)
    return DataBundle(tok, tokens, val_bytes / max(1, len(tokens.val)), PasskeyPrompter(tok, d.passkey))


def _check_lengths(cfg: RunConfig, data: DataBundle) -> None:
    seq = cfg.model.max_seq_len
    check_length(data.tokens.train, seq, "model.max_seq_len (training)")
    check_length(data.tokens.val, seq, "model.max_seq_len (validation)")
    if cfg.eval.extrapolation_batches > 0 and cfg.eval.extrapolation:
        check_factors(data.tokens.val, seq, list(cfg.eval.extrapolation), "eval.extrapolation")
    if cfg.data.passkey_ratio > 0:
        data.prompter.build(seq + 1, 0.5, cfg.data.passkey.max_key)  # raises if the prompt cannot fit
    if cfg.eval.passkey.enabled:
        data.prompter.build(round(seq * min(cfg.eval.passkey.length_factors)), 0.5, cfg.data.passkey.max_key)
    check_task_fits(cfg, lambda split: data.task_builder(cfg, split))
    if cfg.data.tasks and cfg.eval.tasks.enabled:
        factors = cfg.eval.tasks.length_factors
        longest = round(seq * max(factors))
        if longest > len(data.tokens.val):
            raise UserError(f"eval.tasks.length_factors={list(factors)!r}: {max(factors):g} x {seq} = {longest} "
                            f"tokens of filler, but the validation split holds {len(data.tokens.val)}; lower the "
                            "factors or use a larger corpus")
    if cfg.dump.enabled:
        check_budget(cfg.dump, cfg.model.n_layers, cfg.model.n_heads, seq)
        check_length(data.tokens.val, cfg.dump.seq_len or seq, "dump.seq_len")


def _checkpoint_step(path: Path) -> int:
    try:
        return read_state(Path(path))["step"]  # read_state checks that step is an int
    except UserError:  # an unreadable checkpoint is never the one to resume from
        return -1


class _Run:
    """State of one training run; `train` drives it."""

    def __init__(self, cfg: RunConfig, reporter: Reporter, chash: str, run_dir: Path, strategy: str = "ddp") -> None:
        self.cfg, self.reporter = cfg, reporter
        self.world = current_world()
        self.chash, self.run_dir = chash, run_dir
        self.ckpt_root = self.run_dir / "checkpoints"
        self.device = _device(cfg.train.device, self.world)
        self.autocast, self.amp_dtype = _autocast(self.device, cfg.train.dtype)
        with main_first(self.world):  # rank 0 fills the tokenizer and token caches, the others read them
            self.data = prepare_data(cfg)
        _check_lengths(cfg, self.data)
        documents = document_policy(cfg.data, self.data.tokenizer)
        self.documents = None if documents is None else document_stats(self.data.tokens.train, documents.eos_id,
                                                                       cfg.model.max_seq_len + 1)
        seed_everything(cfg.train.seed)
        self.model = Llama(cfg.model).to(self.device)  # the run's model: evaluated and checkpointed by rank 0
        self.model.documents = documents
        self.switches = pe_schedule(cfg)  # train.pe_schedule, read once (typed) for every step
        self.optimizer = build_optimizer(self.model, cfg.optim)
        self.parallel = self.model if self.world.size == 1 else wrap_model(self.model, strategy, self.device)
        self.shards = self.world.size > 1 and STRATEGIES[strategy].shards  # trains a sharded copy of self.model
        self.train_optimizer = build_optimizer(self.parallel, cfg.optim) if self.shards else self.optimizer
        self.synced = (0, True)  # (step, with optimizer) self.model last received the shards' state
        compile_model = cfg.train.compile if cfg.train.compile is not None else self.device.type == "cuda"
        self.forward = torch.compile(self.parallel) if compile_model else self.parallel
        mixture = [(cfg.data.passkey_ratio, self.data.prompter)]
        if cfg.data.task_ratio > 0:
            mixture.append((cfg.data.task_ratio, TaskMixture(self.data.task_builder(cfg, "train"), cfg.data.tasks)))
        self.batches = TrainBatches(self.data.tokens.train, cfg.model.max_seq_len, cfg.train.batch_size,
                                    cfg.train.seed, mixture, self.world.rank, self.world.size)
        # no steps yet, so no process: it checks train.batch_producer before the run writes anything (train() opens
        # the stream of the steps to train)
        self.stream = BatchStream(self.batches, 0, 0, cfg.train.grad_accum, cfg.train.batch_producer)
        self.losses: list[float] = []  # per-step training loss, settled (read back from the device)
        self.pending: list[torch.Tensor] = []  # losses of the steps since, still on the device
        self.start_suspects: list[tuple[str, str]] = []  # non-finite or extreme parameters this process started from
        self.step = 0
        self.train_seconds, self.steps_here = 0.0, 0  # pure training time and steps in this process
        self.resumed_from: int | None = None
        self.last_ckpt: Path | None = None
        self.metrics_file = self.run_dir / METRICS_FILE
        self.step_metrics: dict[str, float] = {}  # what was reported at self.step

    def resume(self) -> None:
        """Continue from the newest of the reporter's checkpoint (e.g. Ray's) and this run's own latest.

        A checkpoint of another configuration is refused; metrics.jsonl is cut back to the resumed step.
        Rank 0 chooses the checkpoint and every worker loads it."""
        path = None
        if self.world.main:
            candidates = [p for p in (self.reporter.restore_path(), latest_checkpoint(self.ckpt_root)) if p is not None]
            path = max(candidates, key=_checkpoint_step) if candidates else None
            if path is None:
                self._refuse_restart()
        path = broadcast_from_main(path, self.world)
        if path is not None:
            written_by = read_state(Path(path)).get("config_hash")
            if written_by != self.chash:
                raise UserError(
                    f"checkpoint {path} was written by config {written_by}, not this config {self.chash}; "
                    "resume it with the config it was trained with, or pass another train.out_dir"
                )
            state = load_checkpoint(Path(path), self.model, self.optimizer)
            self.step, self.losses = int(state["step"]), list(state["losses"])
            self.synced = (self.step, True)
            if self.shards:
                load_from_main(self.parallel, self.train_optimizer, self.model, self.optimizer)
            self.resumed_from, self.last_ckpt = self.step, Path(path)
        self.follow_schedule()
        if not self.world.main:
            return
        truncate_metrics(self.metrics_file, self.step)
        self.step_metrics = metrics_at(read_metrics(self.metrics_file), self.step)
        if self.step < self.cfg.train.steps:
            (self.run_dir / RESULT_FILE).unlink(missing_ok=True)  # it describes a state this run moves past

    def _refuse_restart(self) -> None:
        """UserError when the run has no checkpoint to resume but training from step 0 would replace what it did:
        its checkpoints are all damaged (no manifest.json), or it finished (result.json)."""
        damaged = damaged_checkpoints(self.ckpt_root)
        if not damaged and read_result(self.run_dir) is None:
            return  # a new run, or one that stopped before its first checkpoint
        what = (f"its checkpoints {', '.join(p.name for p in damaged)} have no manifest.json (damaged), so none can "
                "be resumed" if damaged else f"it finished ({RESULT_FILE}) but has no checkpoint left")
        raise UserError(f"train.out_dir={str(self.run_dir)!r}: {what}, and training again from step 0 would replace "
                        f"its {METRICS_FILE}; restore the checkpoints, or move the run directory away (or pass another "
                        "train.out_dir) to train from step 0")

    def follow_schedule(self) -> None:
        """Give the model the encoding train.pe_schedule puts in force at the current step (a DroPE switch)."""
        if self.switches:
            switch_encoding(self.model, pe_at(self.cfg, self.step, self.switches))

    def train_step(self) -> float:
        cfg = self.cfg
        lr = lr_override(cfg, self.step, self.switches) or lr_at(self.step, cfg.optim, cfg.train.steps)
        for group in self.train_optimizer.param_groups:
            group["lr"] = lr
        total = torch.zeros((), dtype=torch.float64, device=self.device)
        for micro in range(cfg.train.grad_accum):
            batch = to_device(torch.from_numpy(self.stream.get(self.step, micro)), self.device)
            with no_sync(self.parallel, sync=micro == cfg.train.grad_accum - 1):  # all-reduce once per step
                with self.autocast():
                    logits = self.forward(batch[:, :-1])
                loss = F.cross_entropy(logits.float().flatten(0, 1), batch[:, 1:].flatten())
                (loss / cfg.train.grad_accum).backward()  # the strategy averages the gradients over the workers
            total += loss.detach().double() / cfg.train.grad_accum  # stays on the device: no sync per micro-step
        self.pending.append(mean_across(total, self.world))
        if self.steps_here == 0:  # once, on the parameters this process starts from (before their first update)
            self.start_suspects = suspect_parameters(self.model)
            if not math.isfinite(first := float(self.pending[-1])):
                raise TrainingDiverged(first_step_message(cfg, self.start_suspects, first, self.step + 1,
                                                          self.step > 0))
        if cfg.optim.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(self.parallel.parameters(), cfg.optim.grad_clip)
        self.train_optimizer.step()
        self.train_optimizer.zero_grad(set_to_none=True)
        self.step += 1
        self.follow_schedule()  # a switch at this step is in force for its evaluations and checkpoint already
        return lr

    def settle(self) -> None:
        """Read the pending losses back from the device in one transfer (at log steps, checkpoints and the end);
        TrainingDiverged names the first step whose loss is not finite."""
        if not self.pending:
            return
        values = torch.stack(self.pending).tolist()
        self.pending = []
        for i, value in enumerate(values):
            if not math.isfinite(value):
                raise TrainingDiverged(later_step_message(self.cfg, self.start_suspects, value,
                                                          len(self.losses) + i + 1, self.step))
        self.losses.extend(values)

    def sync(self, with_optimizer: bool) -> None:
        """Bring rank 0's model (and optimizer) up to the current step from a sharding strategy's shards: a
        collective, so every worker calls it at the same steps (a no-op when nothing is sharded or when done)."""
        step, had_optimizer = self.synced
        if not self.shards or (step == self.step and (had_optimizer or not with_optimizer)):
            return
        gather_to_main(self.parallel, self.train_optimizer, self.model, self.optimizer if with_optimizer else None,
                       self.world)
        self.synced = (self.step, with_optimizer)

    def emit(self, metrics: dict[str, float]) -> None:
        """Record and report metrics computed at the current step (each name once per step); rank 0 only."""
        metrics = {k: v for k, v in metrics.items() if k not in self.step_metrics}
        if not metrics or not self.world.main:
            return
        append_metrics(self.metrics_file, self.step, metrics)
        self.step_metrics.update(metrics)
        self.reporter.log(self.step, metrics)

    def checkpoint(self) -> None:
        """Save a checkpoint of the current step (rank 0 only: it holds the whole model and optimizer state);
        the reporter sees only the metrics computed at this step."""
        self.settle()  # every worker: the losses are the same on all, so all stop together on a bad one
        self.sync(with_optimizer=True)
        if not self.world.main:
            return
        state = {"losses": self.losses, "config_hash": self.chash}
        self.last_ckpt = save_checkpoint(self.ckpt_root, self.step, self.model, self.optimizer, state,
                                         self.cfg.train.keep_last)
        self.reporter.checkpoint(self.step, self.last_ckpt, dict(self.step_metrics))

    def validation(self, extrapolate: bool) -> Validation:
        return evaluate_validation(self.model, self.data.tokens.val, self.cfg.model.max_seq_len, self.cfg.eval,
                                   self.data.bytes_per_token, self.autocast, extrapolate)


def train(cfg: RunConfig, reporter: Reporter | None = None, strategy: str = "ddp") -> TrainResult:
    """Train one model as configured, resuming from the reporter's or the run's latest checkpoint.

    In a torch.distributed world of W > 1 processes every process calls this with the same config; the model
    is wrapped by `strategy` (a key of `trainer.run.distributed.STRATEGIES`), and only rank 0's reporter is
    used. Every worker returns its TrainResult; rank 0's holds the final metrics."""
    validate_config(cfg)
    main = current_world().main
    reporter = (reporter or Reporter()) if main else Reporter()
    if cfg.train.threads:
        torch.set_num_threads(cfg.train.threads)
    try:
        chash = config_hash(cfg)
        run_dir = Path(cfg.train.out_dir) if cfg.train.out_dir else default_out_dir(cfg.name, chash)
        if main:
            refuse_foreign_run_dir(run_dir)  # the user's own files are never replaced
        run = _Run(cfg, reporter, chash, run_dir, strategy)  # data and model ready; nothing written in run_dir yet
        made = [p for p in (run_dir, *run_dir.parents) if not p.exists()] if main else []  # what this run creates
        # rank 0 alone writes the run directory, so it alone holds it (a second writer is refused, naming this PID)
        try:
            with hold_dir_lock(run_dir, f"hdrope train of config {chash}") if main else contextlib.nullcontext(), \
                    leaving_no_stillborn_run(run_dir, TrainingDiverged, active=main):
                return _train(run)
        except TrainingDiverged:
            if made:  # a run that died before its first checkpoint in a directory it made: leave nothing behind
                remove_stillborn_dir(run_dir, made[1:])
            raise
    except BaseException as err:  # every way a run ends early is recorded as its status, then raised again
        status = "KILLED" if isinstance(err, KeyboardInterrupt) else "FAILED"
        reporter.finish(status, f"{type(err).__name__}: {err}")
        raise


def _evaluated_lengths(cfg: RunConfig) -> dict[str, int]:
    """The sequence lengths a run trains and evaluates at, by name: train, and x<f> for each validation length."""
    seq = cfg.model.max_seq_len
    lengths = {"train": seq, "x1": seq}
    if cfg.eval.extrapolation_batches > 0:
        lengths.update({f"x{f}": seq * f for f in cfg.eval.extrapolation})
    return lengths


def _train(run: _Run) -> TrainResult:
    cfg, reporter = run.cfg, run.reporter
    attention = run.model.attention_paths(run.device.type, _evaluated_lengths(cfg))
    if run.world.main:
        schedule = [{"step": s.step, "pe_label": encoding_identity(s.pe)["pe_label"], "lr": s.lr}
                    for s in run.switches]
        claim_run_dir(run.run_dir, run.chash, cfg.name, machine_info(run.device),
                      {"attention": attention, **({"documents": run.documents} if run.documents else {}),
                       **({"pe_schedule": schedule} if schedule else {})})
        (run.run_dir / "config.yaml").write_text(config_yaml(cfg))
        store_tokenizer(run.run_dir, getattr(run.data.tokenizer, "path", None))
    run.resume()
    t = cfg.train
    chosen = {f"attention.{length}": path for length, path in attention.items()}
    documents = {f"documents.{k}": v for k, v in (run.documents or {}).items()}
    reporter.start(run.run_dir, {**flatten_config(cfg), "config_hash": run.chash, **chosen, **documents}, t.steps,
                   run.step)
    reporter.artifact(run.run_dir / "config.yaml", "config")
    tokens_per_step = t.batch_size * t.grad_accum * cfg.model.max_seq_len
    fpt = flops_per_token(cfg.model, cfg.model.max_seq_len)
    t_start = window_t = time.perf_counter()
    window_steps, stop_reason = 0, "completed"
    # the batches of the steps left, made in a producer process when train.batch_producer says so (the same ones)
    with BatchStream(run.batches, run.step, t.steps, t.grad_accum, t.batch_producer) as run.stream:
        while run.step < t.steps:
            t0 = time.perf_counter()
            lr = run.train_step()
            run.step_metrics = {}
            run.train_seconds += time.perf_counter() - t0
            run.steps_here += 1
            window_steps += 1
            step = run.step
            metrics: dict[str, float] = {}
            if (t.log_every and step % t.log_every == 0) or step == t.steps:
                run.settle()
                elapsed = time.perf_counter() - window_t
                tps = tokens_per_step * window_steps / max(elapsed, 1e-9)
                metrics = {"train_loss": float(np.mean(run.losses[-window_steps:])), "lr": lr, "tokens_per_s": tps,
                           "mfu": tps * fpt / (peak_flops(run.device, run.amp_dtype, t.peak_tflops) * run.world.size)}
                window_steps, window_t = 0, time.perf_counter()
            if t.eval_every and step % t.eval_every == 0 and step < t.steps:
                run.sync(with_optimizer=False)
                if run.world.main:
                    metrics.update(run.validation(extrapolate=False).metrics)
            run.emit(metrics)
            out_of_time = t.max_time_s > 0 and time.perf_counter() - t_start > t.max_time_s
            if t.max_time_s > 0:
                out_of_time = broadcast_from_main(out_of_time, run.world)  # every worker stops at rank 0's step
            if (t.ckpt_every and step % t.ckpt_every == 0 and step < t.steps) or out_of_time:
                run.checkpoint()
            if out_of_time:
                stop_reason = "max_time"
                break
    run.settle()
    run.sync(with_optimizer=True)  # the final checkpoint's state, on rank 0
    if not run.world.main:  # rank 0 alone evaluates and writes the final checkpoint and result
        return TrainResult(run.run_dir, run.chash, run.step, run.losses, {}, None, resumed_from=run.resumed_from,
                           stop_reason=stop_reason)
    return _finish(run, stop_reason, window_steps)


def _finish(run: _Run, stop_reason: str, window_steps: int) -> TrainResult:
    """The final evaluation at the last step, its report, the last checkpoint and result.json."""
    cfg, reporter = run.cfg, run.reporter
    t_eval = time.perf_counter()
    validation = run.validation(extrapolate=True)
    final = validation.metrics
    if window_steps:  # the run stopped between log steps (out of time): its train metrics are reported here
        final["train_loss"] = float(np.mean(run.losses[-window_steps:]))
    if run.steps_here and "tokens_per_s" not in run.step_metrics:
        tps = cfg.train.batch_size * cfg.train.grad_accum * cfg.model.max_seq_len * run.steps_here / run.train_seconds
        peak = peak_flops(run.device, run.amp_dtype, cfg.train.peak_tflops) * run.world.size  # all workers' devices
        final.update(tokens_per_s=tps, mfu=tps * flops_per_token(cfg.model, cfg.model.max_seq_len) / peak)
    artifacts: dict[str, Path] = {"position_loss": run.run_dir / POSITION_LOSS_FILE}
    identity = run_identity(cfg)
    write_position_loss(validation.by_position, cfg.eval.position_bins, cfg.eval.position_spacing,
                        artifacts["position_loss"], lambda n: run_columns(cfg.name, run.chash, identity, n),
                        validation.limited, cfg.model.max_seq_len)
    pk = cfg.eval.passkey
    if pk.enabled:
        res = evaluate_passkey(run.model, run.data.prompter, cfg.model.max_seq_len, list(pk.length_factors),
                               pk.depths, pk.samples, pk.max_new_tokens, cfg.train.seed, run.autocast)
        final["passkey_acc"] = res.accuracy
        artifacts["passkey"] = run.run_dir / "passkey.parquet"
        write_passkey_table(res.rows, cfg, run.chash, artifacts["passkey"])
    if cfg.data.tasks and cfg.eval.tasks.enabled:
        tasks = evaluate_tasks(run.model, run.data.task_builder(cfg, "val"), list(cfg.data.tasks),
                               cfg.model.max_seq_len, cfg.eval.tasks, cfg.train.seed, run.autocast)
        final.update(tasks.metrics)
        artifacts["tasks"] = write_tasks_table(tasks.rows, cfg, run.chash, run.run_dir / TASKS_FILE)
    final["eval_s"] = time.perf_counter() - t_eval  # validation, loss by position, passkey and tasks
    if cfg.dump.enabled:
        length = cfg.dump.seq_len or cfg.model.max_seq_len
        probe = val_windows(run.data.tokens.val, length, cfg.dump.samples)[:, :length]
        ids = DumpIds(cfg.name, run.chash, run.step, run_identity(cfg))
        attn, prof = dump_attention(run.model, probe, cfg.dump, ids, run.run_dir / "attention")
        artifacts["attention"], artifacts["logit_profile"] = attn, prof
    run.emit(final)
    if run.last_ckpt is None or not run.last_ckpt.name.endswith(f"{run.step:08d}"):
        run.checkpoint()
    else:
        reporter.checkpoint(run.step, run.last_ckpt, dict(run.step_metrics))
    metrics = {k: v for k, v in run.step_metrics.items() if k != "lr"}
    clean = {k: (v if v is not None and math.isfinite(v) else None) for k, v in metrics.items()}
    result_path = run.run_dir / RESULT_FILE
    write_json_atomic(result_path, {"config_hash": run.chash, "step": run.step, "stop_reason": stop_reason,
                                    "metrics": clean, "checkpoint": str(run.last_ckpt),
                                    "resumed_from": run.resumed_from, "workers": run.world.size})
    for kind, path in {**artifacts, "result": result_path}.items():
        reporter.artifact(path, kind)
    reporter.finish("FINISHED")
    return TrainResult(run.run_dir, run.chash, run.step, run.losses, metrics, run.last_ckpt, artifacts,
                       run.resumed_from, stop_reason)
