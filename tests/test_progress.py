"""What a sweep tells the researcher before and while it runs: plan summary, time estimate, progress lines."""

import io
import os
from types import SimpleNamespace

from sweeps.estimate import estimate_sweep, estimate_text
from sweeps.plan import make_plan
from sweeps.progress import ProgressCallback
from sweeps.spec import load_spec
from sweeps.trainable import tune_result

GRID = """
name: est
base: tiny
storage: {storage}
overrides: {{train.steps: 40, train.threads: 1}}
axes: {{model.pe.rotation_dim: [2, 4], model.pe.basis: [identity, paley], seed: [1, 2]}}
resources: {{cpus: 1}}
"""


def _plan(tmp_path, text=GRID):
    path = tmp_path / "est.yaml"
    path.write_text(text.format(storage=tmp_path))
    return make_plan(load_spec(path))


def test_progress_keys_come_first_so_tunes_table_shows_them():
    result = tune_result("c000", 60, {"train_loss": 2.0, "val_loss": 2.5}, steps=120, eta_s=30.0)
    assert list(result)[:3] == ["step", "steps", "eta_s"]
    assert result["reported"] == "train_loss,val_loss"


def test_a_progress_line_carries_step_of_total_eta_and_losses():
    out = io.StringIO()
    cb = ProgressCallback(every_s=1e9, out=out)
    trial = type("T", (), {"trial_id": "a", "status": "RUNNING", "__str__": lambda self: "4D-Paley-θ500-s42"})()
    trials = [trial, SimpleNamespace(status="PENDING")]
    cb.on_trial_result(0, trials, trial, {"step": 60, "steps": 120, "eta_s": 35.2, "train_loss": 2.4013})
    cb.on_trial_result(0, trials, trial, {"step": 80, "steps": 120, "eta_s": 20.0, "train_loss": 2.2})  # throttled
    lines = out.getvalue().splitlines()
    assert len(lines) == 1
    assert "4D-Paley-θ500-s42" in lines[0] and "step    60/120" in lines[0] and "eta   35 s" in lines[0]
    assert "train_loss 2.401" in lines[0] and "(1 running, 1 pending)" in lines[0]


def test_counts_include_the_trial_whose_event_is_printed():
    """Tune calls on_trial_start while the trial is still PENDING and on_trial_complete while it is still RUNNING
    (ray.tune.execution.tune_controller): each line counts that trial in the state its event moves it to."""
    out = io.StringIO()
    cb = ProgressCallback(every_s=1e9, out=out)
    trials = [type("T", (), {"trial_id": str(i), "status": "PENDING", "last_result": {},
                             "__str__": lambda self: f"cell{self.trial_id}"})() for i in range(2)]
    cb.on_trial_start(0, trials, trials[0])
    trials[0].status = "RUNNING"
    cb.on_trial_start(0, trials, trials[1])
    trials[1].status = "RUNNING"
    cb.on_trial_complete(0, trials, trials[0])
    trials[0].status = "TERMINATED"
    trials[1].status, trials[1].error_file = "ERROR", "err.txt"  # Tune sets ERROR before on_trial_error
    cb.on_trial_error(0, trials, trials[1])
    lines = out.getvalue().splitlines()
    assert [line.rsplit("(", 1)[-1] for line in lines] == ["1 running, 1 pending)", "2 running)",
                                                           "1 running, 1 done)", "1 done, 1 failed)"]


def test_the_estimate_times_each_model_shape_and_packs_trials_on_the_slots(tmp_path):
    plan = _plan(tmp_path)
    est = estimate_sweep(plan)
    assert len(est["step_s"]) == 2  # RoPE and 4D: two shapes timed (θ, basis and seed cost the same)
    assert len(est["per_trial_s"]) == len(plan.to_run) == 6
    assert all(0 < s < 5 for s in est["step_s"])
    slots = plan.summary()["concurrent_here"]
    assert est["total_s"] >= max(sum(est["per_trial_s"]) / slots, max(est["per_trial_s"]))
    text = estimate_text(plan)
    assert "8 cells, 6 trials to train (2 saved by dedup)" in text and "estimated time: about" in text


def test_no_estimate_for_optuna_says_why(tmp_path):
    spec = GRID.replace("axes: {{model.pe.rotation_dim: [2, 4], model.pe.basis: [identity, paley], seed: [1, 2]}}",
                        "search: {{kind: optuna, n_trials: 3, space: {{optim.lr: {{low: 1.0e-4, high: 1.0e-2}}}}}}")
    est = estimate_sweep(_plan(tmp_path, spec))
    assert "total_s" not in est and "sampled" in est["reason"]


def test_fractional_gpus_plan_and_refuse_a_machine_without_gpus(tmp_path, monkeypatch):
    import sweeps.plan as plan_mod
    from sweeps.console import main

    spec = GRID.replace("resources: {{cpus: 1}}", "resources: {{cpus: 0.5, gpus: 0.25}}")
    monkeypatch.setattr(plan_mod, "local_gpus", lambda: 1)  # pure planning logic: one GPU, 0.25 per trial
    assert _plan(tmp_path, spec).summary()["concurrent_here"] == min(4, int((os.cpu_count() or 1) // 0.5))
    monkeypatch.setattr(plan_mod, "local_gpus", lambda: 0)
    plan = _plan(tmp_path, spec)
    assert plan.summary()["concurrent_here"] == 0 and any("no GPU" in w for w in plan.warnings)
    path = tmp_path / "gpu.yaml"
    path.write_text(spec.format(storage=tmp_path))
    assert main(["sweep", "run", str(path)]) == 2  # refused before Ray: it would hang PENDING forever
    assert not (tmp_path / "est" / "plan.json").exists()
