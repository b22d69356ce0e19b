"""The hostile edges of `hdrope data prepare` and training on shards: nothing of the user's is overwritten, an
edited corpus or manifest is never taken as current, prepare and training give one answer, and every bad
input is exit 2 naming the field, the value and the fix."""

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from test_data_prepare import _write_corpus

from hdrope.errors import UserError
from sweeps.console import main
from trainer.config import DataConfig
from trainer.data.corpus import load_corpus
from trainer.data.shard_manifest import MANIFEST
from trainer.data.shard_prepare import prepare_shards, usable_cpus
from trainer.data.shard_tokens import load_shards
from trainer.data.token_cache import cached_tokens
from trainer.data.tokenizer import ByteTokenizer
from trainer.files.dir_lock import LOCK_FILE


def _args(paths: list[str], out: Path, *extra: str) -> list[str]:
    return ["data", "prepare", "data.corpus=files", f"data.paths=[{paths[0]},{paths[1]}]", "--out", str(out),
            "--shard-tokens", "20000", "--workers", "1", "--no-progress", *extra]


def _hdrope(argv: list[str], capsys) -> tuple[int, str, str]:
    """`hdrope ARGV` through the console's own dispatch, in this process: (exit code, stdout, stderr)."""
    rc = main(argv)
    out = capsys.readouterr()
    return rc, out.out, out.err


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    """A small corpus (40 documents, about 180k byte tokens) and its complete shards, made once."""
    root = tmp_path_factory.mktemp("prepared")
    paths = _write_corpus(root / "corpus", docs=40, seed=5)
    cfg = DataConfig(corpus="files", paths=paths, cache_dir=str(root / "cache"))
    res = prepare_shards(cfg, root / "shards", shard_tokens=20_000)
    assert res.complete and len(res.manifest["shards"]) >= 8
    return root, paths


@pytest.fixture
def work(prepared, tmp_path):
    """The corpus (not to be edited) and this test's copy of its shards: (paths, shards dir, cache dir)."""
    root, paths = prepared
    shutil.copytree(root / "shards", tmp_path / "shards")
    return paths, tmp_path / "shards", str(tmp_path / "cache")


def _edit_manifest(shards: Path, edit) -> None:
    path = shards / MANIFEST
    manifest = json.loads(path.read_text())
    edit(manifest)
    path.write_text(json.dumps(manifest))


def _same_size_edit(path: Path) -> None:
    """Change the file's content, keeping its size and its modification time."""
    st = path.stat()
    text = path.read_text()
    assert "king" in text
    path.write_text(text.replace("king", "gnik", 1))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert path.stat().st_size == st.st_size and path.stat().st_mtime_ns == st.st_mtime_ns


# ---- 1. a directory that is not prepare's ---------------------------------------------------------------


def test_prepare_never_overwrites_a_users_file_in_a_foreign_directory(work, tmp_path, capsys):
    paths, _, _ = work
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "val-000000.npy").write_bytes(b"the user's own array")
    rc, _, err = _hdrope(_args(paths, foreign), capsys)
    assert rc == 2, err
    assert (f"--out {foreign}: holds 'val-000000.npy', which `hdrope data prepare` did not write "
            "(the directory holds no manifest.json); give a new or empty directory") in err
    assert (foreign / "val-000000.npy").read_bytes() == b"the user's own array"
    assert sorted(p.name for p in foreign.iterdir()) == ["val-000000.npy"]  # not even a lock file left


@pytest.mark.parametrize("under", [False, True])
def test_prepare_out_that_is_a_file_or_under_one(work, tmp_path, capsys, under):
    paths, _, _ = work
    (tmp_path / "afile").write_text("mine")
    out = tmp_path / "afile" / "shards" if under else tmp_path / "afile"
    rc, _, err = _hdrope(_args(paths, out), capsys)
    where = f"is under the file {tmp_path / 'afile'}" if under else "is a file"
    assert rc == 2 and f"--out {out}: {where}, not a directory; give a directory path" in err, err
    assert (tmp_path / "afile").read_text() == "mine"


# ---- 2. an edited corpus is another corpus -----------------------------------------------------------------


@pytest.mark.parametrize("interrupted", [True, False])
def test_a_corpus_edited_keeping_sizes_and_times_is_not_current(prepared, tmp_path, capsys, interrupted):
    shutil.copytree(prepared[0] / "corpus", tmp_path / "corpus", copy_function=shutil.copy2)  # keeps mtimes
    paths = [str(tmp_path / "corpus" / "*.jsonl"), str(tmp_path / "corpus" / "*.txt")]
    out = tmp_path / "new"
    rc, _, err = _hdrope(_args(paths, out, *(["--max-shards", "2"] if interrupted else [])), capsys)
    assert rc == 0, err
    edited = tmp_path / "corpus" / "a.jsonl"
    _same_size_edit(edited)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    rc, _, err = _hdrope(_args(paths, out), capsys)
    assert rc == 2, err
    assert (f"--out {out}: its shards were made from another version of the corpus (changed: {edited}); "
            f"give a new --out, or remove {out} and prepare again") in err
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # nothing mixed in
    shutil.rmtree(out)  # the fix works
    rc, _, err = _hdrope(_args(paths, out), capsys)
    assert rc == 0, err
    cfg = DataConfig(corpus="files", paths=paths)
    assert json.loads((out / MANIFEST).read_text())["corpus_fingerprint"] == load_corpus(cfg).fingerprint


# ---- 3. and 4. one check of the manifest, one answer from prepare and training ----------------------------


def _both(paths, shards: Path, cache: str, capsys) -> tuple[str, tuple[int, str]]:
    """What training (load_shards) and a rerun of prepare say of shards: (training's error, (rc, stderr))."""
    with pytest.raises(UserError) as err:
        load_shards(str(shards), ByteTokenizer(), cache)
    rc, _, stderr = _hdrope(_args(paths, shards), capsys)
    return str(err.value), (rc, stderr)


def test_a_manifest_that_contradicts_itself_gets_one_answer_that_works(work, capsys):
    paths, shards, cache = work
    _edit_manifest(shards, lambda m: m["shards"][1].update(tokens=19_999))
    training, (rc, prepare) = _both(paths, shards, cache, capsys)
    expected = (f"{shards / MANIFEST}: shards[1].tokens is 19999, but every shard but a split's last holds "
                f"shard_tokens=20000; the manifest was edited or is damaged, so its shards cannot be trusted: remove "
                f"the directory {shards} and run `hdrope data prepare --out {shards}` again")
    assert training.startswith(expected)
    assert rc == 2 and expected in prepare, prepare  # prepare says the same, not "already complete"
    shutil.rmtree(shards)  # the fix works
    assert _hdrope(_args(paths, shards), capsys)[0] == 0
    assert len(load_shards(str(shards), ByteTokenizer(), cache).train) > 0


def test_a_shard_that_disagrees_with_its_entry_is_remade_by_the_prepare_training_asks_for(work, capsys):
    paths, shards, cache = work
    manifest = json.loads((shards / MANIFEST).read_text())
    last = max(i for i, e in enumerate(manifest["shards"]) if e["split"] == "train")

    def edit(m):  # the last train shard's count, with the totals kept consistent: only the file can tell
        m["shards"][last]["tokens"] -= 1
        m["splits"]["train"]["tokens"] -= 1

    _edit_manifest(shards, edit)
    with pytest.raises(UserError) as err:
        load_shards(str(shards), ByteTokenizer(), cache)
    name = manifest["shards"][last]["file"]
    assert str(err.value).startswith(f"{shards / name}: holds ")
    assert f"rerun `hdrope data prepare` with --out {shards}" in str(err.value)
    rc, out, stderr = _hdrope(_args(paths, shards), capsys)
    kept = len(manifest["shards"]) - 1  # all but the one that disagrees
    assert rc == 0 and "already complete" not in out and f"({kept} kept from an earlier run)" in out, out + stderr
    assert json.loads((shards / MANIFEST).read_text()) == manifest  # repaired, byte for byte the same shards
    assert len(load_shards(str(shards), ByteTokenizer(), cache).train) == manifest["splits"]["train"]["tokens"]


@pytest.mark.parametrize("split", ["test", "val"])
def test_a_relabelled_shard_is_refused(work, capsys, split):
    paths, shards, cache = work
    _edit_manifest(shards, lambda m: m["shards"][1].update(split=split))
    training, (rc, prepare) = _both(paths, shards, cache, capsys)
    want = ("not one of train or val" if split == "test"
            else "but shard 0 of split 'val' is 'val-000000.npy'")
    assert f"shards[1].{'split' if split == 'test' else 'file'} is " in training and want in training
    assert rc == 2 and training in prepare


def test_shards_without_their_manifest_get_one_answer(work, capsys):
    paths, shards, cache = work
    (shards / MANIFEST).unlink()
    training, (rc, prepare) = _both(paths, shards, cache, capsys)
    assert "missing; data.shards_dir must be a directory written by `hdrope data prepare`" in training
    assert "prepare the corpus into a new or empty directory" in training
    assert rc == 2 and "holds 'train-000000.npy' and" in prepare and "give a new or empty directory" in prepare


# ---- 8. and 9. malformed manifests: the field, the value, the fix -------------------------------------------

BAD_MANIFESTS = [  # (id, edit, expected in the message)
    ("entry-not-an-object", lambda m: m["shards"].__setitem__(0, "train-000000.npy"),
     'shards[0] is "train-000000.npy", not a JSON object with file, split, tokens, sha256 and end'),
    ("entry-without-split", lambda m: m["shards"][0].pop("split"), "shards[0].split is missing"),
    ("entry-split-test", lambda m: m["shards"][0].update(split="test"),
     'shards[0].split is "test", not one of train or val'),
    ("entry-end-a-number", lambda m: m["shards"][0].update(end=7),
     "shards[0].end is 7, not [document, offset] (two whole numbers)"),
    ("dtype-bogus", lambda m: m.update(dtype="bogus"), 'dtype is "bogus", not one of uint16, uint32'),
    ("dtype-too-wide", lambda m: m.update(dtype="uint32"),
     'dtype is "uint32", but tokenizer.vocab_size=259 makes uint16 shards'),
    ("no-splits", lambda m: m.pop("splits"), "splits is missing"),
    ("no-fingerprint", lambda m: m.pop("corpus_fingerprint"), "corpus_fingerprint is missing"),
    ("tokenizer-a-string", lambda m: m.update(tokenizer="bytes"), 'tokenizer is "bytes", not a JSON object'),
    ("bytes-a-string", lambda m: m["splits"]["val"].update(bytes="many"),
     'splits.val.bytes is "many", not a whole number >= 0'),
    ("tokens-a-bool", lambda m: m["shards"][0].update(tokens=True), "shards[0].tokens is true, not a whole number"),
    ("totals-off", lambda m: m["splits"]["val"].update(tokens=1), "splits.val.tokens is 1, but its shards hold"),
]


@pytest.mark.parametrize("edit,expected", [c[1:] for c in BAD_MANIFESTS], ids=[c[0] for c in BAD_MANIFESTS])
def test_a_malformed_manifest_is_one_user_error_for_prepare_and_training(work, capsys, edit, expected):
    paths, shards, cache = work
    _edit_manifest(shards, edit)
    training, (rc, prepare) = _both(paths, shards, cache, capsys)
    assert training.startswith(f"{shards / MANIFEST}: {expected}"), training
    assert training.endswith("(or prepare into a new --out)")
    assert rc == 2 and "Traceback" not in prepare and training in prepare, prepare


def test_resume_of_a_malformed_manifest_is_a_user_error(work, tmp_path, capsys):
    paths, _, _ = work
    out = tmp_path / "cut"
    assert _hdrope(_args(paths, out, "--max-shards", "3"), capsys)[0] == 0
    _edit_manifest(out, lambda m: m["shards"][2].update(end=[1]))
    rc, _, err = _hdrope(_args(paths, out), capsys)
    assert rc == 2 and "shards[2].end is [1], not [document, offset]" in err, err


def test_a_bin_shard_whose_size_does_not_fit_its_dtype(work, tmp_path, capsys):
    paths, _, cache = work
    out = tmp_path / "bin"
    assert _hdrope([*_args(paths, out), "--format", "bin"], capsys)[0] == 0
    with open(out / "val-000000.bin", "ab") as f:
        f.write(b"\0")
    with pytest.raises(UserError) as err:
        load_shards(str(out), ByteTokenizer(), cache)
    assert str(err.value).startswith(f"{out / 'val-000000.bin'}: ")
    assert "bytes, not a whole number of uint16 tokens; the manifest says" in str(err.value)
    assert "rerun `hdrope data prepare`" in str(err.value)
    assert _hdrope([*_args(paths, out), "--format", "bin"], capsys)[0] == 0  # which re-makes it
    assert len(load_shards(str(out), ByteTokenizer(), cache).val) > 0


def test_hdrope_train_on_a_manifest_with_a_string_tokenizer_exits_2(work, tmp_path, hdrope_here):
    _, shards, _ = work
    _edit_manifest(shards, lambda m: m.update(tokenizer="bytes"))
    out = hdrope_here(["train", "tiny", "data.corpus=shards", f"data.shards_dir={shards}",
                       f"train.out_dir={tmp_path / 'run'}", "--no-progress"])
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr[-2000:]
    assert f'{shards / MANIFEST}: tokenizer is "bytes", not a JSON object' in out.stderr


# ---- 5. one writer per shard directory ---------------------------------------------------------------------

HOLD = ("import sys, time; from pathlib import Path; from trainer.files.dir_lock import hold_dir_lock\n"
        "with hold_dir_lock(Path(sys.argv[1]), 'hdrope data prepare'):\n"
        "    print('held', flush=True); time.sleep(120)\n")


def test_a_second_prepare_into_one_directory_is_refused_naming_the_first(work, tmp_path, capsys):
    paths, _, _ = work
    out = tmp_path / "busy"
    first = subprocess.Popen([sys.executable, "-c", HOLD, str(out)], stdout=subprocess.PIPE, text=True)
    try:
        assert first.stdout is not None and first.stdout.readline().strip() == "held"
        rc, _, err = _hdrope(_args(paths, out), capsys)
        assert rc == 2, err
        assert f"{out} is in use by hdrope data prepare (PID {first.pid}, started " in err
        assert not (out / MANIFEST).exists()
    finally:
        first.kill()
        first.wait()
    rc, _, err = _hdrope(_args(paths, out), capsys)  # the holder is gone (killed): its lock does not block
    assert rc == 0, err
    assert (out / LOCK_FILE).read_text() == ""


def test_two_prepares_at_once_one_writes_and_the_other_is_refused_or_finds_it_done(work, tmp_path):
    paths, _, _ = work
    out = tmp_path / "race"
    cmd = [sys.executable, "-m", "sweeps.console", *_args(paths, out)]
    cmd[cmd.index("20000")] = "2000"  # ~90 shards: the writers overlap
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    results = [(p.pid, p.wait(timeout=300), *p.communicate()) for p in procs]
    for pid, rc, _, err in results:
        assert rc in (0, 2) and "Traceback" not in err, err
        if rc == 2:
            other = next(q for q, *_ in results if q != pid)
            assert f"{out} is in use by hdrope data prepare (PID {other}, started " in err
    assert any(rc == 0 for _, rc, _, _ in results)
    assert len(load_shards(str(out), ByteTokenizer(), str(tmp_path / "cache")).train) > 0


# ---- 6. and 7. resources ---------------------------------------------------------------------------------


@pytest.mark.slow
def test_tiny_shards_take_linear_time(tmp_path):
    paths = _write_corpus(tmp_path / "corpus", docs=6, seed=6)  # 35k byte tokens: 7k shards
    cfg = DataConfig(corpus="files", paths=paths, cache_dir=str(tmp_path / "cache"))
    start = time.perf_counter()
    res = prepare_shards(cfg, tmp_path / "shards", shard_tokens=5)
    took = time.perf_counter() - start
    tokens = sum(e["tokens"] for e in res.manifest["shards"])
    assert res.complete and 25_000 < tokens < 50_000 and len(res.manifest["shards"]) > 5_000, tokens
    assert took < 60, f"{tokens} tokens in 5-token shards took {took:.1f} s"  # 5 s here; quadratic: tens of minutes
    memory = cached_tokens(load_corpus(cfg), ByteTokenizer(), cfg.cache_dir)
    shards = load_shards(str(tmp_path / "shards"), ByteTokenizer(), cfg.cache_dir)
    assert np.array_equal(np.asarray(shards.train), memory.train)


def test_more_workers_than_cpus_are_capped_with_a_warning(work, tmp_path, capsys):
    paths, _, _ = work
    cpus = usable_cpus()
    argv = _args(paths, tmp_path / "w")
    argv[argv.index("--workers") + 1] = str(cpus + 22)
    rc, out, err = _hdrope(argv, capsys)
    assert rc == 0, err
    assert f"warning: --workers {cpus + 22} is more than the {cpus} CPUs this process may use; using {cpus}" in err
    assert f"with {cpus} worker(s)" in out


# ---- 8. overrides and corpora that cannot be read ---------------------------------------------------------


@pytest.mark.parametrize("command", ["data", "train"])
def test_an_override_that_is_not_yaml_is_named(tmp_path, capsys, command):
    argv = (["data", "prepare", "data.paths=[a", "--out", str(tmp_path / "s")] if command == "data"
            else ["train", "tiny", "data.paths=[a"])
    rc, _, err = _hdrope(argv, capsys)
    assert rc == 2, err
    assert ("override 'data.paths=[a': the value is not valid YAML (did not find expected ',' or ']'); "
            "close the brackets and quotes") in err
    assert not (tmp_path / "s").exists()


HF = ["data", "prepare", "data.corpus=hf", "data.hf_dataset=someone/some-corpus", "--no-progress"]


def test_hf_corpus_offline_is_a_user_error(tmp_path):
    pytest.importorskip("datasets")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    out = subprocess.run([sys.executable, "-m", "sweeps.console", *HF, "--out", str(tmp_path / "s")],
                         capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr[-2000:]
    assert ("data.corpus=hf: data.hf_dataset='someone/some-corpus' cannot be streamed from the Hugging Face Hub"
            in out.stderr)
    assert "data.corpus=shards" in out.stderr


def test_hf_corpus_without_the_datasets_package_is_a_user_error(tmp_path):
    code = ("import sys; sys.modules['datasets'] = None; from sweeps.console import main; "
            f"sys.exit(main({[*HF, '--out', str(tmp_path / 's')]!r}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr[-2000:]
    assert "data.corpus=hf needs the `datasets` package: pip install -e '.[hf]'" in out.stderr


# ---- 10. a damaged token cache is rebuilt -------------------------------------------------------------------


def test_a_truncated_token_cache_is_rebuilt(work, tmp_path, capsys):
    paths, _, _ = work
    cfg = DataConfig(corpus="files", paths=paths, cache_dir=str(tmp_path / "tc"))
    corpus = load_corpus(cfg)
    first = cached_tokens(corpus, ByteTokenizer(), cfg.cache_dir)
    expected = np.array(first.train)
    train = first.path / "train.npy"
    del first
    with open(train, "r+b") as f:
        f.truncate(train.stat().st_size // 2)
    again = cached_tokens(corpus, ByteTokenizer(), cfg.cache_dir)
    assert np.array_equal(np.asarray(again.train), expected)
    assert f"{again.path}: a damaged cache entry; rebuilding it" in capsys.readouterr().err
    (again.path / "val.npy").unlink()
    assert len(cached_tokens(corpus, ByteTokenizer(), cfg.cache_dir).val) > 0
