"""A position encoding per layer (`model.pe_layers`, issue 46): a hybrid stack computes, layer by layer, exactly what
each layer's own kind computes there; every attention path equals the dense one for it, with masks, windows and a KV
cache; it is one variant to plans, labels, dedup and MLflow; it trains and resumes exactly; bad lists are refused
before training, naming the field."""

from __future__ import annotations

import pytest
import torch

from hdrope.errors import UserError
from tests.test_attention_paths import EOS, _tokens
from tests.test_attention_paths import _model as _tiny
from trainer.config import config_errors, config_hash
from trainer.model.attention.documents import Documents
from trainer.model.llama import KVCache, Llama, ModelArgs, _Context
from trainer.model.pe_layers import (
    HYBRID_KIND,
    every_nth,
    layer_sections,
    stack_dedup,
    stack_groups,
    stack_identity,
)
from trainer.model.position import pe_config_class
from trainer.run.loop import train

# FIRE (per-layer MLPs) on layers 0 and 2, so its part's layer 1 is model layer 2; RoPE, then CoPE (a carry)
MIXED = [{"kind": "fire"}, {"kind": "rope"}, {"kind": "fire"}, {"kind": "cope"}]


def _args(pe_layers, n_layers: int = 4, pe=None, **more) -> ModelArgs:
    return ModelArgs(vocab_size=32, dim=32, n_layers=n_layers, n_heads=4, n_kv_heads=2, ffn_hidden=64, max_seq_len=32,
                     pe=pe or pe_config_class("rope")(kind="rope"), pe_layers=pe_layers, **more)


def _model(pe_layers, **more) -> Llama:
    """A tiny float64 hybrid on RoPE whose encodings' parameters are moved off their initial values."""
    return _tiny("rope", n_layers=4, pe_layers=pe_layers, **more)


def _plain_twin(hybrid: Llama, kind: str) -> Llama:
    """A model of `kind` on every layer with the hybrid's weights, its encoding's per-layer parameters those of the
    hybrid's part at the layers that part serves."""
    twin = Llama(_args([], pe=pe_config_class(kind)(kind=kind))).double()
    twin.load_state_dict({k: v for k, v in hybrid.state_dict().items() if not k.startswith("pe.")}, strict=False)
    group = next(g for g in stack_groups(hybrid.args) if g.pe.kind == kind)
    part = hybrid.layer_encoding(group.layers[0])
    with torch.no_grad():
        for (name, mine), theirs in zip(twin.pe.named_parameters(), part.parameters(), strict=True):
            if mine.shape == theirs.shape:
                mine.copy_(theirs)  # one table for all layers
            else:
                assert mine.shape[0] == hybrid.args.n_layers and theirs.shape[0] == len(group.layers), name
                mine[list(group.layers)] = theirs
    return twin


def test_a_hybrid_computes_at_each_layer_what_its_own_kind_computes_there():
    hybrid = _model(MIXED)
    assert [type(hybrid.layer_encoding(i)).__name__ for i in range(4)] == ["Fire", "HDRotaryEncoding", "Fire", "CoPE"]
    assert hybrid.layer_encoding(0) is hybrid.layer_encoding(2)  # equal sections share one module
    twins = {kind: _plain_twin(hybrid, kind) for kind in ("fire", "rope", "cope")}
    tokens = _tokens()
    positions = torch.arange(tokens.shape[1])
    h = hybrid.tok_embeddings(tokens)
    ctx = _Context(None, None, "dense", 0, positions[None], None, 0)
    for i, block in enumerate(hybrid.layers):
        pe = twins[MIXED[i]["kind"]].pe  # the plain model's encoding at model layer i
        h = block(h, pe, pe.tables(positions, h.dtype, tokens.shape[1]), ctx)
    torch.testing.assert_close(hybrid(tokens), hybrid.output(hybrid.norm(h)), atol=1e-12, rtol=0)


def _run(model: Llama, path: str, tokens: torch.Tensor):
    model.args.attention = path
    model.zero_grad()
    out = model(tokens)
    (out * torch.randn(out.shape, generator=torch.Generator().manual_seed(2), dtype=out.dtype)).sum().backward()
    return out.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("masks", ["causal", "documents and windows"])
def test_a_hybrid_is_the_same_on_every_path_in_values_gradients_and_through_a_kv_cache(masks):
    more = {"window": 6, "layer_pattern": "1 local, 1 global", "attention_block": 5} if masks != "causal" else \
        {"attention_block": 5}
    model = _model(MIXED, **more)
    model.documents = Documents(EOS, True) if masks != "causal" else None
    tokens = _tokens()
    want, want_grads = _run(model, "dense", tokens)
    got, got_grads = _run(model, "tiled", tokens)
    torch.testing.assert_close(got, want, atol=1e-12, rtol=0)
    assert set(got_grads) == set(want_grads) and {"pe.parts.0", "pe.parts.2"} <= {n[:10] for n in got_grads}
    for name, grad in want_grads.items():  # FIRE computes its bias in float32, as its official code
        torch.testing.assert_close(got_grads[name], grad, atol=5e-7, rtol=5e-7, msg=name)
    with torch.no_grad():
        cache = KVCache(4)
        steps = [model(tokens[:, :9], cache=cache)] + [model(tokens[:, i:i + 4], cache=cache) for i in range(9, 23, 4)]
        model.args.attention = "dense"
        full = model(tokens)
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-7, rtol=0)


def test_the_forms_name_the_same_layers():
    assert every_nth(4, 8) == [3, 7] and every_nth(1, 3) == [0, 1, 2]
    nope = {"kind": "nope"}
    pattern = layer_sections([{"layers": "every 4th", "pe": nope}], 8)
    listed = layer_sections([{"layers": [3, -1], "pe": nope}], 8)
    assert [s is not None for s in pattern] == [s is not None for s in listed] == [i in (3, 7) for i in range(8)]
    later = layer_sections([{"layers": "every 2nd", "pe": nope}, {"layers": [3], "pe": {"kind": "alibi"}}], 4)
    assert [s and s[0]["kind"] for s in later] == [None, "nope", None, "alibi"]  # a later entry wins
    explicit = [{"kind": "rope"}, {"kind": "rope"}, {"kind": "rope"}, nope]
    a, b = _args(explicit), _args([{"layers": "every 4th", "pe": nope}])
    assert stack_identity(a) == stack_identity(b)
    assert stack_identity(a)["pe_kind"] == HYBRID_KIND and stack_identity(a)["pe_label"] == "RoPE + NoPE at layer 3"
    eight = _args([{"layers": "every 4th", "pe": nope}], n_layers=8)
    assert stack_identity(eight)["pe_label"] == "RoPE + NoPE every 4th"


def test_a_section_starts_from_its_kinds_defaults_and_equal_sections_are_one_model():
    args = _args([{"layers": [1], "pe": {"kind": "hdrope", "rotation_dim": 4, "basis": "paley"}}])
    groups = stack_groups(args)
    assert [g.layers for g in groups] == [(0, 2, 3), (1,)] and groups[1].pe.theta == 10000.0
    assert groups[1].shape.n_layers == 1
    same = _args([{"layers": "every 2nd", "pe": {"kind": "rope"}}])  # RoPE where RoPE is already
    assert stack_identity(same) == stack_identity(_args([]))
    assert stack_dedup(same) == (stack_dedup(_args([]))[0], [])
    # 2D HD-RoPE with any basis is RoPE (NOTES §1): a stack of it dedups to the plain RoPE model
    two = _args([{"layers": [0], "pe": {"kind": "hdrope", "rotation_dim": 2, "basis": "paley"}}])
    assert stack_dedup(two)[1] == []


def test_a_hybrid_has_its_own_config_hash_and_the_plain_models_keep_theirs(tiny_cfg):
    plain = tiny_cfg("model.n_layers=4")
    assert config_hash(plain) == config_hash(tiny_cfg("model.n_layers=4", "model.pe_layers=[]"))
    hybrid = tiny_cfg("model.n_layers=4", "model.pe_layers=[{layers: 'every 4th', pe: {kind: nope}}]")
    assert config_hash(hybrid) != config_hash(plain) and not config_errors(hybrid)


BAD = {
    "a per-layer list of the wrong length": ("[{kind: rope}, {kind: nope}]",
                                             "model.pe_layers: a list of 2 model.pe sections for model.n_layers=4"),
    "a pattern that does not divide the depth": ("[{layers: 'every 3rd', pe: {kind: nope}}]",
                                                 "model.pe_layers[0].layers='every 3rd': 3 does not divide"),
    "a layer the model does not have": ("[{layers: [4], pe: {kind: nope}}]",
                                        "model.pe_layers[0].layers=[4]: 4 is not a layer"),
    "an unknown kind": ("[{layers: [1], pe: {kind: ropee}}]", "model.pe_layers[0].pe: model.pe.kind='ropee'"),
    "a key the kind does not have": ("[{layers: [1], pe: {kind: nope, thetaa: 5}}]",
                                     "model.pe_layers[0].pe: bad key or value at 'thetaa'"),
    "an entry without its pe": ("[{layers: [1]}]", "model.pe_layers[0]=['layers']: an entry has exactly"),
    "a section at a shape its kind refuses": ("[{layers: [1], pe: {kind: hdrope, rotation_dim: 3}}]",
                                              "model.pe.rotation_dim=3: must be an even integer"),
    "not a list": ("{kind: nope}", "model.pe_layers={'kind': 'nope'}: must be a list"),
}


def _refusal(tiny_cfg, value: str) -> str:
    with pytest.raises(UserError) as err:  # refused where the config is merged and validated
        tiny_cfg("model.n_layers=4", f"model.pe_layers={value}")
    return str(err.value)


@pytest.mark.parametrize("case", list(BAD))
def test_a_bad_per_layer_setting_is_refused_before_training_naming_the_field(tiny_cfg, case):
    value, message = BAD[case]
    assert message in _refusal(tiny_cfg, value)


def test_a_section_a_kind_refuses_names_its_layers(tiny_cfg):
    text = _refusal(tiny_cfg, "[{layers: [1, 3], pe: {kind: hdrope, rotation_dim: 64}}]")
    assert text.startswith("model.pe.rotation_dim=64 does not divide")
    assert text.endswith("(model.pe_layers: layers 1, 3)")


def test_a_hybrid_trains_logs_its_identity_and_resumes_exactly(tiny_cfg):
    from test_train import FAST, Interrupt, StopAt

    from trainer.run.checkpoint import latest_checkpoint

    overrides = ["model.n_layers=4", "model.pe_layers=[{layers: 'every 4th', pe: {kind: nope}}]", "train.steps=16",
                 "train.ckpt_every=8", "train.eval_every=16", "dump.enabled=true", *FAST]
    whole = train(tiny_cfg(*overrides, out="whole"))
    with pytest.raises(Interrupt):
        train(tiny_cfg(*overrides, out="cut"), StopAt(8))
    assert latest_checkpoint(whole.run_dir.parent / "cut" / "checkpoints").name == "step_00000008"
    resumed = train(tiny_cfg(*overrides, out="cut"))
    assert resumed.resumed_from == 8 and resumed.losses == whole.losses
    import pyarrow.parquet as pq

    dump = pq.read_table(whole.run_dir / "attention" / "attention.parquet").to_pandas()
    assert set(dump["pe_kind"]) == {HYBRID_KIND} and set(dump["pe_label"]) == {"4D Paley + NoPE at layer 3"}
    assert sorted(set(dump["layer"])) == [0, 1, 2, 3]


def test_a_sweep_over_stacks_names_each_one_variant_in_results_reports_and_run_names(tmp_path, cache_dir):
    """Arms that set several model keys at once (the hybrid study's form): each is one variant, named by its label in
    results.parquet, the report's variants and the MLflow run names, never by the axis value."""
    from conftest import train_sweep_in_process

    from analysis.load import load_results
    from analysis.variants import trained
    from sweeps.callback import cell_run_name
    from trainer.model.pe_schedule import run_identity

    spec = tmp_path / "stacks.yaml"
    spec.write_text(f"""
name: stacks
base: tiny
storage: {tmp_path / 'store'}
overrides: {{data.cache_dir: {cache_dir}, model.n_layers: 4, train.steps: 6, train.log_every: 3,
            eval.passkey.enabled: false, eval.extrapolation_batches: 0}}
axes:
  model:
    - {{pe: {{kind: rope}}}}
    - {{pe: {{kind: rope}}, pe_layers: [{{layers: every 4th, pe: {{kind: nope}}}}]}}
    - {{pe: {{kind: rope}}, pe_layers: [{{layers: every 4th, pe: {{kind: nope}}}}], window: 16,
       layer_pattern: "3 local, 1 global"}}
  seed: [1]
""")
    plan = train_sweep_in_process(spec)
    labels = ["RoPE", "RoPE + NoPE at layer 3", "RoPE + NoPE at layer 3, window 16 at layers 0, 1, 2"]
    results = load_results(plan.root)
    assert list(results["pe_label"]) == labels and list(results["pe_kind"]) == ["rope", "hybrid", "hybrid"]
    assert sorted(trained(results)["variant"]) == sorted(labels)
    names = [cell_run_name(run_identity(c.config), c.config.train.seed, c.values, plan.seed_axes) for c in plan.cells]
    assert names == [f"{label.replace(' ', '-')}-θ10000-s1" for label in labels]


HYBRID_ARMS = ["RoPE", "RoPE + NoPE at layer 3", "4D Paley + NoPE at layer 3",
               "RoPE + NoPE at layer 3, window 16 at layers 0, 1, 2"]


def _pilot_table(rows: list[dict]) -> str:
    """The per-seed table docs/hybrid-stacks.md quotes, from the pilot's cells.csv rows."""
    seeds = sorted({int(r["seed"]) for r in rows})
    lines = [f"| arm | `efflen_loss` (seeds {', '.join(map(str, seeds))}) | `val_loss_x8` | copy exact match at 8x |",
             "|---|---|---|---|"]
    for arm in HYBRID_ARMS:
        mine = sorted((r for r in rows if r["pe_label"] == arm), key=lambda r: int(r["seed"]))
        columns = [", ".join("—" if r[key] == "" else form.format(float(r[key])) for r in mine)
                   for key, form in (("efflen_loss", "{:.3g}"), ("val_loss_x8", "{:.2f}"), ("acc_copy_x8", "{:.2f}"))]
        lines.append(f"| {arm} | " + " | ".join(columns) + " |")
    return "\n".join(lines)


def test_the_hybrid_study_is_sized_on_its_shipped_pilot_as_the_docs_and_spec_say():
    """docs/hybrid-stacks.md's pilot table, spread, seeds and cost are experiments/results/hybrid_pilot/cells.csv's,
    sized as `hdrope sweep plan --detect 0.25 --pilot` sizes the spec's declared family (Holm's first step)."""
    import csv
    import json
    import math
    from pathlib import Path

    import numpy as np

    from analysis.stats import seeds_needed
    from sweeps.spec import load_spec

    repo = Path(__file__).resolve().parents[1]
    pilot = repo / "experiments" / "results" / "hybrid_pilot"
    rows = list(csv.DictReader((pilot / "cells.csv").open()))
    text = (repo / "docs" / "hybrid-stacks.md").read_text()
    quoted = text.split("<!-- pilot-table:hybrid_pilot -->\n", 1)[1].split("\n<!-- /pilot-table -->", 1)[0]
    assert quoted == _pilot_table(rows)
    spec = load_spec(repo / "experiments" / "tables" / "hybrid_compact.yaml")
    value = {(r["pe_label"], int(r["seed"])): float(r["efflen_loss"]) for r in rows if r["efflen_loss"]}
    spreads = []
    for q in spec.questions:
        diffs = [value[q.variant, s] - value[q.reference, s] for s in (30, 31, 32)
                 if (q.variant, s) in value and (q.reference, s) in value]
        spreads.append((float(np.std(diffs, ddof=1)), len(diffs), q))
    sd, pairs, worst = max(spreads, key=lambda s: s[0])
    needed = seeds_needed(0.25, sd, paired=True, alpha=0.05 / len(spec.questions))
    assert (worst.variant, worst.reference, pairs) == ("RoPE + NoPE at layer 3", "RoPE", 2)
    flat = " ".join(text.split())
    said = f"(sd {sd:.3f} over its 2 paired seeds): **{needed} paired seeds**, which the spec holds (42-{41 + needed})"
    assert said in flat
    assert spec.axes["seed"] == list(range(42, 42 + needed))
    trials = json.loads((pilot / "study.json").read_text())["rows"]  # 12, in 1099 s
    per_trial = 1099 / trials
    assert f"That is {4 * needed} trials; at the pilot's {per_trial:.0f} s a trial (two at once) about " \
           f"{4 * needed * per_trial / 60:.0f} minutes" in flat
    assert all(math.isclose(value[HYBRID_ARMS[3], s], 8.0) for s in (30, 31, 32))  # "never crosses ... in any seed"
    header = " ".join(w for w in (repo / "experiments" / "tables" / "hybrid_compact.yaml").read_text().split()
                      if w != "#")
    assert f"{needed} paired seeds (sd {sd:.3f} of the largest paired spread), so {4 * needed} trials, about " \
           f"{4 * needed * per_trial / 60:.0f} min of 2 cores" in header


def test_the_docs_read_the_hybrid_studys_seed_counts_from_its_file():
    """The counts docs/hybrid-stacks.md gives for the shipped study are experiments/results/hybrid_compact's."""
    from pathlib import Path

    from analysis.shipped import load_study

    repo = Path(__file__).resolve().parents[1]
    cells = load_study(repo / "experiments" / "results" / "hybrid_compact").cells
    swa, rope, nope, paley = HYBRID_ARMS[3], HYBRID_ARMS[0], HYBRID_ARMS[1], HYBRID_ARMS[2]
    by = {m: cells.pivot_table(index="seed", columns="variant", values=m)
          for m in ("efflen_loss", "val_loss_x8", "acc_copy_x8")}
    eff, x8, copy = by["efflen_loss"], by["val_loss_x8"], by["acc_copy_x8"]
    seeds = len(eff)
    flat = " ".join((repo / "docs" / "hybrid-stacks.md").read_text().split())
    assert (f"RNoPE-SWA reads longer than RoPE in {int((eff[swa] > eff[rope]).sum())} of its {seeds} seeds and "
            f"shorter in {int((eff[swa] < eff[rope]).sum())}; in {int((eff[swa] == 8).sum())} it never crosses") in flat
    assert int((x8[swa] < x8[rope]).sum()) == int((copy[swa] > copy[rope]).sum()) == seeds
    assert f"loss at 8x is below RoPE's in all {seeds} seeds" in flat and f"above RoPE's in all {seeds} seeds" in flat
    assert f"spreads from {copy[swa].min():.2f} to {copy[swa].max():.1f} over seeds" in flat
    assert f"above the RoPE hybrid's in {int((x8[paley] > x8[nope]).sum())} of {seeds} seeds" in flat
    import pandas as pd

    declared = pd.read_csv(repo / "experiments" / "results" / "hybrid_compact" / "comparisons.csv")
    declared = declared[declared["metric"] == "efflen_loss"].set_index(["variant", "reference"])
    row = {arm: declared.loc[(arm, ref)] for arm, ref in ((swa, rope), (nope, rope), (paley, nope))}
    assert f"+{row[swa].delta:.1f} train lengths on the paired loss effective length (p_Holm {row[swa].p_adj:.3f}, " \
           "marked)" in flat and row[swa].significant
    assert f"(+{row[nope].delta:.2f} train lengths, p_Holm {row[nope].p_adj:.2f})" in flat
    assert f"({row[paley].delta:.2f}, p_Holm {row[paley].p_adj:.2f})".replace("-", "−") in flat
    assert not (row[nope].significant or row[paley].significant)
