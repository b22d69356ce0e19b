"""A tiny version of experiments/tables/mechanism_compact.yaml trains and its report states the Paley − identity gap
per optimiser with CIs (the shipped spec's own axes, on the tiny model; trained in this process: the Ray path of a
sweep is tests/test_sweeps_e2e.py's)."""

from pathlib import Path

import pytest
from omegaconf import OmegaConf

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent


def test_tiny_mechanism_study_runs_and_reports_the_gap_per_optimizer(tmp_path, cache_dir, sweep_trainer, hdrope_here):
    spec = OmegaConf.load(REPO / "experiments/tables/mechanism_compact.yaml")
    spec.base = "tiny"
    spec.storage = str(tmp_path / "store")
    spec.overrides = {"data.cache_dir": cache_dir, "train.steps": 12, "train.threads": 1, "train.log_every": 6,
                      "train.eval_every": 0, "train.ckpt_every": 0, "eval.passkey.enabled": False,
                      "eval.extrapolation": [2], "eval.extrapolation_batches": 1}
    spec.axes["model.pe.rotation_dim"] = [4]
    spec.axes["model.pe.basis"] = ["identity", "paley"]
    spec.axes.seed = [1, 2]
    path = tmp_path / "mech.yaml"
    OmegaConf.save(spec, path)
    sweep_trainer(path)
    rep = hdrope_here(["report", str(tmp_path / "store" / spec.name)], cwd=tmp_path)
    assert rep.returncode == 0, rep.stderr[-3000:]
    text = (tmp_path / "store" / spec.name / "report" / "report.md").read_text()
    assert "## Optimiser mechanism" in text
    from trainer.labels import value_label

    adamw, sgd = (value_label(OmegaConf.to_container(v)) for v in spec.axes.optim)
    assert f"under {adamw}:" in text and f"under {sgd}" in text and f"gap({adamw}) − gap({sgd})" in text
    assert f"4D identity, optim={adamw}" in text  # the optimiser is part of each variant, never pooled
