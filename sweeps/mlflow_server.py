"""A local `mlflow server` bound to 127.0.0.1: started for `hdrope ui`, tests and team-server setups."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request

import psutil

from hdrope.errors import UserError

__all__ = ["port_in_use", "serve_forever", "start_server"]


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


def start_server(backend_uri: str, host: str = "127.0.0.1", port: int = 5000, timeout: float = 90.0,
                 artifacts_dir: str | None = None, allowed_hosts: str = ""):
    """Start `mlflow server` on host:port for backend_uri in its own process group; return (process, url) once it
    answers /health. `allowed_hosts` is MLflow's Host-header guard (needed when host is not loopback).

    MLflow's job runner (GenAI jobs, which the lab does not use: 8 more processes) stays off unless
    MLFLOW_SERVER_ENABLE_JOB_EXECUTION is set."""
    if port_in_use(host, port):
        raise UserError(f"--port {port}: {host}:{port} is already in use (another server?); pick a free port "
                        "with --port")
    cmd = [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", backend_uri, "--host", host,
           "--port", str(port), "--workers", "1"]
    if artifacts_dir:
        cmd += ["--artifacts-destination", artifacts_dir]
    if allowed_hosts:
        cmd += ["--allowed-hosts", allowed_hosts]
    env = {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false", **os.environ}
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            env=env)
    url = f"http://{host}:{port}"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"mlflow server exited with {proc.returncode}: {proc.stderr.read()[-2000:]}")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as r:
                if r.status == 200:
                    return proc, url
        except OSError:
            time.sleep(0.5)
    proc.kill()
    raise RuntimeError(f"mlflow server did not answer at {url} within {timeout:.0f} s")


def serve_forever(backend_uri: str, host: str = "127.0.0.1", port: int = 5000, experiment: str = "",
                  allowed_hosts: str = "") -> int:
    """Run the MLflow UI until interrupted, printing its URL (and the runs page of `experiment` when given).

    SIGTERM, SIGINT and SIGHUP stop the whole server (mlflow, uvicorn, job consumers) before this exits."""
    from sweeps.procs import exit_on_signals, stop_tree

    exit_on_signals()
    try:
        proc, url = start_server(backend_uri, host, port, allowed_hosts=allowed_hosts)
    except RuntimeError as err:
        raise UserError(f"could not start the MLflow UI on {host}:{port} ({str(err)[:300]}); "
                        "if the port is taken, pick another with --port") from None
    try:
        print(f"MLflow UI for {backend_uri}: {url}  (Ctrl-C to stop)", flush=True)
        if experiment:
            import mlflow

            from sweeps.tracking import runs_page

            found = mlflow.MlflowClient(url).get_experiment_by_name(experiment)
            if found is not None:
                print(f"runs of {experiment}: {runs_page(url, found.experiment_id)}", flush=True)
        return proc.wait()
    finally:
        stop_tree([psutil.Process(proc.pid)])
