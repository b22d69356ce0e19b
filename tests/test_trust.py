"""Results a researcher can trust: every number and label in results.parquet, the dumps, passkey tables,
metrics.jsonl and the report is the right one, for the right encoding (issue: trust).

In-process runs of the tiny model (no Ray); the MLflow side under Ray is in test_trust_e2e.py.
"""

import json
import shutil
import subprocess
import sys

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from trainer.model.position import IDENTITY_COLUMNS, POSITION_ENCODINGS, PEConfig, encoding_identity, pe_config_class

KIND_SPEC = """
name: kinds
base: tiny
storage: {storage}
overrides:
  data.cache_dir: {cache}
  train.steps: 6
  train.log_every: 3
  train.eval_every: 3
  train.ckpt_every: 3
  eval.extrapolation: [2, 16]
  eval.passkey.length_factors: [2.0]
  eval.passkey.depths: 2
  dump.enabled: true
  dump.samples: 1
axes:
  model.pe.kind: [rope, hdrope, nope]
  model.pe.basis: [identity, paley]
"""


@pytest.fixture(scope="module")
def kind_sweep(cache_dir, tmp_path_factory, sweep_trainer):
    """A finished in-process sweep over kind x basis (6 cells; rope and nope dedup their basis axis)."""
    root = tmp_path_factory.mktemp("kinds")
    spec = root / "kinds.yaml"
    spec.write_text(KIND_SPEC.format(storage=root / "store", cache=cache_dir))
    return sweep_trainer(spec)


def _identity(table: pd.DataFrame) -> dict:
    rows = table[list(IDENTITY_COLUMNS)].drop_duplicates()
    assert len(rows) == 1, rows
    return {k: (None if pd.isna(v) else v) for k, v in rows.iloc[0].to_dict().items()}


def test_every_artifact_of_a_cell_names_the_same_encoding(kind_sweep):
    results = pq.read_table(kind_sweep.root / "results.parquet").to_pandas()
    trained = {c.cell_id: c for c in kind_sweep.to_run}
    assert len(trained) == 4  # rope, nope once each; hdrope identity and paley
    kinds = set()
    for cell_id, cell in trained.items():
        want = encoding_identity(cell.config.model.pe)
        kinds.add(want["pe_kind"])
        run = kind_sweep.root / "cells" / cell_id
        row = results[results["cell_id"] == cell_id]
        sources = {"results": _identity(row), "passkey": _identity(pq.read_table(run / "passkey.parquet").to_pandas()),
                   "attention": _identity(pq.read_table(run / "attention" / "attention.parquet").to_pandas()),
                   "profile": _identity(pq.read_table(run / "attention" / "logit_profile.parquet").to_pandas())}
        for where, got in sources.items():
            assert got == want, (cell_id, where)
    assert kinds == {"rope", "hdrope", "nope"}  # the newer kinds have their own sweep in test_encodings.py
    nope = results[results["pe_kind"] == "nope"]
    assert set(nope["pe_label"]) == {"NoPE"} and (nope["rotation_dim"] == 0).all() and nope["theta"].isna().all()
    rope = results[results["pe_kind"] == "rope"]
    assert set(rope["basis"]) == {"identity"} and (rope["rotation_dim"] == 2).all()


def test_every_configured_metric_reaches_the_results_table(kind_sweep):
    results = pq.read_table(kind_sweep.root / "results.parquet").to_pandas()
    assert "val_loss_x16" in results.columns
    assert results.loc[results["status"] == "FINISHED", "val_loss_x16"].notna().all()
    for cell in kind_sweep.to_run:
        stored = json.loads((kind_sweep.root / "cells" / cell.cell_id / "result.json").read_text())["metrics"]
        row = results[results["cell_id"] == cell.cell_id].iloc[0]
        assert {k: row[k] for k in stored} == pytest.approx(stored)


def test_metrics_jsonl_reports_each_metric_once_per_step_and_the_final_evaluation(kind_sweep):
    cell = kind_sweep.to_run[0]
    records = [json.loads(line) for line in (kind_sweep.root / "cells" / cell.cell_id / "metrics.jsonl").open()]
    seen = set()
    for rec in records:
        for key in rec.keys() - {"step"}:
            assert (key, rec["step"]) not in seen, (key, rec["step"])
            seen.add((key, rec["step"]))
    val = {r["step"]: r["val_loss"] for r in records if "val_loss" in r}
    assert sorted(val) == [3, 6]  # mid-run at 3, the final evaluation at 6 (not the step-3 value carried forward)
    final = json.loads((kind_sweep.root / "cells" / cell.cell_id / "result.json").read_text())["metrics"]
    assert val[6] == pytest.approx(final["val_loss"]) and val[3] != val[6]


def test_the_report_keeps_every_variant_apart_and_in_every_figure(kind_sweep):
    from analysis.report import build_report

    md = build_report(kind_sweep.root).read_text()
    for label in ("RoPE", "NoPE", "4D identity", "4D Paley"):
        assert (f"| {label} |" in md and f"![passkey {label}, θ=" in md) or f"![passkey {label}, no θ]" in md
    assert "NoPE − RoPE" in md and "4D Paley − RoPE" in md and "4D identity − RoPE" in md


def test_report_groups_by_every_axis_except_the_seed():
    from analysis.report import ablation_table

    rows = []
    for scaling, base in (('{"rope_type": "yarn", "factor": 4}', 2.0), ('{"rope_type": "dynamic", "factor": 4}', 3.0)):
        for seed in (1, 2, 3):
            rows.append({"cell_id": f"c{len(rows)}", "status": "FINISHED", "dedup_of": None, "pe_kind": "hdrope",
                         "pe_label": "4D Paley", "rotation_dim": 4, "basis": "paley", "theta": 1e4,
                         "model.pe.scaling": scaling, "seed": seed, "val_loss": base + 0.01 * seed})
    results = pd.DataFrame(rows)
    results.attrs = {"axes": ["model.pe.scaling", "seed"], "seed_axes": ["seed"]}
    table = ablation_table(results, "val_loss")
    assert len(table) == 2  # yarn and dynamic are two variants, never one 'mean ± CI' over six runs
    means = sorted(float(v.split()[0]) for v in table.iloc[:, 0])
    assert means == pytest.approx([2.02, 3.02]) and all("(n=3)" in v for v in table.iloc[:, 0])
    assert any("scaling=yarn(factor=4)" in v for v in table.index)  # the mapping's label, as in run names


def test_a_run_directory_belongs_to_one_configuration(cache_dir, tmp_path, hdrope_here):
    base = ["train", "tiny", "train.steps=4", "train.ckpt_every=2", f"data.cache_dir={cache_dir}",
            "eval.passkey.enabled=false", "eval.extrapolation_batches=0", "--no-progress"]
    run = tmp_path / "run"
    first = hdrope_here([*base, f"train.out_dir={run}"])
    assert first.returncode == 0, first.stderr
    before = (run / "result.json").read_text()
    other = hdrope_here([*base, f"train.out_dir={run}", "model.pe.basis=identity"])
    assert other.returncode == 2 and "Traceback" not in other.stderr
    owner = json.loads(before)["config_hash"]
    assert owner in other.stderr and "not of this config" in other.stderr and "train.out_dir" in other.stderr
    assert (run / "result.json").read_text() == before  # nothing was overwritten
    # without out_dir each configuration gets its own directory
    defaults = [hdrope_here([*base, *extra], cwd=tmp_path) for extra in ([], ["model.pe.basis=identity"])]
    dirs = [json.loads(d.stdout)["run_dir"] for d in defaults]
    assert all(d.returncode == 0 for d in defaults) and dirs[0] != dirs[1]
    assert all(d.startswith("runs/run-") for d in dirs)


def test_resume_continues_metrics_without_repeating_steps(tiny_cfg):
    from trainer.run.loop import train

    cfg = tiny_cfg("train.steps=8", "train.ckpt_every=4", "train.log_every=2", "train.eval_every=4",
                   "eval.passkey.enabled=false", "eval.extrapolation_batches=0", out="resumed")
    ref_cfg = tiny_cfg("train.steps=8", "train.ckpt_every=4", "train.log_every=2", "train.eval_every=4",
                       "eval.passkey.enabled=false", "eval.extrapolation_batches=0", out="reference")
    train(ref_cfg)
    run = train(cfg).run_dir
    shutil.rmtree(run / "checkpoints" / "step_00000008")  # as if the run died after step 8's metrics
    (run / "result.json").unlink()
    resumed = train(cfg)
    assert resumed.resumed_from == 4
    from trainer.config import COST_METRICS

    timing = set(COST_METRICS)  # machine timings differ between any two runs

    def records(path):
        return [{k: v for k, v in json.loads(line).items() if k not in timing} for line in path.open()]

    reference = run.parent / "reference" / "metrics.jsonl"
    assert records(run / "metrics.jsonl") == records(reference)  # the file an uninterrupted run writes
    # every checkpoint manifest gone: refused (no silent retrain from 0 over the run), its metrics left as they were
    for manifest in (run / "checkpoints").glob("*/manifest.json"):
        manifest.unlink()
    from hdrope.errors import UserError

    with pytest.raises(UserError, match=r"have no manifest\.json \(damaged\), so none can be resumed"):
        train(cfg)
    assert records(run / "metrics.jsonl") == records(reference)


def test_a_copied_sweep_writes_into_itself(tiny_sweep, tmp_path):
    copy = tmp_path / "moved" / "tinysweep"
    shutil.copytree(tiny_sweep, copy)
    original = (tiny_sweep / "results.parquet").stat().st_mtime_ns
    plan = json.loads((copy / "plan.json").read_text())
    plan["root"] = str(tmp_path / "elsewhere")  # an edited root is ignored too
    (copy / "plan.json").write_text(json.dumps(plan))
    out = subprocess.run([sys.executable, "-m", "sweeps.console", "sweep", "results", str(copy)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "c000-rotation_dim2-basisidentity-seed1" in out.stdout and "2D RoPE" in out.stdout  # the table, printed
    assert (tiny_sweep / "results.parquet").stat().st_mtime_ns == original
    assert not (tmp_path / "elsewhere").exists()
    rows = pq.read_table(copy / "results.parquet").to_pandas()
    assert all(d.startswith(str(copy)) for d in rows["run_dir"])
    assert (rows["status"] == "FINISHED").all()


def test_identity_of_every_registered_kind_has_the_same_columns():
    for kind in POSITION_ENCODINGS:
        ident = encoding_identity(pe_config_class(kind)(kind=kind))
        assert list(ident) == list(IDENTITY_COLUMNS)
        assert ident["pe_kind"] == kind and ident["pe_label"]
    # labels are distinct across the paper's variants
    labels = {encoding_identity(PEConfig(kind="hdrope", rotation_dim=n, basis=b))["pe_label"]
              for n in (4, 8) for b in ("identity", "random", "paley")}
    assert len(labels) == 6 and not np.isnan(encoding_identity(PEConfig())["theta"])
