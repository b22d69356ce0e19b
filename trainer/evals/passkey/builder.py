"""The paper's passkey retrieval dataset builder (appendix "Passkey Retrieval Dataset Construction").

question = H ‖ F^x ‖ K(p) ‖ F^y ‖ Q, all lengths in tokens of the given tokenizer (no special
tokens). Passkeys come from a cached pool of integers whose " p" form (optionally also "p") is one
token; buckets (L, U] get a few target lengths each (fewer as U grows), a sum s = x + y is searched
near a linear estimate until the realised length falls in the bucket, and x sweeps an integer
linspace over [1, s−1]. One JSONL per (x, y) under a directory named by U; the file name carries x,
y, their token contributions x·|τ(F)| and y·|τ(F)|, and the realised T. The whole plan, budgets
included, is computed before anything is written, from a conservative bytes-per-line estimate made
with the longest passkey, so a dry run's plan is the written plan and no budget is ever exceeded.

Settings whose estimated work or memory is absurd (a passkey range, question length, bucket count or
file count far past the paper's) are refused before anything large is allocated. The output
directory must be new, empty, or hold only what an earlier build wrote; that is replaced, so stale
buckets never mix into a new dataset, and anything else there is refused, never deleted.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import shutil
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from itertools import islice
from pathlib import Path
from typing import Any

import numpy as np

from hdrope.errors import UserError
from trainer.config import PasskeyFormat
from trainer.data.passkey_prompt import prompt_parts
from trainer.data.tokenizer import Tokenizer
from trainer.files.cache import cache_root
from trainer.files.foreign import refuse_foreign

__all__ = ["FILE_NAME", "BuildConfig", "PlannedFile", "build_dataset", "passkey_pool", "plan_dataset", "validate"]

FILE_NAME = re.compile(r"^x(?P<x>\d+)_y(?P<y>\d+)_xt(?P<xt>\d+)_yt(?P<yt>\d+)_T(?P<T>\d+)\.jsonl$")  # PlannedFile.name
_OWNED_FILES = ("dataset_meta.json", "summary.json")  # written beside the bucket directories

# Sanity bounds, each far past the paper's settings, checked before anything large is allocated.
MAX_PASSKEY_RANGE = 10_000_000  # integers scanned into the passkey pool
MAX_LEN_TOKENS = 2**20  # longest question
MAX_BUCKETS = 10_000
MAX_PLANNED_FILES = 1_000_000  # buckets × targets × depth steps
_POOL_BYTES_PER_INT = 36  # a Python int and its list slot


@dataclass
class BuildConfig:
    """Everything `hdrope passkey build` takes."""

    v_min: int = 1
    v_max: int = 50000
    form: str = "space"  # space: " p" is one token | both: " p" and "p" | nospace: "p"
    multi_token: bool = False  # accept any integer; scored by exact match
    min_len: int = 256  # lower edge L of the first bucket
    max_len: int = 4096  # upper edge U of the last bucket
    bucket_width: int = 256
    adaptive_stride: bool = False  # double the bucket width each time U passes stride_from, 2·stride_from, …
    stride_from: int = 8192
    targets: int = 3  # target lengths in the first bucket (fewer as U grows)
    depth_steps: int = 10  # x values per s in the first bucket (fewer as U grows)
    lines_per_file: int = 4
    budget_bytes: int = 2**30
    bucket_cap_bytes: int = 0  # 0: budget split over buckets in proportion to 1/U
    seed: int = 42
    fmt: PasskeyFormat = field(default_factory=PasskeyFormat)


@dataclass
class PlannedFile:
    """One JSONL file of the plan."""

    bucket_u: int
    x: int
    y: int
    tokens: int  # realised T (with the probe passkey)
    lines: int
    est_bytes: int

    def name(self, filler_tokens: int) -> str:
        return f"x{self.x}_y{self.y}_xt{self.x * filler_tokens}_yt{self.y * filler_tokens}_T{self.tokens}.jsonl"


def validate(cfg: BuildConfig) -> None:
    """UserError naming the option for impossible or absurdly large settings."""
    if cfg.v_min > cfg.v_max:
        raise UserError(f"--v-min {cfg.v_min} > --v-max {cfg.v_max}: the passkey range is empty")
    if cfg.v_min < 0:
        raise UserError(f"--v-min {cfg.v_min}: passkeys are non-negative integers")
    if cfg.budget_bytes <= 0:
        raise UserError(f"--budget {cfg.budget_bytes}: the byte budget must be positive (default 1 GiB)")
    if cfg.form not in ("space", "both", "nospace"):
        raise UserError(f"--form {cfg.form!r}: choose space, both or nospace")
    for name in ("bucket_width", "targets", "depth_steps", "lines_per_file", "stride_from"):
        if getattr(cfg, name) < 1:
            raise UserError(f"--{name.replace('_', '-')} {getattr(cfg, name)}: must be >= 1")
    if cfg.max_len <= cfg.min_len:
        raise UserError(f"--max-len {cfg.max_len} must exceed --min-len {cfg.min_len}")
    _check_size(cfg)


def _check_size(cfg: BuildConfig) -> None:
    """UserError naming the flag, its estimated cost and a sane bound when the build would be absurdly large."""
    n_values = cfg.v_max - cfg.v_min + 1
    if n_values > MAX_PASSKEY_RANGE:
        raise UserError(
            f"--v-max {cfg.v_max}: the range [--v-min {cfg.v_min}, --v-max] holds {n_values:.3g} integers, each "
            f"tokenized into the passkey pool (up to {n_values * _POOL_BYTES_PER_INT / 1e9:.3g} GB as a list); keep "
            f"--v-max - --v-min below {MAX_PASSKEY_RANGE:,} (default --v-max 50000)"
        )
    if cfg.max_len > MAX_LEN_TOKENS:
        raise UserError(
            f"--max-len {cfg.max_len}: questions of up to {cfg.max_len:.3g} tokens, at least {cfg.max_len / 1e9:.3g} "
            f"GB of text per line; keep --max-len <= {MAX_LEN_TOKENS:,} tokens"
        )
    n_buckets = sum(1 for _ in islice(_iter_buckets(cfg), MAX_BUCKETS + 1))
    if n_buckets > MAX_BUCKETS:
        raise UserError(
            f"--bucket-width {cfg.bucket_width}: ({cfg.min_len}, {cfg.max_len}] splits into more than {MAX_BUCKETS:,} "
            "buckets; widen --bucket-width, add --adaptive-stride or lower --max-len"
        )
    n_files = n_buckets * cfg.targets * cfg.depth_steps
    if n_files > MAX_PLANNED_FILES:
        raise UserError(
            f"--targets {cfg.targets} × --depth-steps {cfg.depth_steps} over {n_buckets} bucket(s): up to "
            f"{n_files:.3g} files to plan, each tokenizing a question of up to {cfg.max_len} tokens; keep the "
            f"product below {MAX_PLANNED_FILES:,} (defaults: --targets 3, --depth-steps 10)"
        )


def _question(fmt: PasskeyFormat, x: int, y: int, passkey: int | str) -> str:
    """The prompt's text by the one assembler, x and y counting whole fillers (the appendix's F^x)."""
    return "".join(prompt_parts(fmt, [fmt.filler], x, y, passkey))


def passkey_pool(tok: Tokenizer, cfg: BuildConfig, cache_dir: str = "") -> list[int]:
    """Integers in [v_min, v_max] that meet the token constraint, cached with their metadata."""
    meta = {"v_min": cfg.v_min, "v_max": cfg.v_max, "form": cfg.form, "multi_token": cfg.multi_token,
            "tokenizer": tok.identity}
    key = hashlib.sha256(json.dumps(meta, sort_keys=True).encode()).hexdigest()[:16]
    path = cache_root(cache_dir) / "passkey_pools" / f"{key}.json"
    if path.is_file():
        return json.loads(path.read_text())["pool"]
    values = range(cfg.v_min, cfg.v_max + 1)
    if cfg.multi_token:
        pool = list(values)
    else:
        def ok(v: int) -> bool:
            space = len(tok.encode(f" {v}")) == 1
            nospace = len(tok.encode(str(v))) == 1
            return {"space": space, "both": space and nospace, "nospace": nospace}[cfg.form]

        pool = [v for v in values if ok(v)]
    if not pool:
        raise UserError(
            f"no integer in [{cfg.v_min}, {cfg.v_max}] is a single token in the {cfg.form!r} form under "
            f"{tok.identity}; this tokenizer splits digits: try --form nospace, or --multi-token "
            "(multi-token passkeys, scored by exact match)"
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({**meta, "pool": pool}))
    tmp.replace(path)
    return pool


def _iter_buckets(cfg: BuildConfig) -> Iterator[tuple[int, int]]:
    """The buckets (L, U] from --min-len to --max-len, lazily."""
    low, width = cfg.min_len, cfg.bucket_width
    while low < cfg.max_len:
        if cfg.adaptive_stride:  # double the width at stride_from, 2·stride_from, 4·stride_from, …
            doublings = math.floor(math.log2(low / cfg.stride_from)) + 1 if low >= cfg.stride_from else 0
            width = cfg.bucket_width * 2**doublings
        high = min(low + width, cfg.max_len)
        yield low, high
        low = high


def _buckets(cfg: BuildConfig) -> list[tuple[int, int]]:
    """The buckets (L, U] from --min-len to --max-len."""
    return list(_iter_buckets(cfg))


def _scaled(count: int, u: int, u0: int) -> int:
    """Fewer as U grows: count / (1 + log2(U/U0)), at least 1."""
    return max(1, round(count / (1 + math.log2(max(u / u0, 1.0)))))


def _feasible_sums(tok: Tokenizer, cfg: BuildConfig, low: int, high: int, probe: int, f_tokens: int) -> list[int]:
    base = len(tok.encode(_question(cfg.fmt, 0, 0, probe)))
    found: list[int] = []
    n_targets = _scaled(cfg.targets, high, next(_iter_buckets(cfg))[1])
    for i in range(n_targets):
        target = low + (high - low) * (i + 1) / (n_targets + 1)
        s = max(2, round((target - base) / f_tokens))
        for _ in range(64):
            t = len(tok.encode(_question(cfg.fmt, s // 2, s - s // 2, probe)))
            if low < t <= high:
                if s not in found:
                    found.append(s)
                break
            step = round((target - t) / f_tokens) or (1 if t <= low else -1)
            s = max(2, s + step)
            if s == 2 and t > high:
                break
    return sorted(found)


def plan_dataset(tok: Tokenizer, cfg: BuildConfig, pool: list[int]) -> tuple[list[PlannedFile], dict[str, Any]]:
    """Every file to write, with lines and estimated bytes, and the per-bucket stop reasons."""
    validate(cfg)
    f_tokens = len(tok.encode(cfg.fmt.filler))
    probe = max(pool, key=lambda v: len(str(v)))
    longest_line = json.dumps({"question": _question(cfg.fmt, 0, 0, probe), "answer": str(probe)}) + "\n"
    buckets = _buckets(cfg)
    inv = [1.0 / u for _, u in buckets]
    caps = {u: cfg.bucket_cap_bytes or int(cfg.budget_bytes * w / sum(inv)) for (_, u), w in zip(buckets, inv,
                                                                                                   strict=True)}
    min_tokens = len(tok.encode(_question(cfg.fmt, 1, 1, probe)))
    if cfg.bucket_width < f_tokens:
        raise UserError(f"--bucket-width {cfg.bucket_width} is narrower than one filler repetition ({f_tokens} "
                         "tokens), so lengths cannot be hit inside a bucket; widen the buckets")
    if buckets[0][1] < min_tokens:
        raise UserError(f"bucket ({buckets[0][0]}, {buckets[0][1]}] is narrower than the template, which needs "
                         f"{min_tokens} tokens with one filler on each side; raise --min-len to >= {min_tokens}")
    files: list[PlannedFile] = []
    reasons: dict[str, Any] = {}
    used_total = 0
    for low, high in buckets:
        used, reason = 0, "complete"
        for s in _feasible_sums(tok, cfg, low, high, probe, f_tokens):
            steps = _scaled(cfg.depth_steps, high, buckets[0][1])
            xs = sorted({int(v) for v in np.rint(np.linspace(1, s - 1, steps))})
            for x in xs:
                y = s - x
                t = len(tok.encode(_question(cfg.fmt, x, y, probe)))
                if not low < t <= high:
                    continue
                per_line = len(longest_line.encode()) + (x + y) * len(cfg.fmt.filler.encode())
                lines = min(cfg.lines_per_file, (caps[high] - used) // per_line, (cfg.budget_bytes - used_total)
                            // per_line)
                if lines <= 0:
                    reason = "global budget" if cfg.budget_bytes - used_total < per_line else "bucket cap"
                    break
                files.append(PlannedFile(high, x, y, t, int(lines), int(lines * per_line)))
                used += lines * per_line
                used_total += lines * per_line
            if reason != "complete":
                break
        reasons[str(high)] = reason
        if reason == "global budget":
            break
    return files, {"stop_reasons": reasons, "bucket_caps": {str(k): v for k, v in caps.items()},
                   "filler_tokens": f_tokens, "probe_passkey": probe, "estimated_bytes": used_total}


def _is_ours(path: Path) -> bool:
    """Whether path is a file or bucket directory that an earlier build wrote."""
    if path.is_symlink():
        return False
    if path.is_file():
        return path.name in _OWNED_FILES
    return path.is_dir() and path.name.isdigit() and all(
        f.is_file() and not f.is_symlink() and FILE_NAME.match(f.name) for f in path.iterdir()
    )


def _stale_outputs(out: Path) -> list[Path]:
    """What an earlier build left in --out, to be replaced; UserError if out is a file or holds anything else."""
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out}: is a file, not a directory; pass a new directory for the dataset")
    if not out.is_dir():
        return []
    refuse_foreign(out, f"--out {out}", "hdrope passkey build", _is_ours,
                   fix="pass a new or empty directory (or move those files away)")
    return sorted(out.iterdir())


def _make_out(out: Path, stale: list[Path]) -> None:
    """Create --out and remove an earlier build's outputs from it."""
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise UserError(f"--out {out}: cannot create the directory ({err.strerror}); pass a writable path") from None
    for path in stale:
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink()


def build_dataset(tok: Tokenizer, cfg: BuildConfig, out: Path, dry_run: bool = False, summary: bool = True,
                  cache_dir: str = "") -> dict[str, Any]:
    """Plan, then (unless dry_run) write the JSONL files; always write dataset_meta.json. Returns the summary.

    An earlier build's outputs in `out` are replaced (also on a dry run); anything else there is refused.
    """
    validate(cfg)
    stale = _stale_outputs(out)
    pool = passkey_pool(tok, cfg, cache_dir)
    files, info = plan_dataset(tok, cfg, pool)
    rng = np.random.default_rng(cfg.seed)
    digits = len(str(info["probe_passkey"]))
    candidates = [v for v in pool if len(str(v)) == digits] if cfg.multi_token else pool
    _make_out(out, stale)
    per_bucket: dict[str, dict[str, int]] = {}
    written_total = 0
    for pf in files:
        stats = per_bucket.setdefault(str(pf.bucket_u), {"files": 0, "lines": 0, "bytes": 0, "est_bytes": 0})
        stats["files"] += 1
        stats["lines"] += pf.lines
        stats["est_bytes"] += pf.est_bytes
        lines = []
        for _ in range(pf.lines):
            for _attempt in range(50):  # the file name promises T: resample a passkey that changes it
                p = candidates[int(rng.integers(len(candidates)))]
                question = _question(cfg.fmt, pf.x, pf.y, p)
                if len(tok.encode(question)) == pf.tokens:
                    break
            else:
                raise UserError(f"no passkey in the pool gives {pf.tokens} tokens at x={pf.x}, y={pf.y}; "
                                 "narrow --v-min/--v-max so passkeys have equal digit counts")
            lines.append(json.dumps({"question": question, "answer": str(p)}) + "\n")
        blob = "".join(lines).encode()
        stats["bytes"] += len(blob)
        written_total += len(blob)
        if not dry_run:
            d = out / str(pf.bucket_u)
            d.mkdir(exist_ok=True)
            (d / pf.name(info["filler_tokens"])).write_bytes(blob)
    meta = {
        "tokenizer": tok.identity, "vocab_size": tok.vocab_size, "config": {**asdict(cfg), "fmt": asdict(cfg.fmt)},
        "buckets": [list(b) for b in _buckets(cfg)], "pool_size": len(pool), "passkey_range": [cfg.v_min, cfg.v_max],
        "filler_tokens": info["filler_tokens"],
        "base_tokens": len(tok.encode(_question(cfg.fmt, 0, 0, info["probe_passkey"]))), "seed": cfg.seed,
        "budget_bytes": cfg.budget_bytes, "bucket_caps": info["bucket_caps"], "dry_run": dry_run,
    }
    (out / "dataset_meta.json").write_text(json.dumps(meta, indent=1))
    result = {"files": len(files), "lines": sum(f.lines for f in files), "bytes": written_total,
              "estimated_bytes": info["estimated_bytes"], "buckets": per_bucket,
              "stop_reasons": info["stop_reasons"], "plan": [asdict(f) for f in files]}
    if summary:
        (out / "summary.json").write_text(json.dumps(result, indent=1))
    return result
