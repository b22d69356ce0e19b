"""The on-disk cache shared by trials on one machine: corpora, tokenizers and token arrays.

`build_once(final_dir, build)` makes a directory exactly once even when several processes race:
a file lock serialises the builders, each builds into a private temporary directory, and an
atomic rename publishes it. Readers only ever see a complete directory; one found damaged later
(an `intact` check fails) is moved aside and built again.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from filelock import FileLock

__all__ = ["build_once", "cache_root", "sha256_file"]


def cache_root(configured: str = "") -> Path:
    """The cache directory: the configured one, else $HDROPE_CACHE, else ~/.cache/hdrope."""
    root = Path(configured or os.environ.get("HDROPE_CACHE") or Path.home() / ".cache" / "hdrope").expanduser()
    root.mkdir(parents=True, exist_ok=True)
    return root


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    """Hex sha256 of a file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def build_once(final_dir: Path, build: Callable[[Path], None], intact: Callable[[Path], bool] | None = None) -> Path:
    """Return final_dir, calling build(tmp_dir) to create it first if no process has yet.

    With `intact`, a final_dir it rejects (truncated, half-deleted: it is a cache) is replaced by a fresh build."""
    ok = (lambda d: True) if intact is None else intact
    if final_dir.is_dir() and ok(final_dir):
        return final_dir
    final_dir.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(final_dir) + ".lock"):
        if final_dir.is_dir():
            if ok(final_dir):  # another process finished while we waited
                return final_dir
            print(f"hdrope: {final_dir}: a damaged cache entry; rebuilding it", file=sys.stderr)
            damaged = Path(tempfile.mkdtemp(prefix=f".{final_dir.name}-damaged-", dir=final_dir.parent))
            os.replace(final_dir, damaged / final_dir.name)  # readers that have it open keep their files
            shutil.rmtree(damaged, ignore_errors=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{final_dir.name}-", dir=final_dir.parent))
        try:
            build(tmp)
            os.replace(tmp, final_dir)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return final_dir
