"""`hdrope passkey build` (the paper's dataset builder) and `hdrope passkey eval` (greedy retrieval accuracy)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from hdrope.errors import UserError

__all__ = ["passkey_main", "resolve_tokenizer"]


def resolve_tokenizer(spec: str, cache_dir: str = ""):
    """`bytes`, a tokenizer.json path, or `bpe:N` (the project's BPE on the Shakespeare train split)."""
    from trainer.data.tokenizer import load_tokenizer

    if spec.startswith("bpe:"):
        from trainer.config import DataConfig
        from trainer.data.corpus import load_corpus

        try:
            vocab = int(spec[4:])
        except ValueError:  # int() of a str raises ValueError alone, for text that is no integer
            raise UserError(f"--tokenizer {spec!r}: write bpe:VOCAB, e.g. bpe:1024") from None
        return load_tokenizer("bpe", load_corpus(DataConfig(cache_dir=cache_dir)).train, vocab, cache_dir)
    try:
        return load_tokenizer(spec)
    except UserError as err:
        hint = "use bytes, bpe:N or a tokenizer.json path"
        raise UserError(f"--tokenizer {spec!r}: unknown tokenizer ({err}); {hint}") from None


def _build(a: argparse.Namespace) -> int:
    from trainer.evals.passkey.builder import BuildConfig, build_dataset, validate

    cfg = BuildConfig(v_min=a.v_min, v_max=a.v_max, form=a.form, multi_token=a.multi_token, min_len=a.min_len,
                      max_len=a.max_len, bucket_width=a.bucket_width, adaptive_stride=a.adaptive_stride,
                      stride_from=a.stride_from, targets=a.targets, depth_steps=a.depth_steps,
                      lines_per_file=a.lines_per_file, budget_bytes=a.budget, bucket_cap_bytes=a.bucket_cap,
                      seed=a.seed)
    validate(cfg)  # before the tokenizer, which may train a BPE
    tok = resolve_tokenizer(a.tokenizer)
    res = build_dataset(tok, cfg, Path(a.out), dry_run=a.dry_run, summary=a.summary)
    print(json.dumps({k: res[k] for k in ("files", "lines", "bytes", "stop_reasons")}, indent=1))
    return 0


def _eval(a: argparse.Namespace) -> int:
    from trainer.evals.passkey.evaluate import evaluate_dataset

    out = evaluate_dataset(Path(a.checkpoint), Path(a.dataset), Path(a.out) if a.out else None,
                           a.max_lines_per_file, a.tracking_uri, progress=not a.no_progress)
    print(out)
    return 0


def passkey_main(argv: list[str]) -> int:
    """Dispatch `hdrope passkey build|eval`."""
    from trainer.evals.passkey.builder import MAX_LEN_TOKENS, MAX_PASSKEY_RANGE, MAX_PLANNED_FILES

    p = argparse.ArgumentParser(prog="hdrope passkey", description=__doc__)
    sub = p.add_subparsers(dest="action", required=True)
    b = sub.add_parser("build", help="build the passkey dataset (token-exact buckets, depth coverage, budgets)")
    b.add_argument("--tokenizer", required=True, help="bytes, bpe:N, or a tokenizer.json path")
    b.add_argument("--out", required=True,
                   help="a new or empty directory, or one an earlier build wrote: its dataset_meta.json, summary.json "
                        "and bucket directories are replaced (also by --dry-run); anything else there is refused")
    b.add_argument("--v-min", type=int, default=1)
    b.add_argument("--v-max", type=int, default=50000,
                   help=f"largest passkey; fewer than {MAX_PASSKEY_RANGE:,} integers from --v-min")
    b.add_argument("--form", default="space", help="single-token form: space (' p'), both, or nospace ('p')")
    b.add_argument("--multi-token", action="store_true", help="allow multi-token passkeys (exact-match scoring)")
    b.add_argument("--min-len", type=int, default=256)
    b.add_argument("--max-len", type=int, default=4096,
                   help=f"upper edge of the last bucket, at most {MAX_LEN_TOKENS:,} tokens")
    b.add_argument("--bucket-width", type=int, default=256)
    b.add_argument("--adaptive-stride", action="store_true")
    b.add_argument("--stride-from", type=int, default=8192, help="length (>= 1) where --adaptive-stride starts")
    b.add_argument("--targets", type=int, default=3,
                   help=f"target lengths per bucket (buckets × --targets × --depth-steps < {MAX_PLANNED_FILES:,})")
    b.add_argument("--depth-steps", type=int, default=10)
    b.add_argument("--lines-per-file", type=int, default=4)
    b.add_argument("--budget", type=int, default=2**30, help="global byte budget (default 1 GiB)")
    b.add_argument("--bucket-cap", type=int, default=0, help="per-bucket byte cap (0: budget split ∝ 1/U)")
    b.add_argument("--seed", type=int, default=42)
    b.add_argument("--dry-run", action="store_true", help="plan and account, write no JSONL")
    b.add_argument("--no-summary", dest="summary", action="store_false")
    b.set_defaults(fn=_build)
    e = sub.add_parser("eval", help="greedy passkey accuracy of a checkpoint on a built dataset -> Parquet")
    e.add_argument("checkpoint", help="a checkpoint directory (runs/.../checkpoints/step_XXXXXXXX)")
    e.add_argument("dataset", help="a directory written by `hdrope passkey build`")
    e.add_argument("--out", default="", help="Parquet path (default: <dataset>/eval_<config hash>.parquet)")
    e.add_argument("--max-lines-per-file", type=int, default=0, help="0: all")
    e.add_argument("--tracking-uri", default="", help="log per-bucket accuracy to this MLflow store")
    e.add_argument("--no-progress", action="store_true")
    e.set_defaults(fn=_eval)
    a = p.parse_args(argv)
    return a.fn(a)
