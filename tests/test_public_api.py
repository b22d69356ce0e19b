"""The documented entry points of `trainer`: each one imports and works (issue 27 §1)."""

from __future__ import annotations

import subprocess
import sys

import pytest

import trainer


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
