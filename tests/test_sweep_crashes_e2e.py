"""Sweeps stopped from outside, end to end on a real embedded Ray: SIGTERM to a running driver and to one whose Ray is
starting, a killed trial, a killed driver and `resume`. (Apart from test_sweeps_e2e.py so that two test processes
share the end-to-end runs; its helpers are shared.)

All marked slow: `.ci/run` runs them; deselect locally with -m 'not slow'.
"""

import json
import signal
import subprocess
import sys

import psutil
import pytest
from test_sweeps_e2e import (
    LOOPBACK,
    _cmdline,
    _listening,
    _trial_workers,
    _wait_for,
    alive,
    cell_runs,
    hdrope,
    ray_env,
    write_spec,
)

pytestmark = pytest.mark.slow


def test_sigterm_ends_the_driver_with_143_and_stops_its_ray(tmp_path, cache_dir, hdrope_here):
    spec = write_spec(tmp_path, "term", steps=3000, batch=8, ckpt=500, dims="[4]", bases="[paley]")
    proc = subprocess.Popen([sys.executable, "-m", "sweeps.console", "sweep", "run", str(spec)], cwd=tmp_path,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=ray_env())
    cell = tmp_path / "store" / "term" / "cells" / "c000-rotation_dim4-basispaley"
    try:
        _wait_for(lambda: (cell / "metrics.jsonl").is_file(), 240, "the trial to report")
        tree = [p for p in psutil.Process(proc.pid).children(recursive=True) if "procs" not in " ".join(_cmdline(p))]
        assert len(tree) >= 3  # GCS, raylet, agents, the trial worker
        # a second driver of this sweep is refused, naming the running one, which goes on
        for second in (("sweep", "run", str(spec)), ("sweep", "resume", "term", "--storage", str(tmp_path / "store"))):
            out = hdrope_here(list(second), cwd=tmp_path)  # refused before Ray: no process of its own needed
            assert out.returncode == 2 and f"in use by hdrope sweep run (PID {proc.pid}" in out.stderr, out.stderr
            assert "Traceback" not in out.stderr
        assert proc.poll() is None
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(120) == 143
        _wait_for(lambda: not alive(tree), 30, "every Ray process of the driver to stop")
    finally:
        proc.kill()


def test_sigterm_while_ray_starts_ends_the_driver_with_143_and_stops_its_ray(tmp_path, cache_dir):
    """The signal lands inside ray.init (GCS up, raylet starting), where Ray's own handlers used to exit 15 or 1,
    its C++ side to abort (-6), or the signal to be lost."""
    spec = write_spec(tmp_path, "startterm", steps=3000, dims="[4]", bases="[paley]")
    env = ray_env()
    proc = subprocess.Popen([sys.executable, "-m", "sweeps.console", "sweep", "run", str(spec)], cwd=tmp_path,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)

    def ray_of_this_test() -> list:
        return [p for p in psutil.process_iter(["cmdline"])
                if env["HDROPE_RAY_TMPDIR"] in " ".join(p.info["cmdline"] or [])]

    try:
        def gcs() -> list:
            return [p for p in psutil.Process(proc.pid).children(recursive=True) if "gcs_server" in p.name()]

        _wait_for(lambda: proc.poll() is not None or gcs(), 240, "Ray's GCS to start")
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=180)
        assert proc.returncode == 143, err[-3000:]
        assert "Traceback" not in err, err[-3000:]
        _wait_for(lambda: not alive(ray_of_this_test()), 60, "every Ray process of the driver to stop")
        assert not (tmp_path / "store" / "startterm" / "cells").exists()  # no trial ran
    finally:
        proc.kill()


def test_a_killed_trial_recovers_then_a_killed_driver_resumes_without_rerunning(tmp_path, cache_dir):
    """One embedded-Ray sweep of three cells, one at a time, killed twice: first the first cell's trial worker after
    its step-10 checkpoint (Tune restarts it from there, and its final numbers equal the same cell trained without a
    stop), then the driver itself once that cell has finished and the next has a checkpoint (its watchdog stops the
    Ray it started; `resume` finishes the rest and leaves the finished cell alone)."""
    import torch

    from sweeps.runner import prepare
    from trainer.run.loop import train

    spec = write_spec(tmp_path, "drv", steps=100, batch=16, ckpt=10, dims="[4, 8, 32]", bases="[identity]",
                      concurrent=1)
    cells = tmp_path / "store" / "drv" / "cells"
    first, second = cells / "c000-rotation_dim4-basisidentity", cells / "c001-rotation_dim8-basisidentity"
    log = open(tmp_path / "driver.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "sweeps.console", "sweep", "run", str(spec)], cwd=tmp_path,
                            stdout=log, stderr=subprocess.STDOUT, env=ray_env())
    try:  # a step here takes about 30 ms on an idle core (measured): the 90 left outlast finding and killing the trial
        _wait_for(lambda: (first / "checkpoints" / "step_00000010").is_dir(), 300, "a checkpoint at step 10")
        workers = _trial_workers(proc.pid)
        assert workers, "no trial worker process found"
        for w in workers:
            w.send_signal(signal.SIGKILL)
        _wait_for(lambda: (first / "result.json").is_file() and (second / "checkpoints" / "step_00000020").is_dir(),
                  300, "the killed cell finished and a checkpoint of the next")
        assert proc.poll() is None  # a killed trial does not stop the sweep
        tree = psutil.Process(proc.pid).children(recursive=True)
        listening = [c for p in tree for c in _listening(p)]
        assert listening and all(c.laddr.ip in LOOPBACK for c in listening), listening  # embedded Ray: loopback
        proc.send_signal(signal.SIGKILL)  # the driver alone: its watchdog must stop the Ray it started
        proc.wait(60)
        _wait_for(lambda: not alive([p for p in tree if "procs" not in " ".join(_cmdline(p))]), 30,
                  "the killed driver's Ray processes to be stopped by its watchdog")
    finally:
        proc.kill()
        log.close()
    said = (tmp_path / "driver.log").read_text()  # what the user saw: the lab's lines, not Tune's or Ray's notices
    assert "drv: 3 cells, 3 trials to train" in said and "started" in said, said[-3000:]
    assert "Configuration for experiment" not in said and "Token authentication is enabled" not in said, said[-3000:]
    result = json.loads((first / "result.json").read_text())
    assert result["resumed_from"] is not None and result["resumed_from"] >= 10  # restarted from a checkpoint
    cfg = prepare(str(spec)).cells[0].config
    cfg.train.out_dir = str(tmp_path / "reference")
    threads = torch.get_num_threads()
    try:
        ref = train(cfg)
    finally:
        torch.set_num_threads(threads)
    assert result["metrics"]["train_loss"] == ref.metrics["train_loss"]
    assert result["metrics"]["val_loss"] == ref.metrics["val_loss"]

    done_before = (first / "result.json").stat().st_mtime_ns, (first / "metrics.jsonl").read_text()
    out = hdrope("sweep", "resume", "drv", "--storage", str(tmp_path / "store"), cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert ((first / "result.json").stat().st_mtime_ns, (first / "metrics.jsonl").read_text()) == done_before
    assert json.loads((second / "result.json").read_text())["resumed_from"] is not None
    _, runs, parents = cell_runs(f"sqlite:///{tmp_path / 'store' / 'drv' / 'mlflow.db'}", "drv")
    assert sorted(r.data.tags["cell_id"] for r in runs) == sorted(p.name for p in cells.iterdir())
    assert len(runs) == 3 and len(parents) == 1  # one run for the killed cell, though its trial restarted
    assert all(r.info.status == "FINISHED" for r in runs + parents)
