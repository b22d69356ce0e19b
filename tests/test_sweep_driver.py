"""The sweep driver's own bookkeeping, without Ray: one driver per sweep directory, and MLflow runs that end when
their cell ended (issue 19). Real parts: a real SQLite MLflow store, real subprocesses of `hdrope`."""

import json
import os
import shutil
import subprocess
import sys

import pytest

SPEC = """
name: locked
base: tiny
storage: {storage}
overrides: {{train.steps: 2, eval.passkey.enabled: false, eval.extrapolation_batches: 0}}
axes: {{model.pe.rotation_dim: [2, 4]}}
resources: {{cpus: 1}}
"""


def _hdrope(*args, cwd):
    return subprocess.run([sys.executable, "-m", "sweeps.console", *args], capture_output=True, text=True,
                          timeout=300, cwd=cwd)


def test_a_second_driver_of_a_sweep_is_refused_naming_the_holder(tmp_path):
    from sweeps.plan_file import save_plan
    from sweeps.runner import prepare
    from trainer.files.dir_lock import hold_dir_lock

    spec = tmp_path / "locked.yaml"
    spec.write_text(SPEC.format(storage=tmp_path / "store"))
    plan = prepare(str(spec))
    save_plan(plan)
    with hold_dir_lock(plan.root, "hdrope sweep run"):  # this test process plays the running driver
        run = _hdrope("sweep", "run", str(spec), cwd=tmp_path)
        resume = _hdrope("sweep", "resume", "locked", "--storage", str(tmp_path / "store"), cwd=tmp_path)
    for out in (run, resume):
        assert out.returncode == 2, out.stderr[-2000:]
        assert f"is in use by hdrope sweep run (PID {os.getpid()}" in out.stderr, out.stderr[-2000:]
        assert "Traceback" not in out.stderr
    assert not (plan.root / "ray").exists() and not (plan.root / "mlflow.db").exists()  # refused before Ray/MLflow


def test_each_cells_mlflow_run_ends_when_the_cell_ended_not_when_the_sweep_did(tiny_sweep, tmp_path):
    import mlflow

    from sweeps.plan_file import load_plan
    from sweeps.runner import _reconcile

    sweep = tmp_path / "tinysweep"
    shutil.copytree(tiny_sweep, sweep, ignore=shutil.ignore_patterns("report", "mlflow.db"))  # keeps mtimes
    plan = load_plan(sweep)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    finished, failed = _reconcile(plan, uri)
    assert finished == len(plan.cells) and not failed
    client = mlflow.MlflowClient(uri)
    exp = client.get_experiment_by_name(plan.spec.name)
    runs = [r for r in client.search_runs([exp.experiment_id]) if r.data.tags.get("role") == "cell"]
    trained = [r for r in runs if "dedup_of" not in r.data.tags]
    assert len(trained) == 6
    for run in trained:
        done = (sweep / "cells" / run.data.tags["cell_id"] / "result.json").stat().st_mtime
        assert run.info.status == "FINISHED"
        assert run.info.end_time == int(done * 1000), run.info.run_name  # its own end, not the reconcile's "now"
    ends = sorted(r.info.end_time for r in trained)
    assert ends[0] < ends[-1]  # the cells trained one after another: six different ends


@pytest.mark.parametrize("damage,problem", [
    (lambda r: r["metrics"].update(val_loss="garbage"), "metric val_loss is 'garbage', not a finite number"),
    (lambda r: r.update(metrics=[1, 2]), "metrics is list, not a mapping"),
    (lambda r: r.update(step="12"), "step is '12', not a step count"),
    (lambda r: r.pop("config_hash"), "config_hash is None"),
])
def test_a_result_json_that_is_not_the_trainers_is_never_used(tiny_sweep, tmp_path, damage, problem, hdrope_here):
    import pyarrow.parquet as pq

    sweep = tmp_path / "tinysweep"
    shutil.copytree(tiny_sweep, sweep, ignore=shutil.ignore_patterns("report", "mlflow.db"))
    cell = sorted(p for p in (sweep / "cells").iterdir() if (p / "result.json").is_file())[0]
    result = json.loads((cell / "result.json").read_text())
    damage(result)
    (cell / "result.json").write_text(json.dumps(result))
    out = hdrope_here(["sweep", "results", str(sweep)], cwd=tmp_path)
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr[-2000:]
    rows = pq.read_table(sweep / "results.parquet").to_pandas()
    bad = rows[rows["trained_cell"] == cell.name]
    assert (bad["status"] == "CORRUPT").all() and bad["val_loss"].isna().all()
    assert bad["error"].str.contains(f"{cell / 'result.json'}: result.json is corrupt ({problem}", regex=False).all()
    assert f"warning: cell {cell.name}: {cell / 'result.json'}: result.json is corrupt" in out.stderr
    assert "delete it and resume the run" in out.stderr
    assert (rows.loc[rows["trained_cell"] != cell.name, "status"] == "FINISHED").all()


def test_a_result_json_of_another_config_is_never_used(tiny_sweep, tmp_path):
    import pyarrow.parquet as pq

    sweep = tmp_path / "tinysweep"
    shutil.copytree(tiny_sweep, sweep, ignore=shutil.ignore_patterns("report", "mlflow.db"))
    first, second = sorted(p for p in (sweep / "cells").iterdir() if (p / "result.json").is_file())[:2]
    shutil.copy(second / "result.json", first / "result.json")  # a result copied over from another cell
    out = _hdrope("sweep", "results", str(sweep), cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = pq.read_table(sweep / "results.parquet").to_pandas().set_index("cell_id")
    assert rows.loc[first.name, "status"] == "CORRUPT" and "result.json is of config" in rows.loc[first.name, "error"]
    assert rows.loc[second.name, "status"] == "FINISHED"
    assert f"warning: cell {first.name}" in out.stderr
