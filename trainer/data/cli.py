"""`hdrope data prepare [key=value ...] --out DIR`: tokenize a corpus into verified, resumable token shards.

The corpus and tokenizer are the `data.*` keys of a run config (the defaults, or `--preset`, plus
dotted overrides such as `data.corpus=files 'data.paths=[corpus/*.jsonl]' data.tokenizer=tok.json`).
Train on the result with `data.corpus=shards data.shards_dir=DIR` and the same `data.tokenizer`.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from trainer.data.shard_prepare import prepare_shards, usable_cpus

__all__ = ["data_main"]


def _prepare(a: argparse.Namespace) -> int:
    from hdrope.errors import UserError
    from trainer.config import validate_config
    from trainer.presets import merge_config, override_layer, preset_layer

    for item in a.overrides:
        if not item.startswith("data.") or "=" not in item:
            raise UserError(f"override {item!r}: prepare takes data.* key=value overrides, e.g. data.corpus=files")
    layers = ([preset_layer(a.preset)] if a.preset else []) + [override_layer(a.overrides)]
    cfg = merge_config(layers, where=a.preset or "overrides")
    validate_config(cfg)
    res = prepare_shards(cfg.data, Path(a.out), shard_tokens=a.shard_tokens, workers=a.workers,
                         file_format=a.format, max_shards=a.max_shards, progress=not a.no_progress)
    m = res.manifest
    if not res.complete:
        print(f"stopped after {res.shards_written} new shards (--max-shards {a.max_shards}); "
              f"{len(m['shards'])} verified shards in {res.out}; rerun the same command to continue")
        return 0
    if res.shards_written == 0 and res.tokens_written == 0:
        print(f"{res.out}: already complete, all {len(m['shards'])} shards verify")
        return 0
    sp = m["splits"]
    print(f"{res.out}: {sp['train']['tokens']:,} train tokens ({sp['train']['documents']:,} documents) and "
          f"{sp['val']['tokens']:,} validation tokens ({sp['val']['documents']:,} documents) in "
          f"{len(m['shards'])} {m['dtype']} shards ({res.shards_kept} kept from an earlier run)")
    print(f"tokenized {res.tokens_written:,} tokens in {res.seconds:.1f} s: {res.tokens_per_s:,.0f} tokens/s "
          f"with {res.workers} worker(s)")
    print(f"train on them with: data.corpus=shards data.shards_dir={res.out} data.tokenizer={cfg.data.tokenizer}")
    return 0


def data_main(argv: list[str]) -> int:
    """Dispatch `hdrope data prepare`."""
    p = argparse.ArgumentParser(prog="hdrope data", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="action", required=True)
    b = sub.add_parser("prepare", help="stream a corpus through the tokenizer into token shards with a manifest")
    b.add_argument("overrides", nargs="*", help="dotted data.* overrides, e.g. data.corpus=files data.paths=[a/*.txt]")
    b.add_argument("--out", required=True, help="shard directory: new, empty, or an earlier run's (resumed)")
    b.add_argument("--preset", default="", help="take the data section from a preset or YAML (default: defaults)")
    b.add_argument("--workers", type=int, default=max(1, usable_cpus() - 1),
                   help="tokenizer processes; 1 tokenizes in this process (default: CPUs - 1)")
    b.add_argument("--shard-tokens", type=int, default=1 << 24, help="tokens per shard (default 16,777,216)")
    b.add_argument("--format", default="npy", choices=["npy", "bin"], help="npy (default) or raw little-endian bin")
    b.add_argument("--max-shards", type=int, default=0,
                   help="stop after writing this many shards (0: no limit); a rerun continues")
    b.add_argument("--no-progress", action="store_true", help="no progress bar")
    if not argv or argv[0] != "prepare":
        p.parse_args(argv)  # help, or the usage error for an unknown action
        return 2
    return _prepare(b.parse_intermixed_args(argv[1:]))  # flags may come before, between or after overrides
