"""Tokenized corpora cached as .npy arrays (uint16, or uint32 for large vocabularies), memory-mapped.

The key is a hash of the corpus fingerprint and the tokenizer identity, so every trial that uses
the same data shares one copy; `build_once` makes concurrent builders safe, and rebuilds an entry
found damaged (a truncated array, a missing file: it is a cache). Documents are joined
with the tokenizer's end-of-text id when it has one.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from trainer.data.corpus import Corpus
from trainer.data.tokenizer import Tokenizer
from trainer.files.cache import build_once, cache_root

__all__ = ["TokenData", "cached_tokens"]


@dataclass
class TokenData:
    """Train and validation token streams (memory-mapped) and where they live.

    With data.corpus=shards the streams are `trainer.data.shard_tokens.ShardStream`s: the same `len` and
    slicing, over several memory-mapped shards."""

    train: np.ndarray
    val: np.ndarray
    path: Path
    key: str


def _encode(tok: Tokenizer, docs: list[str], dtype: np.dtype) -> np.ndarray:
    parts: list[np.ndarray] = []
    sep = [] if tok.eos_id is None else [tok.eos_id]
    for ids in tok.encode_batch(docs):
        parts.append(np.asarray([*ids, *sep], dtype=dtype))
    return np.concatenate(parts) if parts else np.zeros(0, dtype=dtype)


def cached_tokens(corpus: Corpus, tok: Tokenizer, cache_dir: str = "") -> TokenData:
    """Token arrays of the corpus under the tokenizer, built once per cache and memory-mapped."""
    key = hashlib.sha256(f"tokens-v1|{corpus.fingerprint}|{tok.identity}".encode()).hexdigest()[:16]
    dtype = np.dtype(np.uint16 if tok.vocab_size <= 65536 else np.uint32)

    def build(tmp: Path) -> None:
        train, val = _encode(tok, corpus.train, dtype), _encode(tok, corpus.val, dtype)
        np.save(tmp / "train.npy", train)
        np.save(tmp / "val.npy", val)
        meta = {"corpus": corpus.name, "fingerprint": corpus.fingerprint, "tokenizer": tok.identity,
                "vocab_size": tok.vocab_size, "train_tokens": len(train), "val_tokens": len(val),
                "val_documents": corpus.val_names}
        (tmp / "meta.json").write_text(json.dumps(meta, indent=1))

    path = build_once(cache_root(cache_dir) / "tokens" / key, build, intact=_intact)
    return TokenData(np.load(path / "train.npy", mmap_mode="r"), np.load(path / "val.npy", mmap_mode="r"), path, key)


def _intact(path: Path) -> bool:
    """Whether a token cache entry holds both arrays whole, as long as its meta.json says."""
    try:
        meta = json.loads((path / "meta.json").read_text())
        counts = [meta["train_tokens"], meta["val_tokens"]]
        lengths = [len(np.load(path / f"{s}.npy", mmap_mode="r")) for s in ("train", "val")]
    except (OSError, ValueError, KeyError, TypeError):  # ValueError: "mmap length is greater than file size"
        return False
    return lengths == counts
