"""The path a spec takes from `run_sweep` to a trial: planned once, then carried as the typed plan (issue 18).

A step is a call into a lab function from another lab module whose arguments carry the spec in one of its forms (the
spec path, SweepSpec, Plan, Cell, an OmegaConf node, a YAML text of a config); a resolved RunConfig handed to the
trainer is the trainer's input, and a typed artifact's own accessors (Plan.to_run…) read data. Tune is stood in for
by the calls it makes on the driver (the trial's name, the callback's start) and in the worker (the trial function,
up to the trainer's `train`), so the whole path runs in this process.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest
from omegaconf import DictConfig, ListConfig

REPO = Path(__file__).resolve().parents[1]
LAB = tuple(str(REPO / p) + "/" for p in ("sweeps", "trainer", "analysis", "hdrope"))
SPEC = """\
name: path
storage: {storage}
base: tiny
overrides: {{train.steps: 2, train.threads: 1}}
axes: {{model.pe.kind: [hdrope], seed: [42]}}
"""


class _Trained(Exception):
    """Raised where the trial would start training."""


def _carries_spec(value, spec_path: str, top: bool = True) -> bool:
    if isinstance(value, (DictConfig, ListConfig)):
        return True
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return type(value).__module__.startswith("sweeps.")
    if isinstance(value, str):
        return value == spec_path or value.startswith("model:") or "\nmodel:" in value
    if top and isinstance(value, dict):
        return any(_carries_spec(v, spec_path, False) for v in value.values())
    if top and isinstance(value, (list, tuple)):
        return any(_carries_spec(v, spec_path, False) for v in value)
    return False


def test_a_spec_is_planned_once_and_returns_to_no_module_it_left_but_the_config_assembly(tmp_path, monkeypatch):
    import sweeps.runner
    import trainer.run.loop
    from sweeps import callback, trainable

    spec = tmp_path / "path.yaml"
    spec.write_text(SPEC.format(storage=tmp_path / "store"))

    def execute(plan, address, uri, restore):  # what Tune calls, in order, for the first trial
        trial = type("Trial", (), {"config": {"cell": plan.to_run[0].cell_id}, "trial_id": "t0"})
        callback.trial_name(trial, plan=plan)
        callback.TrackingCallback(uri, plan).run_for(trial.config)
        trainable.run_trial(dict(trial.config), plan=plan)

    def no_training(*args, **kwargs):
        raise _Trained

    monkeypatch.setattr(sweeps.runner, "_execute", execute)
    monkeypatch.setattr(trainer.run.loop, "train", no_training)
    monkeypatch.chdir(tmp_path)
    steps: list[tuple[str, str]] = []

    def profile(frame, event, arg):
        code = frame.f_code
        if event != "call" or not code.co_filename.startswith(LAB) or code.co_name.startswith("<"):
            return
        if frame.f_back is None or frame.f_back.f_code.co_filename == code.co_filename:
            return
        names = code.co_varnames[: code.co_argcount + code.co_kwonlyargcount]
        if names and names[0] == "self" and dataclasses.is_dataclass(frame.f_locals.get("self")):
            return
        if any(_carries_spec(frame.f_locals.get(n), str(spec)) for n in names):
            steps.append((str(Path(code.co_filename).relative_to(REPO)), code.co_name))

    sys.setprofile(profile)
    try:
        with pytest.raises(_Trained):
            sweeps.runner.run_sweep(str(spec))
    finally:
        sys.setprofile(None)
    visits: list[str] = []
    for module, _ in steps:
        if not visits or visits[-1] != module:
            visits.append(module)
    returns = [m for i, m in enumerate(visits) if m in visits[:i]]
    # the one return: the spec's YAML is checked for interpolations by the rule every config YAML obeys
    # (trainer/presets.py), and its layers are merged into cells by the same module
    assert returns == ["trainer/presets.py"], " > ".join(visits)
    assert visits[0] == "sweeps/runner.py" and visits[-1] == "sweeps/trainable.py"
    assert sum(f == "merge_config" for _, f in steps) == 1  # each cell is merged once, at planning
