"""`hdrope ui` at its edges (issue 19), against a real `mlflow server`: the README's --allowed-hosts form, ports out
of range or 0, and the runs-table link it prints."""

import json
import re
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request

import psutil
import pytest

SPEC = """
name: uisweep
base: tiny
storage: {storage}
axes: {{model.pe.rotation_dim: [2, 4]}}
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ui(*args, cwd):
    return subprocess.Popen([sys.executable, "-m", "sweeps.console", "ui", *args], cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _alive(procs):
    return [p for p in procs if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


def _stop(proc) -> list:
    """SIGTERM `hdrope ui` (it stops its server's tree), kill whatever is left; returns the tree it had."""
    tree = psutil.Process(proc.pid).children(recursive=True) if proc.poll() is None else []
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(60)
    finally:
        for p in _alive(tree):
            p.kill()
        proc.kill()
    return tree


@pytest.fixture
def sweep_store(tmp_path, migrated_mlflow_db):
    """A planned sweep with its MLflow experiment and parent run (what a sweep's driver writes before Ray), in a
    store of its own (a copy of the session's migrated empty database: the schema migrations run once)."""
    import shutil

    from sweeps.plan_file import save_plan
    from sweeps.runner import prepare
    from trainer.run.tracking import SweepTracker

    spec = tmp_path / "uisweep.yaml"
    spec.write_text(SPEC.format(storage=tmp_path / "store"))
    plan = prepare(str(spec))
    save_plan(plan)
    shutil.copyfile(migrated_mlflow_db, plan.root / "mlflow.db")
    SweepTracker(f"sqlite:///{plan.root / 'mlflow.db'}", "uisweep").parent_run()
    return tmp_path / "store"


@pytest.mark.parametrize("port", ["70000", "-1"])
def test_a_port_out_of_range_exits_2(tmp_path, port, hdrope_here):  # refused before a server starts
    out = hdrope_here(["ui", "--tracking-uri", f"sqlite:///{tmp_path / 'm.db'}", "--port", port])
    assert out.returncode == 2, out.stderr[-2000:]
    assert f"--port {port}: a TCP port is 1 to 65535 (0 picks a free one)" in out.stderr
    assert "Traceback" not in out.stderr


def _status(url: str, host: str) -> int:
    request = urllib.request.Request(url, headers={"Host": host})
    try:
        with urllib.request.urlopen(request, timeout=10) as r:
            return r.status
    except urllib.error.HTTPError as err:
        return err.code


@pytest.mark.slow
def test_the_allowed_hosts_form_answers_its_names_and_the_runs_view_lists_the_cells(sweep_store, tmp_path):
    """One server (each start is about 15 s) for two checks. The README's --allowed-hosts form answers its names and
    loopback, and the DNS-rebinding guard still refuses another name. Issue 27 §6: the printed runs page's stored
    view filters to the cells (the parent run, which has no metrics, was a row among them); a view stored before
    keeps its order and gains the filter; `hdrope ui` prints the parent run's own page. SIGTERM ends it with 143,
    its server's whole process tree with it, and the port is free again. (Was also test_sweeps_e2e's
    test_ui_serves_a_sweep_store_on_localhost, a server of its own.)"""
    import mlflow

    from sweeps.plan_file import find_plan
    from trainer.run.tracking import SweepTracker

    tracker = SweepTracker(f"sqlite:///{find_plan('uisweep', str(sweep_store)).root / 'mlflow.db'}", "uisweep")
    cells = {tracker.cell_run(f"c{i}", f"h{i}", {}, {}, run_name=f"cell-{i}") for i in (1, 2)}
    parent = tracker.parent_run()
    stale = {"orderByKey": "metrics.`val_loss_x2`", "orderByAsc": False}  # as a sweep of an older lab stored it
    tracker.client.set_experiment_tag(tracker.experiment_id, "mlflow.sharedViewState.hdrope-runs", json.dumps(stale))
    port = _free_port()
    ui = _ui("uisweep", "--storage", str(sweep_store), "--port", str(port), "--allowed-hosts",
             f"lab-box,lab-box:{port}", cwd=tmp_path)
    try:
        lines = [ui.stdout.readline() for _ in range(3)]  # the URL, the runs page, the sweep's own run
        assert f"http://127.0.0.1:{port}" in lines[0], ui.stderr.read() if ui.poll() is not None else lines
        assert "runs of uisweep: http://127.0.0.1" in lines[1]
        api = f"http://127.0.0.1:{port}/api/2.0/mlflow/experiments/search?max_results=5"
        assert _status(api, f"lab-box:{port}") == 200  # the names the user gave
        assert _status(api, f"127.0.0.1:{port}") == 200 and _status(api, f"localhost:{port}") == 200  # loopback
        assert _status(api, f"evil.example:{port}") == 403  # the DNS-rebinding guard still holds
        client = mlflow.MlflowClient(f"http://127.0.0.1:{port}")
        exp = client.get_experiment_by_name("uisweep")
        view = json.loads(exp.tags["mlflow.sharedViewState.hdrope-runs"])
        listed = client.search_runs([exp.experiment_id], filter_string=view["searchFilter"])
        everything = client.search_runs([exp.experiment_id])
        tree = psutil.Process(ui.pid).children(recursive=True)
        assert tree  # mlflow server, uvicorn, job consumers
        ui.send_signal(signal.SIGTERM)  # what `hdrope ui` started, it stops
        assert ui.wait(60) == 143
        _, survivors = psutil.wait_procs(tree, timeout=20)
        assert not _alive(survivors), [p.cmdline() for p in _alive(survivors)]
    finally:
        _stop(ui)
    assert "Traceback" not in ui.stderr.read()
    from sweeps.mlflow_server import port_in_use

    assert not port_in_use("127.0.0.1", port)
    assert view == {**stale, "searchFilter": "tags.role = 'cell'"}
    assert {r.info.run_id for r in listed} == cells  # the default list: the cells, one row each
    assert {r.info.run_id for r in everything} == cells | {parent}  # the parent is still in the experiment
    assert lines[2].startswith("the sweep's own run (plan, report): ") and parent in lines[2], lines


@pytest.mark.slow
def test_port_0_serves_on_a_free_port_prints_the_training_view_and_rapid_sigints_stop_it_all(sweep_store, tmp_path):
    """`--port 0` picks a free port and prints it; the runs page it prints next opens the training view with the
    stored view's metric columns and order. Then five SIGINTs 50 ms apart (a key held down): `hdrope ui` exits 130
    and no process of its server survives (a second signal used to cut its cleanup short and leave the server
    running under PID 1). One server for both: each start is about 15 s."""
    import time

    import mlflow

    ui = _ui("uisweep", "--storage", str(sweep_store), "--port", "0", cwd=tmp_path)
    try:
        line = ui.stdout.readline()
        assert "MLflow UI for" in line, ui.stderr.read()[-2000:] if ui.poll() is not None else line
        found = re.search(r"http://127\.0\.0\.1:(\d+)", line)
        assert found and int(found.group(1)) > 0, line
        with urllib.request.urlopen(f"{found.group(0)}/health", timeout=10) as r:
            assert r.status == 200
        page = re.search(r"(http://\S+)", ui.stdout.readline()).group(1)
        exp = mlflow.MlflowClient(found.group(0)).get_experiment_by_name("uisweep")
        tree = psutil.Process(ui.pid).children(recursive=True)
        assert tree  # the mlflow server and its workers
        for _ in range(5):
            ui.send_signal(signal.SIGINT)
            time.sleep(0.05)
        assert ui.wait(60) == 130
        _, alive = psutil.wait_procs(tree, timeout=10)
        assert not _alive(alive), [p.cmdline() for p in _alive(alive)]
    finally:
        _stop(ui)
    assert page.startswith(found.group(0))
    assert "workflowType=machine_learning" in page and "viewStateShareKey=hdrope-runs" in page
    assert "orderByKey" not in page  # an order in the URL would make MLflow's UI ignore the stored view
    view = json.loads(exp.tags["mlflow.sharedViewState.hdrope-runs"])
    assert view["selectedColumns"][:3] == ["metrics.`val_loss`", "metrics.`val_loss_x2`", "metrics.`passkey_acc`"]
    assert view["orderByKey"] == "metrics.`val_loss`" and view["orderByAsc"] is True


def test_a_store_under_a_file_exits_2_before_a_server_starts(tmp_path, hdrope_here):
    """`--tracking-uri sqlite:///<a file>/x.db`: exit 2 naming the flag and the file (was a psutil traceback)."""
    blocker = tmp_path / "afile"
    blocker.write_text("not a directory")
    out = hdrope_here(["ui", "--tracking-uri", f"sqlite:///{blocker / 'x.db'}", "--port", str(_free_port())])
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr[-2000:]
    assert f"--tracking-uri sqlite:///{blocker / 'x.db'}: {blocker} is a file" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
