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

SPEC = """
name: browse
base: tiny
storage: {storage}
overrides: {{data.cache_dir: {cache}, train.steps: 8, train.threads: 1, train.log_every: 4, train.eval_every: 0,
            eval.passkey.enabled: false, eval.extrapolation_batches: 1}}
axes:
  model.pe.rotation_dim: [2, 4]
  model.pe.basis: [identity, paley]
resources: {{cpus: 1}}
"""


@pytest.mark.skipif(CHROMIUM is None, reason="Chromium is not installed (apt-get install chromium)")
def test_the_runs_page_shows_every_cell_by_name_in_a_real_browser(tmp_path, cache_dir, hdrope_cli):
    import socket

    spec = tmp_path / "browse.yaml"
    spec.write_text(SPEC.format(storage=tmp_path / "store", cache=cache_dir))
    run = hdrope_cli("sweep", "run", str(spec), cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ui = subprocess.Popen([sys.executable, "-m", "sweeps.console", "ui", "browse", "--storage", str(tmp_path / "store"),
                           "--port", str(port)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
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
        exp = client.get_experiment_by_name("browse")
        run = next(r for r in client.search_runs([exp.experiment_id]) if r.data.tags.get("role") == "cell")
        run_dom = subprocess.run([*common, "--dump-dom", run_link(f"http://127.0.0.1:{port}", exp.experiment_id,
                                                                   run.info.run_id)],
                                 capture_output=True, text=True, timeout=120).stdout
    finally:
        for child in psutil.Process(ui.pid).children(recursive=True):
            child.kill()
        ui.kill()
    for name in ("2D-RoPE-θ10000-s42", "2D-Paley-θ10000-s42", "4D-identity-θ10000-s42", "4D-Paley-θ10000-s42"):
        assert name in dom, name
    for column in ("val_loss", "val_loss_x2", "Duration", "Sort: val_loss"):  # the stored runs-table view
        assert column in dom, column
    assert "Evaluation runs" not in dom
    assert run.info.run_name in run_dom and "Evaluation runs" not in run_dom  # the training view of one run
    assert shot.is_file() and shot.stat().st_size > 10_000
