"""The documented entry points of `hdrope`, `trainer`, `sweeps` and `analysis`: each one imports and works on a small
input or the tiny preset, each package's `__all__` names exactly what it exports, and a moved module fails with a
message naming its new home (issue 27 §1)."""

from __future__ import annotations

import importlib
import subprocess
import sys

import numpy as np
import pytest
import torch

import analysis
import hdrope
import sweeps
import trainer

PACKAGES = ("hdrope", "trainer", "sweeps", "analysis")


def test_trainer_names_import_in_a_fresh_interpreter():
    """`import trainer; trainer.train` and `from trainer import *` work where nothing else was imported first."""
    code = "import trainer; trainer.train; trainer.TrainResult\nfrom trainer import *\nprint(sorted(dir()))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    for name in trainer.__all__:
        assert name in out


def test_unknown_trainer_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'loop'"):
        trainer.loop  # noqa: B018


def test_train_runs_the_tiny_preset_through_a_reporter(cache_dir, tmp_path):
    """`trainer.load_config` + `trainer.train` with a `trainer.Reporter` subclass, as the docs show it."""

    class Collect(trainer.Reporter):
        def __init__(self) -> None:
            self.steps: list[int] = []

        def log(self, step, metrics):
            self.steps.append(step)

    cfg = trainer.load_config("tiny", [f"data.cache_dir={cache_dir}", f"train.out_dir={tmp_path}", "train.steps=4",
                                       "train.log_every=2", "eval.passkey.enabled=false"])
    assert isinstance(cfg, trainer.RunConfig)
    reporter = Collect()
    result = trainer.train(cfg, reporter)
    assert isinstance(result, trainer.TrainResult)
    assert reporter.steps and reporter.steps[-1] == 4
    assert result.step == 4 and len(result.losses) >= 1


@pytest.mark.parametrize("package", PACKAGES)
def test_star_import_gives_exactly_the_public_names(package):
    """`from PKG import *` works in a fresh interpreter and every name of `__all__` resolves."""
    code = (f"import {package} as p\nfrom {package} import *\ng = globals()\n"
            "print(all(n in g for n in p.__all__), p.__all__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.startswith("True"), out
    module = importlib.import_module(package)
    assert len(set(module.__all__)) == len(module.__all__)
    if hasattr(module, "_EXPORTS"):  # a lazily exporting package exports exactly its public names
        assert set(module._EXPORTS) == set(module.__all__)
    assert all(getattr(module, n) is not None for n in module.__all__)


@pytest.mark.parametrize(("old", "new"), [
    ("trainer.loop", "trainer.run.loop"), ("trainer.passkey", "trainer.evals.passkey"),
    ("trainer.model.encodings.learned", "trainer.model.encodings.learned_basis"),
    ("sweeps.tracking", "trainer.run.tracking"), ("hdrope.console", "sweeps.console")])
def test_a_moved_module_names_its_new_home(old, new):
    code = f"import {old}"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert run.returncode == 1 and f"ModuleNotFoundError: {old} moved to {new}: import {new} instead" in run.stderr
    importlib.import_module(new)  # the new home exists
    package, _, name = old.rpartition(".")
    if package in PACKAGES:
        with pytest.raises(AttributeError, match=f"no attribute '{name}': {old} moved to {new}"):
            getattr(importlib.import_module(package), name)


def test_a_moved_name_never_shadows_a_module_that_exists():
    """The moved-module finder is asked last: every real module imports as before."""
    from hdrope.moved import MOVED

    for old in MOVED:
        assert importlib.util.find_spec(MOVED[old]) is not None, old


def test_hdrope_names_on_small_inputs():
    assert hdrope.paley_orders(14) == [2, 4, 6, 8, 10, 12, 14]
    c = hdrope.conference_matrix(6)
    assert c.shape == (6, 6) and np.allclose(c @ c.T, 5 * np.eye(6)) and np.all(np.diag(c) == 0)
    assert set(hdrope.BASIS_KINDS) >= {"identity", "random", "paley", "hadamard", "dct"}
    q = hdrope.mixing_basis("paley", 4)
    assert np.allclose(q @ q.T, np.eye(4))
    report = hdrope.describe_basis("paley", 4)
    assert isinstance(report, hdrope.BasisReport) and report.k_nonzero == 12  # NOTES §1: dense K at N = 4
    k = hdrope.basis_generator("paley", 4)
    assert np.allclose(k @ k, -np.eye(4)) and np.allclose(k, -k.T)
    rot = hdrope.HDRotary(head_dim=16, rotation_dim=4, theta=1e4, basis="paley")
    x = torch.randn(1, 2, 8, 16)
    q_rot, k_rot = rot(x, x, torch.arange(8))
    assert q_rot.shape == x.shape and torch.allclose(q_rot.norm(dim=-1), x.norm(dim=-1), atol=1e-5)
    scores = q_rot[..., :1, :] @ k_rot[..., 1:, :].transpose(-1, -2)  # relative: shift both positions by 3
    q3, k3 = rot(x, x, torch.arange(3, 11))
    assert torch.allclose(scores, q3[..., :1, :] @ k3[..., 1:, :].transpose(-1, -2), atol=1e-4)
    b = hdrope.fold_matrix(rot)
    assert np.allclose(b @ b.T, np.eye(16), atol=1e-10)
    assert "yarn" in hdrope.SCALING_TYPES
    assert hdrope.validate_scaling(None) is None
    assert hdrope.validate_scaling({"rope_type": "linear", "factor": 2.0})["factor"] == 2.0
    with pytest.raises(hdrope.UserError, match="rope_type"):
        hdrope.validate_scaling({"rope_type": "bogus"})


def test_analysis_names_on_small_inputs():
    import pandas as pd

    rng = np.random.default_rng(0)
    logits = rng.normal(size=(2, 8, 8))
    attn = np.tril(np.exp(logits))
    attn /= attn.sum(-1, keepdims=True)
    erank = analysis.effective_rank(attn)
    assert erank.shape == (2,) and np.all((erank >= 1) & (erank <= 8))
    assert analysis.row_entropy(attn).shape == (2,)
    profile = analysis.distance_profile(logits)
    assert profile.shape == (2, 8)
    freqs, mag = analysis.fourier_magnitude(profile)
    assert freqs.shape == (5,) and mag.shape == (2, 5) and freqs[-1] == pytest.approx(np.pi)
    assert analysis.rope_band_magnitude(profile, np.array([0.1, 1.0])).shape == (2, 2)
    stats = pd.DataFrame({"seed": np.repeat([1, 2, 3], 4), "layer": np.tile([0, 0, 1, 1], 3),
                          "erank": rng.normal(3, 0.1, 12)})
    assert list(analysis.layerwise_rank(stats.query("seed == 1"))["layer"]) == [0, 1]
    seeded = analysis.per_seed(stats)
    assert len(seeded) == 6 and set(seeded.columns) == {"seed", "layer", "erank"}
    iv = analysis.seed_interval(seeded)
    assert list(iv["n"]) == [3, 3] and (iv["lo"] < iv["mean"]).all() and (iv["mean"] < iv["hi"]).all()
    diff = analysis.rank_difference(seeded.assign(erank=seeded["erank"] + 1), seeded)
    assert np.allclose(diff["diff"], 1.0) and diff["paired"].all()
    c = analysis.compare([1.0, 2.0, 3.0], [0.0, 1.1, 2.0], paired=True)
    assert c.paired and c.n == 3 and c.lo <= c.delta <= c.hi
    assert analysis.mean_interval([1.0, 2.0, 3.0]).estimate == 2.0
    assert analysis.proportion_interval(3, 10).estimate == pytest.approx(0.3)
    assert analysis.adjust([0.01, 0.04]) == pytest.approx([0.02, 0.04])
    assert analysis.NOTEBOOKS_DIR.is_dir()


def test_sweeps_names_plan_a_tiny_spec_and_read_back_a_finished_sweep(short_sweep_spec, tiny_sweep):
    path = short_sweep_spec("api", 2, {"model.pe.rotation_dim": [2, 4], "seed": [1, 2]})
    spec = sweeps.load_spec(path)
    assert isinstance(spec, sweeps.SweepSpec) and spec.name == "api"
    plan = sweeps.prepare(str(path))
    assert isinstance(plan, sweeps.Plan) and len(plan.cells) == len(sweeps.make_plan(spec).cells) == 4
    with pytest.raises(sweeps.SpecError, match="nosuch"):
        sweeps.prepare(str(path), ["axes.nosuch=[1, 2]"])
    stored = sweeps.load_plan(tiny_sweep)
    assert len(stored.cells) == 8
    assert sweeps.write_results(stored).is_file()
    # run_sweep / resume_sweep start Ray: tests/test_spec_path.py and the resume tests run them end to end
    with pytest.raises(sweeps.SpecError):
        sweeps.run_sweep(str(path), ["base=nosuch"])
    assert callable(sweeps.resume_sweep)
