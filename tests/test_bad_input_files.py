"""Bad flags and tampered files through the real `hdrope` console: exit 2, one clear line, no traceback (the cases
through its `main` in this process; the baseline, the taken port and `sweep submit` through a fresh interpreter).

Each row of CASES is (id, setup, argv, expected): setup writes the bad input under a test's working
directory, which holds its own copy of a tiny trained run (`run/`) and a tiny passkey dataset
(`ds/`), both made once per module; argv and expected may name `{tmp}`, `{ckpt}` and `{ds}`.
"""

import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from hdrope.errors import UserError
from trainer.data.tokenizer import ByteTokenizer
from trainer.evals.passkey.builder import BuildConfig, build_dataset
from trainer.files.cache import sha256_file

Setup = Callable[[Path], None]
CKPT = "run/checkpoints/step_00000002"
DATASET = dict(form="nospace", v_min=1, v_max=9, max_len=512, targets=1, depth_steps=2, lines_per_file=1)
BUILD = ["passkey", "build", "--tokenizer", "bytes", "--form", "nospace", "--v-max", "9", "--min-len", "256",
         "--max-len", "512", "--out", "{tmp}/out"]
EVAL = ["passkey", "eval", "{ckpt}", "{ds}", "--no-progress"]
THEORY = ["theory", "--out", "{tmp}/theory"]
DELETE_CKPT = "delete this checkpoint directory to resume from the previous one"


def nothing(tmp: Path) -> None:
    """No file to spoil: the flags are the bad input."""


def write(rel: str, data: str | bytes) -> Setup:
    """Overwrite (or create) tmp/rel with data."""

    def setup(tmp: Path) -> None:
        path = tmp / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data.encode() if isinstance(data, str) else data)

    return setup


def edit(rel: str, old: str, new: str) -> Setup:
    """Replace old (which must be there) by new in tmp/rel."""

    def setup(tmp: Path) -> None:
        text = (tmp / rel).read_text()
        assert old in text
        (tmp / rel).write_text(text.replace(old, new))

    return setup


def rename_bucket(tmp: Path) -> None:
    """Rename the dataset's bucket directory (named by its length, e.g. 512) to a name that is no number."""
    (bucket,) = [d for d in (tmp / "ds").iterdir() if d.is_dir()]
    bucket.rename(bucket.with_name("bucket-x"))


def append_line(text: str) -> Setup:
    """Add a line to the dataset's JSONL file (its line 2)."""

    def setup(tmp: Path) -> None:
        (jsonl,) = (tmp / "ds").glob("*/*.jsonl")
        with jsonl.open("a") as f:
            f.write(text + "\n")

    return setup


def tampered(rel: str, data: str | bytes) -> Setup:
    """Overwrite a checkpoint file and recompute the manifest, so only reading the file can catch it."""

    def setup(tmp: Path) -> None:
        write(f"{CKPT}/{rel}", data)(tmp)
        manifest = tmp / CKPT / "manifest.json"
        names = json.loads(manifest.read_text())
        manifest.write_text(json.dumps({name: sha256_file(tmp / CKPT / name) for name in names}))

    return setup


def torch_saved(obj: object) -> bytes:
    """obj as the bytes of a torch.save file."""
    import io

    import torch

    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


CASES = [
    # hdrope passkey build
    ("build-out-is-a-file", write("out", "x"), BUILD, "--out {tmp}/out: is a file, not a directory"),
    ("build-out-holds-foreign-files", write("out/notes.txt", "mine"), BUILD,
     "--out {tmp}/out: holds 'notes.txt', which `hdrope passkey build` did not write; pass a new or empty directory"),
    ("build-max-len-absurd", nothing, [*BUILD, "--max-len", str(10**12)],
     "--max-len 1000000000000: questions of up to 1e+12 tokens, at least 1e+03 GB of text per line; keep --max-len <="),
    ("build-v-max-absurd", nothing, [*BUILD, "--v-max", str(10**15)],
     "--v-max 1000000000000000: the range [--v-min 1, --v-max] holds 1e+15 integers"),
    ("build-targets-absurd", nothing, [*BUILD, "--targets", str(10**9)],
     "--targets 1000000000 × --depth-steps 10 over 1 bucket(s): up to 1e+10 files to plan"),
    ("build-stride-from-zero", nothing, [*BUILD, "--stride-from", "0", "--adaptive-stride"],
     "--stride-from 0: must be >= 1"),
    # hdrope passkey eval: the dataset and --out
    ("eval-jsonl-line-not-json", append_line("not json"), EVAL, ".jsonl:2: not JSON (Expecting value"),
    ("eval-jsonl-line-without-answer", append_line('{"question": "q"}'), EVAL,
     """.jsonl:2: no 'answer' string in '{"question": "q"}'"""),
    ("eval-meta-garbage", write("ds/dataset_meta.json", "garbage"), EVAL,
     "{ds}/dataset_meta.json: not valid JSON (Expecting value: line 1 column 1 (char 0)); rebuild the dataset"),
    ("eval-meta-empty-object", write("ds/dataset_meta.json", "{}"), EVAL,
     "{ds}/dataset_meta.json: no 'tokenizer' string in '{}'; rebuild the dataset"),
    ("eval-bucket-dir-not-a-number", rename_bucket, EVAL,
     "{ds}/bucket-x: holds JSONL files but is no bucket directory: a bucket is named by its target length in tokens, "
     "a whole number such as 1024, and 'bucket-x' is not; rename it to its bucket's length or move it out"),
    ("eval-out-in-missing-dir", nothing, [*EVAL, "--out", "{tmp}/missing/acc.parquet"],
     "--out {tmp}/missing/acc.parquet: directory {tmp}/missing does not exist"),
    # tampered checkpoints, read by hdrope passkey eval
    ("ckpt-trainer-state-garbage", tampered("trainer_state.pt", "garbage"), EVAL,
     f"{{ckpt}}: trainer_state.pt is unreadable (not a weights-only torch.save file); {DELETE_CKPT}"),
    ("ckpt-trainer-state-not-weights-only", tampered("trainer_state.pt", torch_saved({"rng": Path("x")})), EVAL,
     f"{{ckpt}}: trainer_state.pt is unreadable (not a weights-only torch.save file); {DELETE_CKPT}"),
    ("ckpt-state-json-empty-object", tampered("state.json", "{}"), EVAL,
     f"{{ckpt}}: state.json is unreadable (missing or malformed step, python_rng, numpy_rng); {DELETE_CKPT}"),
    ("ckpt-state-json-garbage", tampered("state.json", "garbage"), EVAL,
     f"{{ckpt}}: state.json is unreadable (not JSON: Expecting value: line 1 column 1 (char 0)); {DELETE_CKPT}"),
    # hdrope export: OUT_DIR, and a run whose config.yaml was spoiled after training
    ("export-out-is-a-file", write("afile.txt", "x"), ["export", "{ckpt}", "{tmp}/afile.txt"],
     "OUT_DIR {tmp}/afile.txt: is a file, not a directory"),
    ("export-out-under-a-file", write("afile.txt", "x"), ["export", "{ckpt}", "{tmp}/afile.txt/hf"],
     "OUT_DIR {tmp}/afile.txt/hf: is under the file {tmp}/afile.txt, not a directory"),
    ("export-config-not-yaml", write("run/config.yaml", "model: [1, 2\n"), ["export", "{ckpt}", "{tmp}/hf"],
     "{tmp}/run/config.yaml: not valid YAML: while parsing a flow sequence; the run's config.yaml is damaged"),
    ("export-config-edited-after-training", edit("run/config.yaml", "basis: paley", "basis: identity"),
     ["export", "{ckpt}", "{tmp}/hf"], "config.yaml (or the run's tokenizer) was changed after training; restore "
                                       "the config.yaml the run wrote"),
    ("passkey-eval-config-edited-after-training", edit("run/config.yaml", "basis: paley", "basis: identity"), EVAL,
     "config.yaml (or the run's tokenizer) was changed after training"),
    # hdrope train: what no encoding can be built with, and torchrun's environment
    ("train-fope-keeps-no-frequency", nothing, ["train", "tiny", "model.pe.kind=fope", "model.max_seq_len=4"],
     "model.max_seq_len=4: FoPE keeps only frequencies that finish a period within the train length"),
    ("train-pe-null", nothing, ["train", "tiny", "model.pe=null"], "model.pe=None: must be a mapping with a kind"),
    ("train-tables-too-large", nothing, ["train", "tiny", "model.max_seq_len=100000000"],
     "model.max_seq_len=100000000: the position tables of 100000000 positions × head_dim 32 take about 83.4 GiB"),
    # hdrope theory
    ("theory-train-len-negative", nothing, [*THEORY, "--train-len", "-5"], "--train-len -5: must be a positive number"),
    ("theory-max-distance-zero", nothing, [*THEORY, "--max-distance", "0"], "--max-distance 0: must be a positive"),
    ("theory-head-dim-zero", nothing, [*THEORY, "--head-dim", "0"], "--head-dim 0: must be a positive number"),
    ("theory-head-dim-odd", nothing, [*THEORY, "--head-dim", "63", "--rotation-dim", "2"],
     "--head-dim 63: must be even"),
    # tracking stores, servers and clusters that cannot be used (checked before anything starts)
    ("train-tracking-uri-under-a-file", write("afile.txt", "x"),
     ["train", "tiny", "--tracking-uri", "sqlite:///{tmp}/afile.txt/mlflow.db"],
     "--tracking-uri sqlite:///{tmp}/afile.txt/mlflow.db: {tmp}/afile.txt is a file"),
    ("sweep-tracking-uri-under-a-file", write("afile.txt", "x"),
     ["sweep", "run", "{tmp}/s.yaml", "--tracking-uri", "sqlite:///{tmp}/afile.txt/m.db"],
     "--tracking-uri sqlite:///{tmp}/afile.txt/m.db: {tmp}/afile.txt is a file"),
    ("submit-to-a-closed-port", nothing, ["sweep", "submit", "{tmp}/s.yaml", "--address", "http://127.0.0.1:9",
                                          "--working-dir", "{tmp}"],
     "--address http://127.0.0.1:9: no Ray dashboard answers there"),
    ("ui-on-all-interfaces-without-allowed-hosts", nothing,
     ["ui", "--tracking-uri", "sqlite:///{tmp}/m.db", "--host", "0.0.0.0"],
     "--host 0.0.0.0 exposes the MLflow UI (no login) beyond this machine; pass --allowed-hosts"),
]


@pytest.fixture(scope="module")
def originals(cache_dir, tmp_path_factory) -> Path:
    """A tiny run trained for 2 steps (`run/`) and a one-file passkey dataset (`ds/`), made once."""
    from trainer.presets import load_config
    from trainer.run.loop import train

    root = tmp_path_factory.mktemp("originals")
    run = train(load_config("tiny", [f"data.cache_dir={cache_dir}", f"train.out_dir={root / 'run'}", "train.steps=2",
                                     "eval.passkey.enabled=false", "eval.extrapolation_batches=0"]))
    assert run.checkpoint == root / CKPT
    build_dataset(ByteTokenizer(), BuildConfig(**DATASET), root / "ds", cache_dir=cache_dir)
    return root


@pytest.fixture
def work(originals, tmp_path) -> Path:
    """This test's own copy of the run and the dataset, free to spoil, and a valid tiny sweep spec `s.yaml`."""
    for name in ("run", "ds"):
        shutil.copytree(originals / name, tmp_path / name)
    (tmp_path / "s.yaml").write_text(f"name: s\nbase: tiny\nstorage: {tmp_path / 'store'}\n"
                                     "axes: {model.pe.rotation_dim: [2, 4]}\n")
    return tmp_path


def test_ui_on_a_taken_port_exits_2_naming_it(work):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        out = hdrope(["ui", "--tracking-uri", f"sqlite:///{work}/m.db", "--port", str(port)], work)
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr[-2000:]
    assert f"--port {port}: 127.0.0.1:{port} is already in use" in out.stderr


def test_the_untouched_copies_evaluate(work):
    """The baseline every eval row spoils: exit 0."""
    out = hdrope(EVAL, work)
    assert out.returncode == 0, out.stderr[-2000:]


@pytest.mark.parametrize("setup,argv,expected", [case[1:] for case in CASES], ids=[case[0] for case in CASES])
def test_bad_input_exits_2_with_one_clear_line(work, setup, argv, expected, hdrope_here):
    setup(work)
    # `sweep submit` makes a Ray job client, whose auth mode Ray fixes once per process: a process of its own
    out = hdrope(argv, work) if argv[:2] == ["sweep", "submit"] else hdrope_here([fill(a, work) for a in argv], work)
    assert out.returncode == 2, out.stderr[-2000:]
    assert "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr[-2000:]
    assert fill(expected, work) in out.stderr


IN_PROCESS = [  # more checkpoint spoilers, through load_checkpoint itself (no interpreter start each)
    ("trainer-state-empty-dict", tampered("trainer_state.pt", torch_saved({})), "no RNG state of this trainer"),
    ("trainer-state-cut-short", tampered("trainer_state.pt", b""), "empty or cut short"),
    ("state-json-a-list", tampered("state.json", "[1]"), "not a JSON object: '[1]'"),
    ("manifest-a-list", write(f"{CKPT}/manifest.json", "[]"), "manifest.json is corrupt"),
]


@pytest.mark.parametrize("setup,expected", [case[1:] for case in IN_PROCESS], ids=[case[0] for case in IN_PROCESS])
def test_spoiled_checkpoint_is_a_user_error(work, setup, expected):
    from trainer.model.llama import Llama
    from trainer.presets import load_config
    from trainer.run.checkpoint import load_checkpoint

    setup(work)
    with pytest.raises(UserError) as err:
        load_checkpoint(work / CKPT, Llama(load_config("tiny").model))
    assert expected in str(err.value) and str(err.value).endswith(DELETE_CKPT)


def test_rebuild_replaces_its_own_outputs_and_refuses_anything_else(tmp_path, cache_dir):
    out = tmp_path / "ds"
    build_dataset(ByteTokenizer(), BuildConfig(**{**DATASET, "max_len": 768}), out, cache_dir=cache_dir)
    assert {p.name for p in out.iterdir()} == {"512", "768", "dataset_meta.json", "summary.json"}
    build_dataset(ByteTokenizer(), BuildConfig(**DATASET), out, summary=False, cache_dir=cache_dir)
    assert {p.name for p in out.iterdir()} == {"512", "dataset_meta.json"}  # no stale bucket, no stale summary
    (out / "eval_0.parquet").write_text("results")
    with pytest.raises(UserError, match=r"holds 'eval_0\.parquet'"):
        build_dataset(ByteTokenizer(), BuildConfig(**DATASET), out, dry_run=True, cache_dir=cache_dir)
    assert {p.name for p in out.iterdir()} == {"512", "dataset_meta.json", "eval_0.parquet"}  # nothing deleted


def fill(text: str, work: Path) -> str:
    """text with {tmp}, {ckpt} and {ds} replaced by this test's paths."""
    for name, path in (("ckpt", work / CKPT), ("ds", work / "ds"), ("tmp", work)):
        text = text.replace("{" + name + "}", str(path))
    return text


def hdrope(argv: list[str], work: Path) -> subprocess.CompletedProcess:
    """`hdrope ARGV` (placeholders filled) in a fresh interpreter."""
    return subprocess.run([sys.executable, "-m", "sweeps.console", *(fill(a, work) for a in argv)],
                          capture_output=True, text=True, timeout=120)
