"""Damaged or foreign inputs to the analysis: each is refused with the file, what is wrong and the fix (exit 2 at the
console), and a cell that finished without a metric never prints 'nan'."""

import shutil

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from analysis.load import load_profiles, load_stats, sweep_cells
from analysis.report import ablation_table
from hdrope.errors import UserError


def _respoof(src, dst, column: str, array: pa.Array) -> None:
    """Rewrite a dump with one column replaced, keeping its hdrope metadata (a file that claims to be a dump)."""
    table = pq.read_table(src)
    table = table.set_column(table.schema.get_field_index(column), column, array)
    pq.write_table(table.replace_schema_metadata(pq.read_schema(src).metadata), dst)


def test_a_dump_with_spoofed_column_types_is_refused(tiny_sweep, tmp_path):
    cell = sweep_cells(tiny_sweep).iloc[0]
    stats = pq.read_table(cell["attention_path"])
    n = stats.num_rows
    cases = {
        "layer": pa.array([str(i) for i in range(n)]),
        "erank": pa.array(["1.0"] * n),
        "attn": pa.array([["x"]] * n, pa.list_(pa.string())),
    }
    for column, array in cases.items():
        bad = tmp_path / f"{column}.parquet"
        _respoof(cell["attention_path"], bad, column, array)
        with pytest.raises(UserError, match=rf"{column}\.parquet: not an attention dump of this lab \({column} is"):
            load_stats(bad)
    prof = tmp_path / "profile.parquet"
    rows = pq.read_table(cell["profile_path"]).num_rows
    _respoof(cell["profile_path"], prof, "logit_mean", pa.array(["oops"] * rows))
    with pytest.raises(UserError, match="logit_mean is string, not a list of floats"):
        load_profiles(prof)


def test_report_refuses_a_truncated_passkey_table_naming_it(tiny_sweep, tmp_path, hdrope_here):
    sweep = tmp_path / "copy"
    shutil.copytree(tiny_sweep, sweep, ignore=shutil.ignore_patterns("report"))
    cell = sweep_cells(sweep).iloc[0]
    path = cell["passkey_path"]
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    out = hdrope_here(["report", str(sweep)])
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr[-2000:]
    assert str(path) in out.stderr and "unreadable passkey table" in out.stderr and "rerun the cell" in out.stderr


def test_a_finished_cell_without_a_metric_prints_no_nan():
    rows = [{"cell_id": f"c{i}", "status": "FINISHED", "dedup_of": None, "pe_kind": kind, "pe_label": label,
             "rotation_dim": dim, "basis": "paley", "theta": 1e4, "seed": seed,
             "val_loss": 2.0 + 0.01 * seed, "val_loss_x16": np.nan if kind == "rope" else 3.0 + 0.01 * seed}
            for i, (kind, label, dim, seed) in enumerate(
                [(k, lab, d, s) for k, lab, d in (("rope", "RoPE", 2), ("hdrope", "4D Paley", 4)) for s in (1, 2)])]
    results = pd.DataFrame(rows)
    results.attrs = {"axes": ["model.pe.kind", "seed"], "seed_axes": ["seed"]}
    table = ablation_table(results, "val_loss_x16")
    text = table.to_string()
    assert "nan" not in text.lower() and table.loc["RoPE"].iloc[0] == "—"
    assert table.loc["4D Paley"].iloc[0].startswith("3.0150 ± ")


def test_lm_eval_accuracies_are_tabled_as_k_of_n_with_wilson_intervals():
    from analysis.report import comparisons

    rows = [{"cell_id": f"c{i}", "status": "FINISHED", "dedup_of": None, "pe_kind": kind, "pe_label": label,
             "rotation_dim": dim, "basis": "paley", "theta": 1e4, "seed": seed, "lm_arc_easy_acc": acc,
             "lm_arc_easy_acc_stderr": 0.05, "lm_arc_easy_n": 100.0}
            for i, (kind, label, dim, seed, acc) in enumerate(
                [("rope", "RoPE", 2, 1, 0.30), ("rope", "RoPE", 2, 2, 0.32),
                 ("hdrope", "4D Paley", 4, 1, 0.35), ("hdrope", "4D Paley", 4, 2, 0.36)])]
    results = pd.DataFrame(rows)
    results.attrs = {"axes": ["model.pe.kind", "seed"], "seed_axes": ["seed"]}
    cell = ablation_table(results, "lm_arc_easy_acc").loc["4D Paley"].iloc[0]
    assert cell.startswith("71/200 = 35.5% [") and "(seeds=2)" in cell and cell.endswith("(too few seeds to test)")
    test = comparisons(results, "lm_arc_easy_acc").iloc[0]
    assert test["paired"] and test["delta"] == pytest.approx(0.045) and not test["testable"]
    from analysis.outcomes import outcome_metrics

    assert outcome_metrics(["lm_arc_easy_acc", "lm_arc_easy_acc_stderr", "lm_arc_easy_n", "tokens_per_s", "mfu",
                            "val_loss"]) == ["lm_arc_easy_acc", "val_loss"]
