"""`prepare_shards`: stream a corpus through the tokenizer in worker processes into fixed-size token shards.

The corpus is read twice, never held in memory: a first pass lists the document names and picks the
validation documents with `split_documents` (the in-memory split, so shards hold exactly the tokens
`cached_tokens` makes); the second pass tokenizes chunks of documents in a `multiprocessing` pool
(results consumed in submission order, at most two chunks per worker in flight) and cuts each
split's token stream (documents joined by the tokenizer's end-of-text id) into shards of
`shard_tokens` tokens, the last one shorter. Layout of the output directory:

- `train-000000.npy` / `val-000000.npy` … (or `.bin`: raw little-endian tokens), uint16 when the
  vocabulary fits, else uint32;
- `manifest.json` (`MANIFEST`): settings, tokenizer identity, source identity, and per shard its
  file, split, token count, sha256 and stream position at its end; when complete also per-split
  totals and the corpus fingerprint (the same as `load_corpus(cfg).fingerprint`).

The manifest is rewritten (atomically) after every shard, so an interrupted run resumes: a rerun
keeps each split's leading shards whose checksum verifies, skips the documents they cover without
tokenizing them, and continues; the result is byte-identical to an uninterrupted run.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import multiprocessing as mp
import os
import sys
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from hdrope.errors import UserError
from trainer.cache import sha256_file
from trainer.config import DataConfig
from trainer.corpus import corpus_files, corpus_fingerprint, iter_documents, single_document_cut, split_documents
from trainer.run_files import write_json_atomic
from trainer.tokenizer import Tokenizer, load_tokenizer

__all__ = [
    "MANIFEST",
    "SHARD_FORMAT",
    "SPLITS",
    "PrepareResult",
    "prepare_shards",
    "prepare_tokenizer",
    "shard_dtype",
    "token_source",
]

MANIFEST = "manifest.json"
SHARD_FORMAT = "hdrope-shards-v1"
SPLITS = ("train", "val")
_CHUNK_CHARS = 1 << 20  # text per worker task
_CHUNK_DOCS = 1024


def shard_dtype(vocab_size: int) -> np.dtype:
    """uint16 when every id fits, else uint32 (as the in-memory token cache)."""
    return np.dtype(np.uint16 if vocab_size <= 65536 else np.uint32)


def prepare_tokenizer(cfg: DataConfig) -> Tokenizer:
    """The tokenizer shards are made with: `bytes` or a tokenizer.json (a BPE is trained by the in-memory path)."""
    if cfg.tokenizer == "bpe":
        raise UserError("data.tokenizer=bpe: shards need a fixed tokenizer; give `bytes` or a tokenizer.json path "
                        "(e.g. the one a bpe run cached under $HDROPE_CACHE/tokenizers/)")
    return load_tokenizer(cfg.tokenizer, cache_dir=cfg.cache_dir)


def token_source(cfg: DataConfig) -> dict[str, Any]:
    """What decides the documents and their split: corpus settings plus, for files, each path and size."""
    src: dict[str, Any] = {"corpus": cfg.corpus, "val_fraction": cfg.val_fraction}
    if cfg.corpus == "files":
        src["text_field"] = cfg.text_field
        src["files"] = [{"path": str(p), "bytes": p.stat().st_size} for p in corpus_files(cfg)]
    elif cfg.corpus == "hf":
        src.update(dataset=cfg.hf_dataset, split=cfg.hf_split, documents=cfg.hf_documents, text_field=cfg.text_field)
    return src


# ---- worker side -------------------------------------------------------------------------------

_worker_tok: Tokenizer | None = None


def _init_worker(spec: str, cache_dir: str) -> None:
    global _worker_tok
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one thread per worker: the processes are the parallelism
    _worker_tok = load_tokenizer(spec, cache_dir=cache_dir)


def _encode_chunk(texts: list[str], dtype: str, tok: Tokenizer | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Tokens of the documents, each followed by end-of-text, and each document's token count."""
    tok = tok or _worker_tok
    assert tok is not None
    sep = [] if tok.eos_id is None else [tok.eos_id]
    docs = [np.asarray(t + sep, dtype=dtype) for t in tok.encode_batch(texts)]
    lengths = np.fromiter(map(len, docs), dtype=np.int64, count=len(docs))
    return (np.concatenate(docs) if docs else np.zeros(0, dtype=dtype)), lengths


# ---- main side -----------------------------------------------------------------------------------


@dataclass
class _Position:
    """A point in a split's token stream: token `offset` of the split's document `doc`."""

    doc: int = 0
    offset: int = 0


@dataclass
class _SplitWriter:
    """Cuts one split's token stream into shards, recording each shard and the stream position at its end."""

    split: str
    out: Path
    shard_tokens: int
    suffix: str
    dtype: np.dtype
    start: _Position
    shards: list[dict]  # kept shard entries of this split, in order
    on_shard: Callable[[dict], None]
    pos: _Position = field(init=False)
    buf: list[np.ndarray] = field(default_factory=list)
    buffered: int = 0
    lengths: deque = field(default_factory=deque)  # token counts of the documents in buf, from pos.doc

    def __post_init__(self) -> None:
        self.pos = _Position(self.start.doc, self.start.offset)

    def add(self, tokens: np.ndarray, lengths: np.ndarray, first_doc: int) -> None:
        """Append the tokens of documents first_doc, first_doc+1, …; the resumed document's head is dropped."""
        if first_doc == self.start.doc and self.start.offset and not self.buffered and not self.lengths:
            tokens = tokens[self.start.offset :]
        self.buf.append(tokens)
        self.buffered += len(tokens)
        self.lengths.extend(int(n) for n in lengths)
        while self.buffered >= self.shard_tokens:
            self._cut(self.shard_tokens)

    def finish(self) -> None:
        if self.buffered:
            self._cut(self.buffered)

    def _cut(self, n: int) -> None:
        data = np.concatenate(self.buf) if len(self.buf) > 1 else self.buf[0]
        shard, rest = data[:n], data[n:]
        self.buf, self.buffered = ([rest] if len(rest) else []), len(rest)
        left = n
        while left:  # advance the stream position by n tokens
            in_doc = self.lengths[0] - self.pos.offset
            if left >= in_doc:
                left -= in_doc
                self.lengths.popleft()
                self.pos = _Position(self.pos.doc + 1, 0)
            else:
                self.pos = _Position(self.pos.doc, self.pos.offset + left)
                left = 0
        name = f"{self.split}-{len(self.shards):06d}{self.suffix}"
        _write_shard(self.out / name, shard.astype(self.dtype, copy=False))
        entry = {"file": name, "split": self.split, "tokens": int(n), "sha256": sha256_file(self.out / name),
                 "end": [self.pos.doc, self.pos.offset]}
        self.shards.append(entry)
        self.on_shard(entry)


def _write_shard(path: Path, tokens: np.ndarray) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as f:
        if path.suffix == ".npy":
            np.save(f, tokens)
        else:
            f.write(tokens.astype(tokens.dtype.newbyteorder("<"), copy=False).tobytes())
    os.replace(tmp, path)


class _Stopped(Exception):
    """--max-shards reached: the run stops as if interrupted."""


@dataclass
class PrepareResult:
    """What one `prepare_shards` call did."""

    out: Path
    complete: bool
    shards_written: int
    shards_kept: int
    tokens_written: int
    seconds: float
    manifest: dict

    @property
    def tokens_per_s(self) -> float:
        return self.tokens_written / max(self.seconds, 1e-9)


def _settings(cfg: DataConfig, tok: Tokenizer, shard_tokens: int, file_format: str) -> dict[str, Any]:
    return {"format": SHARD_FORMAT, "dtype": shard_dtype(tok.vocab_size).name, "file_format": file_format,
            "shard_tokens": shard_tokens,
            "tokenizer": {"spec": cfg.tokenizer, "identity": tok.identity, "vocab_size": tok.vocab_size,
                          "eos_id": tok.eos_id},
            "source": token_source(cfg)}


def _kept_shards(out: Path, settings: dict[str, Any]) -> tuple[list[dict], dict | None]:
    """Shard entries of an earlier run into out that verify (each split's leading run of good shards),
    and that run's manifest (None when there was none)."""
    path = out / MANIFEST
    if not path.is_file():
        ours = (MANIFEST, *(f"{s}-" for s in SPLITS))  # a run killed before its first manifest leaves only these
        others = [p.name for p in out.iterdir() if not p.name.lstrip(".").startswith(ours)] if out.is_dir() else []
        if others:
            raise UserError(f"--out {out}: not empty ({', '.join(sorted(others)[:3])} …) and holds no {MANIFEST}; "
                            "give a new or empty directory")
        return [], None
    try:
        old = json.loads(path.read_text())
        old_settings = {k: old[k] for k in settings}
        entries = list(old["shards"])
    except (OSError, ValueError, KeyError, TypeError):
        raise UserError(f"{path}: not a readable shard manifest; delete {out} (or give a new --out) "
                        "and prepare again") from None
    if old_settings != settings:
        diff = sorted(k for k in settings if old_settings[k] != settings[k])
        raise UserError(f"--out {out}: holds shards of another preparation ({', '.join(diff)} differ); "
                        "give a new --out, or delete the directory to rebuild it")
    kept: list[dict] = []
    broken = set()
    for entry in entries:
        split = entry["split"]
        f = out / entry["file"]
        if split in broken or not f.is_file() or sha256_file(f) != entry["sha256"]:
            broken.add(split)
            continue
        kept.append(entry)
    return kept, old


def _chunks(docs: Iterator[tuple[str, str]], starts: dict[str, _Position],
            digests: dict[str, list[bytes]], val_bytes: list[int]) -> Iterator[tuple[str, int, list[str]]]:
    """(split, first document index in the split, texts) chunks of the documents not yet in kept shards.

    Every document's digest is recorded (for the fingerprint), including those that are skipped."""
    counts = dict.fromkeys(SPLITS, 0)
    pending: dict[str, tuple[int, list[str], int]] = {}
    for split, text in docs:
        digests[split].append(hashlib.sha256(text.encode()).digest())
        if split == "val":
            val_bytes[0] += len(text.encode("utf-8"))
        index = counts[split]
        counts[split] += 1
        if index < starts[split].doc:
            continue
        first, texts, chars = pending.get(split, (index, [], 0))
        texts.append(text)
        chars += len(text)
        if chars >= _CHUNK_CHARS or len(texts) >= _CHUNK_DOCS:
            pending.pop(split, None)
            yield split, first, texts
        else:
            pending[split] = (first, texts, chars)
    for split, (first, texts, _) in pending.items():
        yield split, first, texts


def _split_stream(cfg: DataConfig) -> tuple[Iterator[tuple[str, str]], int]:
    """A re-iterable (split, text) stream of the corpus with the in-memory split, and its document count."""
    names = [n for n, _ in iter_documents(cfg)]  # first pass: names only are kept
    if not names:
        raise UserError(f"data ({cfg.corpus}): the corpus holds no text")
    if len(names) == 1:
        def one() -> Iterator[tuple[str, str]]:
            for _, text in iter_documents(cfg):
                cut = single_document_cut(text, cfg.val_fraction)
                yield "train", text[:cut]
                yield "val", text[cut:]

        return one(), 2
    held = split_documents(names, cfg.val_fraction)
    return ((("val" if n in held else "train"), t) for n, t in iter_documents(cfg)), len(names)


class _Progress:
    """tqdm over documents when it is installed, else one line per shard on stderr."""

    def __init__(self, total: int, enabled: bool, done: int = 0) -> None:
        self.bar, self.enabled, self.tokens = None, enabled, 0
        if enabled:
            try:
                from tqdm import tqdm

                self.bar = tqdm(total=total, initial=done, unit="doc", dynamic_ncols=True, file=sys.stderr)
            except ImportError:
                pass

    def docs(self, n: int, tokens: int) -> None:
        self.tokens += tokens
        if self.bar is not None:
            self.bar.update(n)
            self.bar.set_postfix(tokens=f"{self.tokens:,}", refresh=False)

    def shard(self, entry: dict) -> None:
        if self.enabled and self.bar is None:
            print(f"  {entry['file']}: {entry['tokens']:,} tokens ({self.tokens:,} this run)", file=sys.stderr)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def prepare_shards(cfg: DataConfig, out: Path, *, shard_tokens: int = 1 << 24, workers: int = 1,
                   file_format: str = "npy", max_shards: int = 0, progress: bool = False) -> PrepareResult:
    """Tokenize cfg's corpus into shards under out, resuming an earlier run there; see the module docstring.

    max_shards > 0 stops after writing that many shards (an interruption on purpose; a rerun continues)."""
    if cfg.corpus not in ("shakespeare", "files", "hf"):
        raise UserError(f"data.corpus={cfg.corpus!r}: prepare reads shakespeare, files or hf")
    if shard_tokens < 1:
        raise UserError(f"--shard-tokens {shard_tokens}: must be a positive number of tokens, e.g. 16777216")
    if workers < 1:
        raise UserError(f"--workers {workers}: must be at least 1")
    if file_format not in ("npy", "bin"):
        raise UserError(f"--format {file_format!r}: choose npy or bin")
    if max_shards < 0:
        raise UserError(f"--max-shards {max_shards}: must be >= 0 (0: no limit)")
    t0 = time.perf_counter()
    tok = prepare_tokenizer(cfg)
    dtype = shard_dtype(tok.vocab_size)
    settings = _settings(cfg, tok, shard_tokens, file_format)
    kept, old = _kept_shards(out, settings)
    if old is not None and old.get("complete") and len(kept) == len(old["shards"]):
        return PrepareResult(out, True, 0, len(kept), 0, time.perf_counter() - t0, old)
    out.mkdir(parents=True, exist_ok=True)
    shards: dict[str, list[dict]] = {s: [e for e in kept if e["split"] == s] for s in SPLITS}
    starts = {s: _Position(*shards[s][-1]["end"]) if shards[s] else _Position() for s in SPLITS}
    written: list[dict] = []

    def save_manifest(extra: dict | None = None) -> dict:
        ordered = sorted(kept + written, key=lambda e: (SPLITS.index(e["split"]), e["file"]))
        manifest = {**settings, "complete": False, "shards": ordered, **(extra or {})}
        write_json_atomic(out / MANIFEST, manifest)
        return manifest

    stream, n_docs = _split_stream(cfg)
    bar = _Progress(n_docs, progress, done=sum(p.doc for p in starts.values()))  # resumed: skipped documents

    def on_shard(entry: dict) -> None:
        written.append(entry)
        save_manifest()
        bar.shard(entry)
        if max_shards and len(written) >= max_shards:
            raise _Stopped

    writers = {s: _SplitWriter(s, out, shard_tokens, ".npy" if file_format == "npy" else ".bin", dtype, starts[s],
                               shards[s], on_shard) for s in SPLITS}
    digests: dict[str, list[bytes]] = {s: [] for s in SPLITS}
    val_bytes = [0]
    save_manifest()
    complete = False
    try:
        chunks = _chunks(stream, starts, digests, val_bytes)
        with contextlib.closing(_encoded(chunks, cfg, tok, dtype.name, workers)) as results:  # closes the pool
            for split, first, texts, (tokens, lengths) in results:
                bar.docs(len(texts), len(tokens))
                writers[split].add(tokens, lengths, first)
        for s in SPLITS:
            writers[s].finish()
        complete = True
    except _Stopped:
        pass
    finally:
        bar.close()
    manifest = save_manifest()
    if complete:
        totals = {s: {"documents": len(digests[s]), "tokens": sum(e["tokens"] for e in shards[s]),
                      "shards": len(shards[s])} for s in SPLITS}
        totals["val"]["bytes"] = val_bytes[0]
        manifest = save_manifest({"complete": True, "splits": totals,
                                  "corpus_fingerprint": corpus_fingerprint(digests["train"], digests["val"])})
    return PrepareResult(out, complete, len(written), len(kept), sum(e["tokens"] for e in written),
                         time.perf_counter() - t0, manifest)


def _encoded(chunks: Iterator[tuple[str, int, list[str]]], cfg: DataConfig, tok: Tokenizer, dtype: str,
             workers: int) -> Iterator[tuple[str, int, list[str], tuple[np.ndarray, np.ndarray]]]:
    """Each chunk with its tokens, in chunk order; in-process for one worker, else a bounded pool."""
    if workers == 1:
        for split, first, texts in chunks:
            yield split, first, texts, _encode_chunk(texts, dtype, tok)
        return
    ctx = mp.get_context("spawn")  # no fork of a process that holds tokenizer threads
    with ctx.Pool(workers, initializer=_init_worker, initargs=(cfg.tokenizer, cfg.cache_dir)) as pool:
        inflight: deque = deque()
        for split, first, texts in chunks:
            inflight.append((split, first, texts, pool.apply_async(_encode_chunk, (texts, dtype))))
            if len(inflight) >= 2 * workers:
                s, f, t, res = inflight.popleft()
                yield s, f, t, res.get()
        while inflight:
            s, f, t, res = inflight.popleft()
            yield s, f, t, res.get()
