"""Length generalisation in the analysis: effective lengths on synthetic inputs (edge cases included), "not learned"
marks, and the report's tables and figures from a synthetic sweep (results table + per-run loss-by-position files)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from analysis.lengthgen import (
    AccuracyRule,
    effective_length,
    is_task_metric,
    learned_table,
    loss_effective_length,
    task_metrics,
    with_effective_lengths,
)
from trainer.evals.position_loss import PositionLoss, write_position_loss

FACTORS = [1.0, 1.5, 2.0, 4.0, 8.0]


@pytest.mark.parametrize("accs,rule,expected", [
    ([0.95, 0.9, 0.6, 0.2, 0.0], AccuracyRule(), 2.0),  # half of 0.95 is 0.475: kept to 2x
    ([0.95, 0.9, 0.6, 0.2, 0.0], AccuracyRule("absolute", 0.9), 1.5),
    ([0.95, 0.95, 0.94, 0.93, 0.92], AccuracyRule(), 8.0),  # always above: censored at the longest length
    ([0.3, 0.2, 0.1, 0.0, 0.0], AccuracyRule("absolute", 0.5), 0.0),  # never above
    ([0.0, 0.0, 0.0, 0.0, 0.0], AccuracyRule(), 0.0),  # nothing right: not "kept" relative to 0
    ([0.95, 0.2, 0.9, 0.9, 0.9], AccuracyRule(), 1.0),  # "stays": the first drop ends it
    ([0.95, math.nan, 0.9, 0.1, 0.0], AccuracyRule(), 2.0),  # an unevaluated length is skipped
])
def test_accuracy_effective_length(accs, rule, expected):
    assert effective_length(FACTORS, accs, rule) == expected


def test_effective_length_of_nothing_is_nan_and_bad_rules_are_refused():
    assert math.isnan(effective_length(FACTORS, [math.nan] * 5))
    with pytest.raises(ValueError, match="relative or absolute"):
        AccuracyRule("ruler", 0.5)


def _curve(length: int, rise_at: int | None, level: float = 2.0, bins: int = 32) -> tuple:
    starts = np.arange(0, length, length // bins)
    loss = np.where(starts < 8, level + 1.0, level)  # the first positions lack context: higher, never checked
    if rise_at is not None:
        loss = np.where(starts >= rise_at, level + 0.5, loss)
    return starts, loss, np.full(len(starts), 100)


@pytest.mark.parametrize("rise_at,expected", [(None, 8.0), (64, 1.0), (320, 5.0)])
def test_loss_effective_length(rise_at, expected):
    positions, losses, tokens = _curve(512, rise_at)
    assert loss_effective_length(positions, losses, tokens, 64, 512, tolerance=0.1) == expected


def test_loss_within_tolerance_is_kept():
    positions, losses, tokens = _curve(512, 128, level=2.0)
    assert loss_effective_length(positions, losses + np.where(positions >= 128, -0.45, 0), tokens, 64, 512, 0.1) == 8.0


def _identity(kind: str, **pe) -> dict:
    from trainer.model.position import encoding_identity
    from trainer.presets import load_config

    cfg = load_config("tiny", [f"model.pe.kind={kind}", *(f"model.pe.{k}={v}" for k, v in pe.items())])
    return encoding_identity(cfg.model.pe)


# variant -> (identity, 1x accuracy of copy, where its loss rises beyond the train length 64 in tokens)
VARIANTS = {"rope": (("rope", {}), 0.97, 128), "nope": (("nope", {}), 0.5, None),
            "paley": (("hdrope", {"rotation_dim": 4, "basis": "paley"}), 0.95, 256)}
SEEDS = [1, 2, 3, 4, 5, 6]


@pytest.fixture(scope="module")
def synthetic_sweep(tmp_path_factory):
    """A sweep directory as `hdrope sweep results` leaves it: results.parquet with task accuracies for three
    variants × six seeds, and each run's position_loss.parquet with its paired columns (real writer)."""
    root = tmp_path_factory.mktemp("lengthgen-sweep")
    rng = np.random.default_rng(0)
    rows = []
    for v, ((kind, pe), acc1, rise) in VARIANTS.items():
        ident = _identity(kind, **pe)
        for seed in SEEDS:
            run = root / "cells" / f"{v}-{seed}"
            run.mkdir(parents=True)
            row = {"cell_id": f"{v}-{seed}", "status": "FINISHED", "dedup_of": None, "run_dir": str(run),
                   "seed": seed, "model.pe.kind": kind, **ident, "val_loss": 2.0 + rng.normal(0, 0.01)}
            for f in FACTORS:
                tag = f"{f:g}"
                drop = 1.0 if f <= 1.5 else (0.75 if v == "paley" else 0.3) ** math.log2(f)
                row[f"acc_copy_x{tag}"] = round(acc1 * drop * 64) / 64
                row[f"n_copy_x{tag}"] = 64.0
                row[f"tokacc_copy_x{tag}"] = acc1 * drop
            rows.append(row)
            by, limited = {}, {}
            for f in (1, 4):  # 5 windows: full context rises past `rise`, the train-length context does not
                length = 64 * f
                same = np.full((5, length), 2.0) + rng.normal(0, 0.01, (5, length))
                full = same + (0.6 * (np.arange(length) >= rise) if rise is not None else 0.0)
                by[f] = PositionLoss(full.sum(0), np.full(length, 5), full, same + 1.0)  # unigram: 1 nat worse
                limited[f] = PositionLoss(same.sum(0), np.full(length, 5), same)
            write_position_loss(by, 16, "linear", run / "position_loss.parquet", limited=limited, train_length=64)
    table = pa.Table.from_pylist(rows)
    table = table.replace_schema_metadata({"hdrope.axes": '["model.pe.kind", "seed"]', "hdrope.seed_axes": '["seed"]'})
    pq.write_table(table, root / "results.parquet")
    return root


def _cells(root) -> pd.DataFrame:
    from analysis.load import sweep_cells

    return sweep_cells(root)


def test_task_metrics_and_not_learned(synthetic_sweep):
    cells = _cells(synthetic_sweep)
    assert list(task_metrics(list(cells.columns))["copy"]) == FACTORS
    assert is_task_metric("acc_copy_x1.5") and is_task_metric("n_copy_x2") and is_task_metric("tokacc_copy_x8")
    assert not is_task_metric("val_loss_x2")
    learned = learned_table(cells).set_index("variant")
    assert learned["n"].eq(6 * 64).all()
    assert not learned.filter(like="NoPE", axis=0)["learned"].any()
    assert learned.drop(learned.filter(like="NoPE", axis=0).index)["learned"].all()


def test_effective_lengths_per_seed(synthetic_sweep):
    cells = with_effective_lengths(_cells(synthetic_sweep))
    by = cells.groupby("model.pe.kind")
    assert by["efflen_copy"].apply(lambda s: s.isna().all())["nope"]  # not learned: no effective length
    assert (by.get_group("rope")["efflen_copy"] == 1.5).all()  # 0.97·0.3 < half of 0.97 at 2x
    assert (by.get_group("hdrope")["efflen_copy"] == 4.0).all()
    assert (by.get_group("rope")["efflen_loss"] == 2.0).all()  # rises at 128 = 2x the train length
    assert (by.get_group("hdrope")["efflen_loss"] == 4.0).all()
    assert (by.get_group("nope")["efflen_loss"] == 4.0).all()  # never rises: censored at the 4x window


def test_report_draws_length_tables_and_figures(synthetic_sweep):
    from analysis.report import build_report, report_figures

    stems = {f.stem for f in report_figures(synthetic_sweep)}
    assert {"accuracy_vs_length_copy_theta10000", "position_loss_theta10000", "position_loss_diff_theta10000"} <= stems
    report = build_report(synthetic_sweep).read_text()
    assert "## Length generalisation" in report and "### copy: exact match by evaluated length" in report
    assert "### acc_copy_x2" not in report  # no generic outcome table per task metric
    section = report.split("### copy: exact match")[1].split("### Effective length")[0]
    nope = next(line for line in section.splitlines() if line.startswith("| NoPE"))
    assert nope.count("not learned") == 5 and "192/384 = 50.0%" in nope  # k/n pooled over 6 seeds × 64 prompts
    assert "Holm (family-wise error) over the 5 comparisons of this table" in section  # Paley × 5 lengths
    assert "| acc_copy_x2 | θ=10000 | 4D Paley − RoPE | 0.4219" in section
    effective = report.split("### Effective length")[1].split("## ")[0]
    rows = {line.split(" |")[0].strip("| "): line for line in effective.splitlines() if line.startswith("| ")}
    assert rows["RoPE, θ=10000"].startswith("| RoPE, θ=10000 | 1.5000 ± 0.0000 (n=6) | 2.0000 ± 0.0000 (n=6)")
    assert "| NoPE, no θ | — | 4.0000" in rows["NoPE, no θ"]  # not learned: no task value; loss still measured
    assert "over the 3 comparisons of this table" in effective  # Paley × (copy, loss) + NoPE × loss
    verdicts = report.split("## Verdicts")[1]
    assert "efflen_loss, θ=10000: NoPE − RoPE = 2.0000" in verdicts and "acc_copy_x8" in verdicts
    assert "acc_copy_x2, θ=10000: NoPE" not in verdicts  # not learned: no verdict
    assert (synthetic_sweep / "report" / "position_loss_diff_theta10000.png").is_file()


def test_notebook_c_draws_the_length_figures_and_tables(synthetic_sweep):
    import nbformat
    from nbclient import NotebookClient

    from analysis import NOTEBOOKS_DIR

    nb = nbformat.read(NOTEBOOKS_DIR / "c_results_and_tables.ipynb", as_version=4)
    params = next(c for c in nb.cells if "parameters" in c.metadata.get("tags", []))
    params.source = f"sweep_dir = {str(synthetic_sweep)!r}"
    here = {"metadata": {"path": str(NOTEBOOKS_DIR)}}
    NotebookClient(nb, timeout=300, kernel_name="python3", resources=here).execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    shown = "".join(o.get("text", "") + str(o.get("data", {}).get("text/markdown", "")) for o in outputs)
    assert "### Effective length" in shown and "not learned" in shown
    assert "Wilson interval of k/n" in shown and "lines: mean per-seed difference" in shown  # both new figures
    assert sum("image/png" in o.get("data", {}) for o in outputs) >= 3


def test_a_family_of_several_metrics_is_corrected_together(synthetic_sweep):
    from analysis.comparisons import comparison_family, comparison_table
    from analysis.stats import adjust

    cells = _cells(synthetic_sweep)
    metrics = ["acc_copy_x2", "acc_copy_x4", "val_loss"]
    family = comparison_family(cells, metrics)
    alone = [comparison_table(cells, m) for m in metrics]
    raw = [p for t in alone for p in t["p"]]
    assert family["p"].tolist() == raw and family["family"].eq(len(raw)).all()
    assert family["p_adj"].tolist() == pytest.approx(adjust(raw, "holm"))
    assert (family["p_adj"] >= pd.concat(alone)["p_adj"].to_numpy()).all()  # a larger family never corrects less


def test_an_axis_over_whole_encodings_is_said_by_the_label_and_keeps_rope_as_reference(synthetic_sweep):
    """lengthgen_compact's axis is `model.pe` (a list of whole encodings): the report must name the variants by their
    labels and compare each with RoPE, not split every encoding into its own group without a reference."""
    import json

    from analysis.comparisons import references
    from analysis.variants import trained, variant_axes

    base = pd.read_parquet(synthetic_sweep / "results.parquet")
    pe = {"rope": {"kind": "rope"}, "nope": {"kind": "nope"}, "hdrope": {"kind": "hdrope", "rotation_dim": 4,
                                                                          "basis": "paley"}}
    base["model.pe"] = [json.dumps(pe[k]) for k in base["model.pe.kind"]]
    results = base.drop(columns="model.pe.kind")
    results.attrs = {"axes": ["seed", "model.pe"], "seed_axes": ["seed"]}
    cells = trained(results)
    assert variant_axes(cells) == []
    assert set(cells["variant"]) == {"RoPE", "NoPE", "4D Paley"}
    assert references(cells) == {"NoPE": "RoPE", "4D Paley": "RoPE"}
    # two encodings with one label (a setting the label does not say) stay apart: the axis is kept
    results.loc[results["seed"] == 1, "model.pe"] = json.dumps({"kind": "rope", "theta": 500000.0})
    results.loc[(results["seed"] == 1) & (results["pe_kind"] != "rope"), "model.pe"] = json.dumps({"kind": "nope"})
    mixed = trained(results)
    assert variant_axes(mixed) == ["model.pe"]


def test_the_seed_plan_sizes_an_effective_length_from_a_pilot(synthetic_sweep):
    from analysis.load import load_results
    from analysis.power import seed_advice
    from hdrope.errors import UserError

    planned = load_results(synthetic_sweep)
    advice = seed_advice(synthetic_sweep, planned, "efflen_copy", 0.5)
    assert advice.family == 2 * 2  # NoPE and 4D Paley against RoPE, over the table's columns copy and loss
    assert advice.paired_sd >= 0 and advice.planned_seeds == len(SEEDS)
    with pytest.raises(UserError, match=r"--metric efflen_nothing: .*'efflen_copy'"):
        seed_advice(synthetic_sweep, planned, "efflen_nothing", 0.5)
    assert seed_advice(synthetic_sweep, planned, "efflen_loss", 0.5).planned_seeds == len(SEEDS)


def test_cells_without_loss_by_position_have_no_loss_reading(tmp_path):
    from analysis.lengthgen import loss_readings
    from analysis.report import _loss_reasons

    cells = pd.DataFrame({"run_dir": [str(tmp_path)]})
    assert loss_readings(cells).empty and _loss_reasons(cells) == ""


def test_a_pilot_of_unpaired_files_names_the_re_evaluation(synthetic_sweep, tmp_path):
    """Loss-by-position files from before the paired columns load, and the plan says what to rerun."""
    import shutil

    from analysis.load import load_results
    from analysis.power import seed_advice
    from hdrope.errors import UserError
    from trainer.evals.position_loss import POSITION_LOSS_SCHEMA

    pilot = tmp_path / "pilot"
    shutil.copytree(synthetic_sweep, pilot)
    results = pq.read_table(pilot / "results.parquet")
    dirs = [str(pilot / "cells" / Path(d).name) for d in results.column("run_dir").to_pylist()]
    pq.write_table(results.set_column(results.schema.get_field_index("run_dir"), "run_dir", pa.array(dirs)),
                   pilot / "results.parquet")
    for d in dirs:
        path = Path(d) / "position_loss.parquet"
        v1 = pq.read_table(path).select(POSITION_LOSS_SCHEMA.names).replace_schema_metadata(None)
        pq.write_table(v1, path)  # a version 1 file: no paired columns and no version in its metadata
    with pytest.raises(UserError, match=r"--metric efflen_loss: .*eval\.sliding_stride"):
        seed_advice(pilot, load_results(pilot), "efflen_loss", 0.5)
