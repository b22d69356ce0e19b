"""Training batches in step order, made inline or ahead of the step by a forked producer process.

`train.batch_producer` picks who makes them (`PRODUCERS`, which the config validator reads). Either way a batch is
`TrainBatches.rows(step, micro)`, a function of (seed, step, micro) alone, so a run's batches, and its losses, are the
same under every producer. The producer process takes the per-example numpy work of task and passkey windows off the
training process's critical path and onto another core; it runs at most one batch plus a pipe's buffer ahead, exits
when the last step's batch is taken or the training process goes away, and sends a failure back as an error.

Importing this module loads no torch (trainer.config imports it for the registry).
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import struct
import sys
import traceback
from multiprocessing.connection import Connection
from types import TracebackType
from typing import TYPE_CHECKING

import numpy as np

from hdrope.errors import UserError

if TYPE_CHECKING:
    from trainer.data.batches import TrainBatches

__all__ = ["PRODUCERS", "BatchStream", "producer_runs_process"]

# The choices of `train.batch_producer`; trainer.config validates against these keys.
PRODUCERS: dict[str, str] = {
    "auto": "a producer process when the batch mixes in generated windows (data.task_ratio or data.passkey_ratio > 0) "
            "and the platform forks (Linux); inline otherwise",
    "inline": "the training process makes each batch when its step needs it",
    "process": "a forked producer process makes the batches ahead of the steps (Linux; needs the fork start method)",
}

_HEADER = struct.Struct("<cqq")  # tag (b"B" batch, b"E" error), step, micro
_JOIN_S = 5.0


def producer_runs_process(batches: TrainBatches, producer: str) -> bool:
    """Whether `producer` (a key of PRODUCERS) makes `batches` in a producer process; UserError when it cannot."""
    if producer not in PRODUCERS:
        raise UserError(f"train.batch_producer={producer!r}: choose one of {', '.join(PRODUCERS)}")
    forks = sys.platform.startswith("linux") and "fork" in mp.get_all_start_methods()
    if producer == "process" and not forks:
        raise UserError(f"train.batch_producer=process needs the fork start method, which {sys.platform} does not "
                        "offer by default; use train.batch_producer=auto or inline")
    if producer == "process" and mp.current_process().daemon:
        raise UserError("train.batch_producer=process: this training process is a daemonic multiprocessing child, "
                        "which may not start processes; use train.batch_producer=auto or inline")
    forks = forks and not mp.current_process().daemon
    return producer == "process" or (producer == "auto" and forks and bool(batches.mixture))


class BatchStream:
    """Batch (step, micro) of `batches` for steps start..stop - 1 and micro-batches 0..accum - 1, taken in that order
    with `get`; a context manager that stops its producer process on exit."""

    def __init__(self, batches: TrainBatches, start: int, stop: int, accum: int, producer: str = "auto") -> None:
        self.batches, self.start, self.stop, self.accum = batches, start, stop, accum
        self.process: mp.process.BaseProcess | None = None
        self.conn: Connection | None = None
        if producer_runs_process(batches, producer) and start < stop:
            ctx = mp.get_context("fork")  # the child shares the token stream copy-on-write: nothing is pickled
            reader, writer = ctx.Pipe(duplex=False)
            self.process = ctx.Process(target=_produce, args=(batches, start, stop, accum, writer, reader),
                                       name="hdrope-batch-producer", daemon=True)
            self.process.start()
            writer.close()  # the child holds the only writer: the reader sees EOF when it goes away
            self.conn = reader

    @property
    def in_process(self) -> bool:
        """Whether a producer process makes the batches."""
        return self.process is not None

    def get(self, step: int, micro: int = 0) -> np.ndarray:
        """This rank's rows of micro-batch `micro` of step `step` (the next one in order when a process makes them)."""
        if self.conn is None:
            return self.batches.rows(step, micro)
        try:
            message = self.conn.recv_bytes()
        except (EOFError, OSError):  # gone between messages (EOF), or halfway through writing one (OSError)
            raise RuntimeError(f"the batch producer process ended ({self._ending()}) before step {step}'s "
                               "batch; rerun with train.batch_producer=inline to see the error in the training "
                               "process") from None
        tag, got_step, got_micro = _HEADER.unpack_from(message)
        if tag == b"E":
            error = json.loads(message[_HEADER.size :])
            if error["user"]:
                raise UserError(error["message"])
            raise RuntimeError(f"the batch producer process failed at step {got_step}:\n{error['traceback']}")
        if (got_step, got_micro) != (step, micro):
            raise RuntimeError(f"the batch producer sent step {got_step} micro {got_micro} where step {step} "
                               f"micro {micro} was asked for: batches are taken in order from step {self.start}")
        shape = (self.batches.rows_per_rank, self.batches.seq_len + 1)
        return np.frombuffer(message, dtype=np.int64, offset=_HEADER.size).reshape(shape).copy()

    def _ending(self) -> str:
        """How the producer process ended, once it has (a killed one is reaped here to learn its signal)."""
        if self.process is None:
            return "exit code None"
        self.process.join(timeout=_JOIN_S)
        code = self.process.exitcode
        return f"killed by signal {-code}" if code is not None and code < 0 else f"exit code {code}"

    def close(self) -> None:
        """Stop the producer process (it also stops by itself at the last batch or when the reader goes away)."""
        if self.conn is not None:
            self.conn.close()
            self.conn = None
        if self.process is not None:
            self.process.join(timeout=0.1)
            if self.process.is_alive():  # blocked on a full pipe whose reader just closed, or mid-batch
                self.process.terminate()
                self.process.join(timeout=_JOIN_S)
            self.process = None

    def __enter__(self) -> BatchStream:
        return self

    def __exit__(self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None) -> None:
        self.close()


def _produce(batches: TrainBatches, start: int, stop: int, accum: int, writer: Connection, reader: Connection) -> None:
    """The producer process: every batch from (start, 0) in order down the pipe, or the first error."""
    os.nice(19)  # idle CPU only: when torch holds every core, the step waits for a batch rather than share a core
    reader.close()  # else this process's own copy keeps the pipe open after the training process is gone
    step = micro = 0
    try:
        for step in range(start, stop):
            for micro in range(accum):
                rows = np.ascontiguousarray(batches.rows(step, micro), dtype=np.int64)
                writer.send_bytes(_HEADER.pack(b"B", step, micro) + rows.tobytes())
    except (BrokenPipeError, ConnectionResetError):
        return  # the training process stopped reading (done early, out of time, or gone)
    except Exception as err:  # any failure of a source: sent to the training process, which raises it
        error = {"user": isinstance(err, UserError), "message": str(err), "traceback": traceback.format_exc()}
        try:
            writer.send_bytes(_HEADER.pack(b"E", step, micro) + json.dumps(error).encode())
        except (BrokenPipeError, ConnectionResetError):
            pass
    finally:
        writer.close()
