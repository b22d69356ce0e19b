"""Batches made by a forked producer process (`train.batch_producer`): the same batches as inline, so the same losses
and an exact resume; errors come back named; the process never outlives its reader."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from hdrope.errors import UserError
from trainer.config import config_hash
from trainer.data.batch_stream import BatchStream, producer_runs_process
from trainer.data.batches import TrainBatches
from trainer.data.tasks.build import TaskBuilder, TaskMixture
from trainer.data.tasks.spec import TaskParams
from trainer.data.tokenizer import ByteTokenizer
from trainer.run.loop import train

FILLER = np.asarray(ByteTokenizer().encode("The grass is green. The sky is blue. " * 200), dtype=np.int64)


def _mixture() -> list:
    return [(0.5, TaskMixture(TaskBuilder(ByteTokenizer(), TaskParams(), FILLER), ["mqar", "copy", "reverse"]))]


class _Failing:
    """A mixture source that raises `err` on every row it is given."""

    def __init__(self, err: Exception) -> None:
        self.err = err

    def fill(self, row: np.ndarray, rng: np.random.Generator) -> None:
        raise self.err


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie has exited (its parent has not reaped it yet)
        return f.read().split(") ")[1][0] != "Z"


def test_a_producer_process_makes_exactly_the_inline_batches_in_order():
    batches = TrainBatches(FILLER, 48, 8, seed=5, mixture=_mixture(), rank=1, world_size=2)
    with BatchStream(batches, 3, 7, 2, "process") as stream:
        assert stream.in_process
        got = [stream.get(step, micro) for step in range(3, 7) for micro in range(2)]
        process = stream.process
        process.join(5)  # it ends by itself after the last batch
        assert process.exitcode == 0
    want = [batches.rows(step, micro) for step in range(3, 7) for micro in range(2)]
    assert all(np.array_equal(g, w) for g, w in zip(got, want, strict=True)) and got[0].shape == (4, 49)
    assert any(ord("{") in row or ord("<") in row for g in got for row in g.tolist())  # task rows are in them
    with BatchStream(batches, 0, 4, 1, "process") as stream, pytest.raises(RuntimeError, match="taken in order"):
        stream.get(1)  # step 0's batch comes first


def test_auto_uses_a_process_only_for_a_mixture_and_unknown_producers_are_named():
    assert producer_runs_process(TrainBatches(FILLER, 48, 8, 5, _mixture()), "auto") is sys.platform.startswith("linux")
    assert not producer_runs_process(TrainBatches(FILLER, 48, 8, 5), "auto")
    assert not producer_runs_process(TrainBatches(FILLER, 48, 8, 5, _mixture()), "inline")
    with pytest.raises(UserError, match=r"train.batch_producer='threads': choose one of auto, inline, process"):
        producer_runs_process(TrainBatches(FILLER, 48, 8, 5), "threads")


@pytest.mark.parametrize("err, kind, match", [
    (UserError("data.tasks: too long; lower it"), UserError, r"^data.tasks: too long; lower it$"),
    (ZeroDivisionError("boom"), RuntimeError, r"failed at step 0:\n(.|\n)*ZeroDivisionError: boom"),
])
def test_an_error_in_the_producer_is_raised_in_the_training_process(err, kind, match):
    batches = TrainBatches(FILLER, 48, 8, seed=5, mixture=[(1.0, _Failing(err))])
    with BatchStream(batches, 0, 5, 1, "process") as stream, pytest.raises(kind, match=match):
        stream.get(0)


def test_closing_early_stops_the_producer_even_with_a_full_pipe():
    batches = TrainBatches(FILLER, 48, 8, seed=5, mixture=_mixture())
    stream = BatchStream(batches, 0, 10**6, 1, "process")
    stream.get(0)
    pid = stream.process.pid
    time.sleep(0.3)  # it fills the pipe and blocks
    t0 = time.perf_counter()
    stream.close()
    # well under a blocked producer's wait (forever): a nice-19 process on busy cores takes seconds to be scheduled
    assert time.perf_counter() - t0 < 10 and not _alive(pid)


def test_the_producer_ends_when_the_training_process_is_killed(tmp_path):
    script = textwrap.dedent(f"""
        import sys, time
        import numpy as np
        sys.path.insert(0, {os.path.dirname(__file__)!r})
        from test_batch_stream import FILLER, _mixture
        from trainer.data.batch_stream import BatchStream
        from trainer.data.batches import TrainBatches
        stream = BatchStream(TrainBatches(FILLER, 48, 8, 5, _mixture()), 0, 10**6, 1, "process")
        stream.get(0)
        print(stream.process.pid, flush=True)
        time.sleep(60)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        pid = int(proc.stdout.readline())
        assert _alive(pid)
        proc.send_signal(signal.SIGKILL)  # no cleanup runs in the parent
        proc.wait(10)
        deadline = time.monotonic() + 10
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(pid)  # its next send found no reader
    finally:
        proc.kill()


def test_the_producer_is_a_runtime_choice_not_part_of_the_config(tiny_cfg):
    cfg = tiny_cfg("train.batch_producer=process")
    assert config_hash(cfg) == config_hash(tiny_cfg("train.batch_producer=inline"))
    with pytest.raises(UserError, match=r"^train.batch_producer='fork': choose one of auto, inline, process$"):
        tiny_cfg("train.batch_producer=fork")


def test_a_task_run_resumed_with_a_producer_process_continues_the_inline_run_exactly(tiny_cfg):
    from test_train import FAST, Interrupt, StopAt

    overrides = ["train.steps=12", "train.ckpt_every=6", "data.tasks=[copy, mqar]", "data.task_ratio=0.5",
                 "eval.tasks.samples=2", "eval.tasks.length_factors=[1]", *FAST]
    whole = train(tiny_cfg(*overrides, "train.batch_producer=inline", out="whole"))
    with pytest.raises(Interrupt):
        train(tiny_cfg(*overrides, "train.batch_producer=process", out="cut"), StopAt(6))
    resumed = train(tiny_cfg(*overrides, "train.batch_producer=process", out="cut"))
    assert resumed.resumed_from == 6
    assert resumed.losses == whole.losses  # bitwise, step by step
    assert resumed.metrics["acc_copy_x1"] == whole.metrics["acc_copy_x1"]


def test_a_trial_whose_torch_threads_take_every_allotted_core_makes_its_batches_inline(tiny_cfg):
    from sweeps.trainable import trial_config

    def producer(cpus: float, *overrides: str) -> str:
        return trial_config(tiny_cfg(*overrides), cpus).train.batch_producer

    assert producer(1, "train.threads=1") == producer(2, "train.threads=2") == producer(1) == "inline"
    assert producer(2, "train.threads=1") == "auto"  # a core to spare: a producer process where auto picks one
    assert producer(1, "train.threads=1", "train.batch_producer=process") == "process"  # the spec's choice stands
