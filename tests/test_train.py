"""The training loop on the tiny preset and real Shakespeare: determinism, exact resume, failures, metrics."""

import itertools
import json
import math
import subprocess
import sys

import pytest
import torch

from hdrope.errors import UserError
from trainer.config import OptimConfig, config_errors, config_hash
from trainer.model.llama import Llama
from trainer.run.checkpoint import latest_checkpoint, list_checkpoints, load_checkpoint
from trainer.run.loop import TrainingDiverged, train
from trainer.run.optim import lr_at
from trainer.run.reporting import Reporter

FAST = ["eval.passkey.enabled=false", "eval.extrapolation_batches=0"]
METRICS = {"train_loss", "val_loss", "val_bpb", "tokens_per_s", "mfu", "val_loss_x2", "val_loss_x4", "val_loss_x8",
           "passkey_acc"}


class Interrupt(Exception):
    pass


class StopAt(Reporter):
    """Simulates a crash after `step` steps (after that step's checkpoint was written)."""

    def __init__(self, step: int) -> None:
        self.step = step

    def checkpoint(self, step, path, metrics):
        if step == self.step:
            raise Interrupt(step)


def trains_dumps_and_resumes(tiny_cfg, *overrides: str):
    """Train 12 steps with `overrides` and a dump, then again cut at step 6 and resumed: assert the loss fell, the
    dumped maps are causal distributions, and the resumed loss curve equals the whole one bit for bit; the maps."""
    import numpy as np
    import pyarrow.parquet as pq

    overrides = (*overrides, "train.steps=12", "train.ckpt_every=6", "dump.enabled=true", *FAST)
    whole = train(tiny_cfg(*overrides, out="whole"))
    assert whole.losses[-1] < whole.losses[0]
    maps = pq.read_table(whole.artifacts["attention"]).column("attn").combine_chunks().to_numpy_ndarray()
    np.testing.assert_allclose(maps.astype(np.float64).sum(-1), 1.0, atol=2e-2)  # rows are distributions (fp16)
    assert np.all(np.triu(maps, 1) == 0)
    with pytest.raises(Interrupt):
        train(tiny_cfg(*overrides, out="cut"), StopAt(6))
    resumed = train(tiny_cfg(*overrides, out="cut"))
    assert resumed.resumed_from == 6 and resumed.losses == whole.losses
    return maps


def test_same_seed_same_loss_curve_and_metric_names(tiny_cfg):
    a = train(tiny_cfg("train.steps=20", out="a"))
    b = train(tiny_cfg("train.steps=20", out="b"))
    assert a.losses == b.losses and len(a.losses) == 20
    assert a.losses[-1] < a.losses[0] - 1.0  # it learns
    assert METRICS <= set(a.metrics)
    c = train(tiny_cfg("train.steps=20", "train.seed=7", out="c"))
    assert c.losses != a.losses
    lines = [json.loads(x) for x in (a.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines if "lr" in x] == [10, 20] and "val_loss_x8" in lines[-1]
    assert all(0 < x["mfu"] < 5 for x in lines if "mfu" in x)


def test_resume_continues_exactly(tiny_cfg):
    overrides = ["train.steps=24", "train.ckpt_every=8", *FAST]
    whole = train(tiny_cfg(*overrides, out="whole"))
    with pytest.raises(Interrupt):
        train(tiny_cfg(*overrides, out="cut"), StopAt(16))
    assert latest_checkpoint(whole.run_dir.parent / "cut" / "checkpoints").name == "step_00000016"
    resumed = train(tiny_cfg(*overrides, out="cut"))
    assert resumed.resumed_from == 16
    assert resumed.losses == whole.losses  # bitwise, step by step
    assert resumed.metrics["val_loss"] == whole.metrics["val_loss"]


def test_keep_last_prunes_old_checkpoints(tiny_cfg):
    r = train(tiny_cfg("train.steps=20", "train.ckpt_every=4", "train.keep_last=2", *FAST))
    names = [p.name for p in list_checkpoints(r.run_dir / "checkpoints")]
    assert names == ["step_00000016", "step_00000020"]


def test_corrupt_checkpoint_is_a_clear_error(tiny_cfg):
    r = train(tiny_cfg("train.steps=4", *FAST))
    weights = r.checkpoint / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    model = Llama(tiny_cfg().model)
    with pytest.raises(UserError, match=r"model\.safetensors is truncated or corrupt"):
        load_checkpoint(r.checkpoint, model)
    (r.checkpoint / "manifest.json").unlink()
    with pytest.raises(UserError, match=r"no manifest\.json"):
        load_checkpoint(r.checkpoint, model)


def test_nan_loss_stops_and_names_the_step(tiny_cfg):
    with pytest.raises(TrainingDiverged, match=r"loss is (nan|inf) at step [12] "):
        train(tiny_cfg("model.init_std=1e30", *FAST))


def test_sgd_and_bf16_run(tiny_cfg):
    r = train(tiny_cfg("train.steps=6", "optim.name=sgd", "optim.momentum=0.9", "optim.lr=0.1", *FAST, out="sgd"))
    assert all(map(lambda x: x == x, r.losses))
    b = train(tiny_cfg("train.steps=6", "train.dtype=bf16", *FAST, out="bf16"))
    assert abs(b.losses[0] - r.losses[0]) < 0.05  # same data, same init, bf16 rounding only


def test_passkey_table_and_mixture(tiny_cfg):
    import pyarrow.parquet as pq

    r = train(tiny_cfg("train.steps=4", "model.max_seq_len=160", "data.passkey_ratio=0.5",
                       "eval.passkey.length_factors=[1.0,2.0]", "eval.extrapolation_batches=0"))
    from trainer.evals.passkey.table import PASSKEY_SCHEMA

    assert pq.read_schema(r.artifacts["passkey"]).remove_metadata() == PASSKEY_SCHEMA  # the one passkey schema
    t = pq.read_table(r.artifacts["passkey"]).to_pylist()
    assert len(t) == 2 * 3  # length factors x depths x samples
    assert {row["rotation_dim"] for row in t} == {4} and all(row["length"] <= 320 for row in t)
    assert [row["depth_target"] for row in t[:3]] == [0.0, 0.5, 1.0]
    assert t[0]["depth"] == 0.0 < t[1]["depth"] < t[2]["depth"] == 1.0
    assert r.metrics["passkey_acc"] == sum(row["correct"] for row in t) / len(t)


@pytest.mark.parametrize(
    "overrides,match",
    [
        (["data.corpus=files", "data.paths=[SMALL]", "model.max_seq_len=4096"], r"model.max_seq_len \(training\)"),
        (["eval.extrapolation_batches=1", "eval.extrapolation=[2,100000]"], "largest factor that fits"),
        (["data.corpus=files", "data.paths=[/nonexistent/*.txt]"], "matches no file"),
        (["data.tokenizer=bpe", "data.bpe_vocab_size=300"], "model.vocab_size=259 is smaller"),
    ],
)
def test_data_dependent_errors_name_the_field(tiny_cfg, tmp_path, overrides, match):
    (tmp_path / "small.txt").write_text("a few words of text " * 150)
    overrides = [o.replace("SMALL", str(tmp_path / "small.txt")) for o in overrides]
    with pytest.raises(UserError, match=match):
        train(tiny_cfg(*FAST, *overrides))


def test_config_errors_lists_every_problem(tiny_cfg):
    cfg = tiny_cfg()
    cfg.optim.name, cfg.train.steps, cfg.dump.layers = "lion", 0, [7]
    errors = config_errors(cfg)
    assert len(errors) == 3
    assert any("optim.name='lion'" in e for e in errors) and any("dump.layers" in e for e in errors)


def test_config_hash_ignores_output_paths(tiny_cfg):
    assert config_hash(tiny_cfg(out="x")) == config_hash(tiny_cfg(out="y"))
    assert config_hash(tiny_cfg()) != config_hash(tiny_cfg("model.pe.theta=500000"))


def test_lr_schedule_shape():
    cfg = OptimConfig(lr=1e-4, warmup_start_lr=1e-6, final_lr=1e-6, warmup_steps=10, schedule="cosine")
    lrs = [lr_at(s, cfg, 100) for s in range(100)]
    assert lrs[0] == pytest.approx(1e-6 + (1e-4 - 1e-6) / 10) and lrs[9] == pytest.approx(1e-4)
    assert all(a >= b for a, b in itertools.pairwise(lrs[9:]))  # non-increasing after warmup
    assert lr_at(100, cfg, 100) == pytest.approx(1e-6)
    cfg.schedule = "linear"
    assert lr_at(55, cfg, 100) == pytest.approx(1e-6 + (1e-4 - 1e-6) * 0.5)


def test_cli_train_logs_to_mlflow(tmp_path, cache_dir, hdrope_here):  # the process boundary: test_cli_user_errors
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    out = hdrope_here(["train", "tiny", "train.steps=10", f"data.cache_dir={cache_dir}",
                       f"train.out_dir={tmp_path / 'run'}", "train.log_every=5", "train.eval_every=5", *FAST,
                       "--tracking-uri", uri, "--no-progress"])
    assert out.returncode == 0, out.stderr
    printed = json.loads(out.stdout)
    assert printed["step"] == 10
    import mlflow

    client = mlflow.MlflowClient(uri)
    exp = client.get_experiment_by_name("hdrope-train")
    (run,) = client.search_runs([exp.experiment_id])
    assert run.info.status == "FINISHED"
    assert run.data.params["model.pe.rotation_dim"] == "4"
    # each metric once, at the step it was computed; the final evaluation reaches MLflow (not the mid-run value)
    assert [m.step for m in client.get_metric_history(run.info.run_id, "train_loss")] == [5, 10]
    val = client.get_metric_history(run.info.run_id, "val_loss")
    assert [m.step for m in val] == [5, 10] and val[0].value != val[1].value
    assert round(val[1].value, 4) == printed["metrics"]["val_loss"]
    assert {a.path for a in client.list_artifacts(run.info.run_id)} >= {"config", "result"}


def test_cli_user_errors_exit_2(cache_dir):
    cmd = [sys.executable, "-m", "sweeps.console", "train", "tiny", "model.pe.rotation_dim=5"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "model.pe.rotation_dim=5" in out.stderr and "Traceback" not in out.stderr


def test_the_training_loop_reads_the_loss_back_only_at_log_steps(tiny_cfg, monkeypatch):
    # On a GPU each read of a device value stalls the stream; the loop keeps losses on the device and reads
    # them back in one transfer per log step (and checkpoint and end), never per micro-step; plus one read of the
    # first step's loss per process, before any update, so a loss already non-finite names the parameters it came
    # from (trainer/run/divergence.py, issue 34 §13).
    import sys

    reads: list[str] = []
    for name in ("item", "tolist", "__bool__", "__float__"):
        orig = getattr(torch.Tensor, name)

        def spy(self, *a, _orig=orig, _name=name):
            if sys._getframe(1).f_code.co_filename.endswith("trainer/run/loop.py"):
                reads.append(_name)
            return _orig(self, *a)

        monkeypatch.setattr(torch.Tensor, name, spy)
    r = train(tiny_cfg("train.steps=12", "train.grad_accum=2", "train.log_every=6", "train.eval_every=0",
                       "train.ckpt_every=0", *FAST))
    assert len(r.losses) == 12 and all(math.isfinite(x) for x in r.losses)
    assert reads == ["__float__", "tolist", "tolist"]  # step 1's check, then steps 6 and 12: 3 reads for 24 micro-steps


@pytest.mark.slow
def test_a_second_train_into_one_run_directory_is_refused_naming_the_first(tmp_path, cache_dir, hdrope_here):
    # both used to exit 0 over one mixed run directory
    import time

    run = tmp_path / "run"
    args = ["train", "tiny", f"data.cache_dir={cache_dir}", f"train.out_dir={run}", "train.steps=100000",
            "train.ckpt_every=0", "train.eval_every=0", *FAST, "--no-progress"]
    first = subprocess.Popen([sys.executable, "-m", "sweeps.console", *args], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not (run / "metrics.jsonl").is_file():  # the first is training
            assert first.poll() is None and time.monotonic() < deadline, first.communicate()[1][-2000:]
            time.sleep(0.2)
        second = hdrope_here(args)  # the same config (on the old code it trained alongside); refused before training
    finally:
        first.terminate()
        first.communicate(timeout=60)
    assert second.returncode == 2 and "Traceback" not in second.stderr, second.stderr[-2000:]
    assert f"{run} is in use by hdrope train of config " in second.stderr
    assert f"(PID {first.pid}, started " in second.stderr
    from trainer.files.run_files import read_metrics

    steps = [rec["step"] for rec in read_metrics(run / "metrics.jsonl")]
    assert steps and steps == sorted(set(steps))  # one writer: no step twice


def test_a_run_whose_checkpoints_are_all_damaged_is_refused_not_retrained_from_step_0(tiny_cfg):
    overrides = ["train.steps=8", "train.ckpt_every=4", "train.log_every=2", *FAST]
    r = train(tiny_cfg(*overrides))
    metrics = (r.run_dir / "metrics.jsonl").read_text()
    for ckpt in list_checkpoints(r.run_dir / "checkpoints"):
        (ckpt / "manifest.json").unlink()
    with pytest.raises(UserError) as err:
        train(tiny_cfg(*overrides))
    assert (f"train.out_dir={str(r.run_dir)!r}: its checkpoints step_00000004, step_00000008 have no manifest.json "
            "(damaged), so none can be resumed, and training again from step 0 would replace its metrics.jsonl; "
            "restore the checkpoints, or move the run directory away") in str(err.value)
    assert (r.run_dir / "metrics.jsonl").read_text() == metrics  # nothing replaced
    import shutil

    shutil.rmtree(r.run_dir / "checkpoints")  # a finished run with no checkpoint left: refused too
    with pytest.raises(UserError, match=r"it finished \(result\.json\) but has no checkpoint left"):
        train(tiny_cfg(*overrides))


def _bpe_file(path, text: str) -> str:
    from trainer.data.tokenizer import train_bpe

    path.parent.mkdir(parents=True, exist_ok=True)
    train_bpe([text], 300, path)
    return str(path)


def test_a_relative_tokenizer_path_is_the_runs_one_file_wherever_it_resumes(tmp_path, cache_dir, monkeypatch):
    # `data.tokenizer=tok.json` used to resolve against each command's current directory
    from hdrope.errors import UserError
    from trainer.data.tokenizer import JsonTokenizer
    from trainer.presets import load_config
    from trainer.run.trained import load_trained

    corpus = tmp_path / "small.txt"
    corpus.write_text("To be, or not to be, that is the question. " * 200)
    here, elsewhere = tmp_path / "here", tmp_path / "elsewhere"
    ours = _bpe_file(here / "tok.json", corpus.read_text())
    _bpe_file(elsewhere / "tok.json", "Now is the winter of our discontent. " * 200)  # same name, other merges
    overrides = [f"data.cache_dir={cache_dir}", f"train.out_dir={tmp_path / 'run'}", "data.corpus=files",
                 f"data.paths=[{corpus}]", "data.tokenizer=tok.json", "model.vocab_size=300", "train.steps=4", *FAST]
    monkeypatch.chdir(here)
    cfg = load_config("tiny", overrides)
    assert cfg.data.tokenizer == ours  # resolved once, when the config is assembled
    r = train(cfg)
    assert (r.run_dir / "tokenizer.json").read_bytes() == (here / "tok.json").read_bytes()  # kept with the run
    moved = tmp_path / "moved.json"
    moved.write_bytes((here / "tok.json").read_bytes())
    assert config_hash(load_config("tiny", [*overrides, f"data.tokenizer={moved}"])) == r.config_hash  # by content

    monkeypatch.chdir(elsewhere)
    (here / "tok.json").unlink()  # the original is gone: the run's copy serves
    trained = load_trained(r.checkpoint)
    assert trained.tok.identity == JsonTokenizer(r.run_dir / "tokenizer.json").identity
    assert trained.config_hash == r.config_hash
    with pytest.raises(UserError, match="holds a run of config"):  # elsewhere/tok.json is another tokenizer
        train(load_config("tiny", overrides))
