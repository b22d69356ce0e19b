"""Sweeps end to end with real parts: local Ray, a real `mlflow server`, a two-node cluster; MLflow's numbers checked
against the cells' own; `hdrope bench sweep` through the real Tune path. After the two-node test, every test here
runs on this process's shared Ray, started once for them all (crashes: test_sweep_crashes_e2e.py).

All marked slow: `.ci/run` runs them; deselect locally with -m 'not slow'.
"""

import json
import os
import re
import secrets
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest

pytestmark = pytest.mark.slow

SPEC = """
name: {name}
base: tiny
storage: {storage}
tracking_uri: "{uri}"
overrides:
  train.steps: {steps}
  train.batch_size: {batch}
  train.threads: 1
  train.log_every: 5
  train.eval_every: {eval_every}
  train.ckpt_every: {ckpt}
  eval.passkey.enabled: false
  eval.extrapolation_batches: 1
  dump.enabled: {dump}
  dump.samples: 1{extra}
axes:
  model.pe.rotation_dim: {dims}{basis_axis}
resources: {resources}
max_concurrent: {concurrent}
max_failures: 2
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_spec(tmp_path, name, uri="", steps=20, batch=8, ckpt=10, dims="[2, 4]", bases="[identity, paley]",
               concurrent=0, eval_every=0, dump=True, resources="{cpus: 1}", extra=None) -> Path:
    """A tiny sweep spec under tmp_path; bases=None leaves out the basis axis, `extra` adds overrides."""
    path = tmp_path / f"{name}.yaml"
    basis_axis = f"\n  model.pe.basis: {bases}" if bases else ""
    lines = "".join(f"\n  {k}: {v}" for k, v in (extra or {}).items())
    path.write_text(SPEC.format(name=name, storage=tmp_path / "store", uri=uri, steps=steps, batch=batch, ckpt=ckpt,
                                dims=dims, basis_axis=basis_axis, concurrent=concurrent, eval_every=eval_every,
                                dump=str(dump).lower(), resources=resources, extra=lines))
    return path


def ray_env(extra: dict | None = None) -> dict:
    """This test's environment: its embedded Ray lives in a temp dir of its own (short: Unix socket paths)."""
    return {**os.environ, "HDROPE_RAY_TMPDIR": tempfile.mkdtemp(prefix="hdray-"), **(extra or {})}


def hdrope(*args, cwd, timeout=600, env=None, **kw):
    """`hdrope ...` in a subprocess; a sweep driver shuts down the Ray it started (and its watchdog stops the rest)."""
    return subprocess.run([sys.executable, "-m", "sweeps.console", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env=env or ray_env(), **kw)


def alive(procs: list[psutil.Process]) -> list[psutil.Process]:
    out = []
    for p in procs:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.Error:
            pass
    return out


def stop_cluster(*temp_dirs: str) -> None:
    """Stop only the Ray cluster this test started: the processes naming its temp dirs, and their children."""
    from sweeps.procs import stop_tree

    stop_tree([p for p in psutil.process_iter(["cmdline"])
               if any(d in " ".join(p.info["cmdline"] or []) for d in temp_dirs)])


def cell_runs(uri: str, sweep: str):
    import mlflow

    client = mlflow.MlflowClient(uri)
    exp = client.get_experiment_by_name(sweep)
    runs = client.search_runs([exp.experiment_id])
    return client, [r for r in runs if r.data.tags.get("role") == "cell"], [r for r in runs
                                                                            if r.data.tags.get("role") == "parent"]


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory):
    from sweeps.mlflow_server import start_server

    root = tmp_path_factory.mktemp("mlflow")
    proc, url = start_server(f"sqlite:///{root / 'server.db'}", port=free_port(), artifacts_dir=str(root / "art"))
    yield url
    proc.terminate()
    proc.wait(30)


def test_two_node_cluster_runs_a_submitted_sweep(tmp_path, cache_dir):
    # a token of the test's own: a clean machine has no ~/.ray/auth_token, and `ray start` makes none
    token = tmp_path / "auth_token"
    token.write_text(secrets.token_hex(32))
    env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token)}
    env.pop("RAY_AUTH_TOKEN", None)
    gcs, dash = free_port(), free_port()
    head_dir, worker_dir = tempfile.mkdtemp(prefix="hdrh-"), tempfile.mkdtemp(prefix="hdrw-")
    repo = Path(__file__).resolve().parent.parent
    before = subprocess.run(["git", "status", "--porcelain"], cwd=repo, capture_output=True, text=True).stdout
    def own_ports() -> list[str]:  # Ray's fixed defaults (agent 52365, metrics) collide with any other Ray here
        return [f"--dashboard-agent-listen-port={free_port()}", f"--metrics-export-port={free_port()}",
                f"--runtime-env-agent-port={free_port()}"]

    try:
        head = subprocess.run(["ray", "start", "--head", f"--port={gcs}", "--dashboard-host=127.0.0.1",
                               f"--dashboard-port={dash}", "--num-cpus=1", "--include-dashboard=true",
                               f"--ray-client-server-port={free_port()}", *own_ports(), f"--temp-dir={head_dir}"],
                              env=env, capture_output=True, text=True, timeout=180)
        assert head.returncode == 0, head.stderr[-2000:]
        worker = subprocess.run(["ray", "start", f"--address=127.0.0.1:{gcs}", "--num-cpus=1", *own_ports(),
                                 f"--temp-dir={worker_dir}"], env=env, capture_output=True, text=True, timeout=180)
        assert worker.returncode == 0, worker.stderr[-2000:]
        job_dir = tmp_path / "job"  # the job's working dir: the spec alone (the code is installed on the nodes)
        job_dir.mkdir()
        spec = job_dir / "twonode.yaml"
        spec.write_text(write_spec(tmp_path, "twonode", steps=10, dims="[4]").read_text())  # 2 cells, 2 trials
        out = hdrope("sweep", "submit", str(spec), "--address", f"http://127.0.0.1:{dash}", "--working-dir",
                     str(job_dir), cwd=tmp_path, env=env, timeout=300)
        assert out.returncode == 0, out.stderr[-3000:]
        job_id = out.stdout.strip().splitlines()[-1]
        assert job_id.startswith("raysubmit_")
        # one client process of its own (Ray reads its auth mode once per process) asks every second until the job ends
        code = (f"import time\nfrom sweeps.submit import job_status\n"
                f"while (s := job_status('http://127.0.0.1:{dash}', '{job_id}')) not in ('SUCCEEDED', 'FAILED', "
                f"'STOPPED'):\n    time.sleep(1)\nprint(s)")
        ended = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=400)
        assert ended.stdout.strip() == "SUCCEEDED", ended.stdout + ended.stderr[-3000:]
        _, runs, _ = cell_runs(f"sqlite:///{tmp_path / 'store' / 'twonode' / 'mlflow.db'}", "twonode")
        assert len(runs) == 2 and all(r.info.status == "FINISHED" for r in runs)
    finally:
        stop_cluster(head_dir, worker_dir)
    assert subprocess.run(["git", "status", "--porcelain"], cwd=repo, capture_output=True, text=True).stdout == before


def test_local_grid_logs_one_run_per_cell_to_a_real_mlflow_server(tmp_path, cache_dir, mlflow_server, shared_ray,
                                                                  hdrope_here):
    """In this process on its shared Ray (the embedded Ray's own start, stop and quiet output: the crash tests)."""
    # task windows in the batches (made by a producer process forked in each Ray trial) and the strided loss
    extra = {"data.tasks": "[copy]", "data.task_ratio": 0.5, "eval.tasks.samples": 4,
             "eval.tasks.length_factors": "[1, 2]", "eval.sliding_stride": 32, "train.batch_producer": "process"}
    spec = write_spec(tmp_path, "e2e", uri=mlflow_server, extra=extra)
    out = hdrope_here(["sweep", "run", str(spec)], cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    # before Ray: the plan summary and an estimate; during: one line per trial event with step of total and ETA
    assert "4 cells, 3 trials to train (1 saved by dedup)" in out.stderr and "estimated time: about" in out.stderr
    assert re.search(r"4D-Paley-θ10000-s42 +step +\d+/20 +eta", out.stderr), out.stderr[-3000:]
    assert "TensorBoard" not in out.stderr and "Creating initial MLflow database tables" not in out.stderr
    # Tune's own output is off; each line counts the trial in its new state
    assert "Configuration for experiment" not in out.stdout + out.stderr
    events = [line for line in out.stderr.splitlines() if re.search(r"\] \S+ +(started|finished)", line)]
    assert re.search(r"started +\(1 running, 2 pending\)$", events[0]), events
    assert events[-1].endswith("(3 done)"), events
    client, cells, parents = cell_runs(mlflow_server, "e2e")
    assert len(cells) == 4 and len(parents) == 1
    assert all(r.info.status == "FINISHED" for r in cells + parents)
    by_cell = {r.data.tags["cell_id"]: r for r in cells}
    dedup = by_cell["c001-rotation_dim2-basispaley"]
    assert dedup.data.tags["dedup_of"] == "c000-rotation_dim2-basisidentity"
    assert dedup.data.metrics["val_loss"] == by_cell["c000-rotation_dim2-basisidentity"].data.metrics["val_loss"]
    paley = by_cell["c003-rotation_dim4-basispaley"]
    assert paley.data.params["model.pe.rotation_dim"] == "4" and paley.data.params["model.pe.basis"] == "paley"
    assert paley.data.tags["mlflow.parentRunId"] == parents[0].info.run_id
    assert len(paley.data.tags["config_hash"]) == 16 and paley.data.tags["git_commit"]
    for cell_id, run in by_cell.items():  # each run ends when its cell ended, not when the sweep did
        if "dedup_of" not in run.data.tags:
            done = tmp_path / "store" / "e2e" / "cells" / cell_id / "result.json"
            assert abs(run.info.end_time - done.stat().st_mtime * 1000) < 1000, cell_id
    history = client.get_metric_history(paley.info.run_id, "train_loss")
    assert [m.step for m in history] == [5, 10, 15, 20]
    assert {a.path for a in client.list_artifacts(paley.info.run_id)} >= {"config", "result", "attention"}
    import pyarrow.parquet as pq

    table = pq.read_table(tmp_path / "store" / "e2e" / "results.parquet").to_pylist()
    assert len(table) == 4 and all(r["status"] == "FINISHED" and r["val_loss"] for r in table)
    # the task accuracy and the strided loss reach result.json, MLflow and results.parquet as the same numbers
    row = next(r for r in table if r["cell_id"] == "c003-rotation_dim4-basispaley")
    done = json.loads((tmp_path / "store" / "e2e" / "cells" / row["cell_id"] / "result.json").read_text())["metrics"]
    for name in ("acc_copy_x1", "acc_copy_x2", "n_copy_x2", "val_loss_sw_x2", "val_loss_sw_x8"):
        assert done[name] is not None and paley.data.metrics[name] == row[name] == done[name], name
    assert done["n_copy_x2"] == 4 and done["val_loss_sw_x8"] != done["val_loss_x8"]
    status = hdrope_here(["sweep", "status", "e2e", "--storage", str(tmp_path / "store")], cwd=tmp_path)
    assert status.returncode == 0 and "FINISHED 4" in status.stdout


def _trial_workers(driver_pid: int, markers: tuple[str, ...] = ("run_trial", "ImplicitFunc")) -> list[psutil.Process]:
    """The trial workers (processes named by a marker) of this test's sweep driver, never another Ray's."""
    found = []
    for p in psutil.Process(driver_pid).children(recursive=True):
        try:
            text = " ".join(p.cmdline()) + " " + p.name()
        except psutil.Error:
            continue
        if any(m in text for m in markers):
            found.append(p)
    return found


LOOPBACK = ("127.0.0.1", "::1", "::ffff:127.0.0.1")


def _cmdline(p: psutil.Process) -> list[str]:
    try:
        return p.cmdline()
    except psutil.Error:
        return []


def _listening(p: psutil.Process) -> list:
    try:
        return [c for c in p.net_connections(kind="inet") if c.status == psutil.CONN_LISTEN]
    except psutil.Error:
        return []


def _wait_for(predicate, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def test_optuna_search_runs_and_keeps_its_study_in_a_journal(tmp_path, cache_dir, shared_ray):
    """A driver of its own joins a running loopback-bound Ray with `--address 127.0.0.1:PORT` (it used to dial the
    machine's LAN address and hang), and Optuna's trials run there."""
    spec = tmp_path / "opt.yaml"
    spec.write_text(f"""
name: opt
base: tiny
storage: {tmp_path / 'store'}
overrides: {{train.steps: 10, train.threads: 1, eval.passkey.enabled: false, eval.extrapolation_batches: 0}}
search:
  kind: optuna
  n_trials: 3
  metric: val_loss
  space:
    optim.lr: {{type: float, low: 1.0e-4, high: 1.0e-2, log: true}}
resources: {{cpus: 1}}
""")
    assert shared_ray.startswith("127.0.0.1:")
    out = hdrope("sweep", "run", str(spec), "--address", shared_ray, cwd=tmp_path, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    import optuna
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    storage = JournalStorage(JournalFileBackend(str(tmp_path / "store" / "opt" / "optuna.journal")))
    study = optuna.load_study(study_name="opt", storage=storage)
    assert len(study.trials) == 3
    lrs = sorted(t.params["optim.lr"] for t in study.trials)
    assert len(set(lrs)) == 3 and 1e-4 <= lrs[0] and lrs[-1] <= 1e-2
    import pyarrow.parquet as pq

    rows = pq.read_table(tmp_path / "store" / "opt" / "results.parquet").to_pylist()
    assert len(rows) == 3 and all(r["status"] == "FINISHED" and r["cell_id"].startswith("t-") for r in rows)
    _, runs, _ = cell_runs(f"sqlite:///{tmp_path / 'store' / 'opt' / 'mlflow.db'}", "opt")
    assert len(runs) == 3


def test_a_failing_cell_does_not_stop_the_sweep_and_ends_failed(tmp_path, cache_dir, shared_ray, hdrope_here):
    spec = tmp_path / "fail.yaml"
    spec.write_text(f"""
name: fail
base: tiny
storage: {tmp_path / 'store'}
overrides: {{train.steps: 8, train.threads: 1, eval.passkey.enabled: false, eval.extrapolation_batches: 0}}
axes:
  model.init_std: [0.02, 1.0e30]   # the second diverges: NaN loss
resources: {{cpus: 1}}
max_failures: 1
""")
    out = hdrope_here(["sweep", "run", str(spec)], cwd=tmp_path)
    assert out.returncode == 1, out.stderr[-3000:]  # the sweep ran to the end and says a cell failed
    assert "1 cells finished, 1 failed" in out.stderr
    _, runs, parents = cell_runs(f"sqlite:///{tmp_path / 'store' / 'fail' / 'mlflow.db'}", "fail")
    status = {r.data.tags["cell_id"]: r for r in runs}
    assert status["c000-init_std0.02"].info.status == "FINISHED"
    failed = status["c001-init_std1e_30"]
    assert failed.info.status == "FAILED" and "TrainingDiverged" in failed.data.tags["error"]
    assert parents[0].data.tags["failed_cells"] == "c001-init_std1e_30"
    logs = hdrope_here(["sweep", "logs", "fail", "--storage", str(tmp_path / "store")], cwd=tmp_path)
    assert logs.returncode == 0 and "ERROR TrainingDiverged" in logs.stdout


TRUST_SPEC = """
name: trust
base: tiny
storage: {storage}
overrides:
  data.cache_dir: {cache}
  train.steps: 20
  train.threads: 1
  train.log_every: 5
  train.eval_every: 10      # a mid-run evaluation: its value must never stand in for the final one
  train.ckpt_every: 10
  eval.extrapolation: [2, 16]
  eval.extrapolation_batches: 1
  eval.passkey.enabled: false
axes:
  model.pe.kind: [rope, hdrope]
  model.pe.basis: [identity, paley]
resources: {{cpus: 1}}
"""


def test_mlflow_holds_each_cells_own_final_numbers(tmp_path, cache_dir, shared_ray, hdrope_here):
    """The numbers in MLflow are the run's numbers: a real sweep with mid-run evaluations, checked cell by cell
    (dedup copies included) against results.parquet and each cell's own files."""
    import mlflow
    import pyarrow.parquet as pq

    spec = tmp_path / "trust.yaml"
    spec.write_text(TRUST_SPEC.format(storage=tmp_path / "store", cache=cache_dir))
    out = hdrope_here(["sweep", "run", str(spec)], cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    root = tmp_path / "store" / "trust"
    results = pq.read_table(root / "results.parquet").to_pandas().set_index("cell_id")
    client = mlflow.MlflowClient(f"sqlite:///{root / 'mlflow.db'}")
    exp = client.get_experiment_by_name("trust")
    runs = {r.data.tags["cell_id"]: r for r in client.search_runs([exp.experiment_id])
            if r.data.tags.get("role") == "cell"}
    assert set(runs) == set(results.index) and len(runs) == 4
    assert exp.tags["mlflow.experimentKind"] == "custom_model_development"  # the UI opens on the runs
    assert {r.info.run_name for r in runs.values()} == {"RoPE-θ10000-s42", "4D-identity-θ10000-s42",
                                                        "4D-Paley-θ10000-s42"}
    assert results["dedup_of"].notna().sum() == 1  # rope x paley is rope x identity
    for cell_id, run in runs.items():
        row = results.loc[cell_id]
        assert run.info.status == "FINISHED"
        for metric in ("val_loss", "val_bpb", "val_loss_x2", "val_loss_x16", "train_loss"):
            assert run.data.metrics[metric] == pytest.approx(row[metric], rel=1e-9), (cell_id, metric)
        history = client.get_metric_history(run.info.run_id, "val_loss")
        assert sorted(m.step for m in history) == [10, 20], cell_id  # each evaluation once, at its own step
        trained = root / "cells" / row["trained_cell"]
        records = [json.loads(line) for line in (trained / "metrics.jsonl").open()]
        assert {m.step: m.value for m in history} == pytest.approx({r["step"]: r["val_loss"] for r in records
                                                                    if "val_loss" in r})
    dedup_id = results.index[results["dedup_of"].notna()][0]
    dedup = runs[dedup_id]
    assert dedup.data.tags["dedup_of"] == results.loc[dedup_id, "dedup_of"]
    config = client.download_artifacts(dedup.info.run_id, "config/config.yaml", str(tmp_path / "dl"))
    text = open(config).read()
    assert "basis: paley" in text and "kind: rope" in text and f"name: {dedup_id}" in text  # its own config
    assert (root / "cells" / dedup_id / "dedup.json").is_file()


def test_bench_sweep_times_empty_trials_at_two_sizes_and_training_trials(cache_dir, shared_ray, capsys):
    """`hdrope bench sweep` runs both of its parts through the real Tune path on the Ray it finds (this process's
    shared Ray), prints them, and leaves that Ray running."""
    from sweeps.console import main

    assert main(["bench", "sweep", "--steps", "1", "--small", "1", "--large", "2", "--seeds", "1", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["trials"] == 2 and r["empty_trials"] == [1, 2] and len(r["empty_s"]) == 2 and min(r["empty_s"]) > 0
    slope = r["empty_s"][1] - r["empty_s"][0]
    assert r["overhead_per_trial_s"] == pytest.approx(slope)
    assert r["fixed_per_sweep_s"] == pytest.approx(r["empty_s"][0] - slope)
    assert r["mean_per_trial_s"] == pytest.approx(r["empty_s"][1] / 2) and r["target_s"] == 0.5
    assert r["tune_over_sequential"] == pytest.approx(r["tune_s"] / r["sequential_s"])
    import ray

    assert ray.is_initialized()  # what it did not start, it did not stop
