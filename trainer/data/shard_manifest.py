"""The manifest of a shard directory and the one check of a shard against it, shared by prepare and training.

`read_manifest(root)` parses `root/manifest.json` into a typed `ShardManifest`, or raises a
UserError naming the field, its value and the fix. It checks the types and the manifest's own
consistency: shard files named `<split>-<index>` in order, every shard but a split's last holding
`shard_tokens` tokens, stream positions increasing, and, when complete, per-split totals equal to
the sums over the shards. A manifest that fails is not to be trusted, and both `hdrope data prepare`
and training refuse it with the same fix (`REBUILD`).

`shard_problem(root, entry, manifest)` says why a shard file does not match its entry (missing,
size or header, sha256), or None. Prepare re-makes a shard that fails it (and the rest of its
split); training refuses it with the fix of rerunning prepare (`RESUME`), which then re-makes it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from hdrope.errors import UserError
from trainer.files.cache import sha256_file

__all__ = [
    "DTYPES",
    "FOREIGN",
    "MANIFEST",
    "REBUILD",
    "RESUME",
    "SHARD_FORMAT",
    "SPLITS",
    "SUFFIXES",
    "ShardEntry",
    "ShardManifest",
    "SplitTotals",
    "TokenizerRecord",
    "read_manifest",
    "shard_dtype",
    "shard_name",
    "shard_problem",
]

MANIFEST = "manifest.json"
SHARD_FORMAT = "hdrope-shards-v1"
SPLITS = ("train", "val")
DTYPES = ("uint16", "uint32")
SUFFIXES = {"npy": ".npy", "bin": ".bin"}
REBUILD = ("the manifest was edited or is damaged, so its shards cannot be trusted: remove the directory {dir} "
           "and run `hdrope data prepare --out {dir}` again (or prepare into a new --out)")
FOREIGN = ("if `hdrope data prepare` wrote {dir}, remove it and prepare again; otherwise give data.shards_dir / "
           "--out a directory that prepare writes")
RESUME = "rerun `hdrope data prepare` with --out {dir} (it keeps shards that verify and re-makes the rest)"
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


def shard_dtype(vocab_size: int) -> np.dtype:
    """uint16 when every id fits, else uint32 (as the in-memory token cache)."""
    return np.dtype(np.uint16 if vocab_size <= 65536 else np.uint32)


def shard_name(split: str, index: int, suffix: str) -> str:
    """The file name of a split's shard number `index`."""
    return f"{split}-{index:06d}{suffix}"


@dataclass(frozen=True)
class ShardEntry:
    """One shard: its file, split, token count, sha256 of the file and the split's stream position at its end."""

    file: str
    split: str
    tokens: int
    sha256: str
    end: tuple[int, int]

    def to_json(self) -> dict[str, Any]:
        return {"file": self.file, "split": self.split, "tokens": self.tokens, "sha256": self.sha256,
                "end": list(self.end)}


@dataclass(frozen=True)
class TokenizerRecord:
    """The tokenizer the shards were made with."""

    spec: str
    identity: str
    vocab_size: int
    eos_id: int | None


@dataclass(frozen=True)
class SplitTotals:
    """Documents, tokens and shards of a split (and the UTF-8 bytes of its documents, for validation)."""

    documents: int
    tokens: int
    shards: int
    bytes: int | None


@dataclass(frozen=True)
class ShardManifest:
    """A parsed, self-consistent manifest; `raw` is the JSON object it came from."""

    path: Path
    raw: dict[str, Any]
    dtype: np.dtype
    file_format: str
    shard_tokens: int
    tokenizer: TokenizerRecord
    shards: list[ShardEntry]
    complete: bool
    splits: dict[str, SplitTotals] | None
    corpus_fingerprint: str | None

    @property
    def suffix(self) -> str:
        return SUFFIXES[self.file_format]


class _Fields:
    """Typed reads of a JSON object's fields; the first bad one raises a UserError naming it."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def fail(self, field: str, value: Any, want: str) -> UserError:
        shown = json.dumps(value)
        shown = shown if len(shown) <= 80 else shown[:77] + "..."
        return UserError(f"{self.path}: {field} is {shown}, {want}; " + REBUILD.format(dir=self.path.parent))

    def get(self, obj: dict, key: str, where: str, kind: type | tuple[type, ...], want: str) -> Any:
        field = f"{where}.{key}" if where else key
        if key not in obj:
            raise UserError(f"{self.path}: {field} is missing; " + REBUILD.format(dir=self.path.parent))
        value = obj[key]
        if not isinstance(value, kind) or (isinstance(value, bool) and bool not in _as_tuple(kind)):
            raise self.fail(field, value, want)
        return value

    def count(self, obj: dict, key: str, where: str, least: int = 0) -> int:
        value = self.get(obj, key, where, int, f"not a whole number >= {least}")
        if value < least:
            raise self.fail(f"{where}.{key}" if where else key, value, f"not a whole number >= {least}")
        return value

    def mapping(self, obj: dict, key: str, where: str = "") -> dict:
        return self.get(obj, key, where, dict, "not a JSON object")


def _as_tuple(kind: type | tuple[type, ...]) -> tuple[type, ...]:
    return kind if isinstance(kind, tuple) else (kind,)


def _entry(f: _Fields, raw: Any, i: int, index_in_split: dict[str, int], suffix: str) -> ShardEntry:
    where = f"shards[{i}]"
    if not isinstance(raw, dict):
        raise f.fail(where, raw, "not a JSON object with file, split, tokens, sha256 and end")
    split = f.get(raw, "split", where, str, f"not one of {' or '.join(SPLITS)}")
    if split not in SPLITS:
        raise f.fail(f"{where}.split", split, f"not one of {' or '.join(SPLITS)}")
    expected = shard_name(split, index_in_split[split], suffix)
    name = f.get(raw, "file", where, str, f"not the file name {expected!r}")
    if name != expected:
        raise f.fail(f"{where}.file", name, f"but shard {index_in_split[split]} of split {split!r} is {expected!r}")
    index_in_split[split] += 1
    tokens = f.count(raw, "tokens", where, least=1)
    sha = f.get(raw, "sha256", where, str, "not a sha256 (64 hex digits)")
    if not _SHA256.match(sha):
        raise f.fail(f"{where}.sha256", sha, "not a sha256 (64 hex digits)")
    end = f.get(raw, "end", where, list, "not [document, offset] (two whole numbers)")
    if len(end) != 2 or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in end):
        raise f.fail(f"{where}.end", end, "not [document, offset] (two whole numbers)")
    return ShardEntry(name, split, tokens, sha, (end[0], end[1]))


def _check_runs(f: _Fields, shards: list[ShardEntry], shard_tokens: int) -> None:
    """Within a split: full shards but the last, stream positions strictly increasing."""
    for split in SPLITS:
        mine = [(i, e) for i, e in enumerate(shards) if e.split == split]
        for k, (i, e) in enumerate(mine):
            if k < len(mine) - 1 and e.tokens != shard_tokens:
                raise f.fail(f"shards[{i}].tokens", e.tokens,
                             f"but every shard but a split's last holds shard_tokens={shard_tokens}")
            if e.tokens > shard_tokens:
                raise f.fail(f"shards[{i}].tokens", e.tokens, f"more than shard_tokens={shard_tokens}")
            if k and e.end <= mine[k - 1][1].end:
                raise f.fail(f"shards[{i}].end", list(e.end), f"not after the previous {split} shard's end")


def _totals(f: _Fields, raw: dict, shards: list[ShardEntry]) -> dict[str, SplitTotals]:
    splits = f.mapping(raw, "splits")
    out: dict[str, SplitTotals] = {}
    for s in SPLITS:
        where = f"splits.{s}"
        t = f.mapping(splits, s, "splits")
        totals = SplitTotals(f.count(t, "documents", where), f.count(t, "tokens", where), f.count(t, "shards", where),
                             f.count(t, "bytes", where) if s == "val" else None)
        mine = [e for e in shards if e.split == s]
        if totals.tokens != sum(e.tokens for e in mine):
            raise f.fail(f"{where}.tokens", totals.tokens, f"but its shards hold {sum(e.tokens for e in mine)}")
        if totals.shards != len(mine):
            raise f.fail(f"{where}.shards", totals.shards, f"but the manifest lists {len(mine)} {s} shards")
        out[s] = totals
    return out


def _parse(path: Path, raw: Any) -> ShardManifest:
    f = _Fields(path)
    if not isinstance(raw, dict) or raw.get("format") != SHARD_FORMAT:
        got = f"format {json.dumps(raw.get('format'))}" if isinstance(raw, dict) else f"a JSON {type(raw).__name__}"
        raise UserError(f"{path}: not a {SHARD_FORMAT} manifest ({got}); " + FOREIGN.format(dir=path.parent))
    dtype_name = f.get(raw, "dtype", "", str, f"not one of {', '.join(DTYPES)}")
    if dtype_name not in DTYPES:
        raise f.fail("dtype", dtype_name, f"not one of {', '.join(DTYPES)}")
    file_format = f.get(raw, "file_format", "", str, f"not one of {', '.join(SUFFIXES)}")
    if file_format not in SUFFIXES:
        raise f.fail("file_format", file_format, f"not one of {', '.join(SUFFIXES)}")
    shard_tokens = f.count(raw, "shard_tokens", "", least=1)
    t = f.mapping(raw, "tokenizer")
    eos = f.get(t, "eos_id", "tokenizer", (int, type(None)), "not a token id or null")
    tokenizer = TokenizerRecord(f.get(t, "spec", "tokenizer", str, "not a string"),
                                f.get(t, "identity", "tokenizer", str, "not a string"),
                                f.count(t, "vocab_size", "tokenizer", least=1), eos)
    if dtype_name != shard_dtype(tokenizer.vocab_size).name:
        raise f.fail("dtype", dtype_name, f"but tokenizer.vocab_size={tokenizer.vocab_size} makes "
                     f"{shard_dtype(tokenizer.vocab_size).name} shards")
    f.mapping(raw, "source")
    listed = f.get(raw, "shards", "", list, "not a list of shard entries")
    index_in_split = dict.fromkeys(SPLITS, 0)
    shards = [_entry(f, e, i, index_in_split, SUFFIXES[file_format]) for i, e in enumerate(listed)]
    _check_runs(f, shards, shard_tokens)
    complete = f.get(raw, "complete", "", bool, "not true or false")
    splits = fingerprint = None
    if complete:
        splits = _totals(f, raw, shards)
        fingerprint = f.get(raw, "corpus_fingerprint", "", str, "not a string")
    return ShardManifest(path, raw, np.dtype(dtype_name).newbyteorder("<"), file_format, shard_tokens, tokenizer,
                         shards, complete, splits, fingerprint)


def read_manifest(root: Path) -> ShardManifest:
    """The typed manifest of the shard directory root; UserError (field, value, fix) when it is unreadable,
    malformed or contradicts itself. FileNotFoundError when there is none."""
    path = root / MANIFEST
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise
    except (OSError, UnicodeDecodeError) as err:
        raise UserError(f"{path}: unreadable ({type(err).__name__}); " + REBUILD.format(dir=root)) from None
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as err:
        raise UserError(f"{path}: not valid JSON ({err.msg}); " + FOREIGN.format(dir=root)) from None
    return _parse(path, raw)


def _npy_header(path: Path) -> tuple[tuple[int, ...], np.dtype, int] | None:
    """(shape, dtype, header bytes) of a .npy file, None when it has no valid header."""
    fmt = np.lib.format
    try:
        with open(path, "rb") as fh:
            read = {(1, 0): fmt.read_array_header_1_0, (2, 0): fmt.read_array_header_2_0}.get(fmt.read_magic(fh))
            if read is None:
                return None
            shape, _, dtype = read(fh)
            return tuple(shape), np.dtype(dtype), fh.tell()
    except (ValueError, OSError, SyntaxError):  # numpy's header readers: ValueError, or literal_eval's SyntaxError
        return None


def shard_problem(root: Path, entry: ShardEntry, m: ShardManifest,
                  sha256: Callable[[Path], str] = sha256_file) -> str | None:
    """Why root/entry.file does not hold what the manifest says (None when it does): missing, a size or
    header that does not fit `entry.tokens` tokens of the manifest's dtype, or another sha256."""
    path = root / entry.file
    if not path.is_file():
        return "shard missing"
    size = path.stat().st_size
    payload = entry.tokens * m.dtype.itemsize
    if m.file_format == "npy":
        header = _npy_header(path)
        if header is None:
            return "not a readable .npy file"
        shape, dtype, offset = header
        if shape != (entry.tokens,) or dtype != m.dtype or size != offset + payload:
            return (f"holds {shape[0] if len(shape) == 1 else shape} {dtype} tokens in {size} bytes, "
                    f"the manifest says {entry.tokens} {m.dtype.name}")
    elif size != payload:
        whole = "" if size % m.dtype.itemsize == 0 else f", not a whole number of {m.dtype.name} tokens"
        return (f"{size} bytes{whole}; the manifest says {entry.tokens} {m.dtype.name} tokens "
                f"({payload} bytes)")
    if sha256(path) != entry.sha256:
        return "sha256 does not match the manifest (the shard is corrupt)"
    return None
