"""A local `mlflow server` bound to 127.0.0.1: started for `hdrope ui`, tests and team-server setups."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request

from hdrope.errors import UserError

__all__ = ["LOOPBACK_HOSTS", "allowed_hosts_with_loopback", "free_port", "port_in_use", "serve_forever",
           "start_server"]

LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "[::1]")  # Host-header forms of this machine


def port_in_use(host: str, port: int) -> bool:
    """Whether something already listens on host:port (a bind there fails)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as servers bind: TIME_WAIT leftovers are free
        try:
            s.bind((host, port))
        except OSError:
            return True
    return False


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on at host now (the system picks it)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def allowed_hosts_with_loopback(allowed_hosts: str, host: str, port: int) -> str:
    """MLflow's --allowed-hosts: the user's names plus loopback (and the bind address), each bare and with the port,
    so the server still answers on this machine (the lab's own requests, an SSH tunnel) once a guard is set."""
    names = [h.strip() for h in allowed_hosts.split(",") if h.strip()]
    local = [*LOOPBACK_HOSTS, *([f"[{host}]" if ":" in host else host] if host not in ("0.0.0.0", "::") else [])]
    for name in local:
        names += [n for n in (name, f"{name}:{port}") if n not in names]
    return ",".join(names)


def start_server(backend_uri: str, host: str = "127.0.0.1", port: int = 5000, timeout: float = 90.0,
                 artifacts_dir: str | None = None, allowed_hosts: str = ""):
    """Start `mlflow server` on host:port (port 0: a free one) for backend_uri in its own process group; return
    (process, url) once it answers /health. `allowed_hosts` is MLflow's Host-header guard (needed when host is not
    loopback; loopback is always allowed beside it). If it does not come up, nothing it started is left running.

    MLflow's job runner (GenAI jobs, which the lab does not use: 8 more processes) stays off unless
    MLFLOW_SERVER_ENABLE_JOB_EXECUTION is set."""
    from sweeps.procs import stop_session
    from trainer.run.store_seed import seed_store

    port = port or free_port(host)
    if port_in_use(host, port):
        raise UserError(f"--port {port}: {host}:{port} is already in use (another server?); pick a free port "
                        "with --port")
    seed_store(backend_uri)  # a new SQLite store: a copy of the migrated template, not every migration again
    cmd = [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", backend_uri, "--host", host,
           "--port", str(port), "--workers", "1"]
    if artifacts_dir:
        cmd += ["--artifacts-destination", artifacts_dir]
    if allowed_hosts:
        cmd += ["--allowed-hosts", allowed_hosts_with_loopback(allowed_hosts, host, port)]
    env = {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false", **os.environ}
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            env=env)
    url = f"http://{f'[{host}]' if ':' in host else host}:{port}"
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"mlflow server exited with {proc.returncode}: {proc.stderr.read()[-2000:]}")
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=2) as r:
                    if r.status == 200:
                        return proc, url
            except OSError:
                time.sleep(0.5)
        raise RuntimeError(f"mlflow server did not answer at {url} within {timeout:.0f} s")
    except BaseException:  # not up (or stopped while starting): stop its whole tree, uvicorn and job runners included
        stop_session(proc)
        raise


def serve_forever(backend_uri: str, host: str = "127.0.0.1", port: int = 5000, experiment: str = "",
                  allowed_hosts: str = "") -> int:
    """Run the MLflow UI until interrupted, printing its URL (and the runs page of `experiment` when given).

    SIGTERM, SIGINT and SIGHUP stop the whole server (mlflow, uvicorn, job consumers) before this exits, however
    many arrive: the stop itself ignores further signals."""
    from sweeps.procs import exit_on_signals, stop_session

    exit_on_signals()
    try:
        proc, url = start_server(backend_uri, host, port, allowed_hosts=allowed_hosts)
    except RuntimeError as err:
        raise UserError(f"could not start the MLflow UI on {host}:{port} ({str(err)[:300]}); "
                        "if the port is taken, pick another with --port") from None
    try:
        print(f"MLflow UI for {backend_uri}: {url}  (Ctrl-C to stop)", flush=True)
        local = {"0.0.0.0": "127.0.0.1", "::": "[::1]"}.get(host)  # a wildcard bind answers on loopback
        page, parent = _runs_links(url, f"http://{local}:{url.rsplit(':', 1)[1]}" if local else url, experiment)
        if page:
            print(f"runs of {experiment}: {page}", flush=True)
        if parent:
            print(f"the sweep's own run (plan, report): {parent}", flush=True)
        return proc.wait()
    finally:
        stop_session(proc)


def _runs_links(url: str, api_url: str, experiment: str) -> tuple[str | None, str | None]:
    """The runs page of `experiment` on the server at url, asked at api_url, in the runs-table view of
    `trainer.run.tracking.runs_view` (the cells; stored or updated first for a sweep that ran before the lab stored
    it), and the page of the sweep's own parent run (its plan and report), which that view leaves out. None for
    what is not there."""
    if not experiment:
        return None, None
    import mlflow

    from trainer.run.tracking import run_link, runs_page, runs_with, update_runs_view

    client = mlflow.MlflowClient(api_url)
    found = client.get_experiment_by_name(experiment)
    if found is None:
        return None, None
    update_runs_view(client, found)
    parents = runs_with(client, {"sweep": experiment, "role": "parent"}, [found.experiment_id])
    parent = run_link(url, found.experiment_id, parents[0].info.run_id) if parents else None
    return runs_page(url, found.experiment_id), parent
