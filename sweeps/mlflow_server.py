"""A local `mlflow server` bound to 127.0.0.1: started for `hdrope ui`, tests and team-server setups."""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.request

from hdrope.errors import UserError

__all__ = ["serve_forever", "start_server"]


def start_server(backend_uri: str, host: str = "127.0.0.1", port: int = 5000, timeout: float = 90.0,
                 artifacts_dir: str | None = None):
    """Start `mlflow server` on host:port for backend_uri; return (process, url) once it answers /health."""
    cmd = [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", backend_uri, "--host", host,
           "--port", str(port), "--workers", "1"]
    if artifacts_dir:
        cmd += ["--artifacts-destination", artifacts_dir]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
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


def serve_forever(backend_uri: str, host: str = "127.0.0.1", port: int = 5000, experiment: str = "") -> int:
    """Run the MLflow UI until interrupted, printing its URL (and the runs page of `experiment` when given)."""
    try:
        proc, url = start_server(backend_uri, host, port)
    except RuntimeError as err:
        raise UserError(f"could not start the MLflow UI on {host}:{port} ({str(err)[:300]}); "
                         "if the port is taken, pick another with --port") from None
    print(f"MLflow UI for {backend_uri}: {url}  (Ctrl-C to stop)", flush=True)
    if experiment:
        import mlflow

        from sweeps.tracking import runs_page

        found = mlflow.MlflowClient(url).get_experiment_by_name(experiment)
        if found is not None:
            print(f"runs of {experiment}: {runs_page(url, found.experiment_id)}", flush=True)
    try:
        return proc.wait()
    except KeyboardInterrupt:
        proc.terminate()
        return 0
