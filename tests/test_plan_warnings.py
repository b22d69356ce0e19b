"""`hdrope sweep plan` warns, naming the cells and the fix, when the design cannot measure what it names (issue 33
§6, §7, §9): a frequency-starved rotation, a kind's length field past every evaluated length, too few windows."""

from __future__ import annotations

import textwrap

import pytest

from hdrope.errors import UserError
from sweeps.console import main
from sweeps.design_warnings import MAX_WINDOW_SE, PAIRED_WINDOW_SD, design_warnings, evaluated_lengths
from sweeps.runner import prepare
from trainer.model.position import POSITION_ENCODINGS


def plan_of(tmp_path, overrides: dict, axes: dict | None = None, name: str = "pw"):
    """The plan of a tiny-preset spec with these overrides and axes."""
    lines = [f"name: {name}", "base: tiny", f"storage: {tmp_path / 'store'}", "overrides:"]
    lines += [f"  {k}: {v}" for k, v in overrides.items()] or ["  {}"]
    if axes:
        lines += ["axes:", *(f"  {k}: {v}" for k, v in axes.items())]
    path = tmp_path / f"{name}.yaml"
    path.write_text("\n".join(lines) + "\n")
    return prepare(str(path))


def only(warnings: list[str], word: str) -> list[str]:
    return [w for w in warnings if word in w]


def test_8d_at_head_dim_16_is_named_frequency_starved(tmp_path):
    """HD-RoPE at rotation_dim 8 and head_dim 16 keeps 2 frequencies, periods 2π and 2π·100 tokens."""
    plan = plan_of(tmp_path, {"model.dim": 32, "model.n_heads": 2}, {"model.pe.rotation_dim": "[2, 4, 8]"})
    found = only(plan.warnings, "distinct frequenc")
    eight = next(c.cell_id for c in plan.cells if c.values["model.pe.rotation_dim"] == 8)
    assert len(found) == 1 and found[0].startswith(f"cell {eight}: 8D Paley at head_dim 16 has 2 distinct")
    assert "periods 6.28 and 628 tokens" in found[0]
    assert "rotation_dim of at most 4" in found[0] and "head_dim of at least 32" in found[0]


def test_fire_threshold_512_at_train_length_128_times_4_is_named(tmp_path):
    """rivals_compact's FIRE: the initial threshold 512 reaches every evaluated position (128 × 4), so the
    progressive interpolation never acts; at a threshold of 128 it does, and nothing is said."""
    base = {"model.max_seq_len": 128, "model.pe": "{kind: fire}", "eval.extrapolation": "[2, 4]",
            "eval.passkey.length_factors": "[1.0, 2.0, 4.0]"}
    plan = plan_of(tmp_path, base)
    assert max(evaluated_lengths(plan.cells[0].config)) == 512
    found = only(plan.warnings, "init_threshold")
    assert len(found) == 1 and found[0].startswith(f"cell {plan.cells[0].cell_id}: FIRE: model.pe.init_threshold=512")
    assert "longest is 512 tokens" in found[0] and "at most the train length" in found[0]
    ok = plan_of(tmp_path, {**base, "model.pe": "{kind: fire, init_threshold: 128.0}"}, name="fire128")
    assert not only(ok.warnings, "init_threshold")


@pytest.mark.parametrize(("pe", "key"), [
    ("{kind: hope, train_len: 1024}", "model.pe.train_len=1024"),
    ("{kind: rope, scaling: {rope_type: yarn, factor: 2.0, original_max_position_embeddings: 1024}}",
     "model.pe.scaling.original_max_position_embeddings=1024"),
])
def test_other_declared_lengths_past_every_evaluated_length_are_named(tmp_path, pe, key):
    """HoPE's train length and a rope_scaling original length come from the kinds' own declarations."""
    plan = plan_of(tmp_path, {"model.pe": pe})
    assert len(only(plan.warnings, key)) == 1


def test_four_windows_are_too_few_for_a_paired_comparison(tmp_path):
    """The quickstart's design scores 4x on 2 batches × 8 // 4 = 4 windows: the window noise of a paired difference
    is the measured per-window SD / 2, far over the bound; eval.windows=128 clears it, and --detect judges it."""
    over = {"eval.extrapolation": "[2, 4]", "eval.extrapolation_batches": 2, "eval.passkey.enabled": "false"}
    axes = {"model.pe.kind": "[rope, hdrope]", "seed": "[1, 2]"}
    plan = plan_of(tmp_path, over, axes)
    found = only(plan.warnings, "validation windows")
    assert len(found) == 1 and found[0].startswith("all 4 cells: ")
    assert "4x on 4 (needs" in found[0] and f"{PAIRED_WINDOW_SD[2] / 2:.3g} nats" in found[0]
    assert "eval.windows=128" in found[0]
    enough = plan_of(tmp_path, {**over, "eval.windows": 128}, axes, name="w128")
    assert not only(enough.warnings, "validation windows")
    # against --detect 0.02 the window SE may be 0.005: 128 windows (SE 0.0070 past 1x) are too few, 256 are not
    assert only(design_warnings(enough.cells, enough.compares, detect=0.02), "a quarter of --detect 0.02")
    assert PAIRED_WINDOW_SD[2] / 128**0.5 < MAX_WINDOW_SE < PAIRED_WINDOW_SD[2] / 4**0.5
    with pytest.raises(UserError, match="the difference to detect must be a positive number"):
        design_warnings(enough.cells, enough.compares, detect=0.0)


def test_the_tiny_presets_ordinary_rope_cell_gets_no_warning(tmp_path):
    """A plain RoPE cell of the tiny preset (head_dim 32, 16 frequencies, no length field past its lengths, nothing
    compared) plans without a warning; so does the same cell over seeds alone."""
    assert plan_of(tmp_path, {"model.pe.kind": "rope"}).warnings == []
    assert plan_of(tmp_path, {"model.pe.kind": "rope"}, {"seed": "[1, 2, 3]"}, name="seeds").warnings == []


def test_plan_prints_the_warnings_with_the_plan_and_exits_0(tmp_path, capsys):
    plan_of(tmp_path, {"model.dim": 32, "model.n_heads": 2, "model.pe.rotation_dim": 8})
    code = main(["sweep", "plan", str(tmp_path / "pw.yaml")])
    out = capsys.readouterr()
    assert code == 0 and "1 cells" in out.out
    assert "warning: cell c000: 8D Paley at head_dim 16 has 2 distinct frequencies" in out.err


def test_the_planner_reads_the_registry_not_kind_names():
    """Every length the planner checks is a kind's declaration; the planner's module names no kind."""
    import sweeps.design_warnings as dw

    declared = {(name, f.key) for name, k in POSITION_ENCODINGS.items() for f in k.lengths}
    assert {("fire", "init_threshold"), ("hope", "train_len"),
            ("rope", "scaling.original_max_position_embeddings")} <= declared
    source = textwrap.dedent(open(dw.__file__).read())
    assert not [name for name in POSITION_ENCODINGS if f'"{name}"' in source or f"'{name}'" in source]


def test_plan_detect_judges_the_windows_against_the_difference_to_detect(tmp_path, stored_sweep, capsys):
    """128 windows pass without --detect; `plan --detect 0.02` asks for a window SE of 0.005 nats, which 128
    windows past 1x (0.0070) miss: the warning comes with the seed advice, naming the fix."""
    over = {"eval.extrapolation": "[2]", "eval.passkey.enabled": "false", "eval.windows": 128}
    plan = plan_of(tmp_path, over, {"model.pe.kind": "[rope, hdrope]", "seed": "[1, 2, 3]"})
    assert plan.warnings == []
    pilot = stored_sweep(tmp_path / "pw.yaml", lambda c: {"val_loss_x2": 2.0 + 0.01 * c.config.train.seed
                                                          + (0.002 * c.config.train.seed ** 2 if
                                                             c.values["model.pe.kind"] == "hdrope" else 0.0)})
    code = main(["sweep", "plan", str(tmp_path / "pw.yaml"), "--detect", "0.02", "--pilot", str(pilot),
                 "--metric", "val_loss_x2"])
    out = capsys.readouterr()
    assert code == 0 and "seeds" in out.out
    assert "warning: all 6 cells: too few validation windows" in out.err and "a quarter of --detect 0.02" in out.err
    assert "2x on 128 (needs 250)" in out.err and "eval.windows=256" in out.err
