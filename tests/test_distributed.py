"""Data-parallel training with real processes: 2 gloo workers (torch.multiprocessing) against one process.

The 2-worker run (DDP or FSDP2) takes the same global batch as the 1-process run (each worker its half of the
rows), so its per-step losses equal the 1-process ones to fp32 rounding; only rank 0 writes the run
directory, and checkpoints are the single-process format: a 2-worker run resumes in one process and a
1-process run on 2 workers, with the same losses.
"""

import json
import os
import re
import shutil
import socket
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from trainer.data.batches import TrainBatches

STEPS = 6
OVERRIDES = (f"train.steps={STEPS}", "train.batch_size=8", "train.grad_accum=2", "train.log_every=3",
             "train.eval_every=3", "train.ckpt_every=3", "train.threads=1", "eval.passkey.enabled=false",
             "eval.extrapolation_batches=0", "dump.enabled=false")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world: int, port: int, cfg_yaml: str, out: str, strategy: str) -> None:
    """One gloo worker: train the config and write its losses (rank 0 also its metrics) to out/rank<r>.json."""
    import torch.distributed as dist
    from omegaconf import OmegaConf

    from trainer.presets import merge_config
    from trainer.run.loop import train

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        result = train(merge_config([OmegaConf.create(cfg_yaml)]), strategy=strategy)
    finally:
        dist.destroy_process_group()
    Path(out, f"rank{rank}.json").write_text(json.dumps({"losses": result.losses, "metrics": result.metrics,
                                                         "checkpoint": str(result.checkpoint),
                                                         "resumed_from": result.resumed_from}))


def _train_workers(cfg, world: int, out: Path, strategy: str = "ddp") -> dict:
    """Train cfg on `world` gloo processes under `strategy`; rank 0's losses, metrics and checkpoint."""
    from omegaconf import OmegaConf

    out.mkdir(parents=True, exist_ok=True)
    cfg_yaml = OmegaConf.to_yaml(OmegaConf.structured(cfg))
    mp.start_processes(_worker, args=(world, _free_port(), cfg_yaml, str(out), strategy), nprocs=world,
                       start_method="spawn")
    return json.loads((out / "rank0.json").read_text())


def test_batches_split_the_global_batch_by_rank():
    tokens = torch.arange(5000).numpy()
    whole = TrainBatches(tokens, 16, 8, seed=3).get(5, 1)
    parts = [TrainBatches(tokens, 16, 8, seed=3, rank=r, world_size=4).get(5, 1) for r in range(4)]
    assert torch.equal(torch.cat(parts), whole)


def test_batch_that_does_not_split_over_the_workers_is_refused():
    from hdrope.errors import UserError

    with pytest.raises(UserError, match=r"train\.batch_size=6 does not split evenly over 4 workers"):
        TrainBatches(torch.arange(500).numpy(), 16, 6, seed=0, rank=0, world_size=4)


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_two_gloo_workers_equal_one_process_and_resume_on_one(tiny_cfg, tmp_path, strategy):
    from trainer.files.run_files import METRICS_FILE, read_metrics
    from trainer.run.checkpoint import list_checkpoints
    from trainer.run.loop import train

    one = train(tiny_cfg(*OVERRIDES, out="one"))
    two = _train_workers(tiny_cfg(*OVERRIDES, out="two"), 2, tmp_path / "ranks", strategy)
    assert len(two["losses"]) == STEPS
    assert two["losses"] == pytest.approx(one.losses, rel=1e-5)
    assert max(abs(a - b) / abs(b) for a, b in zip(two["losses"], one.losses, strict=True)) < 1e-5
    assert two["metrics"]["val_loss"] == pytest.approx(one.metrics["val_loss"], rel=1e-4)
    rank1 = json.loads((tmp_path / "ranks" / "rank1.json").read_text())
    assert rank1["losses"] == two["losses"] and rank1["metrics"] == {}  # the mean loss on every worker; no eval
    run = tmp_path / "two"
    assert json.loads((run / "result.json").read_text())["workers"] == 2
    records = [(r["step"], sorted(r)) for r in read_metrics(run / METRICS_FILE)]
    assert records == [(r["step"], sorted(r)) for r in read_metrics(tmp_path / "one" / METRICS_FILE)]  # one writer
    assert [p.name for p in list_checkpoints(run / "checkpoints")] == ["step_00000003", "step_00000006"]

    shutil.rmtree(run / "checkpoints" / "step_00000006")  # resume the 2-worker run from step 3 in one process
    resumed = train(tiny_cfg(*OVERRIDES, out="two"))
    assert resumed.resumed_from == 3
    assert resumed.losses == pytest.approx(one.losses, rel=1e-5)

    shutil.rmtree(tmp_path / "one" / "checkpoints" / "step_00000006")  # and a 1-process run on 2 workers
    again = _train_workers(tiny_cfg(*OVERRIDES, out="one"), 2, tmp_path / "ranks2", strategy)
    assert again["resumed_from"] == 3
    assert again["losses"] == pytest.approx(one.losses, rel=1e-5)


@pytest.mark.slow
def test_hdrope_train_under_torchrun_equals_one_process(tiny_cfg, tmp_path, cache_dir):
    # The way a multi-GPU machine runs one model: torchrun starts W `hdrope train` processes, which join its
    # process group (gloo here, NCCL on CUDA); rank 0 alone prints the result.
    import subprocess
    import sys

    from trainer.run.loop import train

    one = train(tiny_cfg(*OVERRIDES, out="one"))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "-m", "sweeps.console", "train", "tiny", *OVERRIDES, f"train.out_dir={tmp_path / 'two'}",
           f"data.cache_dir={cache_dir}", "--no-progress"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    printed = json.loads(proc.stdout[proc.stdout.index("{"):])  # one JSON result, from rank 0
    assert printed["step"] == STEPS
    assert printed["metrics"]["val_loss"] == pytest.approx(one.metrics["val_loss"], rel=1e-4)
    result = json.loads((tmp_path / "two" / "result.json").read_text())
    assert result["workers"] == 2
    from trainer.files.run_files import METRICS_FILE, read_metrics

    two_losses = [r["train_loss"] for r in read_metrics(tmp_path / "two" / METRICS_FILE) if "train_loss" in r]
    one_losses = [r["train_loss"] for r in read_metrics(tmp_path / "one" / METRICS_FILE) if "train_loss" in r]
    assert two_losses == pytest.approx(one_losses, rel=1e-5) and len(two_losses) == 2


def test_torchrun_variables_are_checked_and_the_timeout_is_read_from_the_environment():
    from hdrope.errors import UserError
    from trainer.run.distributed import TorchrunEnv, rendezvous_timeout, torchrun_env

    ok = {"WORLD_SIZE": "2", "RANK": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}
    assert torchrun_env(ok) == TorchrunEnv(1, 2, "127.0.0.1", 29500)
    assert torchrun_env({}) is None and torchrun_env({"WORLD_SIZE": "1"}) is None
    for env, expected in (({**ok, "RANK": "2"}, "RANK='2': must be an integer in [0, 1]"),
                          ({k: v for k, v in ok.items() if k != "MASTER_ADDR"}, "MASTER_ADDR is not set"),
                          ({**ok, "MASTER_PORT": "70000"}, "MASTER_PORT='70000': must be a port number"),
                          ({**ok, "WORLD_SIZE": "0"}, "WORLD_SIZE='0': must be a positive integer")):
        with pytest.raises(UserError, match=re.escape(expected)):
            torchrun_env(env)
    assert rendezvous_timeout({}) == 300 and rendezvous_timeout({"HDROPE_RENDEZVOUS_TIMEOUT_S": "2.5"}) == 2.5
    with pytest.raises(UserError, match="HDROPE_RENDEZVOUS_TIMEOUT_S='0': must be a positive number"):
        rendezvous_timeout({"HDROPE_RENDEZVOUS_TIMEOUT_S": "0"})


def test_more_workers_than_gpus_on_a_machine_is_refused_before_nccl():
    # measured on an H100 (one GPU), torchrun --nproc-per-node 2: NCCL failed in the first barrier with
    # "Duplicate GPU detected : rank 1 and rank 0 both on CUDA device"; now each worker refuses before meeting
    from hdrope.errors import UserError
    from trainer.run.distributed import check_gpu_per_worker

    check_gpu_per_worker({"LOCAL_WORLD_SIZE": "2", "LOCAL_RANK": "1"}, 2)
    check_gpu_per_worker({}, 1)
    for env in ({"LOCAL_WORLD_SIZE": "2", "LOCAL_RANK": "0"}, {"LOCAL_RANK": "1"}):
        with pytest.raises(UserError, match=re.escape("2 workers on this machine (LOCAL_WORLD_SIZE) but it shows 1 "
                                                      "CUDA device(s)") + ".*--nproc-per-node 1.*train.device=cpu"):
            check_gpu_per_worker(env, 1)
    with pytest.raises(UserError, match="LOCAL_WORLD_SIZE='two'"):
        check_gpu_per_worker({"LOCAL_WORLD_SIZE": "two"}, 1)


@pytest.mark.parametrize("env,expected", [
    ({"WORLD_SIZE": "2"}, "RANK is not set but WORLD_SIZE=2 is: every worker needs an integer in [0, 1], its rank; "
                          "run the workers with `torchrun --nproc-per-node N -m sweeps.console train …`"),
    ({"WORLD_SIZE": "abc"}, "WORLD_SIZE='abc': must be a positive integer, the number of workers"),
    # a peer that never comes: bounded by HDROPE_RENDEZVOUS_TIMEOUT_S (it used to wait for torch's 30 minutes)
    ({"WORLD_SIZE": "2", "RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "{port}",
      "HDROPE_RENDEZVOUS_TIMEOUT_S": "3"},
     "torch.distributed rendezvous at 127.0.0.1:{port} (rank 0 of WORLD_SIZE=2): the other workers did not all join "
     "within 3 s (Timed out after"),
])
def test_hdrope_train_in_a_torchrun_environment_it_cannot_use_exits_2(tmp_path, cache_dir, env, expected):
    import subprocess
    import sys
    import time

    port = str(_free_port())
    env = {k: v.replace("{port}", port) for k, v in env.items()}
    cmd = [sys.executable, "-m", "sweeps.console", "train", "tiny", *OVERRIDES, f"train.out_dir={tmp_path / 'run'}",
           f"data.cache_dir={cache_dir}", "--no-progress"]
    start = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env={**os.environ, **env})
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert expected.replace("{port}", port) in proc.stderr
    assert time.monotonic() - start < 60


def test_a_worker_says_at_once_whom_it_waits_for_where_and_how_long(tmp_path, cache_dir):
    """A rank whose peer never comes prints, while it still waits, the ranks it waits for, MASTER_ADDR:MASTER_PORT
    and the limit from HDROPE_RENDEZVOUS_TIMEOUT_S (it used to be silent until the timeout)."""
    import subprocess
    import sys

    from trainer.run.distributed import TorchrunEnv, waiting_line

    port = _free_port()
    env = {**os.environ, "WORLD_SIZE": "3", "RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
           "HDROPE_RENDEZVOUS_TIMEOUT_S": "60"}
    cmd = [sys.executable, "-m", "sweeps.console", "train", "tiny", *OVERRIDES, f"train.out_dir={tmp_path / 'run'}",
           f"data.cache_dir={cache_dir}", "--no-progress"]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=env)
    try:
        line = proc.stderr.readline().strip()
        assert proc.poll() is None, "the worker gave up before saying what it waits for"
        assert line == (f"rank 0 of WORLD_SIZE=3 waits for ranks 1–2 at 127.0.0.1:{port} (hosting the rendezvous) "
                        "for at most 60 s (HDROPE_RENDEZVOUS_TIMEOUT_S)")
    finally:
        proc.kill()
        proc.wait()
    assert waiting_line(TorchrunEnv(2, 4, "node0", 29500), 300) == (
        "rank 2 of WORLD_SIZE=4 waits for ranks 0, 1, 3 at node0:29500 (meeting rank 0) for at most 300 s "
        "(HDROPE_RENDEZVOUS_TIMEOUT_S)")
