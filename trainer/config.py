"""The run configuration: OmegaConf structured configs built from these dataclasses.

One `RunConfig` flows from a preset (experiments/*.yaml) or a sweep cell into `trainer.train`.
`config_errors` lists every problem at once (the sweep layer validates whole grids with it);
`config_hash` identifies a run by what changes its result, not by where it writes.

Importing it loads no torch and no model code (tested in a fresh interpreter): the encoding registry, whose kinds
hold their typed config beside their builder, is imported when a config with a `model.pe` is made or checked.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import re
from dataclasses import dataclass, field
from typing import Any

from hdrope.errors import UserError
from trainer.data.batch_stream import PRODUCERS
from trainer.data.tasks.registry import TASKS
from trainer.data.tasks.spec import KEY_SETS, TaskParams
from trainer.data.tokenizer import tokenizer_hash_key
from trainer.evals.position_loss import POSITION_SPACINGS
from trainer.model.args import ModelArgs, validate_model_args
from trainer.new_setting import NEW_SETTING
from trainer.run.optim import OPTIMIZERS, OptimConfig

__all__ = [
    "BASE_METRICS",
    "COST_METRICS",
    "DOCUMENT_POSITIONS",
    "DUMP_FORMS",
    "NEW_SETTING",
    "DataConfig",
    "DocumentsConfig",
    "DumpConfig",
    "EvalConfig",
    "OptimConfig",
    "PasskeyEvalConfig",
    "PasskeyFormat",
    "RunConfig",
    "TaskEvalConfig",
    "TaskParams",
    "TrainConfig",
    "config_errors",
    "config_hash",
    "factor_tag",
    "flatten_config",
    "metric_names",
    "name_problem",
    "sliding_metric",
    "validate_config",
    "validation_windows",
]

# The metrics every run reports (train side each log_every, validation each eval_every and at the end).
BASE_METRICS = ("train_loss", "lr", "tokens_per_s", "mfu", "val_loss", "val_bpb", "eval_s")
# The metrics that measure the machine a run used, not the model it trained (reports table them apart, untested);
# eval_s is the wall seconds of the final evaluation (every length, loss by position, passkey).
COST_METRICS = ("tokens_per_s", "mfu", "eval_s")


# The per-(task, length factor) metrics of the task evaluation: exact-match accuracy, example count, per-token accuracy
# and per-token accuracy corrected for its chance floor (0 at chance).
TASK_METRICS = ("acc", "n", "tokacc", "tokskill")
HARD_METRICS = ("hardacc", "hardn")  # exact match on the examples a shortcut cannot answer, and their count


def factor_tag(f: float) -> str:
    """A length factor as metric names and tables write it after the x: 1 -> '1', 1.5 -> '1.5', 8.0 -> '8'."""
    return f"{f:g}"


def task_metric(kind: str, task: str, factor: float) -> str:
    """The name of a task metric, e.g. task_metric('acc', 'mqar', 2.0) == 'acc_mqar_x2'."""
    return f"{kind}_{task}_x{factor_tag(factor)}"


def sliding_metric(factor: int) -> str:
    """The name of the strided (sliding-window) loss at `factor` times the train length, e.g. 'val_loss_sw_x4'."""
    return f"val_loss_sw_x{factor}"


def metric_names(cfg: RunConfig) -> list[str]:
    """Every metric a run of cfg reports, in a stable order (extrapolation, passkey and tasks as configured). cfg may
    also be a stored config read untyped (an OmegaConf mapping): `hdrope sweep results` reads a plan so, without
    torch (`sweeps.plan_file.PlanRecord`)."""
    names = list(BASE_METRICS)
    if cfg.eval.extrapolation_batches > 0:
        names += [f"val_loss_x{f}" for f in cfg.eval.extrapolation]
        if cfg.eval.sliding_stride:
            names += [sliding_metric(f) for f in cfg.eval.extrapolation]
    if cfg.eval.passkey.enabled:
        names.append("passkey_acc")
    if cfg.data.tasks and cfg.eval.tasks.enabled:
        names += [task_metric(kind, task, f) for task in cfg.data.tasks for f in cfg.eval.tasks.length_factors
                  for kind in TASK_METRICS + (HARD_METRICS if TASKS[task].hard else ())]
    return names


SEED_MAX = 2**32 - 1  # train.seed seeds python, numpy (which takes [0, 2**32 - 1]) and torch

# Keys that say where or how verbosely a run writes, not what it computes.
_NON_SEMANTIC = ("train.out_dir", "train.log_every", "train.threads", "train.batch_producer", "train.progress",
                 "data.cache_dir")


@dataclass
class PasskeyFormat:
    """LongRoPE-style passkey prompt: header, filler*x, key sentence, filler*y, question. `{k}` is the passkey."""

    header: str = (
        "There is an important info hidden inside a lot of irrelevant text. Find it and memorize it. "
        "I will quiz you about the important information there."
    )
    filler: str = " The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
    key: str = " The pass key is {k}. Remember it. {k} is the pass key."
    question: str = " What is the pass key? The pass key is"
    min_key: int = 1
    max_key: int = 50000


DOCUMENT_POSITIONS = {"restart": "positions count from 0 at each document's first token",
                      "continue": "positions keep counting through the window, across documents"}


@dataclass
class DocumentsConfig:
    """Documents packed into the training and evaluation windows, each ended by the tokenizer's end-of-document
    token (the token streams join documents with it): with `mask`, attention never crosses from one document into
    another, in training, evaluation and decoding; `positions` (a key of DOCUMENT_POSITIONS) restart at each."""

    mask: bool = False
    positions: str = "restart"


@dataclass
class DataConfig:
    """Corpus, tokenizer, split and the optional passkey mixture. The train length is model.max_seq_len."""

    corpus: str = "shakespeare"  # shakespeare | files | hf | shards
    paths: list[str] = field(default_factory=list)  # globs of .txt/.jsonl/.parquet for corpus=files
    text_field: str = "text"  # JSONL key / Parquet column / HF dataset column holding the text
    hf_dataset: str = ""  # corpus=hf: a HF datasets name, e.g. cerebras/SlimPajama-627B (needs the hf extra)
    hf_split: str = "train"
    hf_documents: int = 10000  # corpus=hf: documents streamed from the start of the split
    shards_dir: str = ""  # corpus=shards: a directory written by `hdrope data prepare` (memory-mapped, verified)
    tokenizer: str = "bytes"  # bytes | bpe | path/to/tokenizer.json
    bpe_vocab_size: int = 1024
    val_fraction: float = 0.1  # fraction of documents (plays) held out
    cache_dir: str = ""  # "" -> $HDROPE_CACHE or ~/.cache/hdrope
    passkey_ratio: float = 0.0  # fraction of training sequences that are passkey prompts
    passkey: PasskeyFormat = field(default_factory=PasskeyFormat)
    tasks: list[str] = field(default_factory=list, metadata=NEW_SETTING)  # names in trainer.data.tasks TASKS
    task_ratio: float = field(default=0.0, metadata=NEW_SETTING)  # fraction of training windows that are tasks
    task_params: TaskParams = field(default_factory=TaskParams, metadata=NEW_SETTING)
    documents: DocumentsConfig = field(default_factory=DocumentsConfig, metadata=NEW_SETTING)


@dataclass
class TrainConfig:
    """Loop length, batch, cadence of logging/eval/checkpoints, precision and placement."""

    steps: int = 1000
    batch_size: int = 16
    grad_accum: int = 1
    seed: int = 42
    log_every: int = 10
    eval_every: int = 100  # 0: only at the end
    ckpt_every: int = 100  # 0: only at the end
    keep_last: int = 3
    out_dir: str = ""  # "": runs/<name>-<config hash>, unique per configuration
    dtype: str = "auto"  # auto (bf16 on GPU, fp32 on CPU) | fp32 | bf16
    compile: bool | None = None  # torch.compile the model; None: on CUDA, not on CPU (compile time > gain there)
    device: str = "auto"  # auto | cpu | cuda
    threads: int = 0  # 0: leave torch's default
    batch_producer: str = "auto"  # a key of trainer.data.batch_stream PRODUCERS: who makes the (same) batches
    max_time_s: float = 0.0  # 0: no wall-clock budget
    peak_tflops: float = 0.0  # 0: measure matmul throughput once for the MFU estimate
    progress: bool = False
    # the encoding changed at given steps (trainer.model.pe_schedule; DroPE: [{step: S, pe: {kind: nope}, lr: ...}])
    pe_schedule: list[Any] = field(default_factory=list, metadata=NEW_SETTING)


@dataclass
class PasskeyEvalConfig:
    """Passkey accuracy on a (length x depth) grid; lengths are multiples of the train length."""

    enabled: bool = True
    length_factors: list[float] = field(default_factory=lambda: [1.0, 2.0, 4.0])
    depths: int = 5
    samples: int = 2
    max_new_tokens: int = 8


@dataclass
class TaskEvalConfig:
    """Greedy exact-match accuracy on each of data.tasks at lengths round(train length x factor)."""

    enabled: bool = True  # runs when data.tasks is non-empty
    length_factors: list[float] = field(default_factory=lambda: [1.0, 1.5, 2.0, 4.0, 8.0])
    samples: int = 32  # examples per task and factor
    batch_size: int = 16  # prompts decoded together


@dataclass
class EvalConfig:
    """Validation at the train length and at extrapolated lengths, plus passkey retrieval."""

    val_batches: int = 8
    batch_size: int = 8
    extrapolation: list[int] = field(default_factory=lambda: [2, 4, 8])
    extrapolation_batches: int = 2
    passkey: PasskeyEvalConfig = field(default_factory=PasskeyEvalConfig)
    tasks: TaskEvalConfig = field(default_factory=TaskEvalConfig, metadata=NEW_SETTING)
    # Validation windows at every evaluated length (1x and each extrapolation factor). 0 keeps the counts runs were
    # stored with (val_batches x batch_size at 1x, extrapolation_batches x batch_size // f at f x: 8 and 4 windows
    # at 2x and 4x on the compact preset, far too few); docs/length-generalisation.md gives the measured choice.
    windows: int = field(default=0, metadata=NEW_SETTING)
    position_bins: int = field(default=64, metadata=NEW_SETTING)  # loss-by-position bins per evaluated length
    position_spacing: str = field(default="linear", metadata=NEW_SETTING)  # a key of POSITION_SPACINGS
    # 0: off. Else at each extrapolation factor also val_loss_sw_x<f>, the loss of the same windows when no prediction
    # sees more than the train length (chunks of the train length every sliding_stride tokens): the floor a model
    # that ignores context past the train length reaches, beside val_loss_x<f> (docs/length-generalisation.md)
    sliding_stride: int = field(default=0, metadata=NEW_SETTING)


def validation_windows(e: EvalConfig, factor: int = 1) -> int:
    """How many validation windows are evaluated at `factor` times the train length (the one rule the evaluation
    and the sweep estimate share): eval.windows when set, else the stored runs' counts."""
    if e.windows > 0:
        return e.windows
    if factor == 1:
        return e.val_batches * e.batch_size
    return e.extrapolation_batches * max(1, e.batch_size // factor)


DUMP_FORMS = {"full": "every (query, key) weight: L × L per head",
              "pooled": "the weights summed over blocks of `pool` keys and averaged over blocks of `pool` queries: "
                        "⌈L/pool⌉² per head, each row still a distribution",
              "rows": "the whole rows of `rows` query positions spaced evenly from the first to the last: rows × L",
              "auto": "full up to dump.full_max tokens, pooled beyond"}


@dataclass
class DumpConfig:
    """Attention-map probe set written at the end of training; bounded by byte_budget. At a long dump.seq_len the maps
    are stored block-pooled or as sampled query rows (`form`, a key of DUMP_FORMS), never L² per head."""

    enabled: bool = False
    samples: int = 2
    seq_len: int = 0  # 0: the train length
    layers: list[int] = field(default_factory=list)  # empty: all
    heads: list[int] = field(default_factory=list)  # empty: all
    byte_budget: int = 64 * 2**20
    form: str = field(default="auto", metadata=NEW_SETTING)
    full_max: int = field(default=512, metadata=NEW_SETTING)  # auto: the longest length dumped in full
    pool: int = field(default=0, metadata=NEW_SETTING)  # pooled: tokens per block; 0: the least that keeps 256² maps
    rows: int = field(default=64, metadata=NEW_SETTING)  # rows: query positions sampled


@dataclass
class RunConfig:
    """Everything one training run needs."""

    name: str = "run"
    model: ModelArgs = field(default_factory=ModelArgs)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    dump: DumpConfig = field(default_factory=DumpConfig)


def _positive(errors: list[str], section: Any, prefix: str, names: tuple[str, ...], allow_zero: bool = False) -> None:
    for name in names:
        v = getattr(section, name)
        if isinstance(v, float) and not math.isfinite(v):
            continue  # reported once, by _finite
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0 or (v == 0 and not allow_zero):
            need = "a non-negative" if allow_zero else "a positive"
            errors.append(f"{prefix}.{name}={v!r}: must be {need} number")


NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")


def name_problem(value: Any, what: str) -> str | None:
    """Why value is not a plain name that stays inside its directory, or None when it is one."""
    if isinstance(value, str) and NAME_RE.fullmatch(value) and ".." not in value:
        return None
    return (f"{what}={value!r} is not a plain name; use 1-100 letters, digits, '.', '_' or '-' "
            "(no '/', no '..', no spaces or newlines), starting with a letter or digit")


def _finite(cfg: RunConfig) -> list[str]:
    """A problem for every NaN or infinite number anywhere in the config (lists included)."""
    out = []
    for key, value in flatten_config(cfg).items():
        values = json.loads(value) if isinstance(value, str) and value.startswith("[") else [value]
        for v in values if isinstance(values, list) else [values]:
            if isinstance(v, float) and not math.isfinite(v):
                out.append(f"{key}={value!r}: NaN and infinity are not allowed; give a finite number")
                break
    return out


def _task_size_errors(p: TaskParams) -> list[str]:
    """Problems of task sizes that are each positive but do not fit together (letters to draw, q of k)."""
    errors = []
    if p.key_set not in KEY_SETS:
        return [f"data.task_params.key_set={p.key_set!r}: unknown key set; choose from {', '.join(KEY_SETS)}"]
    size = len(KEY_SETS[p.key_set])
    if p.keys > size:
        errors.append(f"data.task_params.keys={p.keys}: at most {size} with key_set={p.key_set} (its symbols: "
                      f"{' '.join(KEY_SETS[p.key_set])}); lower keys")
    for name, need in (("span", p.span), ("k", p.k), ("hops", 2 * p.hops)):
        if need > min(p.keys, size):
            errors.append(f"data.task_params.{name}={getattr(p, name)}: needs {need} distinct keys but "
                          f"data.task_params.keys={p.keys}; lower it or raise keys (at most {size} with "
                          f"key_set={p.key_set})")
    if p.q > p.k:
        errors.append(f"data.task_params.q={p.q} > k={p.k}: a query asks one of the k keys; use q <= k")
    if p.digits > 18:
        errors.append(f"data.task_params.digits={p.digits}: at most 18")
    return errors


def _repeated_factors(factors: list[float], key: str) -> list[str]:
    """A problem when two length factors of `key` are one factor (one metric name, `factor_tag`): its metrics and
    example counts would be computed twice and merged."""
    seen: dict[str, float] = {}
    for f in factors:
        if factor_tag(f) in seen:
            return [f"{key}={list(factors)!r}: the factor {factor_tag(f)} is listed twice ({seen[factor_tag(f)]!r} and "
                    f"{f!r}); list each factor once"]
        seen[factor_tag(f)] = f
    return []


def _task_errors(cfg: RunConfig) -> list[str]:
    """Problems of data.tasks, data.task_ratio, data.task_params and eval.tasks."""
    d, te, p = cfg.data, cfg.eval.tasks, cfg.data.task_params
    errors = []
    unknown = [t for t in d.tasks if t not in TASKS]
    if unknown:
        errors.append(f"data.tasks={list(d.tasks)!r}: unknown task {unknown[0]!r}; choose from {', '.join(TASKS)}")
    if len(set(d.tasks)) != len(d.tasks):
        errors.append(f"data.tasks={list(d.tasks)!r}: a task is listed twice; list each once")
    if not 0.0 <= d.task_ratio <= 1.0:
        errors.append(f"data.task_ratio={d.task_ratio!r}: must be in [0, 1] (the share of training windows that are "
                      "task examples; 1 = tasks only)")
    elif d.task_ratio > 0 and not d.tasks:
        errors.append(f"data.task_ratio={d.task_ratio!r} with data.tasks empty: list the tasks to train, e.g. "
                      "data.tasks=[mqar, copy], or set data.task_ratio=0")
    elif 0.0 <= d.passkey_ratio <= 1.0 and d.passkey_ratio + d.task_ratio > 1.0:
        errors.append(f"data.task_ratio={d.task_ratio!r} + data.passkey_ratio={d.passkey_ratio!r} > 1: the two "
                      "mixtures share the training windows; make them sum to at most 1")
    size_errors = len(errors)
    _positive(errors, p, "data.task_params", ("keys", "value_digits", "span", "digits", "k", "q", "hops", "ops"))
    if len(errors) == size_errors:  # the sizes are positive numbers: check how they fit together
        errors += _task_size_errors(p)
    if d.tasks and te.enabled:
        if not te.length_factors or any(f <= 0 for f in te.length_factors):
            errors.append(f"eval.tasks.length_factors={list(te.length_factors)!r}: need positive factors, "
                          "e.g. [1, 1.5, 2, 4, 8]")
        errors += _repeated_factors(te.length_factors, "eval.tasks.length_factors")
        _positive(errors, te, "eval.tasks", ("samples", "batch_size"))
    return errors


def _attention_errors(cfg: RunConfig) -> list[str]:
    """A problem when model.attention names a path that cannot train this kind on this run's device."""
    requested = cfg.model.attention
    if requested in ("auto", "dense", "tiled") or not isinstance(requested, str):
        return []  # these serve every kind everywhere; an unknown name is the model's own check
    from trainer.model.attention.paths import path_problem
    from trainer.model.pe_layers import stack_groups
    from trainer.model.position import encoding_scores

    try:
        groups = stack_groups(cfg.model)
        scores = [encoding_scores(g.pe, g.shape) for g in groups]
    except UserError:
        return []  # the encoding's own problems are reported by the model's checks
    device = cfg.train.device
    if device == "auto":
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    for group, kind_scores in zip(groups, scores, strict=True):
        problem = path_problem(requested, kind_scores, device, training=True)
        if problem:
            layers = f", layers {', '.join(map(str, group.layers))} ({group.pe.kind})" if len(groups) > 1 else ""
            return [f"{problem} (train.device={cfg.train.device!r}{layers})"]
    return []


def config_errors(cfg: RunConfig) -> list[str]:
    """Every problem with a config, each naming the key, the value and the fix; empty when valid."""
    errors: list[str] = _finite(cfg)
    if (problem := name_problem(cfg.name, "name")) is not None:
        errors.append(problem)
    try:  # a NaN under model. is named above already: the model's own checks would say it again in other words
        if not any(e.startswith("model.") for e in errors):
            validate_model_args(cfg.model)
    except UserError as err:
        errors.append(str(err))
    d, o, t, e, dump = cfg.data, cfg.optim, cfg.train, cfg.eval, cfg.dump
    if d.corpus not in ("shakespeare", "files", "hf", "shards"):
        errors.append(f"data.corpus={d.corpus!r}: choose 'shakespeare', 'files' (with data.paths globs), 'hf' "
                      "or 'shards' (with data.shards_dir)")
    if d.corpus == "shards" and not d.shards_dir:
        errors.append("data.shards_dir is empty: corpus=shards needs the directory `hdrope data prepare --out` wrote")
    if d.corpus == "shards" and d.tokenizer == "bpe":
        errors.append("data.tokenizer=bpe with corpus=shards: give the tokenizer the shards were prepared with "
                      "(bytes or a tokenizer.json path; the manifest names it)")
    if d.corpus == "hf" and not d.hf_dataset:
        errors.append("data.hf_dataset is empty: corpus=hf needs a dataset name, e.g. cerebras/SlimPajama-627B")
    if d.corpus == "files" and not d.paths:
        errors.append("data.paths is empty: corpus=files needs at least one glob of .txt/.jsonl/.parquet files")
    if not 0.0 < d.val_fraction < 1.0:
        errors.append(f"data.val_fraction={d.val_fraction!r}: must be in (0, 1), e.g. 0.1")
    if not 0.0 <= d.passkey_ratio <= 1.0:
        errors.append(f"data.passkey_ratio={d.passkey_ratio!r}: must be in [0, 1]")
    errors += _task_errors(cfg)
    if d.documents.positions not in DOCUMENT_POSITIONS:
        errors.append(f"data.documents.positions={d.documents.positions!r}: choose one of "
                      f"{', '.join(DOCUMENT_POSITIONS)}")
    if not isinstance(d.documents.mask, bool):
        errors.append(f"data.documents.mask={d.documents.mask!r}: must be true or false")
    errors += _attention_errors(cfg)
    if not any(e.startswith("model.") for e in errors):  # the schedule's encodings are checked at the model's shape
        from trainer.model.pe_schedule import schedule_problems

        errors += schedule_problems(cfg)
    if d.tokenizer == "bpe" and not 260 <= d.bpe_vocab_size <= 65535:
        errors.append(f"data.bpe_vocab_size={d.bpe_vocab_size!r}: must be in [260, 65535]")
    if not 0 <= d.passkey.min_key <= d.passkey.max_key:
        errors.append(
            f"data.passkey.min_key={d.passkey.min_key!r} > max_key={d.passkey.max_key!r}: need 0 <= min_key <= max_key"
        )
    if "{k}" not in d.passkey.key:
        errors.append(f"data.passkey.key={d.passkey.key!r}: must contain the placeholder {{k}}")
    if o.name not in OPTIMIZERS:
        errors.append(f"optim.name={o.name!r}: choose one of {', '.join(sorted(OPTIMIZERS))}")
    if o.schedule not in ("cosine", "linear", "constant"):
        errors.append(f"optim.schedule={o.schedule!r}: choose cosine, linear or constant")
    _positive(errors, o, "optim", ("lr",))
    _positive(errors, o, "optim", ("warmup_start_lr", "final_lr", "warmup_steps", "weight_decay", "grad_clip"), True)
    _positive(errors, o, "optim", ("momentum", "eps"), True)
    if len(o.betas) != 2 or not all(0.0 <= b < 1.0 for b in o.betas):
        errors.append(f"optim.betas={list(o.betas)!r}: must be two numbers in [0, 1)")
    if isinstance(t.seed, bool) or not isinstance(t.seed, int) or not 0 <= t.seed <= SEED_MAX:
        errors.append(f"train.seed={t.seed!r}: must be an integer in [0, 2**32 - 1] (numpy's range), e.g. 42")
    _positive(errors, t, "train", ("steps", "batch_size", "grad_accum", "keep_last"))
    _positive(errors, t, "train", ("log_every", "eval_every", "ckpt_every", "threads", "max_time_s"), True)
    _positive(errors, t, "train", ("peak_tflops",), True)
    if t.dtype not in ("auto", "fp32", "bf16"):
        errors.append(f"train.dtype={t.dtype!r}: choose auto, fp32 or bf16")
    if t.device not in ("auto", "cpu", "cuda"):
        errors.append(f"train.device={t.device!r}: choose auto, cpu or cuda")
    if t.batch_producer not in PRODUCERS:
        errors.append(f"train.batch_producer={t.batch_producer!r}: choose one of {', '.join(PRODUCERS)}")
    _positive(errors, e, "eval", ("val_batches", "batch_size"))
    _positive(errors, e, "eval", ("extrapolation_batches", "windows", "sliding_stride"), True)
    if isinstance(e.sliding_stride, int) and e.sliding_stride > cfg.model.max_seq_len:
        errors.append(f"eval.sliding_stride={e.sliding_stride}: must be at most the train length "
                      f"model.max_seq_len={cfg.model.max_seq_len} (a stride past it leaves tokens unscored), e.g. "
                      f"{max(1, cfg.model.max_seq_len // 2)}")
    _positive(errors, e, "eval", ("position_bins",))
    if e.position_spacing not in POSITION_SPACINGS:
        errors.append(f"eval.position_spacing={e.position_spacing!r}: choose one of {', '.join(POSITION_SPACINGS)}")
    if any(f < 1 for f in e.extrapolation):
        errors.append(f"eval.extrapolation={list(e.extrapolation)!r}: factors must be integers >= 1, e.g. [2, 4, 8]")
    errors += _repeated_factors(e.extrapolation, "eval.extrapolation")
    pk = e.passkey
    if pk.enabled and (not pk.length_factors or any(f <= 0 for f in pk.length_factors)):
        errors.append(f"eval.passkey.length_factors={list(pk.length_factors)!r}: need positive factors, e.g. [1, 2]")
    if pk.enabled:
        errors += _repeated_factors(pk.length_factors, "eval.passkey.length_factors")
    _positive(errors, pk, "eval.passkey", ("depths", "samples", "max_new_tokens"))
    _positive(errors, dump, "dump", ("samples", "byte_budget", "full_max", "rows"))
    _positive(errors, dump, "dump", ("pool",), True)
    if dump.form not in DUMP_FORMS:
        errors.append(f"dump.form={dump.form!r}: choose one of {', '.join(DUMP_FORMS)}")
    _positive(errors, dump, "dump", ("seq_len",), True)
    for key, values, bound in (("layers", dump.layers, cfg.model.n_layers), ("heads", dump.heads, cfg.model.n_heads)):
        bad = [v for v in values if not 0 <= v < bound]
        if bad:
            errors.append(f"dump.{key}={list(values)!r}: {bad} out of range; valid indices are 0..{bound - 1}")
        elif len(set(values)) != len(values):
            errors.append(f"dump.{key}={list(values)!r}: an index is listed twice (its maps would be dumped twice); "
                          "list each once")
    return errors


def validate_config(cfg: RunConfig) -> None:
    """Raise UserError listing every problem (one per line; the console prints them on one) when the config is
    invalid."""
    errors = config_errors(cfg)
    if errors:
        raise UserError("invalid config:\n  " + "\n  ".join(errors) if len(errors) > 1 else errors[0])


def flatten_config(cfg: RunConfig) -> dict[str, Any]:
    """Dotted key -> scalar (lists and dicts JSON-encoded), e.g. for MLflow params."""
    return flatten_config_node("", cfg)


def _new_settings_at_default(node: Any, prefix: str = "") -> set[str]:
    """Dotted keys of fields marked NEW_SETTING whose value is their default (anywhere in the config tree)."""
    keys: set[str] = set()
    if not dataclasses.is_dataclass(node):
        return keys
    for f in dataclasses.fields(node):
        key, value = f"{prefix}{f.name}", getattr(node, f.name)
        if f.metadata.get("hash") == NEW_SETTING["hash"]:
            default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
            plain = dataclasses.asdict(value) if dataclasses.is_dataclass(value) else value
            if plain == (dataclasses.asdict(default) if dataclasses.is_dataclass(default) else default):
                keys.update(k for k in flatten_config_node(key, value))
                continue
        keys |= _new_settings_at_default(value, f"{key}.")  # a new setting inside a set one keeps its own rule
    return keys


def flatten_config_node(prefix: str, node: Any) -> dict[str, Any]:
    """flatten_config of one node of the tree, its keys under `prefix`."""
    out: dict[str, Any] = {}

    def walk(key: str, value: Any) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                walk(f"{key}.{k}" if key else str(k), v)
        elif isinstance(value, list):
            out[key] = json.dumps(value)
        else:
            out[key] = value

    walk(prefix, dataclasses.asdict(node) if dataclasses.is_dataclass(node) else node)
    return out


def config_hash(cfg: RunConfig) -> str:
    """sha256 (16 hex) of the semantic config: output paths, verbosity and caches excluded, and settings marked
    NEW_SETTING left out at their default; a tokenizer.json counts by its content, not its path
    (`tokenizer_hash_key`)."""
    skip = {*_NON_SEMANTIC, "name", *_new_settings_at_default(cfg)}
    flat = {k: v for k, v in flatten_config(cfg).items() if k not in skip}
    flat["data.tokenizer"] = tokenizer_hash_key(cfg.data.tokenizer)
    return hashlib.sha256(json.dumps(flat, sort_keys=True, default=str).encode()).hexdigest()[:16]
