"""The encoding switched during training (`train.pe_schedule`, issue 46: DroPE as a schedule): up to the switch the
run is the plain run, after it the model is the new encoding at the recalibration rate; resume is exact on every side
of the switch; run.json, the identity and `load_trained` say what the model is as it ends; bad schedules are refused
before training, naming the entry."""

from __future__ import annotations

import json

import pytest
from test_train import FAST, Interrupt, StopAt

from hdrope.errors import UserError
from trainer.model.encodings.nope import NoPE
from trainer.model.pe_schedule import SCHEDULED_KIND, run_identity
from trainer.run.loop import train
from trainer.run.trained import load_trained

DROPE = "train.pe_schedule=[{step: 8, pe: {kind: nope}, lr: 1.0e-3}]"
RUN = ["model.pe.kind=rope", "train.steps=16", "train.log_every=2", "train.eval_every=8", "train.ckpt_every=4",
       "train.keep_last=8", *FAST]


def _lrs(run_dir) -> dict[int, float]:
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {x["step"]: x["lr"] for x in lines if "lr" in x}


def test_drope_is_the_plain_run_up_to_its_switch_then_nope_at_its_rate_and_resumes_exactly(tiny_cfg):
    plain = train(tiny_cfg(*RUN, out="plain"))
    whole = train(tiny_cfg(*RUN, DROPE, out="whole"))
    assert whole.losses[:8] == plain.losses[:8] and whole.losses[8:] != plain.losses[8:]
    lrs = _lrs(whole.run_dir)
    assert lrs[8] == _lrs(plain.run_dir)[8] and all(lrs[s] == 1.0e-3 for s in (10, 12, 14, 16))
    for stop in (4, 8, 12):  # before the switch, at it (its checkpoint) and after it
        with pytest.raises(Interrupt):
            train(tiny_cfg(*RUN, DROPE, out=f"cut{stop}"), StopAt(stop))
        resumed = train(tiny_cfg(*RUN, DROPE, out=f"cut{stop}"))
        assert resumed.resumed_from == stop and resumed.losses == whole.losses, stop
        assert resumed.metrics["val_loss"] == whole.metrics["val_loss"]
    run = json.loads((whole.run_dir / "run.json").read_text())
    assert run["pe_schedule"] == [{"step": 8, "pe_label": "NoPE", "lr": 1.0e-3}]
    identity = run_identity(tiny_cfg(*RUN, DROPE))
    assert identity["pe_kind"] == SCHEDULED_KIND and identity["pe_label"] == "RoPE → NoPE at step 8 (lr 0.001)"
    trained = load_trained(whole.checkpoint)  # the model as it ends: NoPE
    assert isinstance(trained.model.pe, NoPE) and trained.model.args.pe.kind == "nope"
    mid = load_trained(whole.run_dir / "checkpoints" / "step_00000004")
    assert mid.model.args.pe.kind == "rope"


BAD = {
    "a step past train.steps": ("[{step: 16, pe: {kind: nope}}]", "train.pe_schedule[0].step=16: must be an integer "
                                                                  "in 1..15"),
    "steps out of order": ("[{step: 8, pe: {kind: nope}}, {step: 4, pe: {kind: rope}}]",
                           "train.pe_schedule[1].step=4: must be an integer in 9..15"),
    "a kind whose parameters cannot carry over": ("[{step: 8, pe: {kind: fire}}]",
                                                  "train.pe_schedule[0].pe (kind fire) holds"),
    "a bad rate": ("[{step: 8, pe: {kind: nope}, lr: 0}]", "train.pe_schedule[0].lr=0: must be a learning rate > 0"),
    "an unknown key": ("[{step: 8, pe: {kind: nope}, rate: 1}]", "train.pe_schedule[0]=['pe', 'rate', 'step']"),
    "a section its kind refuses": ("[{step: 8, pe: {kind: hdrope, rotation_dim: 3}}]",
                                   "train.pe_schedule[0].pe: model.pe.rotation_dim=3"),
    "not a list": ("{step: 8}", "train.pe_schedule={'step': 8}: must be a list"),
    "over a hybrid stack": ("[{step: 8, pe: {kind: nope}}]", "train.pe_schedule with model.pe_layers"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_a_bad_schedule_is_refused_before_training_naming_the_entry(tiny_cfg, case):
    value, message = BAD[case]
    more = ["model.pe_layers=[{layers: [1], pe: {kind: nope}}]"] if case == "over a hybrid stack" else []
    with pytest.raises(UserError) as err:
        tiny_cfg(*RUN, f"train.pe_schedule={value}", *more)
    assert message in str(err.value)


def test_train_exits_2_on_a_bad_schedule_naming_it(hdrope_here, tmp_path):
    out = hdrope_here(["train", "tiny", "train.steps=4", f"train.out_dir={tmp_path / 'run'}",
                       "train.pe_schedule=[{step: 4, pe: {kind: nope}}]"])
    assert out.returncode == 2 and "train.pe_schedule[0].step=4" in out.stderr
    assert not (tmp_path / "run").exists()
