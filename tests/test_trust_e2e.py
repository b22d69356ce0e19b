"""The numbers in MLflow are the run's numbers: a real sweep on a real Ray with mid-run evaluations,
checked cell by cell (dedup copies included) against results.parquet and each cell's own files."""

import json

import pyarrow.parquet as pq
import pytest

pytestmark = pytest.mark.slow

SPEC = """
name: trust
base: tiny
storage: {storage}
overrides:
  data.cache_dir: {cache}
  train.steps: 20
  train.threads: 1
  train.log_every: 5
  train.eval_every: 10      # a mid-run evaluation: its value must never stand in for the final one
  train.ckpt_every: 10
  eval.extrapolation: [2, 16]
  eval.extrapolation_batches: 1
  eval.passkey.enabled: false
axes:
  model.pe.kind: [rope, hdrope]
  model.pe.basis: [identity, paley]
resources: {{cpus: 1}}
"""


def test_mlflow_holds_each_cells_own_final_numbers(tmp_path, cache_dir, shared_ray, hdrope_here):
    import mlflow

    spec = tmp_path / "trust.yaml"
    spec.write_text(SPEC.format(storage=tmp_path / "store", cache=cache_dir))
    out = hdrope_here(["sweep", "run", str(spec)], cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    root = tmp_path / "store" / "trust"
    results = pq.read_table(root / "results.parquet").to_pandas().set_index("cell_id")
    client = mlflow.MlflowClient(f"sqlite:///{root / 'mlflow.db'}")
    exp = client.get_experiment_by_name("trust")
    runs = {r.data.tags["cell_id"]: r for r in client.search_runs([exp.experiment_id])
            if r.data.tags.get("role") == "cell"}
    assert set(runs) == set(results.index) and len(runs) == 4
    assert exp.tags["mlflow.experimentKind"] == "custom_model_development"  # the UI opens on the runs
    assert {r.info.run_name for r in runs.values()} == {"RoPE-θ10000-s42", "4D-identity-θ10000-s42",
                                                        "4D-Paley-θ10000-s42"}
    assert results["dedup_of"].notna().sum() == 1  # rope x paley is rope x identity
    for cell_id, run in runs.items():
        row = results.loc[cell_id]
        assert run.info.status == "FINISHED"
        for metric in ("val_loss", "val_bpb", "val_loss_x2", "val_loss_x16", "train_loss"):
            assert run.data.metrics[metric] == pytest.approx(row[metric], rel=1e-9), (cell_id, metric)
        history = client.get_metric_history(run.info.run_id, "val_loss")
        assert sorted(m.step for m in history) == [10, 20], cell_id  # each evaluation once, at its own step
        trained = root / "cells" / row["trained_cell"]
        records = [json.loads(line) for line in (trained / "metrics.jsonl").open()]
        assert {m.step: m.value for m in history} == pytest.approx({r["step"]: r["val_loss"] for r in records
                                                                    if "val_loss" in r})
    dedup_id = results.index[results["dedup_of"].notna()][0]
    dedup = runs[dedup_id]
    assert dedup.data.tags["dedup_of"] == results.loc[dedup_id, "dedup_of"]
    config = client.download_artifacts(dedup.info.run_id, "config/config.yaml", str(tmp_path / "dl"))
    text = open(config).read()
    assert "basis: paley" in text and "kind: rope" in text and f"name: {dedup_id}" in text  # its own config
    assert (root / "cells" / dedup_id / "dedup.json").is_file()
