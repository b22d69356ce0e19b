"""Issue 34, the edges of the benches, `hdrope seeds`, `sweep plan --detect`, the batch producer, the loss by
position and a run whose loss goes non-finite: each hostile input gets the project's own message."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from hdrope.errors import UserError
from sweeps import console

BAD_BENCH_FLAGS = [
    (["tasks", "--rounds", "0"], "--rounds"),
    (["tasks", "--block", "0"], "--block"),
    (["tasks", "--threads", "-1"], "--threads"),
    (["tasks", "--ratio", "2"], "--ratio"),
    (["tasks", "--ratio", "nan"], "--ratio"),
    (["tasks", "--ratio", "-0.1"], "--ratio"),
    (["encodings", "--shape", "1", "2", "16", "-16"], "--shape"),
    (["encodings", "--shape", "0", "2", "16", "16"], "--shape"),
    (["encodings", "--threads", "-1"], "--threads"),
    (["encodings", "--json", "/nonexistent/dir/x.json"], "--json"),
    (["rotary", "--json", "/nonexistent/dir/x.json"], "--json"),
    (["rotary", "--dims", "0"], "--dims"),
    (["rotary", "--shape", "1", "1", "0", "8"], "--shape"),
    (["train", "--batch", "0"], "--batch"),
    (["train", "--rounds", "0"], "--rounds"),
    (["train", "--threads", "-2"], "--threads"),
    (["sweep", "--steps", "0"], "--steps"),
    (["sweep", "--concurrent", "0"], "--concurrent"),
    (["analysis", "--gib", "nan"], "--gib"),
    (["analysis", "--seconds", "inf"], "--seconds"),
]


@pytest.mark.parametrize(("args", "flag"), BAD_BENCH_FLAGS, ids=[" ".join(a) for a, _ in BAD_BENCH_FLAGS])
def test_a_bench_refuses_a_bad_flag_before_any_work(args, flag, capsys):
    """Issue 34 §10 and §12: `hdrope bench ...` with a count < 1, a negative thread count, a ratio outside [0, 1] or
    not finite, a non-positive shape, or a --json file in a missing folder exits 2 naming the flag, at once."""
    t0 = time.perf_counter()
    with pytest.raises(SystemExit) as exit_:
        console.main(["bench", *args])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {flag}" in err and "Traceback" not in err
    assert time.perf_counter() - t0 < 30  # refused while parsing (imports only), long before any bench finishes


def test_a_json_path_that_is_a_directory_is_refused(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        console.main(["bench", "encodings", "--json", str(tmp_path)])
    assert exit_.value.code == 2 and "argument --json" in capsys.readouterr().err


def _results(rows: list[tuple[str, dict, float | None, int, float]]) -> pd.DataFrame:
    """A results-shaped frame from (kind, pe fields, θ, seed, val_loss) rows, every cell finished."""
    from trainer.model.position import encoding_identity, pe_config_class

    out = []
    for kind, fields, theta, seed, value in rows:
        pe = pe_config_class(kind)(kind=kind, **fields, **({} if theta is None else {"theta": theta}))
        out.append({**encoding_identity(pe), "status": "FINISHED", "dedup_of": None, "seed": seed, "val_loss": value,
                    "run_dir": "/nonexistent/run"})
    df = pd.DataFrame(out)
    df.attrs = {"axes": ["model.pe", "seed"], "seed_axes": ["seed"]}
    return df


RNG_SEEDS = (1, 2, 3, 4)
ROPE = [2.0, 2.1, 1.9, 2.05]
PALEY = [v - 0.01 + d for v, d in zip(ROPE, [0.0001, -0.0001, 0.0002, 0.0], strict=True)]  # paired sd ~ 1e-4
ALIBI = [v + d for v, d in zip(ROPE, [0.03, -0.02, 0.01, -0.03], strict=True)]  # paired sd ~ 0.028


def _pilot(*variants: str) -> pd.DataFrame:
    from analysis.variants import trained

    rows = [("rope", {}, 1e4, s, v) for s, v in zip(RNG_SEEDS, ROPE, strict=True)]
    if "paley" in variants:
        rows += [("hdrope", {"rotation_dim": 4, "basis": "paley"}, 1e4, s, v)
                 for s, v in zip(RNG_SEEDS, PALEY, strict=True)]
    if "alibi" in variants:
        rows += [("alibi", {}, None, s, v) for s, v in zip(RNG_SEEDS, ALIBI, strict=True)]
    return trained(_results(rows))


def test_seed_advice_sizes_for_the_largest_spread_a_variant_without_theta_included():
    """Issue 34 §4: on a RoPE / 4D Paley / ALiBi pilot the spread of ALiBi − RoPE (ALiBi has no θ) was dropped, so the
    advice used Paley − RoPE's far smaller one; the size now comes from the largest, and the advice says which."""
    from analysis.power import pilot_spread

    sd, _, source = pilot_spread(_pilot("paley", "alibi"), Path("pilot"), "val_loss")
    expected = float(np.std(np.subtract(ALIBI, ROPE), ddof=1))
    assert sd == pytest.approx(expected)
    assert "ALiBi − RoPE at θ=10000" in source and "of 2 paired" in source


def test_seed_advice_on_a_rope_and_alibi_pilot_is_no_traceback():
    """Issue 34 §4: RoPE + ALiBi alone was `ValueError: All-NaN slice encountered`."""
    from analysis.power import pilot_spread

    sd, _, source = pilot_spread(_pilot("alibi"), Path("pilot"), "val_loss")
    assert sd == pytest.approx(float(np.std(np.subtract(ALIBI, ROPE), ddof=1)))
    assert "ALiBi − RoPE" in source


def test_the_planned_family_counts_a_variant_without_theta_at_every_theta():
    """Kin of §4: a report compares ALiBi with RoPE at each θ RoPE ran, so a plan over two θ draws four comparisons
    with 4D Paley and ALiBi, not three; a family counted short made the advice's α too lenient."""
    from analysis.comparisons import comparison_table
    from analysis.power import family_size
    from analysis.variants import trained

    rows = [(kind, fields, theta, s, float(s))
            for kind, fields, thetas in [("rope", {}, [1e4, 5e5]),
                                         ("hdrope", {"rotation_dim": 4, "basis": "paley"}, [1e4, 5e5]),
                                         ("alibi", {}, [None])]
            for theta in thetas for s in (1, 2)]
    planned = _results(rows)
    assert family_size(planned) == len(comparison_table(trained(planned), "val_loss")) == 4


def test_seed_advice_on_a_task_no_variant_learned_says_so():
    """Issue 34 §14: `--metric efflen_copy` on a 2-seed pilot that did not learn copy said "no variant of the pilot
    has 2 or more seeds"; it says the metric is empty because the task was not learned, naming the variants."""
    from analysis.lengthgen import with_effective_lengths
    from analysis.power import pilot_spread
    from analysis.variants import trained

    rows = [("rope", {}, 1e4, s, 2.0) for s in (1, 2)] + [("hdrope", {"rotation_dim": 4, "basis": "paley"}, 1e4, s, 2.0)
                                                          for s in (1, 2)]
    results = _results(rows).assign(acc_copy_x1=[0.25, 0.0, 0.125, 0.0], n_copy_x1=8, acc_copy_x2=0.0, n_copy_x2=8)
    cells = with_effective_lengths(trained(results))
    with pytest.raises(UserError) as err:
        pilot_spread(cells, Path("P"), "efflen_copy")
    message = str(err.value)
    assert "2 or more seeds" not in message
    assert "the task copy was not learned" in message and "RoPE at θ=10000 (2/16 at 1x)" in message
    assert "4D Paley at θ=10000 (1/16 at 1x)" in message
    # a pilot of one seed is still told to run more seeds
    with pytest.raises(UserError, match="2 or more seeds"):
        pilot_spread(cells[cells["seed"] == 1], Path("P"), "efflen_copy")


def _damaged_position_loss(run_dir: Path, column: str, values) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from trainer.evals.position_loss import POSITION_LOSS_FILE, PositionLoss, write_position_loss

    path = run_dir / POSITION_LOSS_FILE
    write_position_loss({1.0: PositionLoss(np.full(16, 2.0), np.full(16, 1)),
                         2.0: PositionLoss(np.full(32, 2.0), np.full(32, 1))}, 4, "linear", path)
    table = pq.read_table(path)
    at = table.column_names.index(column)
    pq.write_table(table.set_column(at, column, pa.array(values(table.column(column).to_pylist()))), path)


@pytest.mark.parametrize(("column", "values", "said"), [
    ("length_factor", lambda v: [0.0] * len(v), "length_factor = 0 in"),  # was ZeroDivisionError
    ("loss", lambda v: [str(x) for x in v], "column loss is stored as string"),  # was TypeError
    ("loss", lambda v: [float("nan")] * len(v), "loss = nan"),
    ("tokens", lambda v: [0] * len(v), "tokens = 0 in"),
    ("position", lambda v: [x + 1000 for x in v], "≥ its length"),
    ("length", lambda v: [None] * len(v), "column length is stored as null"),
])
def test_a_damaged_position_loss_file_is_refused_naming_the_file(tmp_path, column, values, said):
    """Issue 34 §9: a position_loss.parquet with length_factor 0, or its loss stored as text, is refused like a
    truncated one (UserError naming the file: exit 2 in `hdrope report`), not a ZeroDivisionError / TypeError."""
    from analysis.lengthgen import with_effective_lengths
    from trainer.evals.position_loss import POSITION_LOSS_FILE

    _damaged_position_loss(tmp_path, column, values)
    cells = pd.DataFrame({"variant": ["RoPE"], "theta": [1e4], "run_dir": [str(tmp_path)]})
    with pytest.raises(UserError) as err:
        with_effective_lengths(cells)
    assert str(tmp_path / POSITION_LOSS_FILE) in str(err.value) and said in str(err.value)
    assert "rerun the cell's evaluation" in str(err.value)


def test_a_producer_killed_halfway_through_a_batch_gives_the_projects_message():
    """Issue 34 §8: the producer is ahead, blocked halfway through writing a batch larger than the pipe's buffer, and
    is killed (as by the OOM killer): the trainer raised `OSError: got end of file during message`; it now gives the
    producer's own message, which says how to rerun."""
    import os
    import signal

    from trainer.data.batch_stream import BatchStream
    from trainer.data.batches import TrainBatches
    from trainer.data.tokenizer import ByteTokenizer

    tokens = np.asarray(ByteTokenizer().encode("The grass is green. The sky is blue. " * 400), dtype=np.int64)
    batches = TrainBatches(tokens, 1024, 16, seed=5)  # 16 x 1025 int64: 131 kB a batch, twice a pipe's 64 KiB
    with BatchStream(batches, 0, 10, 1, "process") as stream:
        assert np.array_equal(stream.get(0), batches.rows(0, 0))
        time.sleep(0.5)  # it writes step 1's batch, fills the pipe and blocks midway
        os.kill(stream.process.pid, signal.SIGKILL)
        stream.process.join(5)
        with pytest.raises(RuntimeError, match=r"the batch producer process ended \(killed by signal 9\) before "
                                               r"step 1's batch; rerun with train.batch_producer=inline"):
            stream.get(1)


def test_a_loss_not_finite_at_step_1_names_the_parameter_and_leaves_no_half_run(tiny_cfg):
    """Issue 34 §13: `model.pe.kind=comrope model.pe.init_std=1e30 optim.lr=1e-6` said "lower optim.lr" and left
    config.yaml and run.json behind; it names the angles and the field that set them, and the run directory is left
    without the run's files (a directory of the user's own files is refused before any of this, test_edges_a), so a
    rerun with the fix into it is not refused."""
    from trainer.files.run_files import claim_run_dir
    from trainer.run.loop import TrainingDiverged, train

    cfg = tiny_cfg("model.pe.kind=comrope", "model.pe.init_std=1e30", "optim.lr=1e-6", "train.steps=3",
                   "eval.passkey.enabled=false", "eval.extrapolation_batches=0")
    run_dir = Path(cfg.train.out_dir)
    with pytest.raises(TrainingDiverged) as err:
        train(cfg)
    message = str(err.value)
    assert message.startswith("loss is nan at step 1 (computed from the initial parameters, before any update)")
    assert "pe.angles has values up to" in message and "model.pe.init_std=1e+30 (default 1.0)" in message
    assert "optim.lr is not the cause" in message and "lower optim.lr" not in message
    assert not run_dir.exists()  # the directory it made is gone (issue 47 case 35), its lock file too
    claim_run_dir(run_dir, "another-config", "fixed")  # a rerun of another config is not refused


def test_a_loss_that_goes_non_finite_after_an_extreme_init_names_the_init_not_the_learning_rate(tiny_cfg):
    """Kin of §13: `model.init_std=1e30` keeps step 1's loss finite and is nan from step 2 on; the message names the
    weights the run started from and model.init_std instead of "lower optim.lr"."""
    from trainer.run.loop import TrainingDiverged, train

    with pytest.raises(TrainingDiverged) as err:
        train(tiny_cfg("model.init_std=1e30", "train.steps=3", "eval.passkey.enabled=false",
                       "eval.extrapolation_batches=0"))
    message = str(err.value)
    assert "the run started from extreme parameters: tok_embeddings.weight has values up to" in message
    assert "model.init_std=1e+30 (default 0.02)" in message and "lower optim.lr" not in message


def test_seed_advice_on_a_metric_with_no_spread_is_refused_not_sized_at_the_minimum():
    """Kin of §4 and §14: a metric the whole pilot scored alike (an accuracy of 0 where the task was not learned) has
    spread 0, and the advice answered the fewest seeds any test allows ("6 seeds", "2 seeds per variant") whatever
    the difference: a silent wrong number. It is refused, naming the value."""
    from analysis.power import pilot_spread
    from analysis.variants import trained

    rows = [("rope", {}, 1e4, s, 0.0) for s in (1, 2, 3)] + [
        ("hdrope", {"rotation_dim": 4, "basis": "paley"}, 1e4, s, 0.0) for s in (1, 2, 3)]
    with pytest.raises(UserError, match=r"--metric val_loss: every seed of every variant of the pilot P gave the "
                                        r"same value \(0\)"):
        pilot_spread(trained(_results(rows)), Path("P"), "val_loss")


def test_a_bench_encodings_head_dim_no_kind_takes_names_the_shape_flag(capsys):
    """Kin of §10: `bench encodings --shape 1 2 16 6` was refused by the message of model.pe.rotation_dim, a field
    the bench has no flag for; it names --shape and a D that fits, before allocating q and k."""
    assert console.main(["bench", "encodings", "--shape", "1", "2", "16", "6", "--rounds", "1"]) == 2
    err = capsys.readouterr().err
    assert "error: --shape 1 2 16 6: the head dim D=6 does not suit" in err and "e.g. 64" in err


class _AgentComingUp:
    """A job client whose head answers 'no available agent' `misses` times, then takes the job (pure logic)."""

    def __init__(self, misses: int, error: str = "Request failed with status code 500: No available agent to submit "
                                                 "job, please try again later.."):
        self.misses, self.error, self.calls = misses, error, 0

    def submit_job(self, **job) -> str:
        self.calls += 1
        if self.calls <= self.misses:
            raise RuntimeError(self.error)
        return f"raysubmit_{self.calls}"


def test_a_submit_to_a_head_whose_job_agent_is_starting_waits_for_it(monkeypatch):
    """`ray start --head` returns before its job agent is up: the submit tries again instead of failing (it did,
    under load, in tests/test_sweeps_e2e.py's two-node test); another error, or an agent that never comes, is not
    waited on forever."""
    import sweeps.submit as submit
    from hdrope.errors import UserError

    monkeypatch.setattr(submit.time, "sleep", lambda s: None)
    client = _AgentComingUp(misses=3)
    assert submit._submit_when_ready(client, "http://127.0.0.1:8265", entrypoint="x") == "raysubmit_4"
    assert client.calls == 4
    other = _AgentComingUp(misses=1, error="Request failed with status code 400: bad runtime_env")
    with pytest.raises(RuntimeError, match="bad runtime_env"):
        submit._submit_when_ready(other, "http://127.0.0.1:8265", entrypoint="x")
    assert other.calls == 1
    monkeypatch.setattr(submit, "AGENT_WAIT_S", 0.0)
    with pytest.raises(UserError, match=r"--address http://h:8265: the cluster's job agent did not come up in 0 s"):
        submit._submit_when_ready(_AgentComingUp(misses=10**6), "http://h:8265", entrypoint="x")


@pytest.mark.parametrize("address,loopback", [("127.0.0.1:6379", True), ("127.0.1.1:6379", True),
                                              ("localhost:6379", True), ("[::1]:6379", True), ("head.lab:6379", False),
                                              ("10.0.0.5:6379", False), ("auto", False),
                                              ("ray://127.0.0.1:10001", False)])
def test_a_loopback_address_is_joined_on_loopback(address, loopback):
    """A cluster bound to 127.0.0.1 (as the embedded one is) is joined with the driver on loopback too; Ray
    otherwise dials the machine's LAN address and waits forever. End to end: the Optuna test's driver."""
    from sweeps.runner import _on_loopback

    assert _on_loopback(address) is loopback


def test_the_lm_eval_task_index_is_rebuilt_when_a_task_yaml_changes(tmp_path):
    """The index is cached per process, keyed by the include path's YAMLs and their times: an edited task is seen."""
    import os

    from trainer.evals.lm_harness import _yaml_stamps

    assert _yaml_stamps(None) == ()
    task = tmp_path / "sub" / "t.yaml"
    task.parent.mkdir()
    task.write_text("task: a\n")
    (tmp_path / "notes.txt").write_text("not a task")
    before = _yaml_stamps(str(tmp_path))
    assert [name for name, _ in before] == [str(task)]
    os.utime(task, ns=(before[0][1] + 10**9, before[0][1] + 10**9))
    assert _yaml_stamps(str(tmp_path)) != before
