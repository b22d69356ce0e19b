"""One writer per directory: `hold_dir_lock(directory, what)` refuses a second writer with a UserError.

The lock is an exclusive `flock` on `directory/.hdrope.lock`, a file that records the holder (PID,
host, what it is doing, when it started). The kernel drops the lock when its holder exits, however
it exits (kill -9 included), so a lock file a dead process left behind never blocks: the next writer
takes it over. Only a process that still holds the open lock (the holder, or a child it forked)
blocks, and the error names it.

Within one process the lock is re-entrant: a nested `hold_dir_lock` of a directory the process
already holds succeeds at once (a sweep driver that trains in-process, a prepare inside a run).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from hdrope.errors import UserError

__all__ = ["LOCK_FILE", "hold_dir_lock", "refuse_non_directory"]

LOCK_FILE = ".hdrope.lock"
_held: dict[Path, int] = {}  # directories this process holds -> nesting depth
_guard = threading.Lock()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def _holder(path: Path) -> str:
    """Who holds the lock at path, in words; the holder writes its record right after it locks, so wait a moment."""
    record: dict = {}
    for _ in range(20):  # a new holder may not have replaced a dead one's record yet
        try:
            record = json.loads(path.read_text() or "{}")
        except (OSError, json.JSONDecodeError, UnicodeDecodeError):  # gone, or half written by a new holder
            record = {}
        if isinstance(record, dict) and isinstance(record.get("pid"), int) and _alive(record["pid"]):
            break
        time.sleep(0.05)
    if not isinstance(record, dict) or not isinstance(record.get("pid"), int):
        return "another process (PID unknown)"
    pid, host = record["pid"], record.get("host", "")
    what = record.get("what", "another process")
    started = record.get("started", "?")
    if host and host != socket.gethostname():
        return f"{what} (PID {pid} on host {host}, started {started})"
    if not _alive(pid):  # the lock is still open in a process PID forked, which outlived it
        return f"{what} (PID {pid}, started {started}; PID {pid} has exited but a process it started still holds it)"
    return f"{what} (PID {pid}, started {started})"


def refuse_non_directory(directory: Path, field: str = "") -> None:
    """UserError when directory is a file or lies under one (`field`, e.g. "--out", names where it came from)."""
    blocker = next((p for p in (directory, *directory.parents) if p.exists() and not p.is_dir()), None)
    if blocker is not None:
        where = "is a file" if blocker == directory else f"is under the file {blocker}"
        name = f"{field} {directory}" if field else str(directory)
        raise UserError(f"{name}: {where}, not a directory; give a directory path (a new or empty directory)")


@contextlib.contextmanager
def hold_dir_lock(directory: Path, what: str) -> Iterator[Path]:
    """Hold `directory` (created if missing) for `what` (e.g. "hdrope data prepare") until the block ends.

    Raises UserError "<dir> is in use by <what> (PID n, started ...); wait for it or ..." when another
    live process holds it, and UserError when directory is a file or under one. Yields the lock file."""
    directory = Path(directory).expanduser()
    refuse_non_directory(directory)
    directory.mkdir(parents=True, exist_ok=True)
    key = directory.resolve()
    path = key / LOCK_FILE
    with _guard:
        if key in _held:
            _held[key] += 1
            nested = True
        else:
            nested = False
    if nested:
        try:
            yield path
        finally:
            with _guard:
                _held[key] -= 1
        return
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise UserError(f"{directory} is in use by {_holder(path)}; wait for it to finish, or stop it "
                            "and run again (a lock left by a process that has exited is taken over)") from None
        record = {"pid": os.getpid(), "host": socket.gethostname(), "what": what,
                  "started": time.strftime("%Y-%m-%d %H:%M:%S")}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(record).encode(), 0)
        with _guard:
            _held[key] = 1
        try:
            yield path
        finally:
            with _guard:
                del _held[key]
            os.ftruncate(fd, 0)  # no record of a holder that is gone
    finally:
        os.close(fd)  # releases the flock
