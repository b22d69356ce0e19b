"""The encoding registry is the only list of kinds: each kind's module holds every fact about it, and a kind
defined here alone (config, module, facts) trains, plans, deduplicates, reports and is refused by export."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import pytest

from hdrope.errors import UserError
from trainer.model.encodings.base import EncodingShape, PositionModule
from trainer.model.encodings.kind import EncodingKind, identity_row
from trainer.model.encodings.rotary import PEConfig
from trainer.model.llama import Llama, ModelArgs
from trainer.model.position import (
    IDENTITY_COLUMNS,
    POSITION_ENCODINGS,
    build_position_encoding,
    dedup_pe,
    encoding_identity,
    encoding_params,
    encoding_problems,
    identity_is_rope,
    identity_keys,
    pe_config_class,
    register_kind,
)
from trainer.model.throughput import param_count

SHAPE = EncodingShape(head_dim=16, n_heads=4, n_kv_heads=2, n_layers=2, max_seq_len=32)

# --- a kind that exists only in this test module ------------------------------------------------------------------


@dataclass
class GainConfig:
    """Queries scaled by `gain`; `tag` changes nothing (dedup drops it)."""

    kind: str = "test_gain"
    gain: float = 2.0
    tag: int = 0


class Gain(PositionModule):
    """q·gain, k unchanged: no position information at all."""

    def __init__(self, gain: float) -> None:
        super().__init__()
        self.gain = float(gain)

    def rotate(self, q, k, tables, layer=0):
        return q * self.gain, k


def _gain_problems(pe: GainConfig, shape: EncodingShape) -> list[str]:
    ok = isinstance(pe.gain, (int, float)) and not isinstance(pe.gain, bool) and pe.gain > 0
    return [] if ok else [f"model.pe.gain={pe.gain!r}: must be a number > 0, e.g. 2.0"]


GAIN = EncodingKind(
    "test_gain", GainConfig, lambda c, s: Gain(c.gain),
    lambda pe: identity_row("test_gain", f"Gain ×{pe.gain:g}", 0, "none", None, None), identity_keys=("gain",),
    is_rope=lambda row: False, translation_invariant=True, dedup=lambda pe: GainConfig(gain=pe.gain),
    problems=_gain_problems, tables=False)


@pytest.fixture
def gain_kind():
    """GAIN registered for one test, removed after it."""
    register_kind(GAIN)
    try:
        yield GAIN
    finally:
        POSITION_ENCODINGS.pop(GAIN.name)


@pytest.mark.slow
def test_a_kind_defined_only_in_a_test_trains_plans_dedups_reports_and_is_refused_by_export(
        gain_kind, tmp_path, sweep_trainer, short_sweep_spec):
    import pyarrow.parquet as pq

    from analysis.report import build_report
    from trainer.export.hf_export import export_checkpoint
    from trainer.model.bench import run_encodings_bench
    from trainer.presets import load_config
    from trainer.run.checkpoint import latest_checkpoint

    with pytest.raises(UserError, match=r"model\.pe\.gain=-1\.0: must be a number > 0"):
        load_config("tiny", ["model.pe.kind=test_gain", "model.pe.gain=-1.0"])
    spec = short_sweep_spec("gainkind", 3, {"model.pe.gain": [1.5, 3.0], "model.pe.tag": [0, 7]},
                            {"model.pe.kind": "test_gain"})
    plan = sweep_trainer(spec)  # planned, deduplicated and trained in this process
    assert len(plan.cells) == 4 and len(plan.to_run) == 2  # tag cannot change the model: one run per gain
    assert {c.dedup_of for c in plan.cells if c.dedup_of} == {c.cell_id for c in plan.to_run}
    results = pq.read_table(plan.root / "results.parquet").to_pandas()
    assert set(results["pe_label"]) == {"Gain ×1.5", "Gain ×3"} and set(results["pe_kind"]) == {"test_gain"}
    assert (results["status"] == "FINISHED").all()
    md = build_report(plan.root).read_text()
    for label in ("Gain ×1.5", "Gain ×3"):  # the label says the gain (an identity key); tag is an axis of its own
        assert f"| {label}, tag=0 |" in md, md
    assert "gain=" not in md and "tag=7" not in md  # the dedup copies are answered by their representatives
    run_dir = plan.root / results.loc[results["dedup_of"].isna(), "run_dir"].iloc[0]
    with pytest.raises(UserError, match=r"model\.pe\.kind='test_gain' is not exportable to HF Llama"):
        export_checkpoint(latest_checkpoint(run_dir / "checkpoints"), tmp_path / "hf")
    assert not (tmp_path / "hf").exists() or not any((tmp_path / "hf").iterdir())
    rows = run_encodings_bench((1, 2, 16, 8), rounds=1)  # `hdrope bench encodings` lists every registered kind
    for k in POSITION_ENCODINGS.values():
        label = encoding_identity(k.config(kind=k.name))["pe_label"]
        assert any(r["encoding"].startswith(label) for r in rows), label


def test_a_registered_kind_is_read_everywhere_and_gone_after(gain_kind):
    pe = GainConfig(gain=3.0, tag=5)
    assert pe_config_class("test_gain") is GainConfig
    assert encoding_identity(pe)["pe_label"] == "Gain ×3"
    assert dedup_pe(pe) == GainConfig(gain=3.0) and "model.pe.gain" in identity_keys()
    assert encoding_problems(GainConfig(gain=0), SHAPE) == ["model.pe.gain=0: must be a number > 0, e.g. 2.0"]
    with pytest.raises(UserError, match="registered already"):
        register_kind(GAIN)
    model = Llama(ModelArgs(vocab_size=32, dim=32, n_layers=1, n_heads=2, n_kv_heads=1, ffn_hidden=64,
                            max_seq_len=16, pe=pe))
    assert model.num_params() == param_count(model.args)


def test_the_kind_is_gone_once_removed():
    assert "test_gain" not in POSITION_ENCODINGS and "model.pe.gain" not in identity_keys()
    with pytest.raises(UserError, match=r"model\.pe\.kind='test_gain' is unknown"):
        pe_config_class("test_gain")


# --- every registered kind has every fact, and they agree with what the kind builds -------------------------------

def _configs(name: str) -> list:
    cls = pe_config_class(name)
    base = cls(kind=name)
    out = [base]
    for field, values in {"rotation_dim": [2, 8], "basis": ["identity", "random"], "fraction": [1.0, 0.5],
                          "learnable": [True], "per_head": [True], "init": ["random"]}.items():
        if field in cls.__dataclass_fields__:
            out += [dataclasses.replace(base, **{field: v}) for v in values]
    return out


@pytest.mark.parametrize("name", list(POSITION_ENCODINGS))
def test_every_kind_has_every_fact_and_they_agree_with_its_module(name):
    kind = POSITION_ENCODINGS[name]
    assert kind.name == name and dataclasses.is_dataclass(kind.config)
    fields = kind.config.__dataclass_fields__
    assert set(kind.identity_keys) <= set(fields) and set(kind.cost_keys) <= set(fields)
    for pe in _configs(name):
        row = encoding_identity(pe)
        assert list(row) == list(IDENTITY_COLUMNS) and row["pe_kind"] == name
        assert encoding_problems(pe, SHAPE) == []
        enc = build_position_encoding(pe, SHAPE)
        built = sum(p.numel() for p in enc.parameters())
        assert encoding_params(pe, SHAPE) == built, (pe, built)
        # is-RoPE is what the dedup says: the config's class is RoPE's at its θ
        rope = dedup_pe(PEConfig(kind="rope", theta=getattr(pe, "theta", 10000.0)))
        assert identity_is_rope(row) == (dedup_pe(pe) == rope), pe
        args = ModelArgs(vocab_size=32, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_hidden=64, max_seq_len=32,
                         pe=pe)
        assert param_count(args) == Llama(args).num_params(), pe
    assert kind.exportable == (name in ("rope", "hdrope", "string"))


def test_checking_a_config_builds_no_encoding(monkeypatch):
    """validate_model_args asks each kind for its problems; it never calls a builder."""
    from trainer.model.args import validate_model_args

    def refuse(cfg, shape):
        raise AssertionError("built while validating")

    for name, kind in list(POSITION_ENCODINGS.items()):
        monkeypatch.setitem(POSITION_ENCODINGS, name, dataclasses.replace(kind, build=refuse))
    for name in POSITION_ENCODINGS:
        validate_model_args(ModelArgs(pe=pe_config_class(name)(kind=name)))
    with pytest.raises(UserError, match=r"model\.pe \(hdrope\): theta must be > 1"):
        validate_model_args(ModelArgs(pe=PEConfig(theta=0.5)))
    with pytest.raises(UserError, match=r"rope_scaling\.rope_type='nope' is unknown"):
        validate_model_args(ModelArgs(pe=PEConfig(kind="rope", scaling={"rope_type": "nope"})))


def test_analysis_takes_rope_from_the_registry_not_from_rotation_dim():
    import pandas as pd

    from analysis.comparisons import is_rope

    rows = [encoding_identity(pe) for pe in (
        PEConfig(kind="rope"), PEConfig(rotation_dim=2, basis="random"), PEConfig(rotation_dim=4),
        pe_config_class("xpos")(), pe_config_class("fope")(), pe_config_class("partial_rope")(fraction=1.0),
        pe_config_class("partial_rope")(fraction=0.5))]
    assert is_rope(pd.DataFrame(rows)).tolist() == [True, True, False, False, False, True, False]
