"""Training from prepared shards (`data.corpus=shards`, `data.shards_dir=DIR`): verified, memory-mapped, concatenated.

`load_shards(dir, tokenizer)` checks the manifest `hdrope data prepare` wrote (complete, same
tokenizer identity) and every shard's size and sha256, then memory-maps the shards. A shard whose
checksum verified is recorded in the cache (`shard-checks/`, by path, size and mtime) and is not
hashed again until its size or modification time changes, so trials after the first start at once. Each split is a
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
from trainer.cache import cache_root, sha256_file
from trainer.run_files import write_json_atomic
from trainer.shard_prepare import MANIFEST, SHARD_FORMAT, SPLITS
from trainer.tokenizer import Tokenizer

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
    manifest: dict

    @property
    def key(self) -> str:
        return str(self.manifest["corpus_fingerprint"])

    @property
    def val_bytes_per_token(self) -> float:
        """UTF-8 bytes of the validation documents per validation token (for val_bpb)."""
        return self.manifest["splits"]["val"]["bytes"] / max(1, len(self.val))


_FIX = "rerun `hdrope data prepare` with --out {dir} (it keeps shards that verify and re-makes the rest)"


def _manifest(root: Path) -> dict:
    path = root / MANIFEST
    if not root.is_dir():
        raise UserError(f"data.shards_dir={str(root)!r}: no such directory; run `hdrope data prepare --out {root}` "
                        "first, or fix the path")
    try:
        manifest = json.loads(path.read_text())
        ok = isinstance(manifest, dict) and manifest.get("format") == SHARD_FORMAT
        _ = [(e["file"], e["split"], int(e["tokens"]), e["sha256"]) for e in manifest["shards"]]
    except FileNotFoundError:
        raise UserError(f"{path}: missing; data.shards_dir must be a directory written by `hdrope data prepare`; "
                        + _FIX.format(dir=root)) from None
    except (OSError, ValueError, KeyError, TypeError):
        ok = False
    if not ok:
        raise UserError(f"{path}: not a readable {SHARD_FORMAT} manifest; " + _FIX.format(dir=root))
    if not manifest.get("complete"):
        raise UserError(f"{path}: the preparation did not finish; " + _FIX.format(dir=root))
    return manifest


class _Checked:
    """sha256 results of shards, remembered per (size, mtime) in the cache; one JSON file per shard directory."""

    def __init__(self, root: Path, cache_dir: str) -> None:
        key = hashlib.sha256(str(root.resolve()).encode()).hexdigest()[:16]
        self.path = cache_root(cache_dir) / "shard-checks" / f"{key}.json"
        try:
            self.seen: dict[str, list] = json.loads(self.path.read_text())
        except (OSError, ValueError):
            self.seen = {}
        self.changed = False

    def verify(self, path: Path, sha256: str) -> bool:
        st = path.stat()
        stamp = [st.st_size, st.st_mtime_ns, sha256]
        if self.seen.get(path.name) == stamp:
            return True
        if sha256_file(path) != sha256:
            return False
        self.seen[path.name], self.changed = stamp, True
        return True

    def save(self) -> None:
        if self.changed:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            write_json_atomic(self.path, self.seen)


def _open(root: Path, entry: dict, dtype: np.dtype, checked: _Checked) -> np.ndarray:
    path = root / entry["file"]
    fix = _FIX.format(dir=root)
    if not path.is_file():
        raise UserError(f"{path}: shard missing; {fix}")
    if not checked.verify(path, entry["sha256"]):
        raise UserError(f"{path}: sha256 does not match the manifest (the shard is corrupt); {fix}")
    tokens = np.load(path, mmap_mode="r") if path.suffix == ".npy" else np.memmap(path, dtype=dtype, mode="r")
    if tokens.dtype != dtype or tokens.ndim != 1 or len(tokens) != int(entry["tokens"]):
        raise UserError(f"{path}: holds {tokens.shape} {tokens.dtype}, the manifest says {entry['tokens']} {dtype}; "
                        f"{fix}")
    return tokens


def load_shards(shards_dir: str, tok: Tokenizer, cache_dir: str = "") -> ShardSet:
    """Verified, memory-mapped train/val streams of a prepared directory made with the tokenizer `tok`."""
    root = Path(shards_dir).expanduser()
    manifest = _manifest(root)
    made_with = manifest.get("tokenizer", {})
    if made_with.get("identity") != tok.identity:
        raise UserError(f"data.shards_dir={shards_dir!r} was prepared with tokenizer {made_with.get('spec')!r} "
                        f"({made_with.get('identity')}), but data.tokenizer gives {tok.identity}; "
                        f"set data.tokenizer={made_with.get('spec')}")
    dtype = np.dtype(manifest["dtype"]).newbyteorder("<")
    checked = _Checked(root, cache_dir)
    try:
        streams = {s: ShardStream([_open(root, e, dtype, checked) for e in manifest["shards"] if e["split"] == s])
                   for s in SPLITS}
    finally:
        checked.save()  # what verified stays verified, even when a later shard fails
    return ShardSet(streams["train"], streams["val"], root, manifest)
