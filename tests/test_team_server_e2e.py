"""A team's tracking server on a real database: PostgreSQL behind `mlflow server`, two sweeps logging to it at once,
and the server killed and restarted mid-sweep without a value lost.

Marked slow (`.ci/run` runs it; it installs Debian's `postgresql` package). PostgreSQL is found on PATH or under
/usr/lib/postgresql/<version>/bin; without it, or without the psycopg driver (the dev extra), the test skips.
"""

import json
import os
import pwd
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest
from test_sweeps_e2e import cell_runs, free_port, ray_env, write_spec

pytestmark = pytest.mark.slow


def postgres_bin() -> Path | None:
    """The directory of initdb and pg_ctl: on PATH, or Debian's /usr/lib/postgresql/<newest version>/bin."""
    found = shutil.which("pg_ctl")
    if found and shutil.which("initdb"):
        return Path(found).resolve().parent
    versions = sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"), key=lambda p: int(p.parent.parent.name)
                      if p.parent.parent.name.isdigit() else 0)
    return versions[-1].parent if versions else None


def _as_db_user() -> list[str]:
    """A command prefix that runs PostgreSQL as a non-root user (it refuses to run as root): `postgres` where the
    Debian package made it, else `nobody`; nothing when the tests do not run as root."""
    if os.geteuid() != 0:
        return []
    for user in ("postgres", "nobody"):
        try:
            pwd.getpwnam(user)
        except KeyError:
            continue
        return ["runuser", "-u", user, "--"] if shutil.which("runuser") else ["su", user, "-s", "/bin/sh", "-c"]
    pytest.skip("the tests run as root and there is no `postgres` or `nobody` user to run PostgreSQL as")


def _run_as(prefix: list[str], cmd: list[str]) -> subprocess.CompletedProcess:
    if prefix[:1] == ["su"]:  # su takes one shell command line
        import shlex

        cmd = [shlex.join(cmd)]
    return subprocess.run([*prefix, *cmd], capture_output=True, text=True, timeout=120)


@pytest.fixture
def postgres():
    """A PostgreSQL cluster of its own (initdb into a temp dir, 127.0.0.1 on a free port, password auth), with an
    empty `mlflow` database; yields its postgresql:// URI and stops the server at the end."""
    bin_dir = postgres_bin()
    if bin_dir is None:
        pytest.skip("PostgreSQL is not installed (Debian package `postgresql`, which .ci/run installs)")
    try:
        import psycopg
    except ImportError:
        pytest.skip("the psycopg driver MLflow needs for postgresql:// is not installed (pip install -e '.[dev]')")
    prefix = _as_db_user()
    root = Path(tempfile.mkdtemp(prefix="hdpg-"))  # under /tmp: the database user cannot enter pytest's root dirs
    password, port = secrets.token_hex(16), free_port()
    (root / "pw").write_text(password)
    if prefix:
        user = prefix[2] if prefix[0] == "runuser" else prefix[1]
        shutil.chown(root, user)
        shutil.chown(root / "pw", user)
    data = root / "data"
    ctl = [str(bin_dir / "pg_ctl"), "-D", str(data)]
    try:
        init = _run_as(prefix, [str(bin_dir / "initdb"), "-D", str(data), "-U", "lab", f"--pwfile={root / 'pw'}",
                                "-A", "scram-sha-256", "--no-locale", "-E", "UTF8", "--no-sync"])
        assert init.returncode == 0, init.stdout + init.stderr
        options = f"-c listen_addresses=127.0.0.1 -p {port} -k {root} -c fsync=off"
        start = _run_as(prefix, [*ctl, "-l", str(root / "server.log"), "-w", "-t", "60", "-o", options, "start"])
        assert start.returncode == 0, start.stdout + start.stderr + (root / "server.log").read_text()
        with psycopg.connect(host="127.0.0.1", port=port, user="lab", password=password, dbname="postgres",
                             autocommit=True) as conn:
            conn.execute("CREATE DATABASE mlflow")
        yield f"postgresql+psycopg://lab:{password}@127.0.0.1:{port}/mlflow"  # the driver named: any SQLAlchemy 2
    finally:
        if (data / "postmaster.pid").is_file():
            stop = _run_as(prefix, [*ctl, "-m", "fast", "-w", "-t", "30", "stop"])
            if stop.returncode != 0 and (data / "postmaster.pid").is_file():  # stop it by its PID
                psutil.Process(int((data / "postmaster.pid").read_text().split()[0])).kill()
        shutil.rmtree(root, ignore_errors=True)


def records(run_dir: Path) -> list[dict]:
    from trainer.files.run_files import METRICS_FILE, read_metrics

    return read_metrics(run_dir / METRICS_FILE)


def history(client, run_id: str, keys) -> dict[tuple[str, int], float]:
    return {(k, m.step): m.value for k in keys for m in client.get_metric_history(run_id, k)}


def test_two_sweeps_share_a_postgres_backed_server_and_lose_nothing_when_it_restarts(tmp_path, cache_dir, postgres,
                                                                                     shared_ray):
    """Two drivers of their own, as two researchers' would be, joined to one running Ray (`--address`)."""
    from sweeps.mlflow_server import start_server
    from sweeps.procs import stop_tree

    t0 = time.monotonic()
    port = free_port()
    artifacts = str(tmp_path / "artifacts")
    server, url = start_server(postgres, port=port, artifacts_dir=artifacts, timeout=180)
    started_s = time.monotonic() - t0
    # The drivers' MLflow client gives up after one quick retry: the live logging surely fails while the server is
    # down, however fast it comes back, so what the sweeps logged then is what the end of each sweep recovered.
    env = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1"}
    names = ("team-a", "team-b")
    drivers, logs = {}, {}
    try:
        for name in names:
            (tmp_path / name).mkdir()
            # two cells of one model shape (the estimate before Ray times one shape)
            spec = write_spec(tmp_path / name, name, uri=url, steps=60, ckpt=30, dims="[4]", bases="[identity, paley]",
                              concurrent=1, dump=False)
            logs[name] = tmp_path / f"{name}.log"
            with open(logs[name], "w") as log:
                drivers[name] = subprocess.Popen([sys.executable, "-m", "sweeps.console", "sweep", "run", str(spec),
                                                  "--address", shared_ray], cwd=tmp_path, stdout=log,
                                                 stderr=subprocess.STDOUT, env=ray_env(env))
        cells = {name: tmp_path / name / "store" / name / "cells" for name in names}

        def written() -> dict[Path, int]:
            return {d: len(records(d)) for name in names if cells[name].is_dir() for d in cells[name].iterdir()}

        deadline = time.monotonic() + 300
        while not all(any(n for d, n in written().items() if cells[name] in d.parents) for name in names):
            assert time.monotonic() < deadline, "no sweep trained a step in 5 min"
            assert all(p.poll() is None for p in drivers.values()), {n: logs[n].read_text()[-3000:] for n in names}
            time.sleep(0.5)
        # both sweeps train and log: kill the server (its whole process group), then start it again on its port
        at_kill = written()
        stop_tree([psutil.Process(server.pid)])
        t_kill = time.monotonic()
        server, _ = start_server(postgres, port=port, artifacts_dir=artifacts, timeout=180)
        down_s = time.monotonic() - t_kill
        at_restart = written()
        while_down = sum(n - at_kill.get(d, 0) for d, n in at_restart.items())
        assert while_down > 0, "no metric was computed while the server was down: the sweeps are too short"
        for name, proc in drivers.items():
            assert proc.wait(timeout=600) == 0, logs[name].read_text()[-4000:]
        sweeps_s = time.monotonic() - t0
        assert any("does not answer" in logs[n].read_text() for n in names)  # a driver met the outage, went on
        compared = check_server_equals_files(url, tmp_path, names)
    finally:
        for proc in drivers.values():
            if proc.poll() is None:
                stop_tree([psutil.Process(proc.pid)])
        try:
            stop_tree([psutil.Process(server.pid)])
        except psutil.NoSuchProcess:
            pass
    print(f"\nserver up in {started_s:.0f} s; down {down_s:.0f} s ({while_down} records written meanwhile); sweeps "
          f"done at {sweeps_s:.0f} s; {compared} final metrics equal")


def check_server_equals_files(url: str, tmp_path: Path, names) -> int:
    """One finished run per cell under one finished parent, each run's metric history exactly its metrics.jsonl, its
    latest metrics results.parquet's final ones; returns how many final values were compared."""
    import pyarrow.parquet as pq

    compared = 0
    for name in names:
        client, runs, parents = cell_runs(url, name)
        assert len(runs) == 2 and len(parents) == 1, [r.data.tags.get("cell_id") for r in runs]  # one run per cell
        assert all(r.info.status == "FINISHED" for r in runs + parents)
        by_cell = {r.data.tags["cell_id"]: r for r in runs}
        rows = pq.read_table(tmp_path / name / "store" / name / "results.parquet").to_pylist()
        assert {row["cell_id"] for row in rows} == set(by_cell)
        for row in rows:
            run, run_dir = by_cell[row["cell_id"]], Path(row["run_dir"])
            # the cell's whole metrics.jsonl, the steps logged while the server was down included, and no more
            jsonl = {(k, r["step"]): v for r in records(run_dir) for k, v in r.items() if k != "step" and v is not None}
            assert history(client, run.info.run_id, {k for k, _ in jsonl}) == jsonl
            final = json.loads((run_dir / "result.json").read_text())["metrics"]
            assert {"val_loss", "train_loss"} <= set(final)
            for metric in final:  # MLflow = results.parquet, every final metric
                assert run.data.metrics[metric] == row[metric], (name, row["cell_id"], metric)
                compared += 1
            assert {a.path for a in client.list_artifacts(run.info.run_id)} >= {"config", "result"}
    return compared


def test_a_sweep_whose_tracking_server_does_not_answer_stops_with_exit_2_in_seconds(tmp_path, cache_dir):
    """Before Ray starts: the field, the URI, the fix, after the lab's bounded retries (MLflow's own take ~4 min)."""
    uri = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    spec = write_spec(tmp_path, "noserver", uri=uri, steps=4, dims="[2]", bases=None)
    env = {k: v for k, v in ray_env().items() if not k.startswith("MLFLOW_HTTP_REQUEST_")}
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "sweeps.console", "sweep", "run", str(spec)], cwd=tmp_path,
                         capture_output=True, text=True, timeout=150, env=env)
    assert out.returncode == 2, out.stderr[-3000:]
    assert f"tracking_uri {uri}: the MLflow server does not answer" in out.stderr
    assert "Traceback" not in out.stderr and not (tmp_path / "store" / "noserver" / "ray").exists()
    print(f"\nrefused in {time.monotonic() - t0:.0f} s")
