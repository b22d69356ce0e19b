"""`hold_dir_lock`: one writer per directory across processes; a dead holder's lock is taken over."""

import os
import signal
import subprocess
import sys
import time

import pytest

from hdrope.errors import UserError
from trainer.files.dir_lock import LOCK_FILE, hold_dir_lock

HOLD = ("import sys, time; from pathlib import Path; from trainer.files.dir_lock import hold_dir_lock\n"
        "with hold_dir_lock(Path(sys.argv[1]), 'a test holder'):\n"
        "    print('held', flush=True); time.sleep(60)\n")


def _holder(directory) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(directory)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


def test_a_second_holder_is_refused_naming_the_pid_and_a_dead_holder_is_taken_over(tmp_path):
    proc = _holder(tmp_path / "d")
    try:
        with pytest.raises(UserError) as err, hold_dir_lock(tmp_path / "d", "a second writer"):
            pass
        msg = str(err.value)
        assert msg.startswith(f"{tmp_path / 'd'} is in use by a test holder (PID {proc.pid}, started ")
        assert "wait for it" in msg
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert str(proc.pid) in (tmp_path / "d" / LOCK_FILE).read_text()  # killed: its record stays behind ...
    with hold_dir_lock(tmp_path / "d", "the next writer") as lock:  # ... and does not block
        assert f'"pid": {os.getpid()}' in lock.read_text()
    assert lock.read_text() == ""  # released: no stale record


def test_the_lock_is_reentrant_in_one_process_and_released_after(tmp_path):
    with hold_dir_lock(tmp_path, "outer"), hold_dir_lock(tmp_path, "inner"):
        pass
    start = time.monotonic()
    proc = _holder(tmp_path)  # another process gets it at once
    proc.kill()
    proc.wait()
    assert time.monotonic() - start < 30


@pytest.mark.parametrize("sub", ["", "below"])
def test_a_file_in_the_way_is_a_user_error(tmp_path, sub):
    (tmp_path / "f").write_text("mine")
    target = tmp_path / "f" / sub if sub else tmp_path / "f"
    with pytest.raises(UserError, match="not a directory"), hold_dir_lock(target, "x"):
        pass
    assert (tmp_path / "f").read_text() == "mine"
