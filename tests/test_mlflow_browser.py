"""The MLflow UI in a real browser: headless Chromium renders a finished tiny sweep's runs page (the URL
`hdrope ui NAME` prints): every cell's readable run name and the metric columns are in the rendered DOM, in the
model-training view; a run's own link (`trainer.run.tracking.run_link`) opens the training view too, not the GenAI
"Evaluation runs"; a screenshot is taken. Skipped where Chromium is not installed (`.ci/run` installs Debian's
chromium)."""

import re
import shutil
import subprocess
import sys

import psutil
import pytest

pytestmark = pytest.mark.slow

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")

@pytest.mark.skipif(CHROMIUM is None, reason="Chromium is not installed (apt-get install chromium)")
def test_the_runs_page_shows_every_cell_by_name_in_a_real_browser(tmp_path, tiny_sweep):
    import socket

    from sweeps.plan_file import load_plan
    from sweeps.runner import _reconcile

    # the session's tiny sweep (2D/4D x identity/Paley x seeds 1, 2), its MLflow store written as a sweep's end does
    sweep = tmp_path / "store" / "tinysweep"
    shutil.copytree(tiny_sweep, sweep, ignore=shutil.ignore_patterns("report", "mlflow.db"))
    finished, failed = _reconcile(load_plan(sweep), f"sqlite:///{sweep / 'mlflow.db'}")
    assert finished == 8 and not failed
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ui = subprocess.Popen([sys.executable, "-m", "sweeps.console", "ui", "tinysweep", "--storage",
                           str(tmp_path / "store"), "--port", str(port)], stdout=subprocess.PIPE,
                          stderr=subprocess.DEVNULL, text=True)
    try:
        first, page_line = ui.stdout.readline(), ui.stdout.readline()
        assert f"http://127.0.0.1:{port}" in first
        page = re.search(r"(http://\S+)", page_line).group(1)
        assert "workflowType=machine_learning" in page  # model training view, not the GenAI traces overview
        shot = tmp_path / "runs.png"
        common = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--window-size=1400,900",
                  "--virtual-time-budget=20000", f"--user-data-dir={tmp_path / 'chrome'}"]
        dom = subprocess.run([*common, "--dump-dom", page], capture_output=True, text=True, timeout=120).stdout
        subprocess.run([*common, f"--screenshot={shot}", page], capture_output=True, timeout=120)
        import mlflow

        from trainer.run.tracking import run_link

        client = mlflow.MlflowClient(f"http://127.0.0.1:{port}")
        exp = client.get_experiment_by_name("tinysweep")
        run = next(r for r in client.search_runs([exp.experiment_id]) if r.data.tags.get("role") == "cell")
        run_dom = subprocess.run([*common, "--dump-dom", run_link(f"http://127.0.0.1:{port}", exp.experiment_id,
                                                                   run.info.run_id)],
                                 capture_output=True, text=True, timeout=120).stdout
    finally:
        for child in psutil.Process(ui.pid).children(recursive=True):
            child.kill()
        ui.kill()
    for name in ("2D-RoPE-θ10000-s1", "2D-Paley-θ10000-s2", "4D-identity-θ10000-s1", "4D-Paley-θ10000-s2"):
        assert name in dom, name
    for column in ("val_loss", "val_loss_x2", "Duration", "Sort: val_loss"):  # the stored runs-table view
        assert column in dom, column
    assert "Evaluation runs" not in dom
    assert run.info.run_name in run_dom and "Evaluation runs" not in run_dom  # the training view of one run
    assert shot.is_file() and shot.stat().st_size > 10_000
