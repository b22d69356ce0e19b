"""`hdrope data prepare`: token shards equal the in-memory tokens, resume byte-identically, and train exactly."""

import contextlib
import json
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from hdrope.errors import UserError
from trainer.config import DataConfig
from trainer.data.corpus import load_corpus
from trainer.data.shard_prepare import MANIFEST, prepare_shards
from trainer.data.shard_tokens import ShardStream, load_shards
from trainer.data.token_cache import cached_tokens
from trainer.data.tokenizer import ByteTokenizer, load_tokenizer, train_bpe

WORDS = ("the king queen sword love night day crown fool ghost storm river stone light tower wind "
         "whether thou art mine or not I shall go unto the sea and find the lost ring of gold").split()


def _write_corpus(root: Path, docs: int, seed: int = 0) -> list[str]:
    """Deterministic synthetic documents as two .jsonl files and a few .txt files; returns data.paths globs."""
    rng = random.Random(seed)
    root.mkdir(parents=True, exist_ok=True)
    texts = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(20, 2000))) + "." for _ in range(docs)]
    half = docs // 2
    for name, part in (("a.jsonl", texts[:half]), ("b.jsonl", texts[half:-3])):
        (root / name).write_text("".join(json.dumps({"text": t}) + "\n" for t in part))
    for i, t in enumerate(texts[-3:]):
        (root / f"c{i}.txt").write_text(t)
    return [str(root / "*.jsonl"), str(root / "*.txt")]


def _files(paths: list[str], cache: str, tokenizer: str = "bytes") -> DataConfig:
    return DataConfig(corpus="files", paths=paths, tokenizer=tokenizer, cache_dir=cache)


def _stream(shards, split: str) -> np.ndarray:
    return np.asarray(getattr(shards, split))


def test_shards_hold_exactly_the_in_memory_tokens(tmp_path):
    paths = _write_corpus(tmp_path / "corpus", docs=1400)  # ~3.6 MB of text
    cache = str(tmp_path / "cache")
    tok_path = tmp_path / "tokenizer.json"
    train_bpe([(tmp_path / "corpus" / "c0.txt").read_text()], 320, tok_path)
    cfg = _files(paths, cache, str(tok_path))
    res = prepare_shards(cfg, tmp_path / "shards", shard_tokens=50_000, workers=2)
    assert res.complete and len(res.manifest["shards"]) > 20  # many small shards
    corpus = load_corpus(cfg)
    tok = load_tokenizer(str(tok_path))
    memory = cached_tokens(corpus, tok, cache)
    shards = load_shards(str(tmp_path / "shards"), tok, cache)
    for split in ("train", "val"):
        assert np.array_equal(_stream(shards, split), getattr(memory, split))
    assert res.manifest["corpus_fingerprint"] == corpus.fingerprint
    assert res.manifest["splits"]["val"]["documents"] == len(corpus.val)
    assert res.manifest["splits"]["val"]["bytes"] == sum(len(t.encode()) for t in corpus.val)
    assert all(e["tokens"] == 50_000 for e in res.manifest["shards"][:5])
    assert shards.train.parts[0].dtype == np.uint16


def test_shard_stream_slices_across_boundaries():
    whole = np.arange(100, dtype=np.uint16)
    stream = ShardStream([whole[:7], whole[7:8], whole[8:50], whole[50:]])
    assert len(stream) == 100
    for a, b in [(0, 100), (5, 9), (7, 8), (6, 60), (49, 51), (99, 100), (30, 30)]:
        assert np.array_equal(stream[a:b], whole[a:b])


@pytest.fixture
def prepare_cli(hdrope_here):
    """`hdrope data prepare ARGS --no-progress` in this process (a run killed mid-way is a process of its own)."""
    return lambda *args: hdrope_here(["data", "prepare", *args, "--no-progress"])


def test_interrupted_prepare_resumes_to_byte_identical_shards(tmp_path, prepare_cli):
    paths = _write_corpus(tmp_path / "corpus", docs=300, seed=1)
    common = ["data.corpus=files", f"data.paths=[{paths[0]},{paths[1]}]", f"data.cache_dir={tmp_path / 'cache'}",
              "--shard-tokens", "40000", "--format", "bin", "--workers", "2"]
    whole = prepare_cli(*common, "--out", str(tmp_path / "whole"))
    assert whole.returncode == 0, whole.stderr
    assert "tokens/s" in whole.stdout
    cut = prepare_cli(*common, "--out", str(tmp_path / "cut"), "--max-shards", "4")
    assert cut.returncode == 0 and "rerun" in cut.stdout, cut.stderr
    partial = json.loads((tmp_path / "cut" / MANIFEST).read_text())
    assert not partial["complete"] and len(partial["shards"]) == 4
    names = sorted(p.name for p in (tmp_path / "whole").iterdir())
    assert len(names) > 10
    # a second interruption, then a shard damaged while the run was down: it is re-made, the others kept
    assert prepare_cli(*common, "--out", str(tmp_path / "cut"), "--max-shards", "2").returncode == 0
    damaged = tmp_path / "cut" / "train-000001.bin"
    damaged.write_bytes(b"\0" * damaged.stat().st_size)
    done = prepare_cli(*common, "--out", str(tmp_path / "cut"))
    assert done.returncode == 0, done.stderr
    assert "kept from an earlier run" in done.stdout
    assert sorted(p.name for p in (tmp_path / "cut").iterdir()) == names
    for name in names:
        assert (tmp_path / "cut" / name).read_bytes() == (tmp_path / "whole" / name).read_bytes(), name
    again = prepare_cli(*common, "--out", str(tmp_path / "cut"))
    assert again.returncode == 0 and "already complete" in again.stdout


def test_prepare_killed_mid_run_resumes_to_byte_identical_shards(tmp_path, prepare_cli):
    paths = _write_corpus(tmp_path / "corpus", docs=600, seed=4)
    tok_path = tmp_path / "tokenizer.json"
    train_bpe([(tmp_path / "corpus" / "c0.txt").read_text()], 300, tok_path)
    common = ["data.corpus=files", f"data.paths=[{paths[0]},{paths[1]}]", f"data.tokenizer={tok_path}",
              "--shard-tokens", "5000", "--workers", "1"]
    assert prepare_cli(*common, "--out", str(tmp_path / "whole")).returncode == 0
    cmd = [sys.executable, "-m", "sweeps.console", "data", "prepare", *common, "--out", str(tmp_path / "killed"),
           "--no-progress"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    manifest, seen = tmp_path / "killed" / MANIFEST, 0
    while proc.poll() is None and seen < 5:
        try:
            seen = len(json.loads(manifest.read_text())["shards"])
        except (OSError, ValueError):
            pass
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    assert proc.wait() == -signal.SIGKILL, "prepare finished before it could be killed"
    assert not json.loads(manifest.read_text())["complete"]
    done = prepare_cli(*common, "--out", str(tmp_path / "killed"))
    assert done.returncode == 0, done.stderr
    names = sorted(p.name for p in (tmp_path / "whole").iterdir())
    assert sorted(p.name for p in (tmp_path / "killed").iterdir()) == names
    for name in names:
        assert (tmp_path / "killed" / name).read_bytes() == (tmp_path / "whole" / name).read_bytes(), name


def test_prepare_refuses_another_preparation_in_the_same_directory(tmp_path):
    paths = _write_corpus(tmp_path / "corpus", docs=40, seed=2)
    cfg = _files(paths, str(tmp_path / "cache"))
    prepare_shards(cfg, tmp_path / "s", shard_tokens=10_000)
    with pytest.raises(UserError, match="shard_tokens differ"):
        prepare_shards(cfg, tmp_path / "s", shard_tokens=20_000)
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    with pytest.raises(UserError, match=r"holds no manifest\.json"):
        prepare_shards(cfg, tmp_path / "other")


@pytest.fixture(scope="module")
def small_shards(tmp_path_factory):
    root = tmp_path_factory.mktemp("shards")
    paths = _write_corpus(root / "corpus", docs=120, seed=3)
    cfg = _files(paths, str(root / "cache"))
    prepare_shards(cfg, root / "shards", shard_tokens=8_192, workers=1)
    return root, paths


def test_training_from_shards_equals_training_in_memory(small_shards, tiny_cfg):
    from trainer.run.loop import train

    root, paths = small_shards
    short = ["train.steps=6", "train.eval_every=0", "train.ckpt_every=0", "eval.passkey.enabled=false"]
    files = ["data.corpus=files", f"data.paths=[{paths[0]},{paths[1]}]"]
    sharded = train(tiny_cfg(*short, "data.corpus=shards", f"data.shards_dir={root / 'shards'}", out="shards"))
    memory = train(tiny_cfg(*short, *files, out="memory"))
    assert sharded.losses == memory.losses  # the same windows, bitwise
    assert sharded.metrics["val_loss"] == memory.metrics["val_loss"]
    assert sharded.metrics["val_bpb"] == pytest.approx(memory.metrics["val_bpb"], rel=1e-12)


@pytest.fixture
def train_cli(hdrope_here):
    """`hdrope train tiny ARGS --no-progress` in this process."""
    return lambda *args: hdrope_here(["train", "tiny", *args, "--no-progress"])


def test_hdrope_train_from_shards_and_corrupt_shard_exits_2(small_shards, tmp_path, cache_dir, train_cli):
    root, _ = small_shards
    shards = tmp_path / "copy"
    shards.mkdir()
    for f in (root / "shards").iterdir():
        (shards / f.name).write_bytes(f.read_bytes())
    args = ["data.corpus=shards", f"data.shards_dir={shards}", "train.steps=4", "train.eval_every=0",
            "eval.passkey.enabled=false", f"train.out_dir={tmp_path / 'run'}"]
    ok = train_cli(*args)
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["step"] == 4
    target = shards / "train-000002.npy"
    data = bytearray(target.read_bytes())
    data[-1] ^= 0xFF
    target.write_bytes(bytes(data))
    bad = train_cli(*args, f"train.out_dir={tmp_path / 'run2'}")
    assert bad.returncode == 2
    assert "train-000002.npy" in bad.stderr and "sha256" in bad.stderr and "hdrope data prepare" in bad.stderr
    (shards / MANIFEST).write_text("{not json")
    bad = train_cli(*args, f"train.out_dir={tmp_path / 'run3'}")
    assert bad.returncode == 2 and "manifest.json" in bad.stderr and "hdrope data prepare" in bad.stderr


def test_shards_config_is_validated(tiny_cfg):
    with pytest.raises(UserError, match=r"data\.shards_dir is empty"):
        tiny_cfg("data.corpus=shards")
    with pytest.raises(UserError, match=r"data\.tokenizer=bpe with corpus=shards"):
        tiny_cfg("data.corpus=shards", "data.shards_dir=/x", "data.tokenizer=bpe")


def test_shards_refuse_another_tokenizer(small_shards, tmp_path):
    root, _ = small_shards
    tok_path = tmp_path / "tokenizer.json"
    train_bpe(["some words to learn from " * 20], 300, tok_path)
    with pytest.raises(UserError, match=r"set data\.tokenizer=bytes"):
        load_shards(str(root / "shards"), load_tokenizer(str(tok_path)), str(tmp_path / "cache"))
    assert len(load_shards(str(root / "shards"), ByteTokenizer(), str(tmp_path / "cache")).val) > 0


def test_a_shard_changed_after_it_verified_is_caught(small_shards, tmp_path):
    root, _ = small_shards
    copy, cache = tmp_path / "copy", str(tmp_path / "cache")
    copy.mkdir()
    for f in (root / "shards").iterdir():
        (copy / f.name).write_bytes(f.read_bytes())
    first = load_shards(str(copy), ByteTokenizer(), cache)
    assert list((tmp_path / "cache" / "shard-checks").glob("*.json"))  # the verified shards are remembered
    expected = np.asarray(first.val)
    assert np.array_equal(np.asarray(load_shards(str(copy), ByteTokenizer(), cache).val), expected)
    target = copy / "val-000000.npy"
    data = bytearray(target.read_bytes())
    data[200] ^= 1
    target.write_bytes(bytes(data))
    with pytest.raises(UserError, match=r"val-000000\.npy: sha256 does not match"):
        load_shards(str(copy), ByteTokenizer(), cache)


def test_sigkill_of_prepare_leaves_no_worker_alive(tmp_path):
    """SIGKILL of `hdrope data prepare --workers 2` (no cleanup runs in the driver): its spawned tokenizer workers die
    with it, and multiprocessing's resource tracker follows; nothing it started is alive a few seconds later."""
    import psutil

    paths = _write_corpus(tmp_path / "corpus", docs=1500, seed=5)
    tok_path = tmp_path / "tokenizer.json"
    train_bpe([(tmp_path / "corpus" / "c0.txt").read_text()], 300, tok_path)
    cmd = [sys.executable, "-m", "sweeps.console", "data", "prepare", "data.corpus=files",
           f"data.paths=[{paths[0]},{paths[1]}]", f"data.tokenizer={tok_path}", "--shard-tokens", "5000",
           "--workers", "2", "--out", str(tmp_path / "shards"), "--no-progress"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    driver, started = psutil.Process(proc.pid), []
    try:
        deadline = time.monotonic() + 120
        while proc.poll() is None and time.monotonic() < deadline:
            started = driver.children(recursive=True)
            if len(started) >= 3 and (tmp_path / "shards" / MANIFEST).is_file():  # tracker + 2 workers at work
                break
            time.sleep(0.05)
        assert len(started) >= 3, f"prepare ended or never started its workers: {proc.poll()}"
        proc.send_signal(signal.SIGKILL)
        assert proc.wait() == -signal.SIGKILL, "prepare finished before it could be killed"
        _, alive = psutil.wait_procs(started, timeout=10)
        assert not [p for p in alive if p.status() != psutil.STATUS_ZOMBIE], [p.cmdline() for p in alive]
    finally:
        for p in started:
            with contextlib.suppress(psutil.Error):
                p.kill()
