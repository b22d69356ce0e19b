"""What the lab starts, it stops: signals, a watchdog for a killed driver, and an embedded Ray on loopback.

- `exit_on_signals()`: SIGTERM, SIGINT and SIGHUP end the driver with exit code 128 + signal (143, 130,
  129) through SystemExit, so `finally` blocks and Ray's shutdown run.
- `signals_held()`: while the embedded Ray starts, a first stop signal is held and ends the driver (128 +
  signal) once `ray.init` has returned, so it never lands inside Ray's start-up (where Ray's own handlers
  exited with 15 or 1, its C++ side aborted, or the signal was lost); a second signal ends it at once.
- `start_watchdog()`: a small process (`python -m sweeps.procs PID`) that follows the driver's process
  tree and, when the driver dies without cleaning up (SIGKILL, OOM), stops every process it left (Ray's
  GCS, raylet, dashboard and runtime-env agents, workers). It exits on its own when the driver ends.
- `loopback_ray()`: while the embedded single-node Ray starts, every Ray server binds 127.0.0.1 only
  (Ray's single-node mode, `RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`); the setting is restored afterwards so
  a later `ray start` of a multi-node cluster is unaffected.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import psutil

__all__ = ["exit_on_signals", "loopback_ray", "signal_exit_codes", "signals_held", "signals_ignored", "start_watchdog",
           "stop_session", "stop_tree"]

SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
_CLUSTER_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


_received: list[int] = []  # signals this process was asked to stop by


def exit_on_signals() -> None:
    """Make SIGTERM/SIGINT/SIGHUP raise SystemExit(128 + signal) in this (main-thread) process."""
    if threading.current_thread() is not threading.main_thread():
        return

    def _exit(signum: int, frame: object) -> None:
        _received.append(signum)
        raise SystemExit(128 + signum)

    for sig in SIGNALS:
        signal.signal(sig, _exit)


@contextlib.contextmanager
def signal_exit_codes() -> Iterator[None]:
    """Within the block, a stop signal ends the process with 128 + signal, even when library code that was
    running caught the SystemExit and raised something else instead."""
    exit_on_signals()
    try:
        yield
    except BaseException:  # whatever library code turned our stop signal into; anything else is raised again
        if _received:
            raise SystemExit(128 + _received[-1]) from None
        raise


@contextlib.contextmanager
def signals_held() -> Iterator[None]:
    """Within the block (Ray starting), hold a first stop signal until the block ends, then exit with 128 + signal;
    a second signal exits at once. Ray's own SIGTERM handlers, which `ray.init` installs, are kept out."""
    import ray._private.utils as ray_utils

    held: list[int] = []

    def _hold(signum: int, frame: object) -> None:
        _received.append(signum)
        if held:  # asked twice: stop now, wherever start-up is
            raise SystemExit(128 + signum)
        held.append(signum)

    if threading.current_thread() is threading.main_thread():
        for sig in SIGNALS:
            signal.signal(sig, _hold)
    ray_handler = ray_utils.set_sigterm_handler
    ray_utils.set_sigterm_handler = lambda handler: None  # ray.init would replace ours with sys.exit(15) or 1
    try:
        yield
    finally:
        ray_utils.set_sigterm_handler = ray_handler
        exit_on_signals()
    if held:
        raise SystemExit(128 + held[0])


@contextlib.contextmanager
def loopback_ray() -> Iterator[dict[str, str]]:
    """Within the block, a Ray started here binds loopback only; yields the extra ray.init kwargs to pass."""
    import ray._private.ray_constants as constants

    before_env, before_flag = os.environ.get(_CLUSTER_ENV), constants.ENABLE_RAY_CLUSTER
    os.environ[_CLUSTER_ENV] = "0"  # inherited by the GCS, raylet and agents started in the block
    constants.ENABLE_RAY_CLUSTER = False  # read at call time by the driver's own address lookup
    try:
        yield {"_node_ip_address": "127.0.0.1"}
    finally:
        constants.ENABLE_RAY_CLUSTER = before_flag
        if before_env is None:
            os.environ.pop(_CLUSTER_ENV, None)
        else:
            os.environ[_CLUSTER_ENV] = before_env


def stop_tree(procs: list[psutil.Process], grace_s: float = 3.0) -> int:
    """Terminate the processes and their descendants, kill what is left after grace_s; returns how many ran."""
    found: dict[int, psutil.Process] = {}
    for p in procs:
        with contextlib.suppress(psutil.Error):
            if p.is_running():
                found[p.pid] = p
                found.update({c.pid: c for c in p.children(recursive=True)})
    found.pop(os.getpid(), None)
    for p in found.values():
        with contextlib.suppress(psutil.Error):
            p.terminate()
    _, alive = psutil.wait_procs(list(found.values()), timeout=grace_s)
    for p in alive:
        with contextlib.suppress(psutil.Error):
            p.kill()
    return len(found)


@contextlib.contextmanager
def signals_ignored() -> Iterator[None]:
    """Within the block, further stop signals are ignored (restored after): a cleanup that a second Ctrl-C
    interrupted would leave what it was stopping running."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = {sig: signal.signal(sig, signal.SIG_IGN) for sig in SIGNALS}
    try:
        yield
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)


def stop_session(proc: subprocess.Popen, grace_s: float = 3.0) -> None:
    """Stop a child started with `start_new_session=True` and everything in its process group, even when the child
    itself has exited already (its group outlives it), ignoring further stop signals until it is done; reaps it."""
    with signals_ignored():
        with contextlib.suppress(psutil.NoSuchProcess):
            stop_tree([psutil.Process(proc.pid)], grace_s)
        with contextlib.suppress(ProcessLookupError, PermissionError):  # no group left: nothing to stop
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def start_watchdog() -> subprocess.Popen:
    """Start the watchdog of this process (it stops this process's tree if this process is killed)."""
    return subprocess.Popen([sys.executable, "-m", "sweeps.procs", str(os.getpid())], start_new_session=True,
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _watch(driver_pid: int, every_s: float = 0.5) -> int:
    try:
        driver = psutil.Process(driver_pid)
    except psutil.Error:
        return 0
    known: dict[int, psutil.Process] = {}
    while True:
        try:
            if driver.status() == psutil.STATUS_ZOMBIE:
                break
            known.update({c.pid: c for c in driver.children(recursive=True) if c.pid != os.getpid()})
        except psutil.Error:  # the driver is gone
            break
        time.sleep(every_s)
    return stop_tree(list(known.values()))


if __name__ == "__main__":
    _watch(int(sys.argv[1]))
