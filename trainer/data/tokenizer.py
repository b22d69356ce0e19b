"""Tokenizers behind one interface: raw bytes, a byte-level BPE trained on the train split, or a tokenizer.json.

`load_tokenizer(cfg.data, corpus)` picks one from `data.tokenizer`: `bytes`, `bpe` (trained with
HF `tokenizers`, cached by a hash of the training text and the vocabulary size) or a path to a
`tokenizer.json`. Every tokenizer encodes without adding special tokens. A path is made absolute once,
when the config is assembled (`absolute_tokenizer`), and a run's config hash holds the file's sha256,
not its path (`tokenizer_hash_key`).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Protocol

from hdrope.errors import UserError
from trainer.files.cache import build_once, cache_root, sha256_file

__all__ = ["BPE_SPECIALS", "BUILTIN_TOKENIZERS", "ByteTokenizer", "JsonTokenizer", "Tokenizer", "absolute_tokenizer",
           "load_tokenizer", "tokenizer_hash_key", "tokenizer_problem", "train_bpe"]

BPE_SPECIALS = ["<|endoftext|>", "<|pad|>"]
BUILTIN_TOKENIZERS = ("bytes", "bpe")  # every other data.tokenizer is the path of a tokenizer.json
_EOS_NAMES = ("<|endoftext|>", "</s>", "<eos>", "<|end_of_text|>", "[SEP]")
_BOS_NAMES = ("<|begin_of_text|>", "<s>", "<bos>", "<|startoftext|>", "[CLS]")
_PAD_NAMES = ("<|pad|>", "<pad>", "[PAD]", "<|padding|>")


class Tokenizer(Protocol):
    """What the trainer needs of a tokenizer."""

    vocab_size: int
    eos_id: int | None
    identity: str  # changes whenever the mapping text -> ids could change

    def encode(self, text: str) -> list[int]: ...

    def encode_batch(self, texts: list[str]) -> list[list[int]]: ...

    def decode(self, ids: list[int]) -> str: ...


class ByteTokenizer:
    """UTF-8 bytes 0..255 plus <bos>=256, <eos>=257, <pad>=258."""

    vocab_size = 259
    bos_id, eos_id, pad_id = 256, 257, 258
    identity = "bytes-v1"

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [self.encode(t) for t in texts]

    def decode(self, ids: list[int]) -> str:
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")


class JsonTokenizer:
    """A HF `tokenizers` tokenizer loaded from a tokenizer.json file."""

    def __init__(self, path: Path) -> None:
        from tokenizers import Tokenizer as HFTokenizer

        try:
            self._tok = HFTokenizer.from_file(str(path))
        except Exception as err:  # `tokenizers` raises the bare Exception class for a bad file; a subclass is a bug
            if type(err) is not Exception:
                raise
            raise UserError(f"data.tokenizer={str(path)!r}: not a loadable tokenizer.json ({err})") from None
        self.path = path
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)
        self.bos_id, self.eos_id, self.pad_id = (self._special(names) for names in (_BOS_NAMES, _EOS_NAMES, _PAD_NAMES))
        self.identity = "json-" + sha256_file(path)[:16]

    def _special(self, names: tuple[str, ...]) -> int | None:
        """The id of the first of these special tokens the vocabulary has, or None."""
        return next((i for n in names if (i := self._tok.token_to_id(n)) is not None), None)

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [e.ids for e in self._tok.encode_batch(texts, add_special_tokens=False)]

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids, skip_special_tokens=True)


def train_bpe(texts: list[str], vocab_size: int, out: Path) -> None:
    """Train a deterministic byte-level BPE on texts and save it as out (tokenizer.json)."""
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import decoders, models, pre_tokenizers, trainers

    tok = HFTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=BPE_SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer, length=len(texts))
    tok.save(str(out))


def _bpe_path(texts: list[str], vocab_size: int, cache_dir: str) -> Path:
    import tokenizers

    h = hashlib.sha256(f"bpe-v1|{vocab_size}|{tokenizers.__version__}".encode())
    for t in texts:
        h.update(hashlib.sha256(t.encode()).digest())
    final = cache_root(cache_dir) / "tokenizers" / f"bpe-{vocab_size}-{h.hexdigest()[:16]}"
    return build_once(final, lambda tmp: train_bpe(texts, vocab_size, tmp / "tokenizer.json")) / "tokenizer.json"


def absolute_tokenizer(kind: str) -> str:
    """data.tokenizer with a path made absolute against the current directory (bytes and bpe as they are)."""
    if kind in BUILTIN_TOKENIZERS or not isinstance(kind, str) or not kind:
        return kind
    return os.path.abspath(Path(kind).expanduser())


def tokenizer_problem(kind: str) -> str | None:
    """Why data.tokenizer names no usable tokenizer (the field, the value, the fix), or None."""
    if kind in BUILTIN_TOKENIZERS:
        return None
    path = Path(kind).expanduser()
    if path.suffix != ".json" or not path.is_file():
        return (f"data.tokenizer={kind!r}: not 'bytes', 'bpe' or an existing tokenizer.json path; "
                "give the path of a HF tokenizer.json file")
    return None


def tokenizer_hash_key(kind: str) -> str:
    """What a config hash holds for data.tokenizer: bytes and bpe as they are, a tokenizer.json by its content
    (sha256), so a moved copy is the same run and an edited file another one. A path that names no file (a
    paper-scale spec planned before its tokenizer is in place) counts by its path; training it fails on the
    missing file, so such a hash never names a run."""
    if kind in BUILTIN_TOKENIZERS or tokenizer_problem(kind) is not None:
        return kind
    return "sha256:" + sha256_file(Path(kind).expanduser())


def load_tokenizer(kind: str, train_texts: list[str] | None = None, vocab_size: int = 1024, cache_dir: str = ""):
    """`bytes`, `bpe` (needs train_texts) or a tokenizer.json path -> Tokenizer."""
    if kind == "bytes":
        return ByteTokenizer()
    if kind == "bpe":
        if not train_texts:
            raise UserError("data.tokenizer=bpe needs training text to learn merges from")
        return JsonTokenizer(_bpe_path(train_texts, vocab_size, cache_dir))
    if (problem := tokenizer_problem(kind)) is not None:
        raise UserError(problem)
    return JsonTokenizer(Path(kind).expanduser())
