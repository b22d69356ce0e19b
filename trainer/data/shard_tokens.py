"""Training from prepared shards (`data.corpus=shards`, `data.shards_dir=DIR`): verified, memory-mapped, concatenated.

`load_shards(dir, tokenizer)` checks the manifest `hdrope data prepare` wrote (its schema and
consistency, complete, same tokenizer identity) and every shard's size, header and sha256 (the
checks of `trainer.data.shard_manifest`, the same ones prepare resumes with), then memory-maps the
shards. A shard's sha256 is recorded in the cache (`shard-checks/`, by name, size, mtime, ctime
and inode) and is not hashed again until the file changes, so trials after the first start at once. Each split is a
`ShardStream`: the concatenation of its shards, read like a 1-D token array (`len`, slices). Training
windows are drawn from the whole stream exactly as from the in-memory array, so a window may span a
shard boundary, and a run on shards sees bitwise the batches of a run on the same corpus in memory
(the batches of step s stay a function of (seed, s, micro-batch)).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from hdrope.errors import UserError
from trainer.data.shard_manifest import (
    MANIFEST,
    RESUME,
    SPLITS,
    ShardEntry,
    ShardManifest,
    read_manifest,
    shard_problem,
)
from trainer.data.tokenizer import Tokenizer
from trainer.files.cache import cache_root, sha256_file
from trainer.files.run_files import write_json_atomic

__all__ = ["ShardSet", "ShardStream", "load_shards"]


class ShardStream:
    """Memory-mapped shards read as one token array: `len(s)`, `s[a:b]` (a copy when it spans shards)."""

    def __init__(self, parts: list[np.ndarray]) -> None:
        self.parts = parts
        self.bounds = np.cumsum([0, *map(len, parts)])  # shard i holds [bounds[i], bounds[i+1])
        self.dtype = parts[0].dtype if parts else np.dtype(np.uint16)

    def __len__(self) -> int:
        return int(self.bounds[-1])

    def __getitem__(self, key: slice) -> np.ndarray:
        if not isinstance(key, slice) or key.step not in (None, 1):
            raise TypeError("ShardStream supports contiguous slices only")
        start, stop, _ = key.indices(len(self))
        if stop <= start:
            return np.zeros(0, dtype=self.dtype)
        first = int(np.searchsorted(self.bounds, start, side="right")) - 1
        last = int(np.searchsorted(self.bounds, stop, side="left")) - 1
        pieces = [self.parts[i][max(start - self.bounds[i], 0) : stop - self.bounds[i]] for i in range(first, last + 1)]
        return pieces[0] if len(pieces) == 1 else np.concatenate(pieces)

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        whole = self[0 : len(self)]
        return whole if dtype is None else whole.astype(dtype)


@dataclass
class ShardSet:
    """Train and validation streams of a prepared shard directory and its manifest."""

    train: ShardStream
    val: ShardStream
    path: Path
    manifest: ShardManifest

    @property
    def key(self) -> str:
        return str(self.manifest.corpus_fingerprint)

    @property
    def val_bytes_per_token(self) -> float:
        """UTF-8 bytes of the validation documents per validation token (for val_bpb)."""
        assert self.manifest.splits is not None
        return float(self.manifest.splits["val"].bytes or 0) / max(1, len(self.val))


def _manifest(root: Path) -> ShardManifest:
    if not root.is_dir():
        raise UserError(f"data.shards_dir={str(root)!r}: no such directory; run `hdrope data prepare --out {root}` "
                        "first, or fix the path")
    try:
        manifest = read_manifest(root)
    except FileNotFoundError:
        raise UserError(f"{root / MANIFEST}: missing; data.shards_dir must be a directory written by "
                        "`hdrope data prepare`: fix the path, or prepare the corpus into a new or empty directory "
                        "(`hdrope data prepare --out NEW_DIR`) and set data.shards_dir=NEW_DIR") from None
    if not manifest.complete:
        raise UserError(f"{root / MANIFEST}: the preparation did not finish; " + RESUME.format(dir=root))
    return manifest


class _Checked:
    """sha256 results of shards, remembered per (size, mtime, ctime, inode) in the cache; one JSON file per
    shard directory."""

    def __init__(self, root: Path, cache_dir: str) -> None:
        key = hashlib.sha256(str(root.resolve()).encode()).hexdigest()[:16]
        self.path = cache_root(cache_dir) / "shard-checks" / f"{key}.json"
        try:
            seen = json.loads(self.path.read_text())
        except (OSError, json.JSONDecodeError, UnicodeDecodeError):  # no cache yet, or a damaged one: hash again
            seen = {}
        self.seen: dict[str, list] = seen if isinstance(seen, dict) else {}
        self.changed = False

    def sha256(self, path: Path) -> str:
        """The file's sha256, hashed only when the file changed since it was last hashed."""
        st = path.stat()
        stamp = [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]
        seen = self.seen.get(path.name)
        if isinstance(seen, list) and seen[:-1] == stamp:
            return str(seen[-1])
        digest = sha256_file(path)
        self.seen[path.name], self.changed = [*stamp, digest], True
        return digest

    def save(self) -> None:
        if self.changed:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            write_json_atomic(self.path, self.seen)


def _open(root: Path, entry: ShardEntry, manifest: ShardManifest, checked: _Checked) -> np.ndarray:
    problem = shard_problem(root, entry, manifest, checked.sha256)
    if problem:
        raise UserError(f"{root / entry.file}: {problem}; " + RESUME.format(dir=root))
    path = root / entry.file
    if manifest.file_format == "npy":
        return np.load(path, mmap_mode="r")
    return np.memmap(path, dtype=manifest.dtype, mode="r")


def load_shards(shards_dir: str, tok: Tokenizer, cache_dir: str = "") -> ShardSet:
    """Verified, memory-mapped train/val streams of a prepared directory made with the tokenizer `tok`."""
    root = Path(shards_dir).expanduser()
    manifest = _manifest(root)
    made_with = manifest.tokenizer
    if made_with.identity != tok.identity:
        raise UserError(f"data.shards_dir={shards_dir!r} was prepared with tokenizer {made_with.spec!r} "
                        f"({made_with.identity}), but data.tokenizer gives {tok.identity}; "
                        f"set data.tokenizer={made_with.spec}")
    checked = _Checked(root, cache_dir)
    try:
        streams = {s: ShardStream([_open(root, e, manifest, checked) for e in manifest.shards if e.split == s])
                   for s in SPLITS}
    finally:
        checked.save()  # what verified stays verified, even when a later shard fails
    return ShardSet(streams["train"], streams["val"], root, manifest)
