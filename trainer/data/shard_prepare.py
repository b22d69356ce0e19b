"""`prepare_shards`: stream a corpus through the tokenizer in worker processes into fixed-size token shards.

The corpus is read twice, never held in memory: a first pass lists the document names and picks the
validation documents with `split_documents` (the in-memory split, so shards hold exactly the tokens
`cached_tokens` makes); the second pass tokenizes chunks of documents in a pool of spawned processes
(results consumed in submission order, at most two chunks per worker in flight) and cuts each
split's token stream (documents joined by the tokenizer's end-of-text id) into shards of
`shard_tokens` tokens, the last one shorter. Layout of the output directory:

- `train-000000.npy` / `val-000000.npy` … (or `.bin`: raw little-endian tokens), uint16 when the
  vocabulary fits, else uint32;
- `manifest.json` (`MANIFEST`, schema and checks in `trainer.data.shard_manifest`): settings, tokenizer
  identity, source identity (for files: each path and the sha256 of its bytes), and per shard its
  file, split, token count, sha256 and stream position at its end; when complete also per-split
  totals and the corpus fingerprint (the same as `load_corpus(cfg).fingerprint`);
- `.hdrope.lock`: one `prepare` at a time writes the directory (`trainer.files.dir_lock`).

The manifest is rewritten (atomically) after a shard is written, as often as it costs at most a
small share of the run (every shard, unless shards are tiny), so an interrupted run resumes: a rerun
keeps each split's leading shards that pass `shard_problem` (the check training makes), skips the
documents they cover without tokenizing them, and continues; the result is byte-identical to an
uninterrupted run. A manifest made from another corpus version or with other settings is refused,
and so is a directory without a manifest that holds anything else: prepare overwrites only its own files.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import multiprocessing as mp
import os
import signal
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from hdrope.errors import UserError
from trainer.config import DataConfig
from trainer.data.corpus import corpus_files, corpus_fingerprint, iter_documents, single_document_cut, split_documents
from trainer.data.shard_manifest import (
    MANIFEST,
    SHARD_FORMAT,
    SPLITS,
    SUFFIXES,
    ShardEntry,
    ShardManifest,
    read_manifest,
    shard_dtype,
    shard_name,
    shard_problem,
)
from trainer.data.tokenizer import Tokenizer, load_tokenizer
from trainer.files.cache import sha256_file
from trainer.files.dir_lock import LOCK_FILE, hold_dir_lock, refuse_non_directory
from trainer.files.foreign import refuse_foreign
from trainer.files.run_files import write_json_atomic

__all__ = [
    "MANIFEST",
    "SHARD_FORMAT",
    "SPLITS",
    "PrepareResult",
    "prepare_shards",
    "prepare_tokenizer",
    "shard_dtype",
    "token_source",
    "usable_cpus",
]

_CHUNK_CHARS = 1 << 20  # text per worker task
_CHUNK_DOCS = 1024
_SAVE_SHARE = 20  # the manifest is rewritten at most once per 20x the time its last write took (<= 5% of the run)
_OURS_BEFORE_MANIFEST = (LOCK_FILE, f".{MANIFEST}.tmp")  # what a run leaves before its first manifest


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask, else the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def prepare_tokenizer(cfg: DataConfig) -> Tokenizer:
    """The tokenizer shards are made with: `bytes` or a tokenizer.json (a BPE is trained by the in-memory path)."""
    if cfg.tokenizer == "bpe":
        raise UserError("data.tokenizer=bpe: shards need a fixed tokenizer; give `bytes` or a tokenizer.json path "
                        "(e.g. the one a bpe run cached under $HDROPE_CACHE/tokenizers/)")
    return load_tokenizer(cfg.tokenizer, cache_dir=cfg.cache_dir)


def token_source(cfg: DataConfig) -> dict[str, Any]:
    """What decides the documents and their split: corpus settings plus, for files, each path and the sha256
    of its bytes (so an edit that keeps a file's size and time is a different source)."""
    src: dict[str, Any] = {"corpus": cfg.corpus, "val_fraction": cfg.val_fraction}
    if cfg.corpus == "files":
        src["text_field"] = cfg.text_field
        src["files"] = [{"path": str(p), "sha256": sha256_file(p)} for p in corpus_files(cfg)]
    elif cfg.corpus == "hf":
        src.update(dataset=cfg.hf_dataset, split=cfg.hf_split, documents=cfg.hf_documents, text_field=cfg.text_field)
    return src


# ---- worker side -------------------------------------------------------------------------------

_worker_tok: Tokenizer | None = None


def _die_with_parent(parent_pid: int) -> None:
    """End this worker when the driver that started it dies, even by SIGKILL (which runs no cleanup of the
    driver's): on Linux the kernel sends SIGKILL at once (prctl PR_SET_PDEATHSIG); elsewhere a daemon thread
    notices the new parent within a second. A worker whose driver died before this ran exits here. Multiprocessing's
    resource tracker then sees its pipe close and exits too, so nothing the driver started is left."""
    if sys.platform.startswith("linux"):
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0)
    else:
        def watch() -> None:
            while os.getppid() == parent_pid:
                time.sleep(1.0)
            os._exit(1)

        threading.Thread(target=watch, daemon=True, name="die-with-parent").start()
    if os.getppid() != parent_pid:  # the driver died before the death signal was armed
        os._exit(1)


def _init_worker(spec: str, cache_dir: str, parent_pid: int) -> None:
    global _worker_tok
    _die_with_parent(parent_pid)
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
    shards: list[ShardEntry]  # kept shard entries of this split, in order
    on_shard: Callable[[ShardEntry], None]
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
        name = shard_name(self.split, len(self.shards), self.suffix)
        digest = _write_shard(self.out / name, shard.astype(self.dtype, copy=False))
        entry = ShardEntry(name, self.split, int(n), digest, (self.pos.doc, self.pos.offset))
        self.shards.append(entry)
        self.on_shard(entry)


def _write_shard(path: Path, tokens: np.ndarray) -> str:
    """Write the shard through a temporary file and a rename; returns the sha256 of the file's bytes."""
    if path.suffix == ".npy":
        buf = io.BytesIO()
        np.save(buf, tokens)
        data = buf.getbuffer()
    else:
        data = memoryview(tokens.astype(tokens.dtype.newbyteorder("<"), copy=False)).cast("B")
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)
    return hashlib.sha256(data).hexdigest()


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
    workers: int = 1

    @property
    def tokens_per_s(self) -> float:
        return self.tokens_written / max(self.seconds, 1e-9)


def _settings(cfg: DataConfig, tok: Tokenizer, shard_tokens: int, file_format: str) -> dict[str, Any]:
    return {"format": SHARD_FORMAT, "dtype": shard_dtype(tok.vocab_size).name, "file_format": file_format,
            "shard_tokens": shard_tokens,
            "tokenizer": {"spec": cfg.tokenizer, "identity": tok.identity, "vocab_size": tok.vocab_size,
                          "eos_id": tok.eos_id},
            "source": token_source(cfg)}


def _refuse_foreign(out: Path) -> None:
    """UserError when out holds a manifest that is not prepare's (or not valid), or no manifest and anything but
    what a prepare leaves before its first manifest."""
    if not out.is_dir():
        return
    if (out / MANIFEST).exists():
        read_manifest(out)
        return
    refuse_foreign(out, f"--out {out}", "hdrope data prepare", lambda p: p.name in _OURS_BEFORE_MANIFEST,
                   f" (the directory holds no {MANIFEST})")


def _source_change(old: Any, new: dict[str, Any]) -> str:
    """In words, how the corpus differs from the one the shards were made from."""
    if not isinstance(old, dict) or old.get("corpus") != new["corpus"] or "files" not in new:
        return "the corpus settings differ"
    before = {f.get("path"): f.get("sha256") for f in old.get("files", []) if isinstance(f, dict)}
    after = {f["path"]: f["sha256"] for f in new["files"]}
    changed = [p for p in after if p in before and before[p] != after[p]]
    added, gone = [p for p in after if p not in before], [p for p in before if p not in after]
    parts = [f"{what} {', '.join(map(str, names[:3]))}{' …' if len(names) > 3 else ''}"
             for what, names in (("changed:", changed), ("new:", added), ("gone:", gone)) if names]
    return "; ".join(parts) or "the corpus settings differ"


def _kept_shards(out: Path, settings: dict[str, Any]) -> tuple[list[ShardEntry], ShardManifest | None]:
    """Shard entries of an earlier run into out that verify (each split's leading run of good shards),
    and that run's manifest (None when there was none)."""
    _refuse_foreign(out)
    try:
        old = read_manifest(out)
    except FileNotFoundError:
        return [], None
    differ = sorted(k for k in settings if old.raw.get(k) != settings[k])
    if differ == ["source"]:
        raise UserError(f"--out {out}: its shards were made from another version of the corpus "
                        f"({_source_change(old.raw.get('source'), settings['source'])}); give a new --out, or "
                        f"remove {out} and prepare again")
    if differ:
        raise UserError(f"--out {out}: holds shards of another preparation ({', '.join(differ)} differ); "
                        "give a new --out, or delete the directory to rebuild it")
    kept: list[ShardEntry] = []
    broken = set()
    for entry in old.shards:
        if entry.split in broken or shard_problem(out, entry, old) is not None:
            broken.add(entry.split)
            continue
        kept.append(entry)
    return kept, old


class _ManifestSaver:
    """Rewrites the manifest after a shard, at most once per _SAVE_SHARE times its last write took: with many
    tiny shards the writes (each the size of the manifest) stay a bounded share of the run, not quadratic."""

    def __init__(self, path: Path) -> None:
        self.path, self.next_at = path, 0.0

    def due(self) -> bool:
        return time.perf_counter() >= self.next_at

    def save(self, build: Callable[[], dict]) -> dict:
        """Write the manifest `build` makes now; returns it."""
        start = time.perf_counter()
        manifest = build()
        write_json_atomic(self.path, manifest)
        self.next_at = start + (_SAVE_SHARE + 1) * (time.perf_counter() - start)
        return manifest


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

    def shard(self, entry: ShardEntry) -> None:
        if self.enabled and self.bar is None:
            print(f"  {entry.file}: {entry.tokens:,} tokens ({self.tokens:,} this run)", file=sys.stderr)

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
    workers = _capped_workers(workers)
    refuse_non_directory(out, "--out")
    _refuse_foreign(out)  # before the lock creates anything in a directory that is not ours
    t0 = time.perf_counter()
    tok = prepare_tokenizer(cfg)
    settings = _settings(cfg, tok, shard_tokens, file_format)
    with hold_dir_lock(out, "hdrope data prepare"):
        kept, old = _kept_shards(out, settings)
        if old is not None and old.complete and len(kept) == len(old.shards):
            return PrepareResult(out, True, 0, len(kept), 0, time.perf_counter() - t0, old.raw, workers)
        manifest, complete, written = _prepare(cfg, out, tok, settings, kept, workers, max_shards, progress)
    return PrepareResult(out, complete, len(written), len(kept), sum(e.tokens for e in written),
                         time.perf_counter() - t0, manifest, workers)


def _capped_workers(workers: int) -> int:
    cpus = usable_cpus()
    if workers > cpus:
        print(f"hdrope data prepare: warning: --workers {workers} is more than the {cpus} CPUs this process may use; "
              f"using {cpus} workers", file=sys.stderr)
        return cpus
    return workers


def _prepare(cfg: DataConfig, out: Path, tok: Tokenizer, settings: dict[str, Any], kept: list[ShardEntry],
             workers: int, max_shards: int, progress: bool) -> tuple[dict, bool, list[ShardEntry]]:
    """Tokenize what the kept shards do not cover into out: (the manifest, complete, the shards written)."""
    dtype = np.dtype(settings["dtype"])
    shards: dict[str, list[ShardEntry]] = {s: [e for e in kept if e.split == s] for s in SPLITS}
    starts = {s: _Position(*shards[s][-1].end) if shards[s] else _Position() for s in SPLITS}
    written: list[ShardEntry] = []
    saver = _ManifestSaver(out / MANIFEST)

    def save_manifest(extra: dict | None = None) -> dict:
        def build() -> dict:
            ordered = [e.to_json() for s in SPLITS for e in shards[s]]  # each split's shards, in order
            return {**settings, "complete": False, "shards": ordered, **(extra or {})}

        return saver.save(build)

    stream, n_docs = _split_stream(cfg)
    bar = _Progress(n_docs, progress, done=sum(p.doc for p in starts.values()))  # resumed: skipped documents

    def on_shard(entry: ShardEntry) -> None:
        written.append(entry)
        bar.shard(entry)
        if max_shards and len(written) >= max_shards:
            raise _Stopped
        if saver.due():
            save_manifest()

    writers = {s: _SplitWriter(s, out, settings["shard_tokens"], SUFFIXES[settings["file_format"]], dtype,
                               starts[s], shards[s], on_shard) for s in SPLITS}
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
        totals = {s: {"documents": len(digests[s]), "tokens": sum(e.tokens for e in shards[s]),
                      "shards": len(shards[s])} for s in SPLITS}
        totals["val"]["bytes"] = val_bytes[0]
        manifest = save_manifest({"complete": True, "splits": totals,
                                  "corpus_fingerprint": corpus_fingerprint(digests["train"], digests["val"])})
    return manifest, complete, written


def _encoded(chunks: Iterator[tuple[str, int, list[str]]], cfg: DataConfig, tok: Tokenizer, dtype: str,
             workers: int) -> Iterator[tuple[str, int, list[str], tuple[np.ndarray, np.ndarray]]]:
    """Each chunk with its tokens, in chunk order; in-process for one worker, else a bounded pool."""
    if workers == 1:
        for split, first, texts in chunks:
            yield split, first, texts, _encode_chunk(texts, dtype, tok)
        return
    # spawn: no fork of a process that holds tokenizer threads. An executor, not mp.Pool: a worker that dies
    # breaks the pool (BrokenProcessPool, an error) where Pool would wait for its result forever, and closing
    # it early (--max-shards, an error) cancels what is queued instead of terminating workers mid-transfer
    pool = ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn"), initializer=_init_worker,
                               initargs=(cfg.tokenizer, cfg.cache_dir, os.getpid()))
    try:
        inflight: deque = deque()
        for split, first, texts in chunks:
            inflight.append((split, first, texts, pool.submit(_encode_chunk, texts, dtype)))
            if len(inflight) >= 2 * workers:
                s, f, t, res = inflight.popleft()
                yield s, f, t, res.result()
        while inflight:
            s, f, t, res = inflight.popleft()
            yield s, f, t, res.result()
    except BrokenProcessPool as e:
        raise RuntimeError(f"a tokenizer worker process died ({e}); rerun to resume from the last shard") from e
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
